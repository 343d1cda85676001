"""Measures the AOT builder: a fresh build against pure compiling, a rebuild over the complete
cache, the audit, naming cost per probe and worker memory. Prints ratios from one run; nothing
here is asserted.

    .venv/bin/python benchmarks/aot_build.py [-j 2] [--module gemm] [--table DIR_WITH_TABLES]
        [--archs "gfx942;gfx950;gfx1250"] [--sample N]

- fresh: wall time of `python -m aiter.aot.flydsl` into an empty cache, against the sum of the
  compile times of the kernel sets it built divided by the workers (pure compiling);
- rebuild: the same command over the complete cache (the fingerprint memo), as a fraction of
  fresh; and a forced replay (`--no-memo`) for comparison;
- check: `--check` over the complete cache, as a fraction of fresh (and `--check --sample N`),
  and the same `--check` with each arch process a fresh interpreter (`AITER_AOT_WARM_FORK=0`);
- naming: CPU milliseconds per probe (one call of a public entry in naming mode) and per job,
  for each module, and the naming rate in jobs per CPU second (jobs per second per core);
- memory: the peak RSS of a compile worker.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from aiter.aot.flydsl.jobs.records import ArchReport, from_json  # noqa: E402


def run(args: list[str], env: dict[str, str]) -> tuple[float, list[ArchReport]]:
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "report.json"
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "aiter.aot.flydsl", *args, "--report", str(report_path)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        document = json.loads(report_path.read_text())  # no arch reports when up to date
        return wall, [from_json(ArchReport, a) for a in document["archs"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-j", "--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--module", help="narrow to these modules (default: every one)")
    parser.add_argument("--table", help="AITER_CONFIG_DIR for the run (default: aiter/configs)")
    parser.add_argument("--archs", help="GPU_ARCHS for the run (default: all the tables hold)")
    parser.add_argument("--sample", type=int, default=4, help="points per segment for the audit")
    args = parser.parse_args()

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if args.table:
        env["AITER_CONFIG_DIR"] = args.table
    if args.archs:
        env["GPU_ARCHS"] = args.archs
    with tempfile.TemporaryDirectory(prefix="aiter-bench-cache-") as cache:
        common = ["--cache-dir", cache, "-j", str(args.workers)]
        if args.module:
            common += ["--module", args.module]
        fresh_wall, fresh = run(common, env)
        rebuild_wall, _ = run(common, env)
        replay_wall, replayed = run([*common, "--no-memo"], env)
        check_wall, _ = run(["--check", *common], env)
        fresh_interpreters = {**env, "AITER_AOT_WARM_FORK": "0"}
        unforked_wall, _ = run(["--check", *common], fresh_interpreters)
        sample_wall, sampled = run(["--check", "--sample", str(args.sample), *common], env)

    print(f"{args.workers} workers, modules: {args.module or 'all'}")
    print(
        f"{'arch':<8} {'jobs':>5} {'kernels':>8} {'sets':>5} {'arch s':>7} {'compile s':>10}"
        f" {'probes':>7} {'ms/probe':>9} {'peak MB/worker':>15}"
    )
    compile_sum = 0.0
    probes = naming = jobs = 0.0
    for report in fresh:
        sets = report.compiles
        seconds = sum(c.seconds for c in sets)
        peak = max((c.peak_rss_mb for c in sets), default=0.0)
        arch_probes = sum(r.probes for r in report.results)
        arch_naming = sum(r.naming_cpu for r in report.results)
        compile_sum += seconds
        probes += arch_probes
        naming += arch_naming
        jobs += len(report.results)
        print(
            f"{report.arch:<8} {len(report.results):>5} {len(report.kernels()):>8} {len(sets):>5}"
            f" {report.seconds:>7.1f} {seconds:>10.1f} {arch_probes:>7}"
            f" {1000 * arch_naming / max(arch_probes, 1):>9.1f} {peak:>15.0f}"
        )
    pure = compile_sum / args.workers
    print(f"fresh build wall            {fresh_wall:8.1f} s")
    print(f"pure compile / workers      {pure:8.1f} s  (sum of compile times {compile_sum:.1f} s)")
    print(f"fresh / pure                {fresh_wall / pure if pure else float('nan'):8.2f} x")
    print(f"rebuild (memo)              {rebuild_wall:8.2f} s  = {rebuild_wall / fresh_wall:.1%}")
    recompiled = sum(len(r.compiled()) for r in replayed)
    print(
        f"forced replay (--no-memo)   {replay_wall:8.1f} s  = {replay_wall / fresh_wall:.1%}"
        f" ({recompiled} kernels compiled)"
    )
    print(f"--check                     {check_wall:8.1f} s  = {check_wall / fresh_wall:.1%}")
    print(
        f"--check, fresh interpreters {unforked_wall:8.1f} s  = {unforked_wall / fresh_wall:.1%}"
        f" (arch processes not forked from the warm driver: AITER_AOT_WARM_FORK=0)"
    )
    sampled_probes = sum(r.probes for a in sampled for r in a.results)
    print(
        f"--check --sample {args.sample:<4}       {sample_wall:8.1f} s  = "
        f"{sample_wall / fresh_wall:.1%} ({sampled_probes} probes)"
    )
    print(
        f"naming                      {1000 * naming / max(probes, 1):8.2f} CPU ms per probe, "
        f"{1000 * naming / max(jobs, 1):.1f} per job ({int(probes)} probes, {int(jobs)} jobs), "
        f"{jobs / naming if naming else float('nan'):.0f} jobs/s/core"
    )
    print(
        f"{'module':<12} {'jobs':>6} {'probes':>7} {'ms/probe':>9} {'ms/job':>7} {'jobs/s/core':>12}"
    )
    by_module: dict[str, list[float]] = {}
    for report in fresh:
        for r in report.results:
            counts = by_module.setdefault(r.job.module, [0, 0, 0.0])
            counts[0] += 1
            counts[1] += r.probes
            counts[2] += r.naming_cpu
    for module, (module_jobs, module_probes, cpu) in sorted(by_module.items()):
        print(
            f"{module:<12} {module_jobs:>6} {module_probes:>7} "
            f"{1000 * cpu / max(module_probes, 1):>9.2f} {1000 * cpu / max(module_jobs, 1):>7.1f} "
            f"{module_jobs / cpu if cpu else float('nan'):>12.0f}"
        )


if __name__ == "__main__":
    main()
