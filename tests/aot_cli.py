"""Runs an AOT module's command line in a subprocess, as a user would, for tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aiter import flydsl_bridge as bridge

REPO = Path(__file__).resolve().parent.parent


def run_aot(module: str, *args: str, env: dict[str, str] | None = None, timeout: int = 900):
    """`python -m module args...` from the repository root; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=aot_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def default_signals(*signals: int) -> Callable[[], None]:
    """A `preexec_fn` giving `signals` (SIGINT when none is named) their default disposition,
    unblocked, in the child before its program starts.

    A test that signals a process it starts (or that a process signals itself) must start it
    with this: ignored signals stay ignored across fork and exec, and under a background job
    (`nohup make test &`) SIGINT arrives ignored, so Python would never raise KeyboardInterrupt.
    """
    chosen = signals or (signal.SIGINT,)

    def reset() -> None:
        for sig in chosen:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, chosen)

    return reset


def lines_starting(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


def read_report(path) -> list:
    """The ArchReports of a `--report` JSON document."""
    from aiter.aot.flydsl.jobs.records import ArchReport, from_json

    document = json.loads(Path(path).read_text())
    return [from_json(ArchReport, arch) for arch in document["archs"]]


def run_aot_together(
    runs: Sequence[tuple[str, Sequence[str], dict[str, str] | None]], timeout: int = 900
) -> list[subprocess.CompletedProcess]:
    """Several `run_aot` calls side by side, each given as (module, args, env); the results
    come back in the order of `runs`."""
    with ThreadPoolExecutor(max_workers=max(len(runs), 1)) as pool:
        futures = [
            pool.submit(run_aot, module, *args, env=env, timeout=timeout)
            for module, args, env in runs
        ]
        return [future.result() for future in futures]


def aot_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment `run_aot` gives the command: os.environ, `env`, the repository on
    PYTHONPATH. A target this test process took for itself (an in-process dry run or
    aiter.emulated sets ARCH, FLYDSL_GPU_ARCH, COMPILE_ONLY) is not passed on unless `env`
    names it: a command starts as from a user's shell."""
    own_target = {bridge.ENV_ARCH, bridge.ENV_GPU_ARCH, bridge.ENV_COMPILE_ONLY}
    inherited = {k: v for k, v in os.environ.items() if k not in own_target}
    full_env = {**inherited, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), full_env.get("PYTHONPATH", "")) if p
    )
    return full_env


def start_aot(module: str, *args: str, env: dict[str, str] | None = None, **popen):
    """`python -m module args...` started as `run_aot` runs it, without waiting; `popen` goes to
    subprocess.Popen (start_new_session, preexec_fn, stdout, ...). Returns the Popen."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args], cwd=REPO, env=aot_env(env), **popen
    )


def replay_reports(module: str, env: dict[str, str], report: Path, *args: str):
    """`run_aot(module, *args, --report report)`: the process and its ArchReports by arch."""
    proc = run_aot(module, *args, "--report", str(report), env=env)
    reports = read_report(report) if report.is_file() else []
    return proc, {r.arch: r for r in reports}


def serve_from_cache(
    source: str, args: Sequence[str], env: dict[str, str], cache: Path, work: Path
) -> subprocess.CompletedProcess:
    """Run the script `source` with `args` as a serving process would: FlyDSL reads `cache` only
    (FLYDSL_RUNTIME_RUN_ONLY=1, so any miss raises), the repository importable."""
    script = work / "serve.py"
    script.write_text(source)
    full = {**aot_env(env), "FLYDSL_RUNTIME_CACHE_DIR": str(cache), "FLYDSL_RUNTIME_RUN_ONLY": "1"}
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def observed_calls_script(arch: str, cu_num: int, body: str) -> str:
    """A serving script: `body` (indented 4 spaces, torch and aiter imported) runs in a dry run of
    `arch`; loggers print "LOG name LEVEL message" lines on stderr; the dispatch records of its
    calls are printed as one "RESULT [[kernel, params], ...]" line (see result_of)."""
    prologue = textwrap.dedent(f"""
        import json, logging, torch
        import aiter
        from aiter import device, dispatch
        from aiter import flydsl_bridge as bridge
        from aiter.aot.flydsl.dry_run import dry_run
        logging.basicConfig(format="LOG %(name)s %(levelname)s %(message)s")
        with dispatch.observe() as records, dry_run("{arch}", {cu_num}, bridge.MODE_COMPILE):
        """)
    epilogue = 'print("RESULT " + json.dumps([[r.kernel, r.params] for r in records]))\n'
    return prologue + textwrap.indent(textwrap.dedent(body), "    ") + epilogue


def result_of(proc: subprocess.CompletedProcess):
    """The JSON of a serving script's one "RESULT " line."""
    [line] = lines_starting(proc.stdout, "RESULT ")
    return json.loads(line[len("RESULT ") :])


