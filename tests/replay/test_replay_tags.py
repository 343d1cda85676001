"""Each job of the replay ends in exactly one documented tag; the driver survives a dead worker.

Runs `python -m tests.fixtures.tag_family` (limit M 1000) as a user would and reads the results
from its `--report` JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aiter.aot.flydsl.jobs.records import ArchReport, JobResult, Tag
from aiter.flydsl_bridge import manifest
from tests.aot_cli import lines_starting, read_report, run_aot

TABLE = """gfx,cu_num,M,case
gfx942,304,256,ok
gfx942,304,64,skip
gfx942,304,64,unreached
gfx942,304,64,fail
gfx942,304,64,abort
gfx942,304,500,refused
gfx942,304,4000,refused
"""
pytestmark = pytest.mark.slow  # runs the command line, which replays and compiles

MODULE = "tests.fixtures.tag_family"
TAGS = [tag.value for tag in Tag]  # as printed: the first word of a job line, summary columns
MAX_M = 32768  # the default --max-m
REFUSED_ABOVE = "in-between M 1001-32768 above the module's limit 1000 not replayed"
# Each case is a shape of its own, so its top row serves M up to MAX_M; above the limit only
# tabled M are replayed. The case picks what the fixture's runtime does, not the tag.
EXPECTED = {
    2: ("REFUSED", REFUSED_ABOVE),  # launches kernels up to M 1000
    3: ("SKIP", "runtime declines: no kernel for this variant on this arch"),
    4: ("UNREACHED", "served by torch"),
    5: ("FAIL", "ValueError: the runtime rejected this row"),
    6: ("FAIL", "compile at M=1: worker killed by SIGABRT"),
    7: ("OK", ""),  # M 1-500: below the next row of its case, under the limit
    8: ("REFUSED", REFUSED_ABOVE + " (the tabled M 4000 is)"),
}
BLOCK_64 = "scale[x=float32 y=float32 block=64]"  # up to M 100
BLOCK_128 = "scale[x=float32 y=float32 block=128]"  # above M 100


@pytest.fixture(scope="module")
def tag_env(tmp_path_factory):
    tables = tmp_path_factory.mktemp("tables")
    (tables / "tags.csv").write_text(TABLE)
    return {"AITER_TEST_TAGS_DIR": str(tables), "GPU_ARCHS": "gfx942"}


def replay(env: dict[str, str], report: Path, *args: str, module: str = MODULE):
    """Run the tag module with `--report report`; the process and its one ArchReport."""
    proc = run_aot(module, *args, "--report", str(report), env=env)
    reports = read_report(report) if report.is_file() else []
    assert len(reports) == 1, proc.stdout + proc.stderr
    return proc, reports[0]


def by_line(report: ArchReport) -> dict[int, JobResult]:
    """Results by line of tags.csv."""
    return {int(r.job.row.rsplit(":", 1)[1]): r for r in report.results}


def segments(result: JobResult) -> list[tuple[int, int, list[str]]]:
    return [(s.lo, s.hi, [k.label() for k in s.kernels]) for s in result.segments]


@pytest.fixture(scope="module")
def build(tag_env, tmp_path_factory):
    work = tmp_path_factory.mktemp("build")
    cache = work / "cache"
    proc, report = replay(tag_env, work / "report.json", "--cache-dir", str(cache), "-j", "2")
    return proc, report, cache, json.loads((work / "report.json").read_text())


@pytest.fixture(scope="module")
def listing(tag_env, tmp_path_factory):
    work = tmp_path_factory.mktemp("list")
    cache = work / "cache"  # --list compiles nothing: other listings may name the same cache
    args = ("--list", "--cache-dir", str(cache), "-j", "1")
    proc, report = replay(tag_env, work / "report.json", *args)
    return proc, report, cache


def test_every_tag_is_reported_for_its_row(build):
    proc, report, _, _ = build
    found = {line: (r.tag, r.message) for line, r in by_line(report).items()}
    assert found == EXPECTED, proc.stdout + proc.stderr
    assert {tag for tag, _ in found.values()} == set(TAGS)
    assert all(type(r.tag) is Tag for r in report.results)  # the JSON's strings, typed again
    assert all(r.job.module == "tags" and r.job.table == "tags.csv" for r in report.results)


def test_summary_counts_the_tags(build):
    proc, _, _, document = build
    (row,) = document["summary"]
    counts = {tag: row[tag] for tag in TAGS}
    assert counts == {"OK": 1, "SKIP": 1, "REFUSED": 2, "UNREACHED": 1, "FAIL": 2}
    assert (row["arch"], row["module"], row["jobs"]) == ("gfx942", "tags", 7)
    (printed,) = [x.split() for x in proc.stdout.splitlines() if x.startswith("gfx942 ")]
    assert printed[:8] == ["gfx942", "tags", "7", "1", "1", "2", "1", "2"], proc.stdout


def test_ranges_reach_the_maximum_and_stop_at_the_limit(build):
    _, report, _, _ = build
    results = by_line(report)
    ranges = {line: (r.job.lo, r.job.hi) for line, r in results.items()}
    assert ranges == {**dict.fromkeys(range(2, 7), (1, MAX_M)), 7: (1, 500), 8: (501, MAX_M)}
    assert segments(results[2]) == [(1, 100, [BLOCK_64]), (101, 1000, [BLOCK_128])]
    assert segments(results[7]) == [(1, 100, [BLOCK_64]), (101, 500, [BLOCK_128])]
    # Above the limit only the tabled M 4000 is replayed.
    assert segments(results[8]) == [(501, 1000, [BLOCK_128]), (4000, 4000, [BLOCK_128])]
    assert [(s.lo, s.hi, s.backends) for s in results[4].segments] == [(1, 1000, ["torch"])]
    assert results[3].segments == [] and results[5].segments == []


def test_stdout_shows_only_failures_and_skips_with_their_reasons(build):
    proc, _, cache, _ = build
    assert proc.returncode == 1, proc.stdout + proc.stderr
    jobs = [x for x in proc.stdout.splitlines() if x.split()[:1] and x.split()[0] in TAGS]
    assert [x.split()[0] for x in jobs] == ["SKIP", "FAIL", "FAIL"], proc.stdout
    for line, (tag, message) in EXPECTED.items():
        if tag in ("SKIP", "FAIL"):
            assert any(f" tags.csv:{line} M 1-{MAX_M}  {message}" in x for x in jobs), line
    assert lines_starting(proc.stdout, "limit: tags: M above 1000 is replayed only at tabled")
    assert f"serve from it with: FLYDSL_RUNTIME_CACHE_DIR={cache} " in proc.stdout


def test_a_dead_worker_fails_only_its_job(build):
    _, report, cache, document = build
    failed = [c for c in report.compiles if not c.ok]
    assert [(c.error, c.task.values) for c in failed] == [("worker killed by SIGABRT", {"M": 1})]
    assert report.results[failed[0].task.job].job.row.endswith("tags.csv:6")
    assert all(c.ok for c in report.compiles if c not in failed)
    assert document["summary"][0]["compiled"] == 2
    kernels = manifest.read(cache).archs["gfx942"]["tags"]
    # block 64 below the switch, 128 above it; the aborted job's block 256 never landed.
    assert sorted(k.params for k in kernels.values()) == [
        "x=float32 y=float32 block=128",
        "x=float32 y=float32 block=64",
    ]
    assert all((cache / rel).is_file() for rel in kernels)
    rows = {a.row.rsplit(":", 1)[1] for k in kernels.values() for a in k.requested_by}
    assert rows == {"2", "7", "8"}
    assert report.compiled() == {str(cache / rel) for rel in kernels}


def test_check_after_the_build_misses_only_the_aborted_kernel(build, tag_env, tmp_path):
    _, _, cache, _ = build
    args = ("--check", "--verbose", "--cache-dir", str(cache))
    proc, report = replay(tag_env, tmp_path / "report.json", *args)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    results = by_line(report)
    assert results[6].tag == "FAIL"
    assert results[6].message.startswith("1 kernel(s) missing from the cache")
    assert [m.kernel.label() for m in results[6].missing] == [
        "abort_on_compile[x=float32 block=256]"
    ]
    assert {n: r.tag for n, r in results.items() if n != 6} == {
        n: tag for n, (tag, _) in EXPECTED.items() if n != 6
    }
    assert sum(len(r.missing) for r in report.results) == 1
    (missing,) = lines_starting(proc.stdout, "MISSING")
    assert "tags.csv:6 M=1-1000 arch=gfx942 kernel=abort_on_compile/" in missing
    # --verbose prints a line for every job, not only failures and skips.
    jobs = [x for x in proc.stdout.splitlines() if x.split()[:1] and x.split()[0] in TAGS]
    assert len(jobs) == 7


def test_list_prints_every_job_and_both_sides_of_the_switch(listing):
    proc, report, _ = listing
    assert proc.returncode == 1, proc.stderr  # the 'fail' row fails in --list too
    lines = proc.stdout.splitlines()
    jobs = [x for x in lines if x.split()[:1] and x.split()[0] in TAGS]
    # Nothing compiles: the 'abort' row is only refused above the limit.
    tags = {**{n: tag for n, (tag, _) in EXPECTED.items()}, 6: "REFUSED"}
    assert [x.split()[0] for x in jobs] == [tags[n] for n in range(2, 9)], proc.stdout
    assert jobs[5].startswith("OK        tags gfx942:304 tags.csv:7 M 1-500")
    start = lines.index(jobs[5])
    assert lines[start + 1 : start + 3] == [
        f"          M 1-100: {BLOCK_64}",
        f"          M 101-500: {BLOCK_128}",
    ]
    assert "          M 1-1000: (no FlyDSL kernel: served by torch)" in lines
    assert "          M 1-1000: abort_on_compile[x=float32 block=256]" in lines
    assert {n: r.tag for n, r in by_line(report).items()} == tags and not report.compiles


def test_naming_in_parallel_matches_serial(tag_env, listing, tmp_path):
    serial_proc, serial, cache = listing
    args = ("--list", "--cache-dir", str(cache), "-j", "3")
    parallel_proc, parallel = replay(tag_env, tmp_path / "report.json", *args)

    def named(report: ArchReport) -> list:
        return [(r.tag, r.message, r.job, r.segments, r.probes) for r in report.results]

    def listed(stdout: str) -> list[str]:
        """The job and segment lines, above the summary table."""
        lines = stdout.splitlines()
        return lines[: next(i for i, x in enumerate(lines) if x.split()[:2] == ["arch", "module"])]

    assert (serial.workers, parallel.workers) == (1, 3)
    assert named(parallel) == named(serial)
    assert listed(parallel_proc.stdout) == listed(serial_proc.stdout)
    assert len(listed(serial_proc.stdout)) == 7 + sum(len(r.segments) for r in serial.results)


def test_max_m_cuts_the_top_rows(tag_env, tmp_path):
    args = ("--list", "--max-m", "2000", "--cache-dir", str(tmp_path / "cache"))
    proc, report = replay(tag_env, tmp_path / "report.json", *args)
    results = by_line(report)
    assert results[2].job.hi == 2000
    assert results[2].message == "in-between M 1001-2000 above the module's limit 1000 not replayed"
    # The tabled M 4000 lies above what the deployment serves: not replayed.
    assert (results[8].tag, results[8].job.hi) == ("REFUSED", 2000)
    assert segments(results[8]) == [(501, 1000, [BLOCK_128])]
    assert "replayed: M up to 2000" in proc.stdout


def test_the_combined_command_replays_an_extra_module_alike(tag_env, listing, tmp_path):
    _, alone, cache = listing
    env = {**tag_env, "AITER_AOT_EXTRA_MODULES": MODULE}
    args = ("--module", MODULE, "--list", "--cache-dir", str(cache), "-j", "1")
    proc, combined = replay(env, tmp_path / "report.json", *args, module="aiter.aot.flydsl")
    assert {r.job.module for r in combined.results} == {"tags"}
    assert [(r.tag, r.message, r.job, r.segments) for r in combined.results] == [
        (r.tag, r.message, r.job, r.segments) for r in alone.results
    ], (proc.stdout + proc.stderr)


def test_unknown_arch_is_a_usage_error(tag_env):
    proc = run_aot(MODULE, "--list", env={**tag_env, "GPU_ARCHS": "gfx90a"})
    assert proc.returncode == 2
    assert "error: GPU_ARCHS: unknown GPU arch 'gfx90a'" in proc.stderr


def test_missing_csv_is_a_usage_error(tag_env, tmp_path):
    proc = run_aot(MODULE, "--list", "--csv", str(tmp_path / "nope.csv"), env=tag_env)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: --csv {tmp_path / 'nope.csv'}: no such file"


def test_no_linker_is_a_usage_error(tag_env, tmp_path):
    if Path("/opt/rocm/llvm/bin/ld.lld").exists():
        pytest.skip("this machine has ROCm's ld.lld in /opt/rocm, which is always found")
    site = tmp_path / "site"
    site.mkdir()
    # A machine without ziglang: importing it fails in every process.
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['ziglang'] = None\n")
    bare = {
        **tag_env,
        "PATH": str(tmp_path),  # no ld.lld on PATH
        "ROCM_PATH": str(tmp_path / "no-rocm"),
        "PYTHONPATH": str(site),
        "AITER_LLD_SHIM_DIR": str(tmp_path / "shim"),
    }
    proc = run_aot(MODULE, "--cache-dir", str(tmp_path / "cache"), env=bare)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no AMDGPU-capable ld.lld was found" in proc.stderr
    assert "pip install ziglang" in proc.stderr
    assert not (tmp_path / "cache" / "aiter_aot_manifest.json").exists()
