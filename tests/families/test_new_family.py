"""Adding an operator family needs no change to aiter: a family written at test time as a package
of its own under tmp_path (kernels, entry, plan, table spec, generator and default table, and an
AOT module), registered through AITER_AOT_EXTRA_MODULES, is built, listed, audited and served.
"""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest

from aiter.flydsl_bridge import manifest
from tests.aot_cli import REPO, lines_starting, run_aot, run_aot_together, serve_from_cache

pytestmark = pytest.mark.slow  # compiles the family's kernels into a cache

COMBINED = "aiter.aot.flydsl"
NAME = "tinyscale"  # the family: its package, its AOT module `tinyscale_aot`, its reports
# The field of Family that names a module in reports (read here: it has been renamed before).
TABLE = "tiny_scale_tuned.csv"
MAX_ROWS = 16384  # what the deployment serves: --max-rows


def _kernel_module() -> str:
    """kernels/scale.py: the minimal real FlyDSL kernel and launcher of tests/fixtures/tiny_kernels.py
    (y = 2x; the `block` Constexpr, the work-group size, picks the specialization)."""
    text = (REPO / "tests" / "fixtures" / "tiny_kernels.py").read_text()
    kernel = text[text.index("@flyc.kernel\ndef scale_kernel") : text.index("@flyc.jit\ndef abort")]
    imports = "import flydsl.compiler as flyc\nimport flydsl.expr as fx\n\n\n"
    return f'"""y[i] = 2 * x[i]."""\n\n{imports}{kernel.rstrip()}\n'


