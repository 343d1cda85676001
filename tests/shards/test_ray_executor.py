"""`--executor ray`: a build's shards as tasks on a Ray cluster of two nodes on 127.0.0.1, one
task's worker killed mid-build, the task retried, the caches merged into one that `--check`
passes; and the executor's usage errors."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aiter.aot.flydsl.distribution import ray_executor
from aiter.aot.flydsl.execution.options import UsageError
from tests.aot_cli import REPO, run_aot, start_aot

TABLES = {"AITER_CONFIG_DIR": str(REPO / ".ci" / "audit_tables"), "GPU_ARCHS": "gfx942"}
RAY = str(Path(sys.executable).with_name("ray"))
# A cluster on 127.0.0.1 for this test alone: no usage reports, no token authentication.
QUIET = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def cluster():
    """A head node and a second node, each with one CPU, on this machine."""
    port = _free_port()
    env = {**os.environ, **QUIET}
    common = ["--num-cpus", "1", "--disable-usage-stats"]
    head = [RAY, "start", "--head", "--port", str(port), "--include-dashboard=false", *common]
    subprocess.run(head, env=env, check=True, capture_output=True, timeout=120)
    try:
        node = [RAY, "start", "--address", f"127.0.0.1:{port}", *common]
        subprocess.run(node, env=env, check=True, capture_output=True, timeout=120)
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([RAY, "stop", "--force"], env=env, capture_output=True, timeout=120)


def _task_workers() -> list[int]:
    """The Ray workers running a shard task; not a worker's child between its fork and exec,
    which bears the same title for a moment."""
    found = subprocess.run(["pgrep", "-f", "ray::run_shard"], capture_output=True, text=True)
    pids = {int(pid) for pid in found.stdout.split()}
    return sorted(pid for pid in pids if _parent(pid) not in pids)


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


@pytest.mark.slow  # a Ray cluster and two shard builds
def test_shards_on_two_nodes_survive_a_killed_worker(cluster, tmp_path) -> None:
    cache = tmp_path / "cache"
    args = ("--module", "gemm", "--executor", "ray", "--ray-address", cluster, "--shards", "2",
            "-j", "1", "--cache-dir", str(cache))  # fmt: skip
    proc = start_aot("aiter.aot.flydsl", *args, env={**TABLES, **QUIET},
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 300
    while len(_task_workers()) < 2 and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.5)
    workers = _task_workers()
    assert len(workers) == 2, "both shard tasks should run at once, one per node"
    time.sleep(5)  # the builds are under way
    os.kill(workers[0], signal.SIGKILL)
    out, err = proc.communicate(timeout=1200)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert "ray: 2 shard tasks (2 per arch) on 2 node(s)" in err
    assert "complete build: gemm for gfx942" in out
    check = run_aot("aiter.aot.flydsl", "--module", "gemm", "--check", "--cache-dir", str(cache),
                    env=TABLES)  # fmt: skip
    assert check.returncode == 0, check.stdout[-3000:]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--ray-address", "x"], "--ray-address and --shards go with --executor ray"),
        (["--executor", "ray", "--check"], "--executor ray runs builds"),
        (["--executor", "ray", "--shard", "0/2"], "--executor ray shards the build itself"),
        (["--executor", "ray", "--shards", "0"], "--shards must be >= 1, got 0"),
    ],
)
def test_executor_usage_errors(args, expected, tmp_path) -> None:
    from aiter.aot.flydsl.execution.options import parse

    with pytest.raises(UsageError, match=expected):
        parse(None, [*args, "--cache-dir", str(tmp_path)])


def test_without_ray_the_executor_is_a_usage_error(monkeypatch, tmp_path) -> None:
    from aiter.aot.flydsl.execution.options import parse

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(UsageError, match=r"needs Ray, which is not installed: pip install"):
        parse(None, ["--executor", "ray", "--cache-dir", str(tmp_path)])


def test_a_shards_command_line_carries_the_builds_choices(tmp_path) -> None:
    from aiter.aot.flydsl.execution.options import parse

    table = tmp_path / "mine.csv"
    shutil.copy(REPO / ".ci" / "audit_tables" / "bf16_tuned_gemm.csv", table)
    build = parse(None, ["--module", "gemm", "--executor", "ray", "--max-m", "4096", "-j", "3",
                         "--csv", f"gemm_a16w16={table}", "--cache-dir", str(tmp_path)])  # fmt: skip
    args = ray_executor.task_arguments(build, "1/4", "C", "R")
    assert args[:8] == ["--module", "gemm", "--shard", "1/4", "--cache-dir", "C", "--report", "R"]
    assert "--max-m" in args and args[args.index("--max-m") + 1] == "4096"
    assert args[args.index("-j") + 1] == "3"
    assert f"bf16_tuned_gemm.csv={table}" in args
