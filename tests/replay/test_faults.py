"""Faults the AOT builder must survive with a cache it can trust: bad command lines, builders
sharing one cache, a killed build, dying and hanging workers, a write limit and damaged entries.
"""

from __future__ import annotations

import os
import random
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from aiter.flydsl_bridge import manifest
from aiter.flydsl_bridge.entries import entry_defect, file_digest
from aiter.flydsl_bridge.manifest import MANIFEST_NAME
from tests.aot_cli import (
    default_signals,
    lines_starting,
    read_report,
    run_aot,
    run_aot_together,
    start_aot,
)

pytestmark = pytest.mark.slow  # runs the command line, which replays and compiles

MODULE = "tests.fixtures.fault_family"
AXIS_MODULE = "tests.fixtures.axis_family"
HEADER = "gfx,cu_num,M,case,block\n"
TOP = "M=1-32768"  # every row is a shape of its own, served up to the default --max-m
# Entries of the tiny `scale` kernel are about 2 KB; a file-size limit below that stops them.
WRITE_LIMIT = 1024


def faults_table(directory: Path, *rows: str, archs: str = "gfx942") -> dict[str, str]:
    """Write faults.csv (rows "gfx,cu_num,M,case,block" from line 2 on); the environment that
    makes the fault family read it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "faults.csv").write_text(HEADER + "".join(row + "\n" for row in rows))
    return {"AITER_TEST_FAULTS_DIR": str(directory), "GPU_ARCHS": archs}


def entries(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.pkl"))


def not_whole(cache: Path, archs: tuple[str, ...] = ("gfx942",)) -> dict[Path, list[str]]:
    """Every .pkl under the cache that is not a whole entry for any of `archs`, with why."""
    found = {}
    for path in entries(cache):
        defects = [entry_defect(path, arch) for arch in archs]
        if all(defects):
            found[path] = defects
    return found


def quiet(proc: subprocess.CompletedProcess) -> None:
    """The command failed, if it did, with messages: no Python traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr


