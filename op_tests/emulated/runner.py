"""Runs the emulated numerics suite for one arch in this process (FlyDSL freezes its target per
process) and writes a JSON report: per case its checks, time, the kernels it launched (FlyDSL's
cache entries, compiled or loaded) and, for a failure, the error.

    python -m op_tests.emulated.runner ARCH REPORT [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path

import torch


def _entry(outcome) -> dict:
    request = outcome.request
    return {
        "function": request.function,
        "entry": f"{Path(request.cache_dir).name}/{request.file_name}",
        "params": " ".join(f"{k}={v}" for k, v in request.params),
        "cache": outcome.cache,
    }


def run(arch: str, only: str = "") -> dict:
    import aiter
    from aiter import flydsl_bridge as bridge
    from op_tests.emulated.suite import CaseContext, all_cases

    results = []
    with aiter.emulated(arch) as session:
        for index, case in enumerate(all_cases()):
            if arch not in case.archs or only not in case.id:
                continue
            ctx = CaseContext(arch, torch.Generator().manual_seed(index))
            first, started = len(session.launches), time.perf_counter()
            error = None
            with bridge.observe_launches() as outcomes:
                try:
                    case.run(ctx)
                except Exception:  # noqa: BLE001  (reported per case, the suite goes on)
                    error = traceback.format_exc(limit=8)
            launches = session.launches[first:]
            results.append({
                "case": case.id,
                "seconds": round(time.perf_counter() - started, 3),
                "error": error,
                "checks": [
                    {"what": c.what, "error": c.error, "tolerance": c.tolerance,
                     "passed": c.passed} for c in ctx.checks
                ],
                "kernels": [_entry(o) for o in outcomes],
                "instructions": sum(x.stats.instructions for x in launches),
                "launches": len(launches),
            })  # fmt: skip
    return {"arch": arch, "cases": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("arch")
    parser.add_argument("report", type=Path)
    parser.add_argument("--only", default="", help="run the cases whose id contains this")
    args = parser.parse_args(argv)
    report = run(args.arch, args.only)
    args.report.write_text(json.dumps(report, indent=1))
    failed = [c["case"] for c in report["cases"]
              if c["error"] or not all(x["passed"] for x in c["checks"])]  # fmt: skip
    for c in report["cases"]:
        worst = max((x["error"] / x["tolerance"] for x in c["checks"]), default=0.0)
        print(
            f"{args.arch} {c['case']:<44} {c['seconds']:6.1f} s  {len(c['kernels'])} launches"
            f"  worst error/tolerance {worst:.3f}{'  FAILED' if c['case'] in failed else ''}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
