"""Wave votes: a predicate's lane mask (ballot), and whether any lane holds it."""

from __future__ import annotations

import flydsl.expr as fx
from flydsl.expr import rocdl


def lane_mask_type(wave_size: int):
    """The integer type of a wave's lane mask: one bit per lane."""
    return fx.Int64 if wave_size == 64 else fx.Int32


def ballot(pred, wave_size: int):
    """The mask of the lanes where pred holds."""
    ty = lane_mask_type(wave_size)
    return ty(rocdl.ballot(ty.ir_type, pred))


def any_lane(pred, wave_size: int):
    """Whether pred holds in any lane of the wave: a uniform condition, so a branch on it is a
    scalar branch rather than per-lane selects."""
    return ballot(pred, wave_size) != 0
