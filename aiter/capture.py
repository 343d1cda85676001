"""Serving captures: with `AITER_CAPTURE=PATH`, every public entry records each distinct call of
a process once, as one line of JSON appended to PATH, so that a build can later replay what a
deployment really calls (`python -m aiter.aot.flydsl --capture PATH`).

A line holds the schema version, aiter's and FlyDSL's versions, the op, the arch and CU count,
every argument described (tensors by dtype, shape, strides and device; small integer host
tensors, whose values host code reads, by value too; scalars and flags as they are) and how
the call was served (the dispatch records: backend, kernel, table row or heuristic, the
compile-time choices) and the FlyDSL kernels it launched, each with how the cache served it
(`hit`, `compiled`, or `refused` under FLYDSL_RUNTIME_RUN_ONLY=1). No tensor data is ever
written.

Cost: with the variable unset, `entry` returns the function itself. With it set, a call whose
arguments match one already recorded costs building its key and one dict lookup; only the
first call of a distinct key listens to the dispatch records and writes. Each line goes out
in one `write` of an O_APPEND file under an exclusive `flock`, so processes sharing the file
(ranks of one server, servers on one disk) never interleave or lose lines. The dedupe holds
at most MAX_DISTINCT keys (the oldest out first): past that a key may be written
again, which `capture merge` removes.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

ENV_CAPTURE = "AITER_CAPTURE"
SCHEMA_VERSION = 1
MAX_DISTINCT = 65536
HOST_VALUES_LIMIT = 4097  # integer host tensors up to this many elements are recorded by value

F = TypeVar("F", bound=Callable[..., Any])


def _describe_tensor(t: Any) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": [int(d) for d in t.shape],
        "stride": [int(s) for s in t.stride()],
        "device": t.device.type,
    }
    if (t.device.type == "cpu" and not t.dtype.is_floating_point and t.dtype != torch.bool
            and t.numel() <= HOST_VALUES_LIMIT):  # fmt: skip
        with contextlib.suppress(RuntimeError):  # a FakeTensor has none
            out["values"] = [int(v) for v in t.flatten().tolist()]  # row-major
    return out


def describe(value: Any) -> Any:
    """A JSON description of one argument: tensors as {"tensor": {...}}, dtypes as
    {"dtype": name}, sequences as lists, scalars and None as they are."""
    import torch

    if isinstance(value, torch.Tensor):
        return {"tensor": _describe_tensor(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return {"repr": repr(value)}


def _key_part(value: Any, torch: Any = None) -> Any:
    """What of an argument selects kernels, as a hashable value (cheaper than `describe`: the
    hot path of a captured entry builds one per argument on every call)."""
    if torch is None:
        import torch
    if isinstance(value, torch.Tensor):
        # Attributes only (a FakeTensor answers `is_cpu` or `is_floating_point()` through its
        # dispatcher, tens of times slower).
        dtype, device = value.dtype, value.device
        if (device.type == "cpu" and not dtype.is_floating_point and dtype != torch.bool
                and value.numel() <= HOST_VALUES_LIMIT):  # fmt: skip
            try:
                values = tuple(value.flatten().tolist())
            except RuntimeError:  # a FakeTensor has none
                values = ()
            return (dtype, value.shape, value.stride(), device, values)
        return (dtype, value.shape, value.stride(), device)
    if isinstance(value, (list, tuple)):
        return tuple([_key_part(v, torch) for v in value])
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype)):
        return value
    return repr(value)


class _Capture:
    """The process's capture file and its dedupe of calls already written."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: dict[Any, None] = {}  # insertion-ordered
        self._lock = threading.Lock()

    def first_time(self, key: Any) -> bool:
        if key in self._seen:  # the hot path: one dict lookup, no lock (atomic under the GIL)
            return False
        with self._lock:
            if key in self._seen:
                return False
            self._seen[key] = None
            if len(self._seen) > MAX_DISTINCT:
                del self._seen[next(iter(self._seen))]  # the oldest out first
            return True

    def write(self, line: dict[str, Any]) -> None:
        data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            view = memoryview(data)
            while view:  # a regular file takes it in one write; loop for a short one anyway
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)  # closing releases the lock


