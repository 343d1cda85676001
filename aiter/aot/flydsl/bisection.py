"""Finds every value of an axis (M, tokens, a sequence length) at which the kernels a job
requests change, calling the runtime sparingly.

Samples the ends of the range and each power of two inside it, then bisects between neighbours
that differ. Between two equal neighbouring samples the kernels are taken as constant.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

V = TypeVar("V", bound=Hashable)


@dataclass(frozen=True)
class Segment(Generic[V]):
    lo: int
    hi: int  # inclusive
    value: V


def sample_points(lo: int, hi: int) -> list[int]:
    """The ends of [lo, hi] and every power of two and power of two minus one inside it."""
    points = {lo, hi}
    p = 1
    while p <= hi:
        for q in (p - 1, p):
            if lo <= q <= hi:
                points.add(q)
        p *= 2
    return sorted(points)


def segments(value_at: Callable[[int], V], lo: int, hi: int) -> list[Segment[V]]:
    """Split [lo, hi] into maximal runs with one value; value_at is called once per point."""
    if lo < 1 or hi < lo:
        raise ValueError(f"range of the axis must satisfy 1 <= lo <= hi, got [{lo}, {hi}]")
    seen: dict[int, V] = {}

    def at(m: int) -> V:
        if m not in seen:
            seen[m] = value_at(m)
        return seen[m]

    def changes(a: int, b: int) -> list[int]:
        """Every m in (a, b] with at(m) != at(m - 1), given at(a) != at(b) shows one exists."""
        if at(a) == at(b):
            return []
        if b == a + 1:
            return [b]
        mid = (a + b) // 2
        return changes(a, mid) + changes(mid, b)

    points = sample_points(lo, hi)
    starts = [lo]
    for a, b in zip(points, points[1:], strict=False):
        starts += changes(a, b)
    ends = [s - 1 for s in starts[1:]] + [hi]
    return [Segment(s, e, at(s)) for s, e in zip(starts, ends, strict=True)]