# Everything a new family writes, by path under tmp_path (the default table comes from
# `python -m tinyscale.generate`). In aiter these would be aiter/ops/tinyscale/..., the AOT
# module aiter/aot/flydsl/tinyscale.py, the table aiter/configs/tiny_scale_tuned.csv.
SOURCES = {
    "tinyscale/__init__.py": '''
        """The tinyscale family: `tiny_scale(x)` doubles a float32 [rows, features] tensor."""
        ''',
    "tinyscale/table.py": '''
        """The tuned table of tinyscale: a block per (arch, CU count, features) and bucket of
        rows. No torch here: the AOT driver reads it to decide whether a cache is complete."""

        from pathlib import Path

        from aiter.tuning import BucketAxis, Column, TableSpec

        TINY_SCALE = TableSpec(
            name="tiny_scale_tuned.csv",
            short_name="tiny_scale",
            aot_module="tinyscale",
            env_var="AITER_CONFIG_TINY_SCALE",
            columns=(
                Column("gfx", "str"),
                Column("cu_num", "int", minimum=1),
                Column("features", "int", minimum=1),
                Column("rows", "int", minimum=1),
                Column("block", "int", minimum=64, maximum=512),
            ),
            key=("gfx", "cu_num", "features", "rows"),
            axis=BucketAxis(name="rows", column="rows"),
            directory=Path(__file__).resolve().parent / "configs",
        )
        ''',
    "tinyscale/plan.py": '''
        """How tiny_scale picks its block: the row serving the call's rows, else the heuristic."""

        from dataclasses import dataclass

        from aiter import device
        from tinyscale.table import TINY_SCALE

        HEURISTIC_SWITCH = 16384  # untuned shapes: 256 threads up to this many rows, 512 above


        @dataclass(frozen=True)
        class Choice:
            block: int
            source: str  # "table" or "heuristic"
            row: str | None  # "file:line" of the row that served


        def choose(rows: int, features: int) -> Choice:
            key = {"gfx": device.arch(), "cu_num": device.cu_num(), "features": features}
            row = TINY_SCALE.lookup(key, rows)
            if row is None:
                return Choice(256 if rows <= HEURISTIC_SWITCH else 512, "heuristic", None)
            return Choice(row.int("block"), "table", f"{row.source}:{row.line}")
        ''',
    "tinyscale/generate.py": '''
        """Writes the default tinyscale table: `python -m tinyscale.generate [DIRECTORY]`."""

        import sys
        from pathlib import Path

        from tinyscale.table import TINY_SCALE

        ROWS = (("gfx942", 304, 8, 64, 64), ("gfx942", 304, 8, 4096, 128))


        def write(directory: Path) -> None:
            lines = [TINY_SCALE.header, *ROWS]
            directory.mkdir(parents=True, exist_ok=True)
            text = "".join(",".join(map(str, line)) + "\\n" for line in lines)
            (directory / TINY_SCALE.name).write_text(text)


        if __name__ == "__main__":
            write(Path(sys.argv[1]) if sys.argv[1:] else TINY_SCALE.default_path.parent)
        ''',
    "tinyscale/entry.py": '''
        """Public entry of tinyscale: validate, plan, allocate, report, launch."""

        import torch

        from aiter import dispatch
        from tinyscale import plan
        from tinyscale.kernels.scale import scale
        from tinyscale.table import TINY_SCALE


        def tiny_scale(x: torch.Tensor) -> torch.Tensor:
            if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.dim() != 2:
                raise TypeError("x must be a float32 tensor of shape [rows, features]")
            rows, features = (int(d) for d in x.shape)
            choice = plan.choose(rows, features)
            y = torch.empty_like(x)
            dispatch.report(
                lambda: dispatch.DispatchRecord(
                    "tiny_scale", dispatch.BACKEND_FLYDSL, f"tiny_scale_{choice.block}",
                    choice.source, choice.row, {"block": choice.block}, table=TINY_SCALE.short_name,
                )
            )
            scale(x.view(-1), y.view(-1), rows * features, choice.block)
            return y
        ''',
    "tinyscale/kernels/__init__.py": '''
        """The FlyDSL kernels of tinyscale."""
        ''',
    "tinyscale/kernels/scale.py": _kernel_module(),
    "tinyscale_aot.py": '''
        """AOT replay of tinyscale: each row becomes calls of `tiny_scale` on FakeTensors over the
        rows it serves. `python -m aiter.aot.flydsl --module tinyscale` (registered through
        AITER_AOT_EXTRA_MODULES=tinyscale_aot), or `python -m tinyscale_aot`."""

        import sys

        from aiter.aot.flydsl.jobs.family import Family
        from tinyscale.table import TINY_SCALE


        def caller(spec, row, variant):
            features = row.int("features")

            def call(rows: int) -> None:
                import torch

                from tinyscale.entry import tiny_scale

                tiny_scale(torch.empty((rows, features), dtype=torch.float32, device="cuda"))

            return call


        FAMILY = Family(
            name="tinyscale", tables=(TINY_SCALE,), caller=caller, sources=("tinyscale",)
        )


        def run(argv=None) -> int:
            from aiter.aot.flydsl.driver import main

            return main(["tinyscale_aot"], argv)


        if __name__ == "__main__":
            sys.exit(run())
        ''',
}
GENERATED = "tinyscale/configs/" + TABLE
SKIPPED = {"__pycache__", "build", "dist"}  # besides hidden directories (.venv, .git)

SERVE = """
import sys, torch
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
from tinyscale.entry import tiny_scale
features = int(sys.argv[1])
with dry_run("gfx942", 304, bridge.MODE_COMPILE):
    for rows in map(int, sys.argv[2:]):
        tiny_scale(torch.empty((rows, features), dtype=torch.float32, device="cuda"))
        print("served", rows, flush=True)
"""


def _files(root: Path) -> set[str]:
    return {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """The family's package written, its default table generated, and a build into a fresh cache."""
    root = tmp_path_factory.mktemp("family")
    for rel, text in SOURCES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text).lstrip())
    env = {
        "PYTHONPATH": str(root),
        "PYTHONDONTWRITEBYTECODE": "1",
        "AITER_AOT_EXTRA_MODULES": "tinyscale_aot",
        "GPU_ARCHS": "gfx942",
    }
    generated = run_aot("tinyscale.generate", env=env)
    assert generated.returncode == 0, generated.stderr
    work = tmp_path_factory.mktemp("work")
    cache = work / "cache"
    args = ("--module", NAME, "--max-rows", str(MAX_ROWS), "-j", "2")
    build = run_aot(COMBINED, *args, "--cache-dir", str(cache), env=env)
    listing, check = run_aot_together(
        [
            (COMBINED, [*args, "--list", "--cache-dir", str(work / "listed")], env),
            (COMBINED, [*args, "--check", "--sample", "3", "--cache-dir", str(cache)], env),
        ]
    )
    return {"root": root, "env": env, "work": work, "cache": cache, "build": build,
            "list": listing, "check": check}  # fmt: skip


