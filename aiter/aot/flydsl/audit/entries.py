"""Whether the cache entries a replay needs are whole: present, a readable FlyDSL entry holding
code objects of the arch, and (where the manifest lists them) the bytes the build wrote.

Nothing here runs FlyDSL code; a broken entry is reported, never raised.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from aiter.aot.flydsl.jobs.records import (
    EntryProblem,
)

if TYPE_CHECKING:
    from aiter.flydsl_bridge.manifest import KernelEntry


class EntryAudit:
    """One arch's view of its cache entries, remembered until forget() says they changed."""

    def __init__(self, cache_root: str | Path | None, arch: str) -> None:
        self.cache_root = Path(cache_root) if cache_root else None
        self.arch = arch
        self._entries: dict[Path, KernelEntry] | None = None
        self._problems: dict[Path, str | None] = {}

    def problem(self, path: str | Path) -> str | None:
        """None for a whole entry; else "missing", or why it is corrupt."""
        path = Path(path)
        if not path.is_file():
            return EntryProblem.MISSING  # not remembered: a compile may write it any moment
        if path not in self._problems:
            self._problems[path] = self._inspect(path)
        return self._problems[path]

    def is_whole(self, path: str | Path) -> bool:
        return self.problem(path) is None

    def forget(self, paths: Iterable[str | Path]) -> None:
        """These entries were (re)written: inspect them again, and the manifest's record of
        them is of the entries they replaced."""
        for path in map(Path, paths):
            self._problems.pop(path, None)
            if self._entries is not None:
                self._entries.pop(path, None)

    def remove_corrupt(self, paths: Iterable[str | Path]) -> list[str]:
        """Delete entries that are there but not whole, so FlyDSL writes them anew."""
        removed = []
        for path in map(Path, paths):
            if self.problem(path) not in (None, EntryProblem.MISSING):
                path.unlink(missing_ok=True)
                self.forget([path])
                removed.append(str(path))
        return removed

    def _inspect(self, path: Path) -> str | None:
        from aiter.flydsl_bridge.entries import entry_defect

        entry = self._manifest_entries().get(path)
        return entry_defect(path, self.arch) or (entry and entry.mismatch(path)) or None

    def _manifest_entries(self) -> dict[Path, KernelEntry]:
        """The manifest's entries of this arch, by path (read once: forget() drops rewritten ones)."""
        if self._entries is None:
            from aiter.flydsl_bridge import manifest

            self._entries = {}
            if self.cache_root is not None:
                try:
                    listed = manifest.read(self.cache_root).entries(self.arch)
                except ValueError:
                    listed = {}  # an unreadable manifest vouches for nothing
                self._entries = {self.cache_root / rel: entry for rel, entry in listed.items()}
        return self._entries
