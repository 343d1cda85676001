"""Runs checks of emulated calls and the listed kernels' reachers, one arch per process (FlyDSL
freezes its target per process), and says which failed.

    python -m aiter.verify.execute ARCH TARGETS OUT

TARGETS is a JSON list of {"entry", "function", "params", "rows"} (a cache entry
`<function>_<digest>/<file>`, its FlyDSL function and compile-time parameters, the table rows
that reach it); OUT receives one record per target. A target passes when its reacher's call
launched that entry, loaded from the cache it was given (not compiled anew), and every check
held.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from aiter.verify.checks import CaseContext


def _entry(outcome) -> dict:
    request = outcome.request
    return {
        "function": request.function,
        "entry": f"{Path(request.cache_dir).name}/{request.file_name}",
        "params": " ".join(f"{k}={v}" for k, v in request.params),
        "cache": outcome.cache,
    }


def run_case(session: Any, ctx: CaseContext, body: Callable[[CaseContext], None]) -> dict:
    """Run one case body under `session` (an aiter.emulated session); its record: time, error
    or the reason it cannot reach its kernel, checks, kernels launched, instructions."""
    from aiter import flydsl_bridge as bridge
    from aiter.verify.reachers import Unreachable

    first, started = len(session.launches), time.perf_counter()
    error = unreachable = None
    with bridge.observe_launches() as outcomes:
        try:
            body(ctx)
        except Unreachable as exc:
            unreachable = str(exc)
        except Exception:  # noqa: BLE001  (reported per case, the run goes on)
            error = traceback.format_exc(limit=8)
    launches = session.launches[first:]
    return {
        "seconds": round(time.perf_counter() - started, 3),
        "error": error,
        "unreachable": unreachable,
        "checks": [
            {"what": c.what, "error": c.error, "tolerance": c.tolerance, "passed": c.passed,
             "first_bad": c.first_bad} for c in ctx.checks
        ],  # fmt: skip
        "kernels": [_entry(o) for o in outcomes],
        "instructions": sum(x.stats.instructions for x in launches),
        "launches": len(launches),
        "profile": [_profile(x) for x in launches],
    }


def _profile(launch: Any) -> dict:
    """What one launch executed, for benchmarks/kernel_profile.py --emulated."""
    stats = launch.stats
    return {
        "kernel": launch.kernel,
        "workgroups": stats.workgroups,
        "waves": stats.waves,
        "instructions": stats.instructions,
        "by_mnemonic": dict(stats.by_mnemonic),
        "counts": dict(stats.counts),
    }


def failed(record: dict) -> bool:
    """A record failed: it raised, a check missed its tolerance, or a target's call did not
    launch its target or checked nothing. An unreachable target is reported, not failed."""
    if record.get("unreachable"):
        return False
    if record["error"] or not all(c["passed"] for c in record["checks"]):
        return True
    return "target" in record and not (record["reached"] and record["checks"])


def run_target(session: Any, reachers: dict, target: dict, seed: int) -> dict:
    """One listed kernel: its reacher's small call, and whether it launched the kernel."""
    function, entry = target["function"], target["entry"]
    reacher = reachers.get(function)
    ctx = CaseContext(session.arch, torch.Generator().manual_seed(seed))
    if reacher is None:
        record = {"unreachable": f"no reacher for {function}", "error": None, "checks": [],
                  "kernels": [], "seconds": 0.0, "launches": 0, "instructions": 0}  # fmt: skip
    else:
        record = run_case(session, ctx, lambda c: reacher(c, target["params"]))
    outcome = [k["cache"] for k in record["kernels"] if k["entry"] == entry]
    return {**target, "target": entry, "reached": bool(outcome),
            "cache": outcome[0] if outcome else "", **record}  # fmt: skip


def run_targets(arch: str, targets: list[dict], require_hit: bool = False) -> list[dict]:
    """Every target's record, under one aiter.emulated(arch) session; with `require_hit`, a
    target its call compiled rather than loaded from the cache counts as not reached."""
    import aiter
    from aiter.verify.reachers import all_reachers

    reachers = all_reachers()
    records = []
    with aiter.emulated(arch) as session:
        for seed, target in enumerate(targets):
            record = run_target(session, reachers, target, seed)
            if require_hit and record["reached"] and record["cache"] != "hit":
                record["reached"] = False
                record["error"] = f"{record['target']} was {record['cache']}, not loaded"
            records.append(record)
    return records


def describe(record: dict) -> str:
    """One line on a failed or unreachable record: its target, rows, and what went wrong."""
    rows = record.get("rows") or []
    where = f" (rows {', '.join(rows[:3])}{' ...' if len(rows) > 3 else ''})" if rows else ""
    head = f"{record.get('function', '')} {record.get('target', record.get('case', ''))}{where}"
    if record.get("unreachable"):
        return f"{head}: unreachable: {record['unreachable']}"
    if record["error"]:
        return f"{head}: {record['error'].strip().splitlines()[-1]}"
    bad = [c for c in record["checks"] if not c["passed"]]
    if bad:
        c = bad[0]
        return (f"{head}: {c['what']}: error {c['error']:.3g} > tolerance {c['tolerance']:.3g}, "
                f"first differing element {c['first_bad']}")  # fmt: skip
    launched = ", ".join(k["entry"] for k in record["kernels"]) or "nothing"
    return f"{head}: the call launched {launched}, not the target"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("arch")
    parser.add_argument("targets", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--require-hit", action="store_true",
                        help="a target must load from the cache, not compile")  # fmt: skip
    args = parser.parse_args(argv)
    records = run_targets(args.arch, json.loads(args.targets.read_text()), args.require_hit)
    args.out.write_text(json.dumps(records, indent=1))
    return 1 if any(failed(r) for r in records) else 0


if __name__ == "__main__":
    raise SystemExit(main())