_active: _Capture | None = None
_active_lock = threading.Lock()


def _capture() -> _Capture | None:
    global _active
    path = os.environ.get(ENV_CAPTURE, "")
    if not path:
        return None
    active = _active
    if active is not None and active.path == path:
        return active
    with _active_lock:
        if _active is None or _active.path != path:
            _active = _Capture(path)
        return _active


def _versions() -> dict[str, str]:
    import aiter
    from aiter.flydsl_bridge.env import flydsl_version

    return {"aiter": aiter.__version__, "flydsl": flydsl_version() or "unknown"}


def _served(records) -> list[dict[str, Any]]:
    return [
        {"backend": r.backend, "kernel": r.kernel, "source": r.source, "row": r.row,
         "params": {k: describe(v) for k, v in r.params.items()}, "table": r.table,
         "axis": dict(r.axis), "table_row": r.table_row}  # fmt: skip
        for r in records
    ]


@contextlib.contextmanager
def _launches():
    """The FlyDSL launches of the block with how the cache served each; None when FlyDSL's
    internals the hooks need moved (the call is still served and recorded)."""
    from aiter import flydsl_bridge as bridge

    try:
        observing = bridge.observe_launches()
        launches = observing.__enter__()
    except bridge.ReplayHookBroken:
        yield None
        return
    try:
        yield launches
    finally:
        observing.__exit__(None, None, None)


def _kernels(launches) -> list[dict[str, Any]] | None:
    if launches is None:
        return None
    seen: dict[str, dict[str, Any]] = {}
    for launch in launches:
        r = launch.request
        entry = seen.setdefault(
            str(r.path) if r.key else r.function,
            {"function": r.function, "params": r.describe_params(), "cache": launch.cache},
        )
        if launch.cache != entry["cache"] and launch.cache != "hit":
            entry["cache"] = launch.cache  # a kernel launched twice: its first compile counts
    return list(seen.values())


def _line(op: str, args: tuple, kwargs: dict, records, error, launches=None):
    from aiter import device

    line: dict[str, Any] = {"schema": SCHEMA_VERSION, **_versions(), "op": op}
    try:
        line.update(arch=device.arch(), cu_num=device.cu_num())
    except Exception:  # no GPU to ask: the rest of the line still says what was called
        line.update(arch="unknown", cu_num=0)
    line["args"] = [describe(a) for a in args]
    line["kwargs"] = {name: describe(v) for name, v in kwargs.items()}
    line["served"] = _served(records)
    line["kernels"] = _kernels(launches)
    if error is not None:
        line["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
    return line


def entry(op: str) -> Callable[[F], F]:
    """Decorator of a public entry named `op`: records its distinct calls when AITER_CAPTURE is
    set as the entry's module is imported; otherwise the entry is returned unchanged."""

    def wrap(fn: F) -> F:
        if not os.environ.get(ENV_CAPTURE):
            return fn
        import torch  # an entry's module imports it anyway; the hot path uses it bound here

        @functools.wraps(fn)
        def captured(*args, **kwargs):
            capture = _capture()
            if capture is None:
                return fn(*args, **kwargs)
            key = (op, _key_part(args, torch), _key_part(tuple(kwargs.items()), torch))
            if not capture.first_time(key):
                return fn(*args, **kwargs)
            from aiter import dispatch

            with dispatch.observe() as records, _launches() as launches:
                try:
                    result = fn(*args, **kwargs)
                except BaseException as error:
                    capture.write(_line(op, args, kwargs, records, error, launches))
                    raise
            capture.write(_line(op, args, kwargs, records, None, launches))
            return result

        return captured  # type: ignore[return-value]

    return wrap
