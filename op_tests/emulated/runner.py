"""Runs the emulated numerics suite for one arch in this process (FlyDSL freezes its target per
process) and writes a JSON report: per case its checks, time, the kernels it launched (FlyDSL's
cache entries, compiled or loaded) and, for a failure, the error.

With `--listing` (the builder's `--list --report` for the arch), it then runs a listed case (a
reacher of aiter.verify, one reach module per family) for every listed kernel no case has
executed yet, or for `--sample N` of them per FlyDSL function: a small call that must launch
that very cache entry.

    python -m op_tests.emulated.runner ARCH REPORT [--only SUBSTRING] [--listing L [--sample N]]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from aiter.verify.execute import failed


def _listed_targets(listing: dict, arch: str, done: set[str], sample: int):
    """The listed kernels to run: those no case has executed, at most `sample` per function."""
    from aiter.verify.reachers import listed_kernels

    per_function: dict[str, int] = {}
    for entry, function, params in listed_kernels(listing, arch):
        if entry in done:
            continue
        if sample and per_function.get(function, 0) >= sample:
            continue
        per_function[function] = per_function.get(function, 0) + 1
        yield entry, function, params


def run(arch: str, only: str = "", listing: dict | None = None, sample: int = 0) -> dict:
    import aiter
    from aiter.verify.execute import run_case, run_target
    from aiter.verify.reachers import all_reachers
    from op_tests.emulated.suite import CaseContext, all_cases

    results = []
    with aiter.emulated(arch) as session:
        for index, case in enumerate(all_cases()):
            if arch not in case.archs or only not in case.id:
                continue
            ctx = CaseContext(arch, torch.Generator().manual_seed(index))
            results.append({"case": case.id, **run_case(session, ctx, case.run)})
        if listing is None:
            return {"arch": arch, "cases": results}
        reachers = all_reachers()
        done = {k["entry"] for r in results for k in r["kernels"]}
        for entry, function, params in list(_listed_targets(listing, arch, done, sample)):
            case_id = f"listed/{function}/{Path(entry).stem}"
            if entry in done or only not in case_id:  # done: an earlier listed call launched it
                continue
            target = {"entry": entry, "function": function, "params": params}
            record = run_target(session, reachers, target, len(results))
            done |= {k["entry"] for k in record["kernels"]}
            results.append({"case": case_id, **record})
    return {"arch": arch, "cases": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("arch")
    parser.add_argument("report", type=Path)
    parser.add_argument("--only", default="", help="run the cases whose id contains this")
    parser.add_argument("--listing", type=Path, help="the builder's --list --report for ARCH")
    parser.add_argument("--sample", type=int, default=0,
                        help="listed cases per FlyDSL function (0: every listed kernel)")  # fmt: skip
    args = parser.parse_args(argv)
    listing = json.loads(args.listing.read_text()) if args.listing else None
    report = run(args.arch, args.only, listing, args.sample)
    args.report.write_text(json.dumps(report, indent=1))
    for c in report["cases"]:
        worst = max((x["error"] / max(x["tolerance"], 1e-30) for x in c["checks"]), default=0.0)
        verdict = "  FAILED" if failed(c) else ""
        if c.get("unreachable"):
            verdict = f"  unreachable: {c['unreachable']}"
        print(
            f"{args.arch} {c['case']:<44} {c['seconds']:6.1f} s  {len(c['kernels'])} launches"
            f"  worst error/tolerance {worst:.3f}{verdict}"
        )
    return 1 if any(failed(c) for c in report["cases"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