def succeeded(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    quiet(proc)


def check_cache(cache: Path, env: dict[str, str], module: str = MODULE):
    return run_aot(module, "--check", "--cache-dir", str(cache), "-j", "2", env=env)


def manifest_mismatches(cache: Path) -> list[str]:
    """Manifest entries whose file is not the one recorded (size, sha256) or not whole."""
    wrong = []
    for arch, modules in manifest.read(cache).archs.items():
        for kernels in modules.values():
            for rel, entry in kernels.items():
                path = cache / rel
                if not path.is_file():
                    wrong.append(f"{rel}: missing")
                elif file_digest(path) != (entry.size, entry.sha256):
                    wrong.append(f"{rel}: size/sha256 differ from the manifest")
                elif entry_defect(path, arch):
                    wrong.append(f"{rel}: {entry_defect(path, arch)}")
    return wrong


# --- bad command lines and environments: exit 2, one error line, no traceback ---

Case = Callable[[Path], tuple[list[str], dict[str, str], str]]


def _file(tmp: Path) -> Path:
    path = tmp / "a-file"
    path.write_text("not a directory\n")
    return path


BAD_INPUTS: dict[str, Case] = {
    "cache-dir-is-a-file": lambda tmp: (
        ["--cache-dir", str(_file(tmp))],
        {},
        f"--cache-dir {tmp / 'a-file'}: is a file, expected a directory",
    ),
    "cache-dir-under-a-file": lambda tmp: (
        ["--cache-dir", str(_file(tmp) / "cache")],
        {},
        f"--cache-dir {tmp / 'a-file' / 'cache'}: cannot be created (Not a directory)",
    ),
    "malformed-table": lambda tmp: (
        [],
        faults_table(tmp / "bad", "gfx942,304,64,ok,64", "gfx942,304,64,ok,6x4"),
        f"{tmp / 'bad' / 'faults.csv'}:3: column 'block': expected an integer, found '6x4'",
    ),
    "unknown-arch": lambda tmp: (
        [],
        {"GPU_ARCHS": "gfx000"},
        "GPU_ARCHS: unknown GPU arch 'gfx000'",
    ),
    "csv-is-a-directory": lambda tmp: (
        ["--csv", str(tmp)],
        {},
        f"--csv {tmp}: is a directory, expected a CSV file",
    ),
    "timeout-zero": lambda tmp: (
        ["--timeout", "0"],
        {},
        "--timeout must be a number of seconds > 0, got 0",
    ),
    "timeout-nan": lambda tmp: (
        ["--list", "--timeout", "nan"],
        {},
        "--timeout must be a number of seconds > 0, got nan",
    ),
    "report-in-a-missing-directory": lambda tmp: (
        ["--list", "--report", str(tmp / "missing" / "report.json")],
        {},
        f"--report {tmp / 'missing' / 'report.json'}: expected a file in an existing directory",
    ),
    "report-is-a-directory": lambda tmp: (
        ["--list", "--report", str(tmp)],
        {},
        f"--report {tmp}: expected a file in an existing directory",
    ),
    "workers-zero": lambda tmp: (["-j", "0"], {}, "--workers must be >= 1, got 0"),
    "sample-without-check": lambda tmp: (["--sample", "3"], {}, "--sample N needs --check"),
}


@pytest.fixture(scope="module")
def good_env(tmp_path_factory) -> dict[str, str]:
    return faults_table(tmp_path_factory.mktemp("good"), "gfx942,304,64,ok,64")


def _usage_error(case: Case, good_env: dict[str, str], tmp_path: Path) -> None:
    args, env, message = case(tmp_path)
    if "--cache-dir" not in args:
        args = [*args, "--cache-dir", str(tmp_path / "cache")]
    proc = run_aot(MODULE, *args, env={**good_env, **env}, timeout=300)
    quiet(proc)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = lines_starting(proc.stderr, "error:")
    assert len(errors) == 1 and message in errors[0], proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_a_bad_input_is_one_error_line_and_exit_2(name, good_env, tmp_path):
    _usage_error(BAD_INPUTS[name], good_env, tmp_path)


# --- four builders into one cache at once ---

ARCH_ROWS = {"gfx942": "gfx942,304", "gfx950": "gfx950,256"}


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The fault and axis families, each for gfx942 and for gfx950: four builders side by side
    into one cache (both families launch `scale` with blocks 64 and 128, so they race for the
    same entries), then each builder's --check."""
    work = tmp_path_factory.mktemp("shared")
    cache = work / "cache"
    axis_dir = work / "axis"
    axis_dir.mkdir()
    axis_rows = [f"{prefix},512,8\n{prefix},512,64\n" for prefix in ARCH_ROWS.values()]
    (axis_dir / "axis.csv").write_text("gfx,cu_num,tokens,experts\n" + "".join(axis_rows))
    fault_rows = [f"{prefix},64,ok,{b}" for prefix in ARCH_ROWS.values() for b in (64, 128)]
    fault_env = faults_table(work / "faults", *fault_rows)
    runs = []
    for module, env in ((MODULE, fault_env), (AXIS_MODULE, {"AITER_TEST_AXIS_DIR": str(axis_dir)})):
        for arch in ARCH_ROWS:
            runs.append(
                (module, ["--cache-dir", str(cache), "-j", "1"], {**env, "GPU_ARCHS": arch})
            )
    builds = run_aot_together(runs)
    checks = run_aot_together([(m, ["--check", "--cache-dir", str(cache)], e) for m, _, e in runs])
    return cache, runs, builds, checks


def test_four_builders_into_one_cache_all_succeed(shared):
    _, _, builds, _ = shared
    for proc in builds:
        succeeded(proc)


def test_check_passes_for_each_builder(shared):
    _, runs, _, checks = shared
    for (module, _, env), proc in zip(runs, checks, strict=True):
        assert proc.returncode == 0, (module, env["GPU_ARCHS"], proc.stdout + proc.stderr)
        assert not lines_starting(proc.stdout, "MISSING") + lines_starting(proc.stdout, "CORRUPT")


def test_the_shared_manifest_holds_every_arch_and_module(shared):
    cache, _, _, _ = shared
    data = manifest.read(cache)
    assert {arch: sorted(modules) for arch, modules in data.archs.items()} == {
        "gfx942": ["axis", "faults"],
        "gfx950": ["axis", "faults"],
    }
    assert sorted(data.builds) == [
        "axis|gfx942",
        "axis|gfx950",
        "faults|gfx942",
        "faults|gfx950",
    ]
    listed = {cache / rel for rel in data.entries()}
    # Every entry on disk is listed, whole and as recorded; none is listed that is not there.
    assert set(entries(cache)) == listed
    assert manifest_mismatches(cache) == []
    assert not_whole(cache, tuple(ARCH_ROWS)) == {}


# --- the whole build killed mid-compile ---

BLOCKS = (32, 64, 96, 128, 160, 192, 224, 256)  # eight kernels: compiling takes seconds


def _group_alive(pgid: int) -> list[int]:
    """Processes of the group that still run (zombies left for a reaper do not count)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


def _compiling(cache: Path) -> list[Path]:
    """Entries whose lock file FlyDSL has made but which it has not written: compiles under way."""
    return [
        lock.with_suffix(".pkl")
        for lock in cache.rglob("*.lock")
        if not lock.with_suffix(".pkl").exists()
    ]


def test_a_killed_build_leaves_only_whole_entries_and_a_rerun_completes(tmp_path):
    env = faults_table(tmp_path / "tables", *(f"gfx942,304,64,ok,{b}" for b in BLOCKS))
    cache = tmp_path / "cache"
    args = ("--cache-dir", str(cache), "-j", "2")
    with open(tmp_path / "out", "w") as out:
        proc = start_aot(MODULE, *args, env=env, start_new_session=True, stdout=out, stderr=out)
        deadline = time.monotonic() + 300
        # Kill once one entry has landed and another is being compiled.
        while not (entries(cache) and _compiling(cache)):
            assert proc.poll() is None, (tmp_path / "out").read_text()
            assert time.monotonic() < deadline, "no compile was seen in 300 s"
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)  # the driver, its arch process and every worker
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while _group_alive(proc.pid):
        assert time.monotonic() < deadline, f"still running: {_group_alive(proc.pid)}"
        time.sleep(0.05)
    left = entries(cache)
    assert 1 <= len(left) < len(BLOCKS), "the kill did not land mid-build"
    assert not_whole(cache) == {}

    rerun = run_aot(MODULE, *args, env=env)
    succeeded(rerun)
    assert len(entries(cache)) == len(BLOCKS) and not_whole(cache) == {}
    succeeded(check_cache(cache, env))
    assert manifest_mismatches(cache) == []


def test_an_interrupted_build_says_so_and_leaves_no_process(tmp_path):
    env = faults_table(tmp_path / "tables", *(f"gfx942,304,64,ok,{b}" for b in BLOCKS))
    cache = tmp_path / "cache"
    args = ("--cache-dir", str(cache), "-j", "2")
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    # As Ctrl-C would: SIGINT to the whole group, whose processes take it as KeyboardInterrupt
    # (as in a terminal, whatever disposition this pytest inherited).
    interruptible = {"start_new_session": True, "preexec_fn": default_signals(signal.SIGINT)}
    proc = start_aot(MODULE, *args, env=env, **interruptible, **pipes)
    deadline = time.monotonic() + 300
    while not _compiling(cache):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "interrupted: the cache holds what was compiled so far" in stderr
    assert "Traceback" not in stderr
    deadline = time.monotonic() + 30
    while _group_alive(proc.pid):
        assert time.monotonic() < deadline, f"still running: {_group_alive(proc.pid)}"
        time.sleep(0.05)
    assert not_whole(cache) == {}
    succeeded(run_aot(MODULE, *args, env=env))


# --- a worker killed by SIGKILL, and a compile that hangs ---

FAULTY_ROWS = (
    "gfx942,304,64,ok,64",  # line 2
    "gfx942,304,64,ok,128",  # line 3
    "gfx942,304,64,kill,256",  # line 4: its compile kills the worker
    "gfx942,304,64,hang,256",  # line 5: its compile never ends
    "gfx942,304,64,ok,256",  # line 6
)


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    work = tmp_path_factory.mktemp("faulty")
    env = faults_table(work / "tables", *FAULTY_ROWS)
    cache, report = work / "cache", work / "report.json"
    args = ("--cache-dir", str(cache), "-j", "2", "--timeout", "3", "--report", str(report))
    start = time.perf_counter()
    proc = run_aot(MODULE, *args, env=env)
    seconds = time.perf_counter() - start
    (arch,) = read_report(report)
    check = check_cache(cache, env)
    return {"proc": proc, "seconds": seconds, "report": arch, "cache": cache, "check": check}


def _results_by_line(report) -> dict[int, tuple[str, str]]:
    return {int(r.job.row.rsplit(":", 1)[1]): (r.tag, r.message) for r in report.results}


def test_a_worker_killed_by_sigkill_fails_only_its_job(faulty):
    proc, report = faulty["proc"], faulty["report"]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    quiet(proc)
    results = _results_by_line(report)
    assert results[4] == ("FAIL", "compile at M=1: worker killed by SIGKILL")
    assert {line: results[line] for line in (2, 3, 6)} == dict.fromkeys((2, 3, 6), ("OK", ""))
    (line,) = [x for x in lines_starting(proc.stdout, "FAIL") if "faults.csv:4 " in x]
    assert line.endswith("M 1-32768  compile at M=1: worker killed by SIGKILL")


def test_a_hung_compile_times_out_and_the_rest_builds(faulty):
    proc, report, cache = faulty["proc"], faulty["report"], faulty["cache"]
    message = "compile at M=1: timed out after 3 s; the worker was killed"
    assert _results_by_line(report)[5] == ("FAIL", message)
    assert any("faults.csv:5 " in x and x.endswith(message) for x in proc.stdout.splitlines())
    assert faulty["seconds"] < 40, faulty["seconds"]
    # The three 'ok' kernels are built and whole; only the two faulty ones are missing.
    assert len(entries(cache)) == 3 and not_whole(cache) == {}
    check = faulty["check"]
    assert check.returncode == 1
    quiet(check)
    missing = lines_starting(check.stdout, "MISSING")
    assert len(missing) == 2, check.stdout
    assert any("faults.csv:4 " in x and "kernel=kill_on_compile/" in x for x in missing)
    assert any("faults.csv:5 " in x and "kernel=hang_on_compile/" in x for x in missing)


# --- a file-size limit on the builder ---


def _limit_writes() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (WRITE_LIMIT, WRITE_LIMIT))


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    """A build under RLIMIT_FSIZE below an entry's size, then one without the limit."""
    work = tmp_path_factory.mktemp("limited")
    env = faults_table(work / "tables", *(f"gfx942,304,64,ok,{b}" for b in (64, 128, 256)))
    cache = work / "cache"
    args = ("--cache-dir", str(cache), "-j", "2")
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    proc = start_aot(MODULE, *args, env=env, preexec_fn=_limit_writes, **pipes)
    stdout, stderr = proc.communicate(timeout=600)
    under_limit = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    left = not_whole(cache)
    rerun = run_aot(MODULE, *args, env=env)
    return {
        "proc": under_limit,
        "left": left,
        "rerun": rerun,
        "check": check_cache(cache, env),
        "cache": cache,
    }


def test_a_write_limit_fails_the_build_leaves_no_partial_entry_and_a_rerun_completes(limited):
    proc = limited["proc"]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert limited["left"] == {}
    succeeded(limited["rerun"])
    succeeded(limited["check"])
    sizes = [path.stat().st_size for path in entries(limited["cache"])]
    assert len(sizes) == 3 and min(sizes) > WRITE_LIMIT  # the limit did stop every entry
    assert manifest_mismatches(limited["cache"]) == []


def test_a_write_limit_fails_the_compiles_with_a_clear_message(limited):
    proc = limited["proc"]
    quiet(proc)
    failed = [x for x in lines_starting(proc.stdout, "FAIL") if " faults.csv:" in x]
    assert len(failed) == 3, proc.stdout
    # The linker's temporary files hit the limit before the entry does: the message says why
    # writing fails here, whichever write failed first.
    for line in failed:
        assert any(
            reason in line
            for reason in (
                "cannot write to the cache (",
                "a file-size limit of 1024 bytes is set",
                "could not write its result (the disk is full or a file-size limit",
            )
        ), line
    assert "Traceback" not in proc.stderr


def test_a_worker_that_cannot_write_its_result_says_why():
    """A worker that cannot write its result under a write limit says so, in one process."""
    from aiter.aot.flydsl.execution.workers import run_forked

    def big_result(_: int) -> str:
        resource.setrlimit(resource.RLIMIT_FSIZE, (WRITE_LIMIT, WRITE_LIMIT))
        return "x" * (4 * WRITE_LIMIT)

    (outcome,) = run_forked([0], big_result, workers=1)
    assert not outcome.ok
    assert "could not write its result" in outcome.error, outcome.error


# --- truncated, garbage and swapped entries ---


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """A build for gfx942 (blocks 32-512, lines 2-6) and gfx950 (block 64, line 7); then four
    gfx942 entries damaged, --check, a build, and --check again."""
    work = tmp_path_factory.mktemp("damaged")
    blocks = (32, 64, 128, 256, 512)
    rows = [f"gfx942,304,64,ok,{b}" for b in blocks] + ["gfx950,256,64,ok,64"]
    tables = work / "tables"
    env = faults_table(tables, *rows, archs="gfx942;gfx950")
    cache = work / "cache"
    succeeded(run_aot(MODULE, "--cache-dir", str(cache), "-j", "2", env=env))
    by_block = {}
    built = manifest.read(cache)
    for rel, entry in built.archs["gfx942"]["faults"].items():
        by_block[int(entry.params.rsplit("block=", 1)[1])] = cache / rel
    (gfx950,) = [cache / rel for rel in built.archs["gfx950"]["faults"]]
    victims = {  # block -> (how it is damaged, the start of why --check calls it corrupt)
        32: ("truncated", "not a readable FlyDSL entry ("),
        64: ("garbage", "not a readable FlyDSL entry ("),
        128: ("another arch", "holds code objects for ['gfx950'], expected gfx942"),
        256: ("another kernel", "changed since the build that listed it"),
    }
    data = by_block[32].read_bytes()
    by_block[32].write_bytes(data[: len(data) // 2])
    garbage = random.Random(0).randbytes(by_block[64].stat().st_size)
    by_block[64].write_bytes(garbage)
    shutil.copyfile(gfx950, by_block[128])
    shutil.copyfile(by_block[512], by_block[256])
    lines = {b: 2 + blocks.index(b) for b in blocks}
    check = run_aot(MODULE, "--check", "--cache-dir", str(cache), env=env)
    rebuild = run_aot(MODULE, "--cache-dir", str(cache), "-j", "2", env=env)
    again = run_aot(MODULE, "--check", "--cache-dir", str(cache), env=env)
    return {
        "cache": cache,
        "table": tables / "faults.csv",
        "by_block": by_block,
        "victims": victims,
        "lines": lines,
        "check": check,
        "rebuild": rebuild,
        "again": again,
    }


def test_check_names_every_damaged_entry(damaged):
    check = damaged["check"]
    assert check.returncode == 1, check.stdout + check.stderr
    quiet(check)
    corrupt = lines_starting(check.stdout, "CORRUPT")
    assert len(corrupt) == len(damaged["victims"]), check.stdout
    assert not lines_starting(check.stdout, "MISSING")
    for block, (how, why) in damaged["victims"].items():
        path = damaged["by_block"][block]
        where = (
            f"CORRUPT   module=faults row={damaged['table']}:{damaged['lines'][block]} {TOP} "
            f"arch=gfx942 kernel=scale/{path.name} path={path} why: {why}"
        )
        assert any(x.startswith(where) for x in corrupt), (how, where, corrupt)


def test_a_build_replaces_every_damaged_entry(damaged):
    rebuild = damaged["rebuild"]
    succeeded(rebuild)
    replaced = lines_starting(rebuild.stdout, "replaced: ")
    assert sorted(replaced) == sorted(
        f"replaced: {damaged['by_block'][b]} (it was in the cache but not a whole entry for gfx942)"
        for b in damaged["victims"]
    )


def test_after_the_rebuild_check_passes_and_the_manifest_matches_the_files(damaged):
    succeeded(damaged["again"])
    assert not lines_starting(damaged["again"].stdout, "CORRUPT")
    cache = damaged["cache"]
    assert manifest_mismatches(cache) == []
    assert not_whole(cache, ("gfx942", "gfx950")) == {}
    assert (cache / MANIFEST_NAME).is_file()
