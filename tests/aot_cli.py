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

REPO = Path(__file__).resolve().parent.parent


def run_aot(module: str, *args: str, env: dict[str, str] | None = None, timeout: int = 900):
    """`python -m module args...` from the repository root; returns the CompletedProcess."""
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), full_env.get("PYTHONPATH", "")) if p
    )
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=full_env,
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
    from aiter.aot.flydsl.protocol import ArchReport, from_json

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
    PYTHONPATH."""
    full_env = {**os.environ, **(env or {})}
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
