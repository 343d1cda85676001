"""Whether the cache entries a replay needs are whole: present, a readable FlyDSL entry holding
code objects of the arch, and (where the manifest lists them) the bytes the build wrote.

Nothing here runs FlyDSL code; a broken entry is reported, never raised.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from aiter.aot.flydsl.protocol import MISSING


class EntryAudit:
    """One arch's view of its cache entries, remembered until forget() says they changed."""

    def __init__(self, cache_root: str | Path | None, arch: str) -> None:
        self.cache_root = Path(cache_root) if cache_root else None
        self.arch = arch
        self._records: dict[Path, dict[str, Any]] | None = None
        self._problems: dict[Path, str | None] = {}

    def problem(self, path: str | Path) -> str | None:
        """None for a whole entry; else "missing", or why it is corrupt."""
        path = Path(path)
        if not path.is_file():
            return MISSING  # not remembered: a compile may write it any moment
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
            if self._records is not None:
                self._records.pop(path, None)

    def remove_corrupt(self, paths: Iterable[str | Path]) -> list[str]:
        """Delete entries that are there but not whole, so FlyDSL writes them anew."""
        removed = []
        for path in map(Path, paths):
            if self.problem(path) not in (None, MISSING):
                path.unlink(missing_ok=True)
                self.forget([path])
                removed.append(str(path))
        return removed

    def _inspect(self, path: Path) -> str | None:
        from aiter.flydsl_bridge.entries import entry_defect, record_mismatch

        record = self._manifest_records().get(path)
        return entry_defect(path, self.arch) or (record and record_mismatch(path, record)) or None

    def _manifest_records(self) -> dict[Path, dict[str, Any]]:
        if self._records is None:
            from aiter.flydsl_bridge.manifest import read_manifest

            self._records = {}
            if self.cache_root is not None:
                try:
                    modules = read_manifest(self.cache_root)["archs"].get(self.arch, {})
                except ValueError:
                    modules = {}  # an unreadable manifest vouches for nothing
                for kernels in modules.values():
                    for rel, record in kernels.items():
                        self._records[self.cache_root / rel] = record
        return self._records
