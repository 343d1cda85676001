"""Reading serving captures (the JSON lines `AITER_CAPTURE` writes, see aiter.capture) for a
build, an audit or the `capture` command: every line checked, the calls deduplicated across
files, each bad line a one-line report naming its file and line while the rest is still used.

Nothing here imports torch or FlyDSL.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiter.arch import ARCHS
from aiter.capture import SCHEMA_VERSION

REQUIRED = ("op", "arch", "cu_num", "args", "kwargs")


@dataclass(frozen=True)
class CapturedCall:
    """One distinct call a serving process recorded, where it was first seen and how it was
    served there."""

    op: str
    arch: str
    cu_num: int
    args: list[Any]
    kwargs: dict[str, Any]
    where: str  # "path:line" of its first line
    served: list[dict[str, Any]] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    text: str = ""  # the line as written, for `capture merge`

    def key(self) -> str:
        """What makes two lines the same call: op, device and arguments (not how it was
        served, nor by which versions)."""
        return json.dumps([self.op, self.arch, self.cu_num, self.args, self.kwargs], sort_keys=True)

    def served_rows(self) -> list[str]:
        """The table rows that served it, "file:line" (empty: the heuristic did)."""
        return [s["row"] for s in self.served if s.get("row")]


@dataclass
class CaptureRead:
    """Every distinct call of some capture files, and what was wrong with the other lines."""

    calls: list[CapturedCall] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "path:line: what", each counts as failed
    refused: int = 0  # lines of calls the entry refused at serving: never served, not replayed
    duplicates: int = 0

    def archs(self) -> dict[str, set[int]]:
        """Arch -> the CU counts its calls were made on."""
        found: dict[str, set[int]] = {}
        for call in self.calls:
            found.setdefault(call.arch, set()).add(call.cu_num)
        return found

    def ops(self) -> set[str]:
        return {call.op for call in self.calls}


def current_versions() -> dict[str, str]:
    import aiter
    from aiter.flydsl_bridge.env import flydsl_version

    return {"aiter": aiter.__version__, "flydsl": flydsl_version() or "unknown"}


def _check_line(
    data: Any, where: str, versions: Mapping[str, str]
) -> tuple[CapturedCall | None, str | None]:
    """The call a parsed line holds (None when it cannot be used) and what is wrong with it."""
    if not isinstance(data, dict):
        return None, f"{where}: not a capture line (a JSON object expected)"
    if data.get("schema") != SCHEMA_VERSION:
        return None, (
            f"{where}: capture schema {data.get('schema')!r}, this aiter reads schema "
            f"{SCHEMA_VERSION}; line skipped"
        )
    lacking = [name for name in REQUIRED if name not in data]
    if lacking:
        return None, f"{where}: not a capture line: lacks {', '.join(lacking)}"
    if not isinstance(data["args"], list) or not isinstance(data["kwargs"], dict):
        return None, f"{where}: not a capture line: args must be a list and kwargs an object"
    if data["arch"] not in ARCHS:
        return None, (
            f"{where}: arch {data['arch']!r} is none of {', '.join(ARCHS)} (captured where no "
            "GPU answered?); line skipped"
        )
    if not isinstance(data["cu_num"], int) or data["cu_num"] < 1:
        return None, f"{where}: cu_num {data['cu_num']!r} is not a CU count; line skipped"
    theirs = {name: str(data.get(name, "unknown")) for name in versions}
    call = CapturedCall(
        op=data["op"],
        arch=data["arch"],
        cu_num=data["cu_num"],
        args=data["args"],
        kwargs=data["kwargs"],
        where=where,
        served=list(data.get("served") or []),
        versions=theirs,
    )
    if theirs != dict(versions):
        recorded = ", ".join(f"{k} {v}" for k, v in theirs.items())
        here = ", ".join(f"{k} {v}" for k, v in versions.items())
        return call, (
            f"{where}: recorded by {recorded}; this is {here}: replayed as this code makes "
            "the call"
        )
    return call, None


def read_captures(paths: Iterable[str | Path]) -> CaptureRead:
    """Every distinct call of the capture files at `paths` (first seen first), and a report of
    each line that could not be used as written. OSError when a file cannot be read."""
    versions = current_versions()
    read = CaptureRead()
    seen: set[str] = set()
    for path in map(Path, paths):
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = text.split("\n")
        ended = text.endswith("\n")
        if ended or not lines[-1]:
            lines = lines[:-1]
        for number, line in enumerate(lines, start=1):
            where = f"{path}:{number}"
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as err:
                if number == len(lines) and not ended:
                    read.problems.append(
                        f"{where}: truncated last line (its writer stopped mid-line); skipped"
                    )
                else:
                    read.problems.append(f"{where}: not JSON ({err.msg}); skipped")
                continue
            call, problem = _check_line(data, where, versions)
            if problem:
                read.problems.append(problem)
            if call is None:
                continue
            if data.get("error"):
                read.refused += 1
                continue
            key = call.key()
            if key in seen:
                read.duplicates += 1
                continue
            seen.add(key)
            read.calls.append(_with_text(call, line))
    return read


def _with_text(call: CapturedCall, line: str) -> CapturedCall:
    from dataclasses import replace

    return replace(call, text=line)
