"""The argument checks every kernel launcher shares: what they accept, and errors that name the
argument and what was expected."""

from __future__ import annotations

import pytest
import torch

from aiter.ops.shared.launch_args import (
    check_bool,
    check_choice,
    check_int,
    check_rank,
    check_tensor,
)


def test_choices_are_strings_from_the_list() -> None:
    assert check_choice("mode", "reduce", ("atomic", "reduce")) == "reduce"
    for bad in ("sum", None, 1):
        with pytest.raises(ValueError, match=r"^mode: expected one of \('atomic', 'reduce'\)"):
            check_choice("mode", bad, ("atomic", "reduce"))


def test_bools_are_bools_only() -> None:
    assert check_bool("flag", False) is False
    with pytest.raises(ValueError, match="^flag: expected a bool, got 1$"):
        check_bool("flag", 1)


@pytest.mark.parametrize(
    ("value", "high", "message"),
    [
        (0, None, "^k: expected an int >= 1, got 0$"),
        (True, None, "^k: expected an int >= 1, got True$"),
        (2.0, None, "^k: expected an int >= 1, got 2.0$"),
        (9, 8, r"^k: expected an int in \[1, 8\], got 9$"),
    ],
)
def test_ints_are_bounded_and_not_bools(value, high, message) -> None:
    with pytest.raises(ValueError, match=message):
        check_int("k", value, 1, high)


def test_ints_within_bounds_come_back() -> None:
    assert check_int("k", 8, 1, 8) == 8
    assert check_int("k", 1 << 40, 1) == 1 << 40


def test_rank_gives_the_shape_or_names_the_dims() -> None:
    assert check_rank("a", torch.empty(3, 4), 2, "[M, K]") == (3, 4)
    with pytest.raises(ValueError, match=r"^a: expected a 2-D \[M, K\] tensor, got shape \[12\]$"):
        check_rank("a", torch.empty(12), 2, "[M, K]")
    with pytest.raises(TypeError, match=r"^a: expected a torch.Tensor \(\[M, K\]\), got list$"):
        check_rank("a", [[1.0]], 2, "[M, K]")


def test_a_tensor_of_the_right_dtype_shape_and_layout_passes() -> None:
    check_tensor("x", torch.empty(2, 3, dtype=torch.bfloat16), torch.bfloat16, (2, 3))
    check_tensor("x", torch.empty(2, 3), (torch.float16, torch.float32), (2, 3), "[M, N]")


@pytest.mark.parametrize(
    ("tensor", "error", "message"),
    [
        (None, TypeError, "^x: expected a torch.Tensor, got NoneType$"),
        (torch.empty(2, 3), ValueError, "^x: expected dtype torch.bfloat16, got torch.float32$"),
        (torch.empty(3, 2, dtype=torch.bfloat16), ValueError, r"^x: expected shape \[2, 3\]"),
        (torch.empty(3, 2, dtype=torch.bfloat16).t(), ValueError, "^x: expected a contiguous"),
    ],
)
def test_a_bad_tensor_is_named(tensor, error, message) -> None:
    with pytest.raises(error, match=message):
        check_tensor("x", tensor, torch.bfloat16, (2, 3))


def test_a_size_one_last_axis_needs_a_unit_stride() -> None:
    column = torch.empty(2, 2, dtype=torch.bfloat16).t()[:, :1]
    assert column.is_contiguous() and column.stride() == (1, 2)  # torch calls it contiguous
    with pytest.raises(ValueError, match=r"unit stride on its last axis, got strides \[1, 2\]$"):
        check_tensor("x", column, torch.bfloat16, (2, 1))


def test_several_dtypes_are_listed_and_the_dims_named() -> None:
    with pytest.raises(
        ValueError, match=r"^x: expected dtype in \(torch.float16, torch.bfloat16\)"
    ):
        check_tensor("x", torch.empty(1), (torch.float16, torch.bfloat16), (1,))
    with pytest.raises(ValueError, match=r"^x: expected shape \[B \+ 1\] = \[3\], got \[2\]$"):
        check_tensor("x", torch.empty(2), torch.float32, (3,), "[B + 1]")