def manifest_entries(cache: Path, arch: str, module: str, keep) -> list[Path]:
    """The entries of `module` for `arch` whose manifest entry (a KernelEntry: function, params,
    ...) `keep` accepts."""
    from aiter.flydsl_bridge import manifest

    kernels = manifest.read(cache).archs[arch][module]
    return [cache / rel for rel, entry in kernels.items() if keep(entry)]


def serve_with_fallback(source: str, env: dict[str, str], cache: Path, work: Path, doomed):
    """Delete the `doomed` entries of `cache`; serving `source` from it must then miss under
    RUN_ONLY, and succeed with AITER_AOT_FALLBACK=1, whose process is returned."""
    for entry in doomed:
        entry.unlink()
    refused = serve_from_cache(source, [], env, cache, work)
    assert refused.returncode != 0 and "FLYDSL_RUNTIME_RUN_ONLY=1" in refused.stderr
    proc = serve_from_cache(source, [], {**env, "AITER_AOT_FALLBACK": "1"}, cache, work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


# --- property tests: random tables built with --csv, then served call by call ---


def other_tables(*written) -> list:
    """Every table of the AOT modules the `written` tables belong to, but those: what a test's
    config directory must hold (empty) beside the tables it writes, since a module reads all of
    its tables."""
    from aiter.aot.flydsl import registry

    modules = dict.fromkeys(spec.aot_module for spec in written)
    tables = [t for m in modules for t in registry.load(registry.MODULES[m]).tables]
    return [t for t in tables if t not in written]


def write_header_only_tables(directory: Path, specs) -> None:
    """Default tables of `specs` (and of the other tables of their modules) with a header and no
    row, so that only --csv adds rows."""
    directory.mkdir(parents=True, exist_ok=True)
    for spec in [*specs, *other_tables(*specs)]:
        (directory / spec.name).write_text(",".join(spec.header) + "\n")


def write_table(path: Path, spec, rows) -> Path:
    """A CSV of `spec`'s columns in its header's order; `rows` map column names to cells (a
    column a row leaves out is an empty cell)."""
    lines = [",".join(spec.header)]
    lines += [",".join(str(row.get(name, "")) for name in spec.header) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


_SERVE_EACH_PROLOGUE = """
import json, sys, torch
import aiter
from aiter import dispatch, jit_monitor
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run

def empty(shape, dtype):
    return torch.empty(tuple(shape), dtype=dtype, device="cuda")
"""

_SERVE_EACH_EPILOGUE = """
def _outcome(error):
    if isinstance(error, jit_monitor.JitCompileRefused) or bridge.RUN_ONLY_MISS in str(error):
        return "miss"
    return "error"

calls = json.loads(open(sys.argv[1]).read())
results = []
with dispatch.observe() as records, dry_run(sys.argv[2], int(sys.argv[3]), bridge.MODE_COMPILE):
    for call in calls:
        start = len(records)
        outcome, message = "hit", ""
        try:
            serve(call)
        except Exception as error:  # every call is tried: one miss must not hide another
            outcome, message = _outcome(error), f"{type(error).__name__}: {error}"
        done = [[r.op, r.backend, r.kernel, r.row, r.params] for r in records[start:]]
        results.append({"outcome": outcome, "error": message, "records": done})
print("RESULTS " + json.dumps(results, default=str))
"""


def serve_each_call(
    arch: str, cu_num: int, body: str, calls: list, env: dict[str, str], cache: Path, work: Path
) -> list[dict]:
    """Serve every call of `calls` (JSON values) from `cache` under FLYDSL_RUNTIME_RUN_ONLY=1 in
    one process, in a dry run of `arch`: `body` defines `serve(call)` (torch, aiter and
    `empty(shape, dtype)` at hand). Per call, in order: {"outcome": "hit" | "miss" | "error",
    "error": the exception's text, "records": [[op, backend, kernel, row, params], ...]}."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "calls.json").write_text(json.dumps(calls))
    source = _SERVE_EACH_PROLOGUE + textwrap.dedent(body) + _SERVE_EACH_EPILOGUE
    args = [str(work / "calls.json"), arch, str(cu_num)]
    proc = serve_from_cache(source, args, env, cache, work)
    assert proc.returncode == 0 and "RESULTS " in proc.stdout, proc.stderr[-3000:]
    [line] = lines_starting(proc.stdout, "RESULTS ")
    results = json.loads(line[len("RESULTS ") :])
    assert len(results) == len(calls)
    return results


def served_by_torch(result: dict) -> bool:
    """Whether the dispatch records of a served call say torch served it (no FlyDSL kernel)."""
    return bool(result["records"]) and all(r[1] == "torch" for r in result["records"])


def _first_lines(text: str, count: int = 4) -> str:
    return " | ".join(text.splitlines()[:count])


def cache_failures(calls: list, results: list[dict]) -> list[str]:
    """Each call the built cache did not serve: its row, the call and the error."""
    return [
        f"row {call['row']} call {json.dumps(call)}: {result['outcome']}: "
        f"{_first_lines(result['error'])}"
        for call, result in zip(calls, results, strict=True)
        if result["outcome"] != "hit"
    ]


def empty_cache_failures(calls: list, results: list[dict]) -> list[str]:
    """Each call an empty cache did not miss, torch-served calls (which must hit) aside."""
    wrong = []
    for call, result in zip(calls, results, strict=True):
        expected = "hit" if served_by_torch(result) else "miss"
        if result["outcome"] != expected:
            wrong.append(
                f"row {call['row']} call {json.dumps(call)}: expected {expected} from an empty "
                f"cache, got {result['outcome']} {_first_lines(result['error'])}"
            )
    return wrong


class PropertyFigures:
    """Tables, rows and calls of one table's property test, and how they were served."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tables = self.rows = self.calls = self.misses = 0
        self.empty_misses = self.empty_expected = self.torch = 0

    def add(self, rows: int, results: list[dict], empty_results: list[dict]) -> None:
        self.tables += 1
        self.rows += rows
        self.calls += len(results)
        self.misses += sum(r["outcome"] != "hit" for r in results)
        torch_served = [served_by_torch(r) for r in empty_results]
        self.torch += sum(torch_served)
        self.empty_expected += len(empty_results) - sum(torch_served)
        self.empty_misses += sum(
            r["outcome"] == "miss" and not t
            for r, t in zip(empty_results, torch_served, strict=True)
        )

    def line(self) -> str:
        return (
            f"PROPERTY {self.name}: tables={self.tables} rows={self.rows} calls={self.calls} "
            f"misses={self.misses} empty_cache_misses={self.empty_misses}/{self.empty_expected}"
            f" torch_served={self.torch}"
        )


def build_and_serve_tables(
    module: str,
    specs,
    tables: dict,
    arch: str,
    cu_num: int,
    body: str,
    calls: list,
    work: Path,
    *build_args: str,
) -> tuple[list[dict], list[dict]]:
    """Build `tables` ({spec: rows}) with `--csv SHORT=PATH` for `arch` into a fresh cache (the
    default tables of `specs` empty), then serve `calls` from it and from an empty cache (see
    serve_each_call); asserts that the build passes, the cache serves every call and the empty
    cache misses every call torch does not serve. Returns both runs' results."""
    config, cache = work / "config", work / "cache"
    write_header_only_tables(config, specs)
    csv_args, serve_env = [], {"AITER_CONFIG_DIR": str(config)}
    for spec, rows in tables.items():
        path = write_table(work / f"{spec.short_name}.csv", spec, rows)
        csv_args += ["--csv", f"{spec.short_name}={path}"]
        serve_env[spec.env_var] = str(path)  # as the builder sets it for its replay
    build_env = {"AITER_CONFIG_DIR": str(config), "GPU_ARCHS": arch}
    proc = run_aot(
        module, *csv_args, *build_args, "--cache-dir", str(cache), "-j", "2", env=build_env
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    results = serve_each_call(arch, cu_num, body, calls, serve_env, cache, work / "served")
    failures = cache_failures(calls, results)
    assert not failures, f"{len(failures)} of {len(calls)} calls not served:\n" + "\n".join(
        failures
    )
    empty = work / "empty-cache"
    empty.mkdir()
    empty_results = serve_each_call(arch, cu_num, body, calls, serve_env, empty, work / "empty")
    wrong = empty_cache_failures(calls, empty_results)
    assert not wrong, f"{len(wrong)} of {len(calls)} calls:\n" + "\n".join(wrong)
    return results, empty_results


def build_examples(count: int):
    """Hypothesis settings for a property whose every example is a build: `count` examples,
    derandomized, no database, deadline or shrinking."""
    from hypothesis import HealthCheck, Phase, settings

    return settings(
        max_examples=count,
        derandomize=True,
        database=None,
        deadline=None,
        phases=(Phase.generate,),
        suppress_health_check=list(HealthCheck),
    )
