"""Measures the typed records' JSON round trip at the size of a large build: an ArchReport of
50,000 jobs (two segments of two kernels each, as a GEMM row's job has) converted to JSON data,
written, read and rebuilt, as `--report`, the arch processes' reports and the benchmarks do.
Prints seconds per step from one run; nothing is asserted.

    .venv/bin/python benchmarks/report_round_trip.py [--jobs 50000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiter.aot.flydsl.jobs.records import (  # noqa: E402
    ArchReport,
    JobInfo,
    JobResult,
    KernelRef,
    Mode,
    Segment,
    from_json,
    to_json,
)


def report(jobs: int) -> ArchReport:
    kernels = [
        KernelRef("gemm_a16w16", f"/cache/gemm_a16w16_{i}", f"{i:016x}.pkl", "tile_m=32 split_k=1")
        for i in range(4)
    ]
    segments = [Segment(1, 32, kernels[:2], ["flydsl"]), Segment(33, 64, kernels[2:])]
    results = []
    for i in range(jobs):
        row = f"/t/bf16_tuned_gemm.csv:{i}"
        job = JobInfo("gemm", "bf16_tuned_gemm.csv", row, "gfx942", 304, "", "M", 1, 64, 64)
        results.append(JobResult(job, segments=list(segments), probes=4, naming_cpu=0.01))
    return ArchReport("gfx942", Mode.BUILD, results=results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50_000)
    args = parser.parse_args()
    built = report(args.jobs)
    times = {}
    start = time.perf_counter()
    data = to_json([built])
    times["to_json"] = time.perf_counter() - start
    start = time.perf_counter()
    text = json.dumps(data)
    times["json.dumps"] = time.perf_counter() - start
    start = time.perf_counter()
    loaded = json.loads(text)
    times["json.loads"] = time.perf_counter() - start
    start = time.perf_counter()
    back = [from_json(ArchReport, a) for a in loaded]
    times["from_json"] = time.perf_counter() - start
    assert back == [built]
    print(f"{args.jobs} jobs, {len(text) / 1e6:.0f} MB of JSON")
    for step, seconds in times.items():
        print(f"{step:<11} {seconds:6.2f} s")
    print(f"{'total':<11} {sum(times.values()):6.2f} s")


if __name__ == "__main__":
    main()
