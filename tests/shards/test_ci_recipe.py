"""The CI matrix recipe (docs/aot_matrix_workflow.yml) as GitHub Actions would run it: one job
per arch and shard, then a merge job. Each step's script runs under bash with `python` parsing
the aiter command lines as the real commands do (tests/shards/parse_only.py) and `pip`, `sudo`
doing nothing; every aiter command must parse."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from aiter.flydsl_bridge import manifest
from aiter.flydsl_bridge.manifest import KernelEntry, Requester

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "docs" / "aot_matrix_workflow.yml"
STUBS = f"""
python() {{ "{sys.executable}" "{REPO / 'tests' / 'shards' / 'parse_only.py'}" "$@"; }}
pip() {{ :; }}
sudo() {{ :; }}
nproc() {{ echo 2; }}
"""


def _expanded(script: str, values: dict[str, str]) -> str:
    """The script with the workflow's `${{ name }}` expressions as GitHub fills them."""
    return re.sub(r"\$\{\{\s*([\w.]+)\s*\}\}", lambda m: values[m.group(1)], script)


def _run_steps(
    job: dict, values: dict[str, str], env: dict[str, str], workspace: Path
) -> list[str]:
    parsed = []
    for step in job["steps"]:
        if "run" not in step:
            continue
        script = STUBS + _expanded(step["run"], values)
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=workspace,
            env={**os.environ, **env, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert proc.returncode == 0, f"{step.get('name')}: {proc.stderr[-3000:]}"
        parsed += [line for line in proc.stdout.splitlines() if line.startswith("PARSED ")]
    return parsed


@pytest.fixture
def workflow() -> dict:
    return yaml.safe_load(RECIPE.read_text())


@pytest.fixture
def workspace(tmp_path) -> Path:
    """A checkout of the serving project: its tuned tables (aiter's defaults)."""
    shutil.copytree(REPO / "aiter" / "configs", tmp_path / "tuned")
    return tmp_path


def _values(workflow: dict, workspace: Path, **matrix: object) -> tuple[dict, dict]:
    values = {"github.workspace": str(workspace), "github.sha": "0" * 40}
    values |= {f"matrix.{k}": str(v) for k, v in matrix.items()}
    env = {k: _expanded(str(v), values) for k, v in workflow["env"].items()}
    return values, env


def _estimates(directory: Path) -> None:
    asked = Requester("gemm", "bf16_tuned_gemm.csv", "tuned/bf16_tuned_gemm.csv:2", "M", 1, 16)
    entry = KernelEntry("gemm_a16w16", "", 1, "0" * 64, 2.0, [asked])
    manifest.update_manifest(directory, "gfx942", "gemm", {"k/x.pkl": entry}, {})


@pytest.mark.parametrize("with_estimates", [False, True])
def test_every_shard_job_parses(workflow, workspace, with_estimates) -> None:
    job = workflow["jobs"]["shard"]
    matrix = job["strategy"]["matrix"]
    assert len(matrix["shard"]) == int(workflow["env"]["SHARDS"])
    if with_estimates:
        _estimates(workspace / "estimates")
    for arch, shard in itertools.product(matrix["arch"], matrix["shard"]):
        values, env = _values(workflow, workspace, arch=arch, shard=shard)
        parsed = _run_steps(job, values, env, workspace)
        [build] = parsed
        assert f"--shard {shard}/4" in build
        assert ("--estimates estimates" in build) == with_estimates


def test_the_merge_job_parses_and_ships_the_audited_cache(workflow, workspace) -> None:
    job = workflow["jobs"]["merge"]
    assert job["needs"] == "shard"
    for arch, shard in itertools.product(["gfx942", "gfx950"], range(4)):
        (workspace / "shards" / f"cache-{arch}-{shard}").mkdir(parents=True)
    (workspace / "cache").mkdir()
    (workspace / "cache" / manifest.MANIFEST_NAME).write_text("{}")  # what merge writes
    values, env = _values(workflow, workspace)
    parsed = _run_steps(job, values, env, workspace)
    assert [line.split()[4] for line in parsed] == ["merge", "--cache-dir"]
    assert parsed[0].count("shards/cache-") == 8 and "--into cache" in parsed[0]
    assert "--check --sample 4" in parsed[1]
    wheel = next(s["run"] for s in job["steps"] if "pip wheel" in s.get("run", ""))
    assert "AITER_AOT_CACHE=$PWD/cache" in wheel
