"""Reports how each operator call was served: backend, kernel, and the table row or heuristic.

Observers subscribe with `observe()`; with none, `report` returns before building anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

BACKEND_FLYDSL = "flydsl"
BACKEND_TORCH = "torch"


@dataclass(frozen=True)
class DispatchRecord:
    op: str  # public entry, e.g. "gemm_a16w16"
    backend: str  # BACKEND_FLYDSL or BACKEND_TORCH
    kernel: str | None  # kernel name as the table spells it, None for torch
    source: str  # "table" or "heuristic"
    row: str | None = None  # "file:line" of the table row, when one served the call
    params: dict[str, Any] = field(default_factory=dict)  # compile-time choices


_observers: list[Callable[[DispatchRecord], None]] = []


def listening() -> bool:
    return bool(_observers)


def report(make_record: Callable[[], DispatchRecord]) -> None:
    """Send a record to every observer; `make_record` runs only if someone listens."""
    if not _observers:
        return
    record = make_record()
    for observer in list(_observers):
        observer(record)


@contextmanager
def observe() -> Iterator[list[DispatchRecord]]:
    """Collect every record reported inside the block."""
    records: list[DispatchRecord] = []
    _observers.append(records.append)
    try:
        yield records
    finally:
        _observers.remove(records.append)
