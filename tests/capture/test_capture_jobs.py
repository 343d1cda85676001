"""Moving a captured argument along the axis: the layout it was captured in is kept."""

from __future__ import annotations

import pytest

from aiter.aot.flydsl.capture_jobs import CaptureError, resized


def _tensor(shape, stride):
    return {"dtype": "bfloat16", "shape": shape, "stride": stride, "device": "cuda"}


@pytest.mark.parametrize(
    "shape, stride, dim, size, expected",
    [
        ([300, 4096], [4096, 1], 0, 512, [4096, 1]),  # row-major, the outer dim moves
        ([300, 4096], [1, 300], 0, 512, [1, 512]),  # column-major
        ([8, 2000, 16, 128], [4096000, 2048, 128, 1], 1, 1025, [2099200, 2048, 128, 1]),
        ([1, 300, 4], [7, 4, 1], 1, 10, [40, 4, 1]),  # a size-1 dim's stride is free
    ],
)
def test_resized_keeps_the_dense_layout(shape, stride, dim, size, expected) -> None:
    moved = resized(_tensor(shape, stride), dim, size, "x")
    assert moved["stride"] == expected
    assert moved["shape"] == shape[:dim] + [size] + shape[dim + 1 :]


def test_a_strided_view_cannot_move() -> None:
    with pytest.raises(CaptureError, match=r"argument a \(shape \[300, 4096\], strides "):
        resized(_tensor([300, 4096], [8192, 1]), 0, 512, "a")


def test_the_axis_dim_must_exist() -> None:
    with pytest.raises(CaptureError, match="argument g has 3 dimensions, the axis is dim 3"):
        resized(_tensor([2, 3, 4], [12, 4, 1]), 3, 5, "g")
