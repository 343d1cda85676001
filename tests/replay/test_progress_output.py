"""What a large build prints off a terminal: a few plain progress lines and the summary, never a
line per job or an escape code, unless --verbose asks for a line per job.
"""

from __future__ import annotations

import re

import pytest

from tests.aot_cli import lines_starting, run_aot_together

pytestmark = pytest.mark.slow  # builds a cache

MODULE = "tests.fixtures.axis_family"
EXPERTS = range(1, 151)
TOKENS = (4, 16)  # two rows per shape; --max-tokens 16 keeps each job's range short
JOBS = len(EXPERTS) * len(TOKENS) * 2  # two flavours per row


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """The same 600-job build into two empty caches, plainly and with --verbose."""
    tables = tmp_path_factory.mktemp("tables")
    rows = [f"gfx942,304,{t},{e}" for e in EXPERTS for t in TOKENS]
    (tables / "axis.csv").write_text("\n".join(["gfx,cu_num,tokens,experts", *rows]) + "\n")
    # A terminal type that could show escape codes: only stderr being no terminal rules them out.
    env = {"AITER_TEST_AXIS_DIR": str(tables), "GPU_ARCHS": "gfx942", "TERM": "xterm"}
    args = ["--max-tokens", "16", "-j", "2"]
    plain, verbose = run_aot_together(
        [
            (MODULE, [*args, "--cache-dir", str(tmp_path_factory.mktemp("plain"))], env),
            (MODULE, [*args, "--verbose", "--cache-dir", str(tmp_path_factory.mktemp("v"))], env),
        ]
    )
    return plain, verbose


def _summary_jobs(stdout: str) -> int:
    (row,) = [line for line in stdout.splitlines() if line.startswith("gfx942 ")]
    return int(row.split()[2])


def test_a_large_build_prints_a_few_plain_lines(builds):
    plain, _ = builds
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert _summary_jobs(plain.stdout) == JOBS
    lines = plain.stdout.splitlines() + plain.stderr.splitlines()
    assert len(lines) < 50, "\n".join(lines)
    assert "\x1b" not in plain.stdout + plain.stderr
    progress = lines_starting(plain.stderr, "[gfx942] ")
    assert progress and re.search(rf"done {JOBS}/{JOBS} jobs", progress[-1]), plain.stderr
    assert not lines_starting(plain.stdout, "OK ")


def test_verbose_prints_a_line_per_job(builds):
    _, verbose = builds
    assert verbose.returncode == 0, verbose.stdout + verbose.stderr
    jobs = lines_starting(verbose.stdout, "OK        axis gfx942:304 axis.csv:")
    assert len(jobs) == len(set(jobs)) == JOBS
    assert {line.rsplit(" ", 1)[1] for line in jobs} == {"flavour=a", "flavour=b"}
    assert "\x1b" not in verbose.stdout + verbose.stderr