def _blocks(text: str) -> set[int]:
    return {int(b) for b in re.findall(r"\bblock=(\d+)", text)}


def test_the_family_is_nine_files_and_aiter_is_unchanged(family):
    root = family["root"]
    assert _files(root) == {*SOURCES, GENERATED}
    assert len(_files(root)) == 9
    assert (root / GENERATED).read_text().splitlines() == [
        "gfx,cu_num,features,rows,block",
        "gfx942,304,8,64,64",
        "gfx942,304,8,4096,128",
    ]
    # Nothing of the repository names the family: no registry line, no public name, no table.
    this = Path(__file__).resolve()
    for directory, subdirectories, names in os.walk(REPO):
        subdirectories[:] = [d for d in subdirectories if d not in SKIPPED and d[0] != "."]
        for path in (Path(directory) / name for name in names):
            assert NAME not in path.name, path
            if path.suffix in (".py", ".csv", ".toml", ".cpp", ".md") and path != this:
                assert NAME not in path.read_text(errors="replace"), path


def test_a_build_compiles_the_familys_kernels_into_a_fresh_cache(family):
    build, cache = family["build"], family["cache"]
    assert build.returncode == 0, build.stdout + build.stderr
    built = manifest.read(cache)
    assert set(built.archs) == {"gfx942"} and set(built.archs["gfx942"]) == {NAME}
    entries = built.archs["gfx942"][NAME]
    # Rows 1-64 take block 64, 65-4096 block 128, above the top row the heuristic's 256.
    assert len(entries) == 3 and all((cache / rel).is_file() for rel in entries)
    asked = {e.requested_by[0].row.rsplit("/", 1)[1] for e in entries.values()}
    assert asked == {f"{TABLE}:2", f"{TABLE}:3"}


def test_list_names_the_kernels(family):
    listing = family["list"]
    assert listing.returncode == 0, listing.stdout + listing.stderr
    assert "rows 1-64: scale[x=float32 y=float32 block=64]" in listing.stdout
    assert _blocks(listing.stdout) == {64, 128, 256}
    assert not (family["work"] / "listed" / "aiter_aot_manifest.json").exists()


def test_the_dense_audit_passes(family):
    check = family["check"]
    assert check.returncode == 0, check.stdout + check.stderr
    assert not lines_starting(check.stdout, "MISSING")
    assert not lines_starting(check.stdout, "SAMPLED")


def test_calls_are_served_from_the_cache_alone_and_an_absent_kernel_misses(family, tmp_path):
    env, cache = family["env"], family["cache"]
    rows = ["1", "64", "65", "1000", "4096", "5000", str(MAX_ROWS)]
    served = serve_from_cache(SERVE, ["8", *rows], env, cache, tmp_path)
    assert served.returncode == 0, served.stderr[-3000:]
    assert lines_starting(served.stdout, "served") == [f"served {r}" for r in rows]
    # Above --max-rows the heuristic asks for block 512, which the build did not compile.
    missed = serve_from_cache(SERVE, ["8", str(MAX_ROWS + 1)], env, cache, tmp_path)
    assert missed.returncode != 0 and "FLYDSL_RUNTIME_RUN_ONLY=1" in missed.stderr, missed.stderr
    assert os.listdir(tmp_path) == ["serve.py"]


def test_editing_the_familys_plan_is_not_up_to_date(family):
    """Runs last: it changes the family's heuristic (block 192 in place of 256)."""
    plan = family["root"] / "tinyscale/plan.py"
    plan.write_text(plan.read_text().replace("256 if rows <=", "192 if rows <="))
    args = ("--module", NAME, "--max-rows", str(MAX_ROWS), "--cache-dir", str(family["cache"]))
    rebuild = run_aot(COMBINED, *args, env=family["env"])
    assert rebuild.returncode == 0, rebuild.stdout + rebuild.stderr
    assert "up to date" not in rebuild.stdout + rebuild.stderr
    assert run_aot(COMBINED, *args, "--check", env=family["env"]).returncode == 0
