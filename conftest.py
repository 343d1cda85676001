"""Shared test setup: hypothesis profiles, the `gpu` marker skips where no AMD GPU is visible, `slow` marks what the
inner loop (`pytest -m "not slow"`) leaves out, and the AMDGPU linker is found once a session.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from hypothesis import settings

# CI replays the same generated examples on every run (a red CI then always names a real,
# reproducible bug); a local run explores new examples each time.
settings.register_profile("ci", derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@functools.cache
def amd_gpu_visible() -> bool:
    """A ROCm build of torch that sees a device: what running a kernel needs."""
    if not Path("/dev/kfd").exists():
        return False
    import torch

    return torch.version.hip is not None and torch.cuda.is_available()


def pytest_collection_modifyitems(config, items) -> None:
    if amd_gpu_visible():
        return
    skip = pytest.mark.skip(reason="needs an AMD GPU (gfx942/gfx950/gfx1250); none is visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def rocm_path(tmp_path_factory) -> str:
    """ROCM_PATH of an AMDGPU-capable linker for kernel compiles (skips the test without one)."""
    from op_tests.compile_child import linker_rocm_path

    return linker_rocm_path(tmp_path_factory.mktemp("lld"))
