"""Reports how each operator call was served: backend, kernel, the table row or heuristic, and the
call's arguments. Observers subscribe; with none, `report` returns before building anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

BACKEND_FLYDSL = "flydsl"
BACKEND_TORCH = "torch"


@dataclass(frozen=True)
class DispatchRecord:
    """How one call was served. Records compare on how (op, backend, kernel, source, row,
    params); `args` and `table` describe the call and where to tune it, for messages."""

    op: str  # public entry, e.g. "gemm_a16w16"
    backend: str  # BACKEND_FLYDSL or BACKEND_TORCH
    kernel: str | None  # kernel name as the table spells it, None for torch
    source: str  # "table" or "heuristic"
    row: str | None = None  # "file:line" of the table row, when one served the call
    # Compile-time choices; for torch, "reason" says why no FlyDSL kernel serves the call (when
    # the table did not simply say torch), e.g. {"reason": "K % 32 != 0 (K=100)"}.
    params: dict[str, Any] = field(default_factory=dict)
    # The call's arguments as text, argument name -> e.g. "bfloat16[32, 4096] row-major".
    args: dict[str, str] = field(default_factory=dict, compare=False)
    table: str | None = field(default=None, compare=False)  # the TableSpec's short name
    # For a table of shapes (not of tuned choices): the cells of a row that would cover the call.
    table_row: dict[str, str] | None = field(default=None, compare=False)
    # The call's values of the axes a build replays (e.g. {"M": 37}), named as the AOT jobs
    # name them: a miss message compares them with what the build of the cache replayed.
    axis: dict[str, int] = field(default_factory=dict, compare=False)


def tensor_arg(t: Any, layout: str | None = None) -> str:
    """How a record shows a tensor argument: dtype, shape and layout, e.g.
    "bfloat16[32, 4096] row-major"; None shows as "none"."""
    if t is None:
        return "none"
    dtype = str(t.dtype).replace("torch.", "")
    text = f"{dtype}[{', '.join(str(int(d)) for d in t.shape)}]"
    if layout is None:
        layout = "contiguous" if t.is_contiguous() else f"strides {tuple(t.stride())}"
    return f"{text} {layout}" if layout else text


# aiter.jit_monitor subscribes its installer when it is imported (every entry imports it).
_observers: list[Callable[[DispatchRecord], None]] = []


def listening() -> bool:
    """Whether a report builds its record now (so before the first report of a process, which
    installs the JIT monitor)."""
    return bool(_observers)


def report(make_record: Callable[[], DispatchRecord]) -> None:
    """Send a record to every observer; `make_record` runs only if someone listens."""
    if not _observers:
        return
    record = make_record()
    for observer in list(_observers):
        observer(record)


def subscribe(observer: Callable[[DispatchRecord], None]) -> None:
    """Send every later record to `observer` until `unsubscribe(observer)`."""
    if observer not in _observers:
        _observers.append(observer)


def unsubscribe(observer: Callable[[DispatchRecord], None]) -> None:
    """Stop sending records to `observer` (nothing happens when it was not subscribed)."""
    with suppress(ValueError):
        _observers.remove(observer)


@contextmanager
def observe() -> Iterator[list[DispatchRecord]]:
    """Collect every record reported inside the block."""
    records: list[DispatchRecord] = []
    _observers.append(records.append)
    try:
        yield records
    finally:
        _observers.remove(records.append)
