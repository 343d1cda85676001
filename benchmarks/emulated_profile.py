"""Dynamic figures per kernel from emulated runs: what each launch actually executed on aiter's
emulator (op_tests/emulated/runner.py reports, or the builder's `--check --execute --report`),
summed per kernel.

Per kernel: wave-instructions issued by class, the MFMA share of them, global bytes loaded and
stored, LDS bytes, LDS bank-conflict cycles per LDS phase (aiter.emulator.banks: a model of
32 banks on gfx942 and 64 on gfx950), and a roofline ESTIMATE from those dynamic figures: the
MFMA flops over the global bytes moved, against the spec-sheet peaks of
aiter.flydsl_bridge.listing (every global byte counted as HBM traffic, caches ignored; an
upper-bound estimate under that assumption, not a timing). The shapes are the small ones the
emulated cases run, so the figures describe those calls, not production sizes.

    .venv/bin/python benchmarks/kernel_profile.py --emulated REPORT.json [...]
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from aiter.flydsl_bridge.listing import SPEC_SHEET_PEAKS, mma_flops, mma_precision

CLASSES = ("mfma", "valu", "salu", "smem", "vmem", "lds", "control")
_CONTROL = ("s_waitcnt", "s_barrier", "s_branch", "s_cbranch", "s_endpgm", "s_nop", "s_setprio",
            "s_sleep", "s_sethalt")  # fmt: skip


def instruction_class(mnemonic: str) -> str:
    if mnemonic.startswith(("v_mfma", "v_smfmac")):
        return "mfma"
    if mnemonic.startswith(_CONTROL):
        return "control"
    if mnemonic.startswith(("s_load", "s_buffer_load", "s_store", "s_buffer_store")):
        return "smem"
    if mnemonic.startswith("s_"):
        return "salu"
    if mnemonic.startswith("ds_"):
        return "lds"
    if mnemonic.startswith(("buffer_", "global_", "flat_", "scratch_")):
        return "vmem"
    return "valu"


def kernel_rows(reports: list[dict]) -> list[dict]:
    """One row per (arch, kernel): its launches' figures summed."""
    totals: dict[tuple[str, str], dict] = {}
    for report in reports:
        arch = report["arch"]
        records = report["cases"] if "cases" in report else report["records"]
        for record in records:
            for launch in record.get("profile", []):
                row = totals.setdefault((arch, launch["kernel"]), {
                    "arch": arch, "kernel": launch["kernel"], "launches": 0,
                    "by_mnemonic": Counter(), "counts": Counter(),
                })  # fmt: skip
                row["launches"] += 1
                row["by_mnemonic"].update(launch["by_mnemonic"])
                row["counts"].update(launch["counts"])
    return [_figures(row) for _, row in sorted(totals.items())]


def _figures(row: dict) -> dict:
    by_class = Counter()
    flops, precisions = 0, set()
    for mnemonic, count in row["by_mnemonic"].items():
        by_class[instruction_class(mnemonic)] += count
        if instruction_class(mnemonic) == "mfma":
            flops += count * mma_flops(mnemonic)
            precisions.add(mma_precision(mnemonic))
    counts = row["counts"]
    issued = sum(by_class.values())
    global_bytes = counts["global_load_bytes"] + counts["global_store_bytes"]
    figures = {
        "arch": row["arch"],
        "kernel": row["kernel"],
        "launches": row["launches"],
        "instructions": issued,
        "by_class": {c: by_class[c] for c in CLASSES},
        "mfma_share": by_class["mfma"] / issued if issued else 0.0,
        "global_load_bytes": counts["global_load_bytes"],
        "global_store_bytes": counts["global_store_bytes"],
        "lds_bytes": counts["lds_read_bytes"] + counts["lds_write_bytes"],
        "lds_phases": counts["lds_phases"],
        "bank_conflict_cycles": counts["lds_bank_conflict_cycles"],
        "mfma_flops": flops,
    }
    figures["roofline_estimate"] = _roofline(row["arch"], flops, global_bytes, precisions)
    return figures


def _roofline(arch: str, flops: int, nbytes: int, precisions: set) -> dict | None:
    """min(peak, intensity x HBM bandwidth) / peak: an ESTIMATE (see the module docstring)."""
    peaks = SPEC_SHEET_PEAKS.get(arch)
    if peaks is None or len(precisions) != 1 or None in precisions or not nbytes:
        return None
    (precision,) = precisions
    intensity = flops / nbytes
    peak, bandwidth = peaks[precision], peaks["hbm"]
    return {
        "device": peaks["device"],
        "precision": precision,
        "flop_per_byte": intensity,
        "fraction_of_peak": min(peak, intensity * bandwidth) / peak,
    }


def format_rows(rows: list[dict]) -> str:
    header = (f"{'arch':<7} {'kernel':<44} {'launch':>6} {'instr':>9} {'mfma%':>6} "
              f"{'valu%':>6} {'vmem%':>6} {'lds%':>5} {'global KB':>10} {'lds KB':>8} "
              f"{'conflict/phase':>14}  roofline (estimate)")  # fmt: skip
    lines = [header, "-" * len(header)]
    for r in rows:
        n = r["instructions"] or 1
        share = {c: 100 * r["by_class"][c] / n for c in CLASSES}
        phases = r["lds_phases"]
        conflicts = f"{r['bank_conflict_cycles'] / phases:.2f}" if phases else "-"
        roof = r["roofline_estimate"]
        roof_text = (f"{roof['precision']} {roof['flop_per_byte']:.1f} flop/B, "
                     f"{100 * roof['fraction_of_peak']:.0f}% of {roof['device']} peak"
                     if roof else "-")  # fmt: skip
        kb = (r["global_load_bytes"] + r["global_store_bytes"]) / 1024
        lines.append(
            f"{r['arch']:<7} {r['kernel'][:44]:<44} {r['launches']:>6} {r['instructions']:>9} "
            f"{share['mfma']:>6.1f} {share['valu']:>6.1f} {share['vmem']:>6.1f} "
            f"{share['lds']:>5.1f} {kb:>10.1f} {r['lds_bytes'] / 1024:>8.1f} {conflicts:>14}  "
            f"{roof_text}"
        )
    return "\n".join(lines)


def main(paths: list[Path], json_out: Path | None = None) -> int:
    reports = []
    for path in paths:
        document = json.loads(Path(path).read_text())
        if "executed" in document:  # the builder's --report of --check --execute
            reports += [{"arch": a, "records": r} for a, r in document["executed"].items()]
        else:  # op_tests/emulated/runner.py's report
            reports.append(document)
    rows = kernel_rows(reports)
    print(format_rows(rows))
    if json_out:
        json_out.write_text(json.dumps(rows, indent=1))
    return 0
