"""LDS bank conflicts of one LDS access, from the lanes' real addresses.

A model, not a measurement: the LDS has 32 banks of 4 bytes on gfx942 and 64 on gfx950 (the
CDNA3 and CDNA4 ISA documents, "Local Data Share"), and serves one dword per bank per cycle. A
wave's access is taken in phases of lanes in lane order, as many lanes as fill the banks once
(banks * 4 / bytes per lane, at least one); within a phase, lanes reading one dword share it (a
broadcast) and distinct dwords on one bank take a cycle each. A phase's extra cycles are its
most-loaded bank's distinct dwords minus one. The hardware's exact lane grouping for the wide
forms (b96, b128) differs in detail, so the figure is an estimate of conflict cycles.
"""

from __future__ import annotations

import numpy as np

BANKS = {"gfx942": 32, "gfx950": 64}
DEFAULT_BANKS = 32


def banks_of(arch: str) -> int:
    return BANKS.get(arch, DEFAULT_BANKS)


def conflict_cycles(addresses: np.ndarray, nbytes: int, banks: int) -> tuple[int, int]:
    """(phases, extra cycles) of one access: `addresses` are the active lanes' byte addresses in
    lane order, each touching `nbytes` bytes."""
    if addresses.size == 0:
        return 0, 0
    dwords_per_lane = max(1, (nbytes + 3) // 4)
    lanes_per_phase = max(1, banks // dwords_per_lane)
    first = addresses.astype(np.int64) // 4
    dwords = first[:, None] + np.arange(dwords_per_lane, dtype=np.int64)[None, :]
    phases = extra = 0
    for start in range(0, len(first), lanes_per_phase):
        touched = np.unique(dwords[start : start + lanes_per_phase].ravel())
        load = np.bincount(touched % banks, minlength=banks).max()
        phases += 1
        extra += int(load) - 1
    return phases, extra
