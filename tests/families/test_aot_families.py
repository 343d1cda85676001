"""The combined build over two test families found only through the registry: a table bucketed
on `tokens`, and a batch x seqlen grid; built, listed, checked, narrowed and densely audited.
"""

from __future__ import annotations

import json
import re

import pytest

from aiter.aot.flydsl.jobs.records import ArchReport, JobResult, KernelRef
from aiter.flydsl_bridge import manifest
from tests.aot_cli import lines_starting, read_report, run_aot, run_aot_together
from tests.fixtures import axis_family, grid_family

pytestmark = pytest.mark.slow  # builds a cache

COMBINED = "aiter.aot.flydsl"
AXIS = "tests.fixtures.axis_family"
EXTRA = "tests.fixtures.axis_family,tests.fixtures.grid_family"
# The names the registry gives the two extra modules (the last part of their import paths).
MODULES = "axis_family,grid_family"
AXIS_TABLE = """gfx,cu_num,tokens,experts
gfx942,304,256,8
gfx942,304,1024,8
gfx942,304,64,64
"""
EXPERTS_BY_LINE = {2: 8, 3: 8, 4: 64}
GRID_TABLE = """gfx,cu_num,heads,max_batch,max_seqlen
gfx942,304,16,8,4096
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tables = tmp_path_factory.mktemp("tables")
    (tables / "axis.csv").write_text(AXIS_TABLE)
    (tables / "grid.csv").write_text(GRID_TABLE)
    env = {
        "AITER_AOT_EXTRA_MODULES": EXTRA,
        "AITER_TEST_AXIS_DIR": str(tables),
        "AITER_TEST_GRID_DIR": str(tables),
        grid_family.FLIP_ENV: "0",
        "GPU_ARCHS": "gfx942",
    }
    return env, tmp_path_factory.mktemp("work")


def _reported(work, name: str, env: dict[str, str], *args: str, module: str = COMBINED):
    """A run of `module` with its report written to <work>/<name>.json."""
    return module, [*args, "-j", "2", "--report", str(work / f"{name}.json")], env


@pytest.fixture(scope="module")
def first(setup):
    """The build, a listing, a check of an empty cache and an unknown module, side by side."""
    env, work = setup
    cache = work / "cache"
    only = ("--module", MODULES)
    runs = {
        "build": _reported(work, "build", env, *only, "--cache-dir", str(cache)),
        "list": _reported(work, "list", env, *only, "--list", "--cache-dir", str(work / "listed")),
        "empty": _reported(work, "empty", env, *only, "--check", "--cache-dir", str(work / "no")),
        "nope": (COMBINED, ["--module", "nope", "--list"], env),
    }
    results = dict(zip(runs, run_aot_together(list(runs.values())), strict=True))
    return {**results, "cache": cache, "work": work}


@pytest.fixture(scope="module")
def audits(setup, first):
    """After the build: the dense audit with and without the flip, and the axis module alone
    checking the same cache with a smaller --max-tokens."""
    env, work = setup
    assert first["build"].returncode == 0, first["build"].stdout + first["build"].stderr
    check = ("--check", "--cache-dir", str(first["cache"]))
    audit = (*check, "--sample", "20", "--module", MODULES)
    flipped = {**env, grid_family.FLIP_ENV: "1"}
    runs = {
        "check": _reported(work, "check", env, *audit),
        "flip": _reported(work, "flip", flipped, *audit),
        "narrow": _reported(work, "narrow", env, *check, "--max-tokens", "200", module=AXIS),
    }
    return dict(zip(runs, run_aot_together(list(runs.values())), strict=True))


def _report(work, name: str) -> ArchReport:
    (report,) = read_report(work / f"{name}.json")
    return report


def _results(report: ArchReport, module: str) -> list[JobResult]:
    return [r for r in report.results if r.job.module == module]


def _block(kernel: KernelRef) -> int:
    return int(re.search(r"\bblock=(\d+)", kernel.params).group(1))


def _segments(result: JobResult) -> list[tuple[int, int, tuple[int, ...]]]:
    """(lo, hi, blocks) of every segment the replay found."""
    return [(s.lo, s.hi, tuple(sorted({_block(k) for k in s.kernels}))) for s in result.segments]


def _brute_force(blocks_at, lo: int, hi: int) -> list[tuple[int, int, tuple[int, ...]]]:
    """The segments of [lo, hi] found by asking at every value."""
    segments: list[list] = []
    for value in range(lo, hi + 1):
        blocks = tuple(sorted(set(blocks_at(value))))
        if segments and segments[-1][2] == blocks:
            segments[-1][1] = value
        else:
            segments.append([value, value, blocks])
    return [tuple(s) for s in segments]


def _line(result: JobResult) -> int:
    return int(result.job.row.rpartition(":")[2])


def _grid_job(results: list[JobResult], axis: str, lo: int, **fixed: int) -> JobResult:
    (result,) = [r for r in results if (r.job.axis, r.job.lo, r.job.fixed) == (axis, lo, fixed)]
    return result


def test_the_combined_build_builds_the_registered_families(first):
    proc = first["build"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "replaying axis, grid for gfx942 (build" in proc.stderr
    document = json.loads((first["work"] / "build.json").read_text())
    assert document["modules"] == ["axis", "grid"]
    report = _report(first["work"], "build")
    assert {r.job.module for r in report.results} == {"axis", "grid"}
    assert all(r.tag == "OK" for r in report.results), [r.message for r in report.results]
    kernels = report.kernels()
    assert {_block(k) for k in kernels.values()} == {32, 64, 128, 256}
    assert all(path.is_file() for path in kernels), kernels
    # The manifest holds both families and nothing of the GEMM module the registry also names.
    assert set(manifest.read(first["cache"]).archs["gfx942"]) == {"axis", "grid"}


def test_list_finds_the_tokens_switch_exactly(first):
    assert first["list"].returncode == 0, first["list"].stderr
    results = _results(_report(first["work"], "list"), "axis")
    # Three rows, two flavours each: the open choice the table does not record.
    assert sorted((_line(r), r.job.variant) for r in results) == [
        (line, f"flavour={f}") for line in (2, 3, 4) for f in "ab"
    ]
    for r in results:
        experts = EXPERTS_BY_LINE[_line(r)]
        expected = _brute_force(
            lambda tokens, e=experts: [axis_family.block_for(tokens, e)], r.job.lo, r.job.hi
        )
        assert _segments(r) == expected, r.job.describe()
    row3 = [r for r in results if _line(r) == 3]
    assert all(_segments(r) == [(257, 300, (64,)), (301, 32768, (128,))] for r in row3)
    assert "          tokens 257-300: scale[" in first["list"].stdout
    assert "          tokens 301-32768: scale[" in first["list"].stdout


def test_list_finds_grid_switches_along_both_axes(first):
    results = _results(_report(first["work"], "list"), "grid")
    assert {r.job.axis for r in results} == {"batch", "seqlen"}
    for r in results:
        expected = _brute_force(
            lambda value, job=r.job: grid_family.blocks_for(**job.values(value)),
            r.job.lo,
            r.job.hi,
        )
        assert _segments(r) == expected, r.job.describe()
    # Along batch: the area switch at seqlen 1024, the second pass above batch 5.
    assert _segments(_grid_job(results, "batch", 2, seqlen=1024)) == [(2, 2, (64,)), (3, 4, (128,))]
    assert _segments(_grid_job(results, "batch", 4, seqlen=1)) == [
        (4, 5, (64,)),
        (6, 8, (32, 64)),
    ]
    # Along seqlen: the area switch moves with batch.
    assert _segments(_grid_job(results, "seqlen", 1024, batch=1)) == [
        (1024, 3000, (64,)),
        (3001, 4096, (128,)),
    ]
    assert _segments(_grid_job(results, "seqlen", 128, batch=8)) == [
        (128, 375, (32, 64)),
        (376, 1024, (32, 128)),
    ]
    assert "          batch 3-4: scale[" in first["list"].stdout
    assert "          seqlen 3001-4096: scale[" in first["list"].stdout


def test_check_passes_after_the_build(first, audits):
    proc = audits["check"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not lines_starting(proc.stdout, "MISSING")
    assert not lines_starting(proc.stdout, "SAMPLED")
    # The dense audit did sample both families, inside tokens segments and grid cells.
    report = _report(first["work"], "check")
    for module, axes in (("axis", {"tokens"}), ("grid", {"batch", "seqlen"})):
        samples = [s for r in _results(report, module) for s in r.samples]
        assert samples and all(set(s.values) == axes for s in samples), module
    assert not any(r.missing or r.findings for r in report.results)


def test_check_of_an_empty_cache_names_every_missing_kernel(first):
    proc = first["empty"]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    listed = _report(first["work"], "list")
    wanted = {(r.job.module, k.file) for r in listed.results for k in r.kernels()}
    named = set()
    for line in lines_starting(proc.stdout, "MISSING"):
        fields = dict(re.findall(r"(\w+)=(\S+)", line.split(" params: ")[0]))
        axes = {"tokens"} if fields["module"] == "axis" else {"batch", "seqlen"}
        assert set(fields) == {"module", "row", "arch", "kernel", *axes}, line
        assert fields["arch"] == "gfx942", line
        assert fields["row"].endswith(("axis.csv:2", "axis.csv:3", "axis.csv:4", "grid.csv:2"))
        function, _, file = fields["kernel"].partition("/")
        assert function == "scale", line
        named.add((fields["module"], file))
    assert named == wanted


def test_max_tokens_narrows_the_replayed_range(first, audits):
    proc = audits["narrow"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "replayed: tokens up to 200 " in proc.stdout
    narrowed = _report(first["work"], "narrow").results
    # Row 3 (tokens 257-1024) lies above 200 and is left out; the others stop at 200.
    assert sorted(_line(r) for r in narrowed) == [2, 2, 4, 4]
    assert {r.job.hi for r in narrowed} == {200}
    default = _results(_report(first["work"], "list"), "axis")
    assert {_line(r): r.job.hi for r in default} == {2: 256, 3: 32768, 4: 32768}


def test_dense_audit_finds_what_bisection_misses(first, audits):
    assert audits["check"].returncode == 0  # the same audit without the flip
    proc = audits["flip"]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    results = _results(_report(first["work"], "flip"), "grid")
    findings = [f for r in results for f in r.findings]
    assert findings
    assert {f.problem for f in findings} == {"unprobed"}
    for f in findings:
        batch, seqlen = f.values["batch"], f.values["seqlen"]
        assert batch % 2 == 1 and seqlen % 7 == 3, f.values
        assert _block(f.kernel) == 256
    assert all(r.tag == "FAIL" for r in results if r.findings)
    assert lines_starting(proc.stdout, "SAMPLED   unprobed module=grid ")
    # Bisection itself never met the flip: no segment names block 256.
    assert all(256 not in blocks for r in results for *_, blocks in _segments(r))


def test_summary_counts_no_missing_kernel_for_a_module_without_findings(first, audits):
    document = json.loads((first["work"] / "flip.json").read_text())
    rows = {row["module"]: row for row in document["summary"]}
    assert rows["axis"]["FAIL"] == 0
    assert rows["axis"]["missing"] == 0


def test_unknown_module_lists_the_registered_ones(first):
    proc = first["nope"]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        "--module nope: no such AOT module; registered: axis, chunk_gdn_h, conv3d, fmha_fp8, gemm, grid, moe"
        in (proc.stderr)
    )


def test_module_takes_the_name_reports_use(setup):
    env, work = setup
    proc = run_aot(COMBINED, "--list", "--module", "axis", "--cache-dir", str(work), env=env)
    assert proc.returncode == 0, proc.stderr
