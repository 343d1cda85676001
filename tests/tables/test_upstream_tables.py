"""aiter's own tuned tables, when a copy of its aiter/configs is at hand (AITER_UPSTREAM_CONFIGS):
every file each table merges loads, and `--list` over them exits 0 for gfx942 and gfx950.
benchmarks/upstream_tables.py prints the figures per file and per arch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aiter.aot.flydsl import registry
from aiter.tuning.csvio import read_table_file
from tests.aot_cli import run_aot

UPSTREAM_ENV = "AITER_UPSTREAM_CONFIGS"
CONFIGS = os.environ.get(UPSTREAM_ENV, "")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not CONFIGS, reason=f"{UPSTREAM_ENV} names no copy of aiter's aiter/configs directory"
    ),
]
SPECS = [spec for path in registry.MODULES.values() for spec in registry.load(path).tables]


@pytest.mark.parametrize("spec", [s for s in SPECS if s.aiter_name], ids=lambda s: s.short_name)
def test_every_upstream_file_of_a_table_loads(spec):
    files = spec.aiter_files(Path(CONFIGS))
    assert files, f"{CONFIGS} holds no {spec.aiter_name} file"
    table = spec.load([str(f) for f in files])
    read = {row.source for row in table.rows} | {row.source for row, _ in table.set_aside}
    with_rows = {str(f) for f in files if read_table_file(f, "the test").records}
    assert with_rows <= read


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_listing_the_upstream_tables_fails_no_job(arch, tmp_path):
    proc = run_aot(
        "aiter.aot.flydsl", "--list", "--aiter-configs", CONFIGS,
        "--cache-dir", str(tmp_path), env={"GPU_ARCHS": arch}, timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
