"""aiter's own tuned tables, read as they are: per file, the rows read, the rows by the backend
each names and the rows set aside (with why); then `--list --aiter-configs DIR` per arch, timed,
with the kernels it names.

    .venv/bin/python benchmarks/upstream_tables.py DIR [--arch gfx942,gfx950] [--json PATH]

DIR is a directory laid out as aiter's `aiter/configs` (a checkout of ROCm/aiter holds one).
Nothing here compiles; the figures are this machine's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from aiter.aot.flydsl import registry  # noqa: E402


def file_figures(configs: Path) -> list[dict]:
    """Per file aiter's runtime merges into one of this library's tables."""
    figures = []
    for path in registry.MODULES.values():
        for spec in registry.load(path).tables:
            for file in spec.aiter_files(configs):
                table = spec.load([str(file)])
                rows = [row for row in table.rows if row.source == str(file)]
                aside = [reason for row, reason in table.set_aside if row.source == str(file)]
                backends = Counter(spec.backend_of(r) for r in rows) if spec.backend_of else {}
                figures.append(
                    dict(
                        table=spec.short_name,
                        file=str(file.relative_to(configs)),
                        rows=len(rows) + len(aside),
                        served=len(rows),
                        backends=dict(backends),
                        set_aside=dict(Counter(aside)),
                    )
                )
    return figures


def list_arch(configs: Path, arch: str) -> dict:
    """`--list --aiter-configs` for one arch: seconds, jobs and kernels named, from its report."""
    with tempfile.TemporaryDirectory(prefix="upstream_list_") as tmp:
        report = Path(tmp) / "report.json"
        env = {**os.environ, "GPU_ARCHS": arch}
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "aiter.aot.flydsl", "--list", "--aiter-configs", str(configs),
             "--cache-dir", str(Path(tmp) / "cache"), "--report", str(report)],
            cwd=REPO, env=env, capture_output=True, text=True,
        )  # fmt: skip
        seconds = time.perf_counter() - start
        if not report.exists():
            raise SystemExit(f"--list for {arch} wrote no report:\n{proc.stderr[-3000:]}")
        data = json.loads(report.read_text())
    rows = data.get("summary", [])
    tags = Counter()
    for row in rows:
        for tag in ("OK", "SKIP", "REFUSED", "UNREACHED", "FAIL"):
            tags[tag] += int(row.get(tag, 0))
    return dict(
        arch=arch,
        seconds=round(seconds, 1),
        exit=proc.returncode,
        jobs=sum(int(r.get("jobs", 0)) for r in rows),
        kernels=sum(int(r.get("kernels", 0)) for r in rows),
        tags=dict(tags),
        table_lines=[line for line in proc.stdout.splitlines() if line.startswith("table ")],
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", type=Path, help="aiter's aiter/configs directory")
    parser.add_argument("--arch", default="gfx942,gfx950,gfx1250")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    files = file_figures(args.configs)
    print(f"{'table':<22} {'file':<70} {'rows':>6} {'served':>6}  backends; set aside")
    for f in files:
        backends = ", ".join(f"{b} {n}" for b, n in Counter(f["backends"]).most_common())
        aside = "; ".join(f"{n} x {r}" for r, n in f["set_aside"].items())
        print(f"{f['table']:<22} {f['file']:<70} {f['rows']:>6} {f['served']:>6}  {backends}"
              + (f"; set aside {aside}" if aside else ""))  # fmt: skip
    lists = [list_arch(args.configs, arch) for arch in args.arch.split(",")]
    for item in lists:
        print(f"--list {item['arch']}: {item['seconds']} s, exit {item['exit']}, {item['jobs']} "
              f"jobs, {item['kernels']} kernels, tags {item['tags']}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"files": files, "lists": lists}, indent=1))
    return 0 if all(item["exit"] == 0 for item in lists) else 1


if __name__ == "__main__":
    sys.exit(main())
