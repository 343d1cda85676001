"""A process's first call of a kernel, at a cost that does not grow with the cache.

FlyDSL 0.4.2 runs `JitCacheManager.load_all` the first time a jit function is used in a process:
it unpickles every entry of that function's cache directory and discards the result, so the
first call of each kernel costs more the more entries (tuned rows, archs built into one cache)
the directory holds. `install` replaces it by a count of the entries (its return value, which
FlyDSL does not use either). The entry a call needs is still read, and a broken one still
caught, when the call asks for it (`JitCacheManager.get`, `compile_lock`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiter.flydsl_bridge.internals import jit_function

_original: Callable[..., int] | None = None


def _count_entries(self: Any) -> int:
    """How many entries the function's cache directory holds, none of them read."""
    if not self.cache_dir.exists():
        return 0
    return sum(1 for _ in self.cache_dir.glob("*.pkl"))


def install() -> None:
    """Make FlyDSL's first use of a jit function read no cache entry (idempotent)."""
    global _original
    manager = jit_function().JitCacheManager
    if manager.load_all is not _count_entries:
        _original = manager.load_all
        manager.load_all = _count_entries


def restore() -> None:
    """FlyDSL's own load_all again (for measuring what `install` saves)."""
    if _original is not None:
        jit_function().JitCacheManager.load_all = _original
