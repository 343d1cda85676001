"""`--executor ray`: a build's shards run as Ray tasks across a cluster, and come back merged.

Each (arch target, shard I of N) is one task. It runs the ordinary command line in a fresh
process on its node, `python -m aiter.aot.flydsl --shard I/N` with GPU_ARCHS set to its target
and this build's modules, tables, --csv files and maxima, into a cache directory of its own,
and sends back that cache (a tar) and its `--report`. A task whose process dies (a node lost,
a worker killed) is retried by Ray, up to RETRIES times; the build process is killed with the
worker that started it. The caches are merged into --cache-dir (merge.py: checked, atomic,
one copy of each entry), which records the build whole once every shard of an arch is there,
and the shards' reports are printed as the usual summary.

Every node must hold the same aiter and the same table files at the same paths (the task reads
them where this process named them). N is --shards, else the number of alive nodes.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aiter.aot.flydsl.execution.options import Build
from aiter.aot.flydsl.jobs.records import EXIT_FAIL, EXIT_OK, ArchReport, from_json
from aiter.flydsl_bridge.env import KEY_ENV_VARS

RETRIES = 3  # per task, after its process or node died
PASSED_ENV_PREFIXES = ("AITER_", "FLYDSL_")  # what a task's process inherits from this one
PASSED_ENV = ("PYTHONPATH", "ROCM_PATH", *KEY_ENV_VARS)


def task_arguments(build: Build, shard: str, cache: str, report: str) -> list[str]:
    """The command line of one shard's build, from what this build's command line decided."""
    args = ["--module", ",".join(build.modules), "--shard", shard, "--cache-dir", cache]
    args += ["--report", report, "-j", str(build.workers), "--timeout", str(build.timeout)]
    for name, value in build.maxima.items():
        args += [f"--max-{name.lower().replace('_', '-')}", str(value)]
    for table, paths in build.extra_tables.items():
        args += [item for path in paths for item in ("--csv", f"{table}={path}")]
    for path in build.captures:
        args += ["--capture", path]
    if build.captures and build.capture_widen:
        args.append("--capture-widen")
    if build.captures and build.tables:
        args.append("--tables")
    if build.estimates:
        args += ["--estimates", build.estimates]
    return args


def passed_env(environ: dict[str, str]) -> dict[str, str]:
    return {
        k: v for k, v in environ.items() if k.startswith(PASSED_ENV_PREFIXES) or k in PASSED_ENV
    }


@dataclass(frozen=True)
class ShardOutcome:
    target: str
    shard: str
    returncode: int
    output: str  # the tail of its stdout and stderr
    report: str  # its --report JSON ("" when it wrote none)
    cache: bytes  # its cache directory as a tar


def _die_with_parent_hook():
    """A preexec_fn killing the build process when the task's worker dies (Linux prctl).

    Resolved here, before the fork: the child of a threaded Ray worker must not import
    between fork and exec."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def run_shard(target: str, shard: str, args: Sequence[str], env: dict[str, str]) -> ShardOutcome:
    """One shard's build on this node (the body of the Ray task)."""
    with tempfile.TemporaryDirectory(prefix="aiter-ray-shard-") as work:
        cache, report = Path(work) / "cache", Path(work) / "report.json"
        full = {**os.environ, **env, "GPU_ARCHS": target}
        command = [sys.executable, "-m", "aiter.aot.flydsl", *args]
        command = [
            c.replace("{cache}", str(cache)).replace("{report}", str(report)) for c in command
        ]
        proc = subprocess.run(command, env=full, capture_output=True, text=True, check=False,
                              preexec_fn=_die_with_parent_hook())  # fmt: skip
        if proc.returncode < 0:  # killed: let Ray run it again
            raise RuntimeError(
                f"shard {shard} of {target}: the build was killed ({proc.returncode})"
            )
        packed = io.BytesIO()
        if cache.is_dir():
            with tarfile.open(fileobj=packed, mode="w") as tar:
                tar.add(cache, arcname="cache")
        output = (proc.stdout[-4000:] + proc.stderr[-4000:]).strip()
        text = report.read_text() if report.is_file() else ""
        return ShardOutcome(target, shard, proc.returncode, output, text, packed.getvalue())


def _unpack(outcome: ShardOutcome, into: Path) -> Path:
    directory = into / f"{outcome.target.replace(':', '_')}-{outcome.shard.replace('/', 'of')}"
    directory.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(outcome.cache)) as tar:
        tar.extractall(directory, filter="data")
    return directory / "cache"


def _reports(outcomes: Sequence[ShardOutcome]) -> list[ArchReport]:
    """The shards' ArchReports joined per arch, as one build's."""
    joined: dict[str, ArchReport] = {}
    for outcome in outcomes:
        if not outcome.report:
            continue
        for data in json.loads(outcome.report)["archs"]:
            report = from_json(ArchReport, data)
            mine = joined.setdefault(report.arch, ArchReport(report.arch, report.mode))
            mine.results += report.results
            mine.compiles += report.compiles
            mine.limits += [line for line in report.limits if line not in mine.limits]
            mine.seconds = max(mine.seconds, report.seconds)
            mine.naming_seconds += report.naming_seconds
    return list(joined.values())


def run(build: Build) -> int:
    """The build across the Ray cluster at build.ray_address (a local one when empty)."""
    import ray

    from aiter.aot.flydsl.distribution.merge import merge
    from aiter.aot.flydsl.execution.summary import print_job_lines, print_summary, summary_rows

    ray.init(address=build.ray_address or None, log_to_driver=False)
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        count = build.shards or max(1, len(nodes))
        # A task holds its -j workers' CPUs, at most what the largest node has.
        largest = max((n.get("Resources", {}).get("CPU", 1) for n in nodes), default=1)
        task = ray.remote(run_shard).options(
            num_cpus=min(build.workers, largest), max_retries=RETRIES, retry_exceptions=True
        )
        env = passed_env(dict(os.environ))
        pending = []
        for target in build.targets:
            for index in range(count):
                shard = f"{index}/{count}"
                args = task_arguments(build, shard, "{cache}", "{report}")
                pending.append(task.remote(str(target), shard, args, env))
        print(f"ray: {len(pending)} shard tasks ({count} per arch) on {len(nodes)} node(s)",
              file=sys.stderr)  # fmt: skip
        outcomes = ray.get(pending)
    finally:
        ray.shutdown()
    failed = [o for o in outcomes if o.returncode != 0]
    for outcome in failed:
        print(f"FAIL      shard {outcome.shard} of {outcome.target} exited with "
              f"{outcome.returncode}:\n{outcome.output}")  # fmt: skip
    reports = _reports(outcomes)
    for report in reports:
        print_job_lines(report, build.mode, build.verbose)
    with tempfile.TemporaryDirectory(prefix="aiter-ray-merge-") as work:
        done = [_unpack(o, Path(work)) for o in outcomes if o.returncode == 0]
        merged = merge([str(d) for d in done], build.cache_dir) if done else EXIT_FAIL
    print_summary(summary_rows(reports), reports, build.maxima)
    print(f"cache: {build.cache_dir}")
    return EXIT_FAIL if failed or merged != EXIT_OK else EXIT_OK
