"""Jobs of captured calls: each distinct call of a capture becomes a job that calls the same
public entry with the same arguments rebuilt as FakeTensors (host integer tensors from their
recorded values), at the captured value of the family's axis, or, under --capture-widen, over
the run of the axis that served it.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from aiter.aot.flydsl.capture_file import CapturedCall
from aiter.aot.flydsl.jobs import CapturedOp, Family, Job
from aiter.aot.flydsl.protocol import CAPTURE_TABLE, JobInfo

AS_CAPTURED = "call"  # the axis of a job whose call is replayed only as captured


class CaptureError(ValueError):
    """A captured argument this build cannot rebuild or move along the axis."""


def entry_function(op: CapturedOp) -> Any:
    module, _, name = op.entry.partition(":")
    return getattr(importlib.import_module(module), name)


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


def materialize(description: Any, name: str) -> Any:
    """The argument a description stands for: tensors as FakeTensors of the dry run (host
    integer tensors as real ones, from their values), dtypes, sequences as tuples, scalars."""
    import torch

    if isinstance(description, list):
        return tuple(materialize(d, name) for d in description)
    if not isinstance(description, dict):
        return description
    if "dtype" in description and len(description) == 1:
        return getattr(torch, description["dtype"])
    if "tensor" not in description:
        raise CaptureError(f"argument {name} was recorded as {description}: it cannot be rebuilt")
    t = description["tensor"]
    dtype = getattr(torch, t["dtype"], None)
    if not isinstance(dtype, torch.dtype):
        raise CaptureError(f"argument {name}: unknown dtype {t['dtype']!r}")
    if "values" in t:
        from aiter.aot.flydsl.dry_run import host_tensor

        return host_tensor(t["values"], dtype).reshape(t["shape"])
    device = "cuda" if t["device"] != "cpu" else "cpu"
    return torch.empty_strided(t["shape"], t["stride"], dtype=dtype, device=device)


def _bound(fn: Any, call: CapturedCall) -> inspect.BoundArguments:
    try:
        return inspect.signature(fn).bind(*call.args, **call.kwargs)
    except TypeError as err:
        raise CaptureError(f"{call.op} no longer takes these arguments: {err}") from None


def axis_value(op: CapturedOp, arguments: Mapping[str, Any]) -> int | None:
    """The captured value of the op's axis: the size of the first given argument that has it."""
    for name, dim in op.dims_of(arguments).items():
        description = arguments.get(name)
        if isinstance(description, dict) and "tensor" in description:
            shape = description["tensor"]["shape"]
            if dim < len(shape):
                return int(shape[dim])
    return None


def captured_caller(op: CapturedOp, call: CapturedCall, captured_value: int | None):
    """The call of the public entry with the captured arguments, at a value of the axis."""

    def replay(**values: int) -> object:
        fn = entry_function(op)
        bound = _bound(fn, call)
        value = values.get(op.axis, captured_value)
        dims = op.dims_of(bound.arguments)
        for name, description in list(bound.arguments.items()):
            moved = name in dims and value != captured_value
            if moved and isinstance(description, dict) and "tensor" in description:
                tensor = resized(description["tensor"], dims[name], value, name)
                description = {"tensor": tensor}
            bound.arguments[name] = materialize(description, name)
        return fn(*bound.args, **bound.kwargs)

    return replay


def capture_jobs(
    family: Family,
    calls: Sequence[CapturedCall],
    arch: str,
    cu_nums: frozenset[int] | None,
    maxima: Mapping[str, int],
    widen: bool,
) -> list[Job]:
    """One job per captured call of `family`'s ops on `arch` (and `cu_nums` when given)."""
    jobs = []
    for call in calls:
        op = family.captured.get(call.op)
        if op is None or call.arch != arch or (cu_nums is not None and call.cu_num not in cu_nums):
            continue
        value = None
        if op.axis:
            try:
                arguments = _bound(entry_function(op), call).arguments
            except CaptureError:
                arguments = {}  # the job fails when it calls the entry, naming why
            value = axis_value(op, arguments)
        axis = op.axis if value is not None else AS_CAPTURED
        at = value if value is not None else 1
        # A grid family's axis has no maximum of its own: its table axis's bounds it.
        top = maxima.get(axis) or maxima.get(family.tables[0].axis.name, 0)
        top = top if widen and value is not None else 0
        if top and op.bound is not None:
            top = op.bound(arguments, top)
        info = JobInfo(
            module=family.name,
            table=CAPTURE_TABLE,
            row=call.where,
            arch=call.arch,
            cu_num=call.cu_num,
            variant=call.op,
            axis=axis,
            lo=at,
            hi=at,
            tabled=at,  # replayed even above a module's limit
            widen_to=max(top, at) if top else 0,
        )
        jobs.append(Job(info, captured_caller(op, call, value), 0, family.segment_by))
    return jobs
