"""Progress of every per-arch process on one board in the driver: redrawn in place on a terminal,
a few plain lines at a fixed interval otherwise, so thousands of jobs never mean thousands of lines.

The counts come from each arch process's `replay.ProgressPipe`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

TTY_REDRAW_SECONDS = 0.1

_CSI = "\x1b["


@dataclass
class ArchProgress:
    arch: str
    jobs_total: int = 0
    jobs_done: int = 0
    kernels_to_compile: int = 0
    kernels_compiled: int = 0
    failed: int = 0
    phase: str = "starting"  # e.g. "starting", "naming", "compiling", "done"


_COUNT_FIELDS = frozenset(f.name for f in dataclasses.fields(ArchProgress)) - {"arch"}


def compiles_remain_after_naming(progress: ArchProgress) -> bool:
    """Whether every job is named and kernels are still to compile: time left is then in kernels."""
    return (
        progress.jobs_done >= progress.jobs_total
        and progress.kernels_compiled < progress.kernels_to_compile
    )


def format_rate(rate: float) -> str:
    """A rate per second with a sensible number of digits."""
    if rate >= 1000:
        return f"{rate:.0f}"
    if rate >= 0.1:
        return f"{rate:.1f}"
    return f"{rate:.2g}"


def format_duration(seconds: float) -> str:
    """A duration such as 43s, 1m43s or 2h05m."""
    total = max(0, round(seconds))
    if total < 60:
        return f"{total}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def format_line(progress: ArchProgress, elapsed: float, *, kernel_rate: float | None = None) -> str:
    """One arch's progress, e.g.
    `[gfx942] naming 1234/10000 jobs, 12/40 kernels compiled, 3 failed, 85.3 jobs/s, ~1m43s left`.

    `elapsed` is the time since the arch's first report. The rate is jobs named per second; once
    naming is done and compiles remain it is kernels compiled per second, `kernel_rate` when
    given (0 for not known yet), else kernels_compiled / elapsed. The time left needs a rate.
    """
    p = progress
    jobs = f"{p.jobs_done}/{p.jobs_total}" if p.jobs_total else f"{p.jobs_done}"
    parts = [f"[{p.arch}] {p.phase} {jobs} jobs"]
    if p.kernels_to_compile or p.kernels_compiled:
        parts.append(f"{p.kernels_compiled}/{p.kernels_to_compile} kernels compiled")
    if p.failed:
        parts.append(f"{p.failed} failed")
    if compiles_remain_after_naming(p):
        rate = kernel_rate
        if rate is None:
            rate = p.kernels_compiled / elapsed if elapsed > 0 else 0.0
        unit, left = "kernels", p.kernels_to_compile - p.kernels_compiled
    else:
        rate = p.jobs_done / elapsed if elapsed > 0 else 0.0
        unit, left = "jobs", p.jobs_total - p.jobs_done
    if rate > 0:
        parts.append(f"{format_rate(rate)} {unit}/s")
        if left > 0:
            parts.append(f"~{format_duration(max(left / rate, 1.0))} left")
    return ", ".join(parts)


@dataclass
class _ArchState:
    progress: ArchProgress
    started: float | None = None  # clock at the first update
    finished: float | None = None  # clock when nothing was left to do; rates stop there
    compile_start: tuple[float, int] | None = None  # clock and kernels_compiled when naming ended
    printed: tuple | None = None  # the counts of the last plain line, off a terminal


class ProgressBoard:
    """Shows the progress of several archs; safe to update from several threads."""

    def __init__(
        self,
        archs: Sequence[str],
        stream: TextIO | None = None,
        *,
        tty: bool | None = None,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = sys.stderr if stream is None else stream
        if tty is None:
            tty = _is_terminal(self._stream)
        self._tty = tty
        self._interval = interval
        self._clock = clock
        self._archs: dict[str, _ArchState] = {a: _ArchState(ArchProgress(a)) for a in archs}
        self._lock = threading.Lock()
        self._drawn = 0  # board lines on screen just above the cursor
        self._last_render: float | None = None
        self._plain_since = clock()
        self._closed = False

    def progress(self, arch: str) -> ArchProgress:
        """A copy of one arch's current counts."""
        with self._lock:
            return dataclasses.replace(self._state(arch).progress)

    def update(self, arch: str, **counts: int | str) -> None:
        """Set fields of one arch's ArchProgress (an arch not named before joins the board)."""
        unknown = set(counts) - _COUNT_FIELDS
        if unknown:
            raise TypeError(f"ArchProgress has no field(s) {', '.join(sorted(unknown))}")
        with self._lock:
            state = self._state(arch)
            now = self._clock()
            if state.started is None:
                state.started = now
            phase = state.progress.phase
            for name, value in counts.items():
                setattr(state.progress, name, value)
            if state.compile_start is None and compiles_remain_after_naming(state.progress):
                state.compile_start = (now, state.progress.kernels_compiled)
            if not _finished(state.progress):
                state.finished = None
            elif state.finished is None:
                state.finished = now
            if self._closed:
                return
            # A new phase is shown at once: the update before it may be the last for a while.
            new_phase = state.progress.phase != phase
            if self._tty:
                due = self._last_render is None or now - self._last_render >= TTY_REDRAW_SECONDS
                if due or new_phase:
                    self._redraw(now)
            elif now - self._plain_since >= self._interval:
                self._print_plain(now, changed_only=True)
            elif new_phase:
                self._print_arch(state, now)

    def message(self, text: str) -> None:
        """Print a line in full (a FAIL, a SKIP, a verbose per-job line) above the board."""
        with self._lock:
            line = text if text.endswith("\n") else text + "\n"
            if self._tty and not self._closed:
                now = self._clock()
                self._write(self._erase_board() + line + self._board(now))
                self._last_render = now
            else:
                self._write(line)

    def close(self) -> None:
        """Show every arch's final line; the output ends in plain lines."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            now = self._clock()
            if self._tty:
                self._redraw(now)
            else:  # an arch whose final counts were already printed is not repeated
                self._print_plain(now, changed_only=True)

    def _state(self, arch: str) -> _ArchState:
        state = self._archs.get(arch)
        if state is None:
            state = self._archs[arch] = _ArchState(ArchProgress(arch))
        return state

    def _line(self, state: _ArchState, now: float) -> str:
        if state.finished is not None:
            now = state.finished
        elapsed = 0.0 if state.started is None else now - state.started
        kernel_rate = None
        if state.compile_start is not None:
            since, compiled = state.compile_start
            done = state.progress.kernels_compiled - compiled
            kernel_rate = done / (now - since) if done > 0 and now > since else 0.0
        return format_line(state.progress, elapsed, kernel_rate=kernel_rate)

    def _board(self, now: float) -> str:
        width = _width(self._stream)
        lines = []
        for state in self._archs.values():
            line = self._line(state, now)
            # A wrapped line takes two rows and would throw off moving back over the board.
            if width is not None and len(line) >= width:
                line = line[: max(width - 1, 1)]
            lines.append(line)
        self._drawn = len(lines)
        return "".join(f"{_CSI}2K{line}\n" for line in lines)

    def _erase_board(self) -> str:
        if not self._drawn:
            return ""
        # Back to the first board line, then clear to the end of the screen.
        return f"{_CSI}{self._drawn}F{_CSI}J"

    def _redraw(self, now: float) -> None:
        self._write(self._erase_board() + self._board(now))
        self._last_render = now

    def _print_plain(self, now: float, *, changed_only: bool) -> None:
        lines = []
        for state in self._archs.values():
            counts = dataclasses.astuple(state.progress)
            # An arch with nothing new (often one long done) is not repeated every interval.
            if changed_only and counts == state.printed:
                continue
            state.printed = counts
            lines.append(self._line(state, now) + "\n")
        self._write("".join(lines))
        self._plain_since = now

    def _print_arch(self, state: _ArchState, now: float) -> None:
        state.printed = dataclasses.astuple(state.progress)
        self._write(self._line(state, now) + "\n")

    def _write(self, text: str) -> None:
        if text:
            self._stream.write(text)
            self._stream.flush()


def _finished(progress: ArchProgress) -> bool:
    if progress.phase == "done":
        return True
    return (
        progress.jobs_total > 0
        and progress.jobs_done >= progress.jobs_total
        and progress.kernels_compiled >= progress.kernels_to_compile
    )


def _is_terminal(stream: TextIO) -> bool:
    try:
        is_tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    # A dumb terminal (an editor's shell buffer) shows escape codes as text.
    return bool(is_tty) and os.environ.get("TERM") != "dumb"


def _width(stream: TextIO) -> int | None:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return None
