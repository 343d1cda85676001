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

from aiter.aot.flydsl.capture.files import CapturedCall
from aiter.aot.flydsl.jobs.axes import Along, CaptureError
from aiter.aot.flydsl.jobs.family import CapturedOp, Family, Job
from aiter.aot.flydsl.jobs.records import CAPTURE_TABLE, JobInfo

AS_CAPTURED = "call"  # the axis of a job whose call is replayed only as captured


def entry_function(op: CapturedOp) -> Any:
    module, _, name = op.entry.partition(":")
    return getattr(importlib.import_module(module), name)


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

        return host_tensor(t["values"], dtype, t["shape"])
    device = "cuda" if t["device"] != "cpu" else "cpu"
    return torch.empty_strided(t["shape"], t["stride"], dtype=dtype, device=device)


def _bound(fn: Any, call: CapturedCall) -> inspect.BoundArguments:
    try:
        return inspect.signature(fn).bind(*call.args, **call.kwargs)
    except TypeError as err:
        raise CaptureError(f"{call.op} no longer takes these arguments: {err}") from None


def along(op: CapturedOp, call: CapturedCall) -> Along | None:
    """Where the captured call sits on its family's axis; None: only as captured (also when
    its arguments no longer bind: its job then fails naming why)."""
    if op.along is None:
        return None
    try:
        arguments = _bound(entry_function(op), call).arguments
    except CaptureError:
        return None
    return op.along(arguments)


def captured_caller(op: CapturedOp, call: CapturedCall, place: Along | None):
    """The call of the public entry with the captured arguments, at a value of the axis."""

    def replay(**values: int) -> object:
        fn = entry_function(op)
        bound = _bound(fn, call)
        arguments: Mapping[str, Any] = bound.arguments
        if place is not None and values.get(place.axis, place.value) != place.value:
            arguments = place.at(values[place.axis])
        for name, description in list(arguments.items()):
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
        place = along(op, call)
        axis = place.axis if place is not None else AS_CAPTURED
        at = place.value if place is not None else 1
        top = 0
        if widen and place is not None:
            # A grid family's axis has no maximum of its own: its table axis's bounds it.
            top = place.top(maxima.get(axis) or maxima.get(family.tables[0].axis.name, 0))
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
        jobs.append(Job(info, captured_caller(op, call, place), 0, family.segment_by))
    return jobs
