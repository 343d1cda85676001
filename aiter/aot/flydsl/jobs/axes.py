"""Where a captured call sits on its family's axis, and the same call at another value of it
(what `--capture-widen` replays): the arguments are the capture's descriptions (see
aiter.capture.describe), moved without touching anything the axis does not carry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class CaptureError(ValueError):
    """A captured argument this build cannot rebuild or move along the axis."""


def _unbounded(top: int) -> int:
    return top


@dataclass(frozen=True)
class Along:
    """A captured call's axis (its name in the job), its value there, and its arguments at any
    other value."""

    axis: str
    value: int
    at: Callable[[int], dict[str, Any]] = field(repr=False)
    # The deployment's maximum of the table's axis -> the largest value of this axis within it,
    # where the two differ (T of B sequences of at most `top` tokens: top // B).
    top: Callable[[int], int] = field(default=_unbounded, repr=False)


# A family's declaration: the captured arguments -> their Along, or None (only as captured).
AlongOf = Callable[[Mapping[str, Any]], "Along | None"]


def _dense_order(shape: Sequence[int], stride: Sequence[int]) -> list[int] | None:
    """The dimensions innermost first when `stride` lays `shape` out densely; else None."""
    order = sorted(range(len(shape)), key=lambda i: (stride[i], -i))
    dense = _strides_in(shape, order)
    if any(size != 1 and stride[i] != dense[i] for i, size in enumerate(shape)):
        return None  # a size-1 dimension's stride is free
    return order


def _strides_in(shape: Sequence[int], order: Sequence[int]) -> list[int]:
    """The strides of a dense tensor of `shape` whose dimensions, innermost first, are `order`."""
    expected, strides = 1, [0] * len(shape)
    for i in order:
        strides[i] = expected
        expected *= shape[i]
    return strides


def resized(description: Mapping[str, Any], dim: int, size: int, name: str) -> dict[str, Any]:
    """A tensor description with dimension `dim` of size `size`, laid out as it was."""
    shape, stride = list(description["shape"]), list(description["stride"])
    if dim >= len(shape):
        raise CaptureError(f"argument {name} has {len(shape)} dimensions, the axis is dim {dim}")
    order = _dense_order(shape, stride)
    if order is None:
        raise CaptureError(
            f"argument {name} (shape {shape}, strides {stride}) is not dense: it cannot be "
            "moved along the axis"
        )
    shape[dim] = size
    return {**description, "shape": shape, "stride": _strides_in(shape, order)}


def tensor(arguments: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The tensor description of argument `name`, or None (absent, None, not a tensor)."""
    description = arguments.get(name)
    if isinstance(description, dict) and "tensor" in description:
        return description["tensor"]
    return None


def with_sizes(arguments: Mapping[str, Any], dims: Mapping[str, int], size: int) -> dict[str, Any]:
    """`arguments` with dimension dims[name] of each given tensor argument `name` at `size`."""
    moved = dict(arguments)
    for name, dim in dims.items():
        if (t := tensor(arguments, name)) is not None:
            moved[name] = {"tensor": resized(t, dim, size, name)}
    return moved


def along_dims(
    arguments: Mapping[str, Any],
    axis: str,
    dims: Mapping[str, int],
    top: Callable[[int], int] = _unbounded,
) -> Along | None:
    """The axis as a dimension of tensor arguments (argument name -> its dimension): its value
    is the size of the first given one that has it; moving it resizes them all."""
    for name, dim in dims.items():
        t = tensor(arguments, name)
        if t is not None and dim < len(t["shape"]):
            value = int(t["shape"][dim])
            return Along(axis, value, lambda size: with_sizes(arguments, dims, size), top)
    return None


def dims_along(axis: str, dims: Mapping[str, int]) -> AlongOf:
    """A family's declaration of an axis that is always these tensor dimensions."""
    return lambda arguments: along_dims(arguments, axis, dims)


def with_host_values(arguments: Mapping[str, Any], name: str, values: list[int]) -> dict[str, Any]:
    """`arguments` with host tensor `name` holding `values` (its shape kept) when it was
    recorded by value; a device tensor is left as it was (its values were never read)."""
    t = tensor(arguments, name)
    if t is None or "values" not in t:
        return dict(arguments)
    return {**arguments, name: {"tensor": {**t, "values": list(values)}}}
