"""Finds every value of an axis (M, tokens, a sequence length) at which the kernels a job
requests change, calling the runtime sparingly.

Samples the ends of the range, each power of two inside it and any points the caller names, then
bisects between neighbours that differ. Between two equal neighbouring samples the value is taken
as constant: exact for a monotone function (a value once left never returns); a value that may
stand alone (a row that serves only its own tabled value) is found when its point is named.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
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


def segments(
    value_at: Callable[[int], V], lo: int, hi: int, points: Iterable[int] = ()
) -> list[Segment[V]]:
    """Split [lo, hi] into maximal runs with one value; value_at is called once per point.

    `points` are probed besides the samples (those outside [lo, hi] are ignored): values where
    the function is known to be special, such as the tabled ones.
    """
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

    probed = sorted(set(sample_points(lo, hi)) | {p for p in points if lo <= p <= hi})
    starts = [lo]
    for a, b in zip(probed, probed[1:], strict=False):
        starts += changes(a, b)
    ends = [s - 1 for s in starts[1:]] + [hi]
    return [Segment(s, e, at(s)) for s, e in zip(starts, ends, strict=True)]
