"""A kernel's first call in a process reads only the cache entry it needs: FlyDSL's load_all,
which unpickles every entry of the kernel's directory, is replaced once a kernel module of
aiter is imported; an entry is still read when a call asks for it."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from aiter.flydsl_bridge import jit_function, startup

REPO = Path(__file__).resolve().parents[2]
JCM = jit_function().JitCacheManager


@pytest.fixture
def entries(tmp_path) -> Path:
    directory = tmp_path / "kernel_abc"
    directory.mkdir()
    for i in range(3):
        (directory / f"{i}.pkl").write_bytes(pickle.dumps({"entry": i}))
    (directory / "broken.pkl").write_bytes(b"not a pickle")
    return directory


def _counting_loads(monkeypatch) -> list[int]:
    loads = [0]
    real = pickle.load

    def counting(handle):
        loads[0] += 1
        return real(handle)

    monkeypatch.setattr(jit_function().pickle, "load", counting)
    return loads


def test_flydsls_own_load_all_unpickles_every_entry(entries, monkeypatch) -> None:
    startup.install()
    loads = _counting_loads(monkeypatch)
    monkeypatch.setattr(JCM, "load_all", startup._original)
    assert JCM(entries).load_all() == 3  # the broken one is skipped, after trying it
    assert loads[0] == 4


def test_installed_the_first_use_reads_no_entry(entries, monkeypatch) -> None:
    startup.install()
    loads = _counting_loads(monkeypatch)
    assert JCM(entries).load_all() == 4
    assert JCM(entries.parent / "absent").load_all() == 0
    assert loads[0] == 0


def test_installed_a_call_still_reads_the_entry_it_needs(tmp_path, monkeypatch) -> None:
    startup.install()
    JCM(tmp_path / "kernel").set("key", {"artifact": 1})
    loads = _counting_loads(monkeypatch)
    assert JCM(tmp_path / "kernel").get("key") == {"artifact": 1}
    assert loads[0] == 1


@pytest.mark.slow  # imports torch and FlyDSL in a fresh process
def test_importing_a_kernel_module_installs_it() -> None:
    code = (
        "import aiter.ops.gemm.kernels.a16w16\n"
        "from aiter.flydsl_bridge import jit_function, startup\n"
        "print(jit_function().JitCacheManager.load_all is startup._count_entries)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert proc.stdout.strip() == "True"
