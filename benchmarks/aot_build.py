"""Measures the AOT builder on a fixed table: replay overhead over pure compiling, rebuild cost,
naming time per job. Prints ratios from one run; nothing here is asserted.

    .venv/bin/python benchmarks/aot_build.py [--module aiter.aot.flydsl.gemm] [-j 2]
        [--table DIR_WITH_TABLES] [--archs "gfx942;gfx950;gfx1250"]

- per arch: jobs, unique kernels, kernel sets compiled, the arch process's time fresh and over
  a complete cache, the sum of its compile times and the peak memory of a compile worker;
- fresh build: wall time of a build into an empty cache, against the sum of the compile
  times of the kernel sets it built divided by the workers used (pure compiling);
- rebuild: a build over the complete cache, as a fraction of the fresh build;
- --list: naming time per job (the dry-run calls and bisection, no compile).
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


def run(module: str, args: list[str], env: dict[str, str]) -> tuple[float, list[dict]]:
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "report.json"
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", module, *args, "--report", str(report_path)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(
                f"{module} {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        return wall, json.loads(report_path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default="aiter.aot.flydsl.gemm")
    parser.add_argument("-j", "--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--table", help="AITER_CONFIG_DIR for the run (default: aiter/configs)")
    parser.add_argument("--archs", help="GPU_ARCHS for the run (default: all the tables hold)")
    args = parser.parse_args()

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if args.table:
        env["AITER_CONFIG_DIR"] = args.table
    if args.archs:
        env["GPU_ARCHS"] = args.archs
    with tempfile.TemporaryDirectory(prefix="aiter-bench-cache-") as cache:
        common = ["--cache-dir", cache, "-j", str(args.workers)]
        fresh_wall, fresh = run(args.module, common, env)
        rebuild_wall, rebuild = run(args.module, common, env)
        list_wall, listed = run(args.module, ["--list", *common], env)

    print(f"module {args.module}, {args.workers} workers")
    print(
        f"{'arch':<8} {'jobs':>5} {'kernels':>8} {'sets':>5} {'fresh s':>8} {'compile s':>10}"
        f" {'rebuild s':>10} {'peak MB/worker':>15}"
    )
    compile_sum = 0.0
    for report, again in zip(fresh, rebuild, strict=True):
        sets = report["compiles"]
        kernels = {
            k["file"] for r in report["results"] for s in r["segments"] for k in s["kernels"]
        }
        seconds = sum(c.get("seconds", 0.0) for c in sets)
        peak = max((c.get("peak_rss_mb", 0.0) for c in sets), default=0.0)
        compile_sum += seconds
        print(
            f"{report['arch']:<8} {len(report['results']):>5} {len(kernels):>8} {len(sets):>5}"
            f" {report['seconds']:>8.1f} {seconds:>10.1f} {again['seconds']:>10.1f} {peak:>15.0f}"
        )
    pure = compile_sum / args.workers
    jobs = sum(len(r["results"]) for r in listed)
    naming = sum(r["naming_seconds"] for r in listed)
    print(f"fresh build wall          {fresh_wall:8.1f} s")
    print(f"pure compile / workers    {pure:8.1f} s  (sum of compile times {compile_sum:.1f} s)")
    print(f"replay overhead ratio     {fresh_wall / pure if pure else float('nan'):8.2f} x")
    print(
        f"rebuild over full cache   {rebuild_wall:8.1f} s  = {rebuild_wall / fresh_wall:.1%} of fresh"
    )
    print(
        f"--list wall               {list_wall:8.1f} s  naming {1000 * naming / max(jobs, 1):.1f} ms/job over {jobs} jobs"
    )
    recompiled = sum(len(c.get("compiled", [])) for r in rebuild for c in r["compiles"])
    print(f"kernels compiled by the rebuild: {recompiled}")


if __name__ == "__main__":
    main()
