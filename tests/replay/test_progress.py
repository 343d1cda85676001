"""Tests of aiter.aot.flydsl.execution.progress: the board that shows every arch's counts.

A fake clock drives time, and StringIO streams stand in for a terminal or a log file.
"""

from __future__ import annotations

import io

import pytest

from aiter.aot.flydsl.execution.progress import (
    ArchProgress,
    ProgressBoard,
    format_duration,
    format_line,
)

ARCHS = ["gfx942", "gfx950"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _plain_board(stream: io.StringIO, clock: FakeClock, interval: float = 10.0) -> ProgressBoard:
    return ProgressBoard(ARCHS, stream, tty=False, interval=interval, clock=clock)


def _run_naming(board: ProgressBoard, clock: FakeClock, jobs: int, seconds: float) -> None:
    """`jobs` naming updates spread over `seconds`, taking turns between the archs."""
    per_arch = jobs // len(ARCHS)
    for arch in ARCHS:
        board.update(arch, phase="naming", jobs_total=per_arch)
    for i in range(jobs):
        clock.now += seconds / jobs
        board.update(ARCHS[i % len(ARCHS)], jobs_done=i // len(ARCHS) + 1)


def test_format_line_shows_counts_rate_and_estimate() -> None:
    progress = ArchProgress(
        "gfx942",
        jobs_total=10000,
        jobs_done=1234,
        kernels_to_compile=40,
        kernels_compiled=12,
        failed=3,
        phase="naming",
    )
    line = format_line(progress, elapsed=1234 / 85.3)
    assert line == (
        "[gfx942] naming 1234/10000 jobs, 12/40 kernels compiled, 3 failed, 85.3 jobs/s, "
        "~1m43s left"
    )


def test_format_line_has_no_estimate_without_a_rate() -> None:
    progress = ArchProgress("gfx950", jobs_total=100, phase="naming")
    assert format_line(progress, elapsed=0.0) == "[gfx950] naming 0/100 jobs"
    assert format_line(progress, elapsed=5.0) == "[gfx950] naming 0/100 jobs"
    progress.jobs_done = 10
    assert (
        format_line(progress, elapsed=5.0) == "[gfx950] naming 10/100 jobs, 2.0 jobs/s, ~45s left"
    )


def test_format_line_leaves_out_what_is_empty() -> None:
    assert format_line(ArchProgress("gfx942"), elapsed=0.0) == "[gfx942] starting 0 jobs"
    done = ArchProgress("gfx942", jobs_total=8, jobs_done=8, kernels_to_compile=2)
    done.kernels_compiled, done.phase = 2, "done"
    # Nothing left: a rate but no estimate.
    assert (
        format_line(done, elapsed=4.0) == "[gfx942] done 8/8 jobs, 2/2 kernels compiled, 2.0 jobs/s"
    )


def test_format_line_estimates_from_kernels_once_naming_is_done() -> None:
    progress = ArchProgress(
        "gfx942", jobs_total=100, jobs_done=100, kernels_to_compile=40, kernels_compiled=10
    )
    progress.phase = "compiling"
    assert format_line(progress, elapsed=20.0) == (
        "[gfx942] compiling 100/100 jobs, 10/40 kernels compiled, 0.5 kernels/s, ~1m00s left"
    )
    assert format_line(progress, elapsed=20.0, kernel_rate=2.0).endswith("2.0 kernels/s, ~15s left")
    # Less than a second left still reads as some time left.
    assert format_line(progress, elapsed=20.0, kernel_rate=1000.0).endswith("~1s left")
    # No kernel rate known yet: neither a rate nor an estimate.
    assert format_line(progress, elapsed=20.0, kernel_rate=0.0) == (
        "[gfx942] compiling 100/100 jobs, 10/40 kernels compiled"
    )


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.4, "0s"), (43, "43s"), (103, "1m43s"), (3600, "1h00m"), (7500, "2h05m")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_plain_board_prints_few_lines_for_many_jobs() -> None:
    stream, clock = io.StringIO(), FakeClock()
    board = _plain_board(stream, clock)
    _run_naming(board, clock, jobs=10000, seconds=100.0)
    board.close()
    out = stream.getvalue()
    assert "\x1b" not in out
    lines = out.splitlines()
    assert 0 < len(lines) < 50
    # The last line of each arch is its final state.
    assert lines[-2].startswith("[gfx942] naming 5000/5000 jobs")
    assert lines[-1].startswith("[gfx950] naming 5000/5000 jobs")


def test_plain_board_waits_for_the_interval() -> None:
    stream, clock = io.StringIO(), FakeClock()
    board = _plain_board(stream, clock)
    board.update("gfx942", jobs_total=10, jobs_done=1)
    clock.now += 9.0
    board.update("gfx942", jobs_done=2)
    assert stream.getvalue() == ""
    clock.now += 1.0
    board.update("gfx942", jobs_done=3)
    assert stream.getvalue().splitlines()[0].startswith("[gfx942] starting 3/10 jobs")


def test_plain_board_does_not_repeat_an_idle_arch() -> None:
    stream, clock = io.StringIO(), FakeClock()
    board = _plain_board(stream, clock)
    board.update("gfx950", phase="done", jobs_total=1, jobs_done=1)
    for step in range(1, 4):
        clock.now += 10.0
        board.update("gfx942", jobs_done=step)
    lines = stream.getvalue().splitlines()
    assert [line.split(" ")[0] for line in lines].count("[gfx950]") == 1
    assert [line.split(" ")[0] for line in lines].count("[gfx942]") == 3


def test_plain_board_shows_a_new_phase_at_once() -> None:
    stream, clock = io.StringIO(), FakeClock()
    board = _plain_board(stream, clock)
    board.update("gfx942", phase="compiling", kernels_to_compile=4)
    assert stream.getvalue() == "[gfx942] compiling 0 jobs, 0/4 kernels compiled\n"


def test_plain_board_prints_messages_in_full() -> None:
    stream, clock = io.StringIO(), FakeClock()
    board = _plain_board(stream, clock)
    text = "FAIL     gemm_a8w8 a8w8_tuned.csv:17 " + "x" * 300
    board.update("gfx942", jobs_done=1)
    board.message(text)
    board.message("SKIP     gemm_a8w8 a8w8_tuned.csv:18\n")
    assert stream.getvalue() == text + "\nSKIP     gemm_a8w8 a8w8_tuned.csv:18\n"


def test_plain_board_close_prints_a_final_line_per_arch() -> None:
    stream, clock = io.StringIO(), FakeClock()
    board = _plain_board(stream, clock)
    board.update("gfx942", jobs_total=2, jobs_done=2)
    board.close()
    board.close()
    assert stream.getvalue().splitlines() == [
        "[gfx942] starting 2/2 jobs",
        "[gfx950] starting 0 jobs",
    ]


def test_update_rejects_unknown_fields() -> None:
    board = _plain_board(io.StringIO(), FakeClock())
    with pytest.raises(TypeError):
        board.update("gfx942", jobs=3)
    with pytest.raises(TypeError):
        board.update("gfx942", arch="gfx950")


def test_an_arch_not_named_before_joins_the_board() -> None:
    stream, clock = io.StringIO(), FakeClock()
    board = _plain_board(stream, clock)
    board.update("gfx1201", jobs_total=3, jobs_done=1)
    board.close()
    assert stream.getvalue().splitlines()[-1] == "[gfx1201] starting 1/3 jobs"
    assert board.progress("gfx1201").jobs_done == 1


def test_the_board_rate_counts_kernels_from_when_naming_ended() -> None:
    stream, clock = io.StringIO(), FakeClock()
    board = _plain_board(stream, clock, interval=1e9)
    board.update("gfx942", phase="naming", jobs_total=100)
    clock.now += 100.0
    board.update("gfx942", jobs_done=100, kernels_to_compile=10)
    clock.now += 10.0
    board.update("gfx942", phase="compiling", kernels_compiled=5)
    board.close()
    # 5 kernels in the 10 s since naming ended, not in the 110 s since the start.
    assert "0.5 kernels/s, ~10s left" in stream.getvalue().splitlines()[-2]


def test_the_rate_of_a_finished_arch_stays_put() -> None:
    stream, clock = io.StringIO(), FakeClock()
    board = _plain_board(stream, clock, interval=1e9)
    board.update("gfx942", jobs_total=100)
    clock.now += 50.0
    board.update("gfx942", jobs_done=100)
    clock.now += 500.0
    board.close()
    assert stream.getvalue().splitlines()[-2] == "[gfx942] starting 100/100 jobs, 2.0 jobs/s"


def test_tty_board_redraws_in_place() -> None:
    stream, clock = io.StringIO(), FakeClock()
    board = ProgressBoard(ARCHS, stream, tty=True, clock=clock)
    _run_naming(board, clock, jobs=1000, seconds=10.0)
    board.message("FAIL     gemm_a8w8 a8w8_tuned.csv:17")
    clock.now += 1.0
    board.update("gfx950", phase="done")
    board.close()
    out = stream.getvalue()
    assert "\x1b[2F" in out and "\x1b[2K" in out
    # Throttled: a redraw at most every 0.1 s, plus the message, the phase changes and close.
    assert out.count("\x1b[2F") < 120
    # What stays on screen after the last cursor move: the final line of every arch.
    final = out.rsplit("\x1b[J", 1)[1]
    assert final.count("\n") == 2
    assert "[gfx942] naming 500/500 jobs" in final
    assert "[gfx950] done 500/500 jobs" in final
    assert "FAIL     gemm_a8w8 a8w8_tuned.csv:17\n" in out


def test_tty_message_goes_above_the_board() -> None:
    stream, clock = io.StringIO(), FakeClock()
    board = ProgressBoard(ARCHS, stream, tty=True, clock=clock)
    board.update("gfx942", jobs_total=4, jobs_done=1)
    stream.truncate(0)
    stream.seek(0)
    board.message("SKIP     something")
    assert stream.getvalue() == (
        "\x1b[2F\x1b[J"
        "SKIP     something\n"
        "\x1b[2K[gfx942] starting 1/4 jobs\n"
        "\x1b[2K[gfx950] starting 0 jobs\n"
    )


def test_tty_defaults_to_the_stream() -> None:
    stream = io.StringIO()
    board = ProgressBoard(ARCHS, stream)
    board.update("gfx942", jobs_done=1)
    board.close()
    assert "\x1b" not in stream.getvalue()
