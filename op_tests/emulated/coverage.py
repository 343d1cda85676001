"""How much of an arch's default kernel cache the emulated numerics suite executes.

The builder's `--list --report` names every kernel the default tables reach (its cache entry:
`<function>_<digest>/<file>`); the suite's report names every kernel its cases launched. The
coverage of a family is the share of its listed entries the suite ran; the rest are printed
with their parameters, the kernels no emulated case has proven yet, and so are the cases that
failed (a wrong result, an error, a listed kernel its call did not launch) and the listed
kernels no public call reaches, with the reason. Exits 1 when a case failed.

    python -m op_tests.emulated.coverage SUITE_REPORT LISTING_REPORT [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

from aiter.verify.execute import failed


@dataclass
class FamilyCoverage:
    listed: dict[str, str] = field(default_factory=dict)  # entry -> params
    executed: set[str] = field(default_factory=set)

    @property
    def share(self) -> float:
        return len(self.executed) / len(self.listed) if self.listed else 1.0

    def unreached(self) -> list[tuple[str, str]]:
        return sorted((e, p) for e, p in self.listed.items() if e not in self.executed)


def listed_entries(listing: dict, arch: str) -> dict[str, dict[str, str]]:
    """module -> {cache entry -> params} of every kernel `--list` names for `arch`."""
    out: dict[str, dict[str, str]] = {}
    for report in listing["archs"]:
        if report["arch"] != arch:
            continue
        for result in report["results"]:
            entries = out.setdefault(result["job"]["module"], {})
            for segment in result["segments"]:
                for kernel in segment["kernels"]:
                    entry = f"{Path(kernel['cache_dir']).name}/{kernel['file']}"
                    entries[entry] = kernel["params"]
    return out


def coverage(suite: dict, listing: dict) -> dict[str, FamilyCoverage]:
    """Per builder module, the listed entries and those of them the suite executed."""
    ran = {k["entry"] for case in suite["cases"] for k in case["kernels"]}
    families = {}
    for module, entries in listed_entries(listing, suite["arch"]).items():
        families[module] = FamilyCoverage(entries, ran & entries.keys())
    return families


def render(arch: str, families: dict[str, FamilyCoverage], suite: dict | None = None) -> str:
    lines = [f"{arch}: emulated kernels of the default cache"]
    total_listed = sum(len(f.listed) for f in families.values())
    total_run = sum(len(f.executed) for f in families.values())
    for module, family in sorted(families.items()):
        lines.append(
            f"  {module:<12} {len(family.executed):4d} / {len(family.listed):4d}"
            f"  ({100 * family.share:5.1f} %)"
        )
    share = total_run / total_listed if total_listed else 1.0
    lines.append(f"  {'all':<12} {total_run:4d} / {total_listed:4d}  ({100 * share:5.1f} %)")
    for module, family in sorted(families.items()):
        for entry, params in family.unreached():
            lines.append(f"  not executed: {module} {entry} {params}")
    for case in (suite or {}).get("cases", []):
        if case.get("unreachable"):
            lines.append(f"  unreachable: {case['case']}: {case['unreachable']}")
        elif failed(case):
            lines.append(f"  FAILED: {case['case']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite_report", type=Path)
    parser.add_argument("listing_report", type=Path)
    parser.add_argument("--out", type=Path, help="write the text here as well")
    args = parser.parse_args(argv)
    suite = json.loads(args.suite_report.read_text())
    families = coverage(suite, json.loads(args.listing_report.read_text()))
    text = render(suite["arch"], families, suite)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 1 if any(failed(case) for case in suite["cases"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
