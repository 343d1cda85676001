"""The environment of a benchmark's compile child: FlyDSL targets one arch without a GPU, links
with an AMDGPU linker, and writes its cache where the benchmark says. Shared by the profiles.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def child_env(arch: str, cache: Path, rocm_path: str | None = None) -> dict:
    """The child's environment: FlyDSL targets `arch` without a GPU and links with the
    AMDGPU linker under `rocm_path` (default: aiter.toolchain.find_linker()'s)."""
    from aiter import flydsl_bridge as bridge
    from aiter.toolchain import find_linker

    env = dict(os.environ)
    env.update(bridge.target_env(arch))  # ARCH, FLYDSL_GPU_ARCH, COMPILE_ONLY=1
    env.update(ROCM_PATH=rocm_path or str(find_linker().rocm_path), PYTHONPATH=str(REPO))
    env[bridge.ENV_CACHE_DIR] = str(cache)
    return env
