"""Tests of aiter.aot.flydsl.jobs.bisection: finding every M where the requested kernels change.

Value functions have known switch points; every call is counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from aiter.aot.flydsl.jobs.bisection import Segment, sample_points, segments


def counting(switches: list[int]) -> tuple[Callable[[int], tuple[int, ...]], Counter]:
    """A value function that changes exactly at each M in `switches`; and its call counter."""
    calls: Counter = Counter()

    def value_at(m: int) -> tuple[int, ...]:
        calls[m] += 1
        # A tuple like the kernel sets the replay compares; the number of switches passed.
        return tuple(s for s in switches if m >= s)

    return value_at, calls


def test_sample_points_small_ranges() -> None:
    assert sample_points(1, 10) == [1, 2, 3, 4, 7, 8, 10]
    assert sample_points(5, 20) == [5, 7, 8, 15, 16, 20]
    assert sample_points(129, 256) == [129, 255, 256]
    assert sample_points(1, 1) == [1]
    assert sample_points(6, 6) == [6]
    assert sample_points(9, 14) == [9, 14]


def test_sample_points_whole_range() -> None:
    powers = [2**i for i in range(14)]
    expected = sorted({1, 8192} | set(powers) | {p - 1 for p in powers if p > 1})
    assert sample_points(1, 8192) == expected


def test_switches_found_exactly() -> None:
    value_at, calls = counting([17, 100, 101, 200, 4000])
    result = segments(value_at, 1, 8192)
    assert result == [
        Segment(1, 16, ()),
        Segment(17, 99, (17,)),
        Segment(100, 100, (17, 100)),
        Segment(101, 199, (17, 100, 101)),
        Segment(200, 3999, (17, 100, 101, 200)),
        Segment(4000, 8192, (17, 100, 101, 200, 4000)),
    ]
    # Memoised: no M asked twice, and far fewer calls than the 8192 M in the range (53 today).
    assert max(calls.values()) == 1
    assert len(calls) < 100
    for switch in (17, 100, 101, 200, 4000):
        assert switch in calls and switch - 1 in calls


def test_switch_inside_one_bucket() -> None:
    value_at, calls = counting([200])
    assert segments(value_at, 129, 256) == [Segment(129, 199, ()), Segment(200, 256, (200,))]
    assert max(calls.values()) == 1
    assert len(calls) <= 12


@pytest.mark.parametrize("switch", [2, 128, 129, 255, 256, 8191, 8192])
def test_switches_at_and_next_to_sample_points(switch: int) -> None:
    value_at, _ = counting([switch])
    assert segments(value_at, 1, 8192) == [
        Segment(1, switch - 1, ()),
        Segment(switch, 8192, (switch,)),
    ]


def test_constant_value_asks_only_the_samples() -> None:
    value_at, calls = counting([])
    assert segments(value_at, 1, 8192) == [Segment(1, 8192, ())]
    assert sorted(calls) == sample_points(1, 8192)


def test_every_m_distinct() -> None:
    value_at, calls = counting(list(range(2, 11)))
    result = segments(value_at, 1, 10)
    assert [(s.lo, s.hi) for s in result] == [(m, m) for m in range(1, 11)]
    assert sorted(calls) == list(range(1, 11))


def test_single_point_range() -> None:
    value_at, calls = counting([5])
    assert segments(value_at, 5, 5) == [Segment(5, 5, (5,))]
    assert dict(calls) == {5: 1}


@pytest.mark.parametrize("lo, hi", [(0, 5), (-3, 4), (10, 9), (0, 0)])
def test_invalid_range(lo: int, hi: int) -> None:
    value_at, calls = counting([])
    with pytest.raises(ValueError) as info:
        segments(value_at, lo, hi)
    assert str(info.value) == f"range of the axis must satisfy 1 <= lo <= hi, got [{lo}, {hi}]"
    assert not calls


def test_documented_limit_equal_neighbouring_samples_hide_a_blip() -> None:
    # The module's contract: between two equal neighbouring samples (4 and 7) the value is
    # taken as constant, so a value that differs only at M=5 is not seen.
    calls: Counter = Counter()

    def blip(m: int) -> str:
        calls[m] += 1
        return "b" if m == 5 else "a"

    assert segments(blip, 1, 8) == [Segment(1, 8, "a")]
    assert 5 not in calls


def test_named_points_find_a_value_that_stands_alone() -> None:
    # The same blip at 5, found once 5 is named: a row that serves only its own tabled value.
    def blip(m: int) -> str:
        return "b" if m == 5 else "a"

    assert segments(blip, 1, 8, points=[5]) == [
        Segment(1, 4, "a"),
        Segment(5, 5, "b"),
        Segment(6, 8, "a"),
    ]


def test_named_points_outside_the_range_are_ignored() -> None:
    value_at, calls = counting([300])
    assert segments(value_at, 129, 256, points=[1, 128, 257, 9000]) == [Segment(129, 256, ())]
    assert min(calls) == 129 and max(calls) == 256
    assert sorted(calls) == sample_points(129, 256)
