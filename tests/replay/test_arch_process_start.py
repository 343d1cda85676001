"""Arch processes forked from a warm driver behave as the fresh interpreters they replace."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from aiter.aot.flydsl.jobs.records import EXIT_USAGE
from aiter.aot.flydsl.replay import spawn as arch_process


def _forked(body) -> arch_process.ForkedProcess:
    pid = os.fork()
    if pid == 0:
        try:
            body()
        finally:
            os._exit(0)
    return arch_process.ForkedProcess(pid)


def test_exit_statuses_read_as_popen_reads_them():
    assert _forked(lambda: os._exit(3)).wait() == 3
    killed = _forked(lambda: signal.pause())
    assert killed.poll() is None
    killed.kill()
    assert killed.wait() == -signal.SIGKILL
    killed.kill()  # reaped: nothing left to kill, and no error
    assert killed.poll() == -signal.SIGKILL


def test_forking_is_off_when_asked_or_with_other_threads(monkeypatch):
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.delenv(arch_process.WARM_FORK_ENV, raising=False)
    assert arch_process.can_fork()
    monkeypatch.setenv(arch_process.WARM_FORK_ENV, "0")
    assert not arch_process.can_fork()
    monkeypatch.delenv(arch_process.WARM_FORK_ENV)
    monkeypatch.setattr(threading, "active_count", lambda: 2)
    assert not arch_process.can_fork()


def test_a_forked_arch_process_runs_the_arch_process_main(tmp_path, monkeypatch, capfd):
    """It takes the environment it is given, closes the driver's fds and exits as
    `python -m aiter.aot.flydsl.replay.arch_process` would (here: a usage error for a missing spec).
    """
    monkeypatch.setattr(arch_process, "can_fork", lambda: True)
    drivers_read, drivers_write = os.pipe()
    env = {**os.environ, "AITER_TEST_MARK": "forked"}
    spec = tmp_path / "missing.json"
    proc = arch_process.start(str(spec), env, (), [drivers_read])
    assert isinstance(proc, arch_process.ForkedProcess)
    assert proc.wait() == EXIT_USAGE
    assert f"{spec}: no arch process spec" in capfd.readouterr().err
    assert "AITER_TEST_MARK" not in os.environ  # the driver's own environment is untouched
    os.close(drivers_read)
    os.close(drivers_write)


@pytest.mark.slow
def test_warming_up_reads_nothing_an_arch_decides():
    """After `warm_up` the driver has imported every family's runtime, its kernel modules
    included, but resolved no FlyDSL target, read no cache directory, entered no dry run and
    read no serving setting."""
    script = textwrap.dedent("""
        import pkgutil, sys
        import aiter.ops
        from aiter.aot.flydsl import registry
        from aiter.aot.flydsl.replay import spawn as arch_process
        arch_process.warm_up(registry.MODULES.values())
        kernels = [info.name for info in pkgutil.walk_packages(aiter.ops.__path__, "aiter.ops.")
                   if ".kernels." in info.name]
        assert kernels and all(k in sys.modules for k in kernels), kernels
        import flydsl.runtime.device as device
        from aiter.aot.flydsl.dry_run import context as dry_run
        from aiter import jit_monitor
        from aiter.flydsl_bridge import internals
        JitFunction = internals.jit_function().JitFunction
        jits = [
            value
            for name, module in list(sys.modules.items())
            if name.startswith("aiter.ops.")
            for value in vars(module).values()
            if isinstance(value, JitFunction)
        ]
        assert jits
        assert all(j._backend_target is None and j.cache_manager is None for j in jits)
        assert device._arch_from_hardware.cache_info().currsize == 0
        assert dry_run._process_arch is None
        assert jit_monitor._settings is None
        assert "torch._dynamo" in sys.modules
        print("ok")
        """)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
