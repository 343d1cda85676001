"""Access to FlyDSL's private internals and the self-test that catches a FlyDSL upgrade moving
them: every module of the bridge reaches FlyDSL through `jit_function()`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from aiter.flydsl_bridge.env import (
    ENV_ARCH,
    ENV_CACHE_DIR,
    ENV_COMPILE_ONLY,
    ENV_GPU_ARCH,
    ENV_RUN_ONLY,
    KEY_ENV_VARS,
    TESTED_FLYDSL,
    cache_dir_from_env,
    flydsl_version,
)


class ReplayHookBroken(RuntimeError):
    """A FlyDSL internal the replay relies on moved or changed behaviour."""


def jit_function() -> ModuleType:
    """flydsl.compiler.jit_function, imported on first use: importing FlyDSL imports torch."""
    from flydsl.compiler import jit_function

    return jit_function


# FlyDSL 0.4.2 has no public way to ask which kernels a call needs; the hooks patch its cache
# manager. These are the attribute paths inside flydsl.compiler.jit_function they rely on; a
# path is checked only when its owner exists, so a moved class is reported once.
_REQUIRED = (
    "JitCacheManager",
    "JitFunction",
    "JitCacheManager.get",
    "JitCacheManager.compile_lock",
    "JitCacheManager._safe_key",
    "JitCacheManager.load_all",
    "JitFunction._compile_or_execute",
    "JitFunction._ensure_cache_manager",
    "JitFunction._ensure_sig",
    "_build_call_state",
    "_CACHE_INVALIDATING_ENV_VARS",
    "_TARGET_CACHE_INVALIDATING_ENV_VARS",
)


def _missing_internals(jf: ModuleType) -> list[str]:
    missing = []
    for path in _REQUIRED:
        *owner_path, attr = path.split(".")
        owner: Any = jf
        for part in owner_path:
            owner = getattr(owner, part, None)
        if owner is None:
            continue
        if not hasattr(owner, attr):
            missing.append(f"{owner.__name__}.{attr}")
    return missing


def _flydsl_key_env_vars(jf: ModuleType) -> tuple[str, ...]:
    per_arch = jf._TARGET_CACHE_INVALIDATING_ENV_VARS
    names = list(jf._CACHE_INVALIDATING_ENV_VARS)
    for arch_names in per_arch.values():
        names.extend(arch_names)
    return tuple(names)


def _check_env_names() -> None:
    """FlyDSL's own declarations of the variables aiter names, against the ENV_* constants."""
    from flydsl.runtime import device
    from flydsl.utils import env

    declared = {
        ENV_CACHE_DIR: (env.runtime, "cache_dir"),
        ENV_RUN_ONLY: (env.runtime, "run_only"),
        ENV_COMPILE_ONLY: (env.compile, "compile_only"),
        ENV_ARCH: (env.compile, "arch"),
    }
    for expected, (manager, attr) in declared.items():
        option = getattr(type(manager), attr, None)
        found = getattr(option, "env_var", None)
        if found != expected:
            raise ReplayHookBroken(
                f"flydsl {flydsl_version()}: {type(manager).__name__}.{attr} reads {found!r}, "
                f"aiter sets {expected!r}; update aiter/flydsl_bridge"
            )
    try:
        arch_source = inspect.getsource(device.get_rocm_arch)
    except (OSError, TypeError):  # an install without sources: nothing to check against
        arch_source = ENV_GPU_ARCH
    if ENV_GPU_ARCH not in arch_source:
        raise ReplayHookBroken(
            f"flydsl {flydsl_version()}: get_rocm_arch() no longer reads {ENV_GPU_ARCH}; "
            "update aiter/flydsl_bridge"
        )
    option = getattr(type(env.runtime), "cache_dir", None)
    default = getattr(option, "default", None)
    if default != cache_dir_from_env({}):
        raise ReplayHookBroken(
            f"flydsl {flydsl_version()}: the default cache directory is {default!r}, "
            f"aiter computes {cache_dir_from_env({})!r}; update aiter/flydsl_bridge"
        )


@functools.cache
def self_test_once() -> None:
    """self_test(), once per process: FlyDSL's internals do not move while it runs."""
    self_test()


def self_test() -> None:
    """Raise ReplayHookBroken unless every FlyDSL internal the hooks use is where expected."""
    jf = jit_function()
    missing = _missing_internals(jf)
    if missing:
        raise ReplayHookBroken(
            f"flydsl {flydsl_version()} moved internals the AOT replay uses: {', '.join(missing)}"
            f" (the bridge was written against {TESTED_FLYDSL}); update aiter/flydsl_bridge"
        )
    checks = {
        "JitCacheManager.get": (jf.JitCacheManager.get, ["self", "cache_key"]),
        "JitCacheManager.compile_lock": (jf.JitCacheManager.compile_lock, ["self", "cache_key"]),
        "JitFunction._compile_or_execute": (
            jf.JitFunction._compile_or_execute,
            ["self", "args", "kwargs"],
        ),
    }
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    for label, (fn, expected) in checks.items():
        found = list(inspect.signature(fn).parameters.values())[: len(expected)]
        params = [
            p.name if p.kind in positional else f"{p.kind.description} {p.name}" for p in found
        ]
        if params != expected:
            raise ReplayHookBroken(
                f"flydsl {flydsl_version()}: {label} takes {params}, the replay expects"
                f" {expected}; update aiter/flydsl_bridge"
            )
    key = jf.JitCacheManager._safe_key("k")
    if not (isinstance(key, str) and len(key) == 16):
        raise ReplayHookBroken(
            f"flydsl {flydsl_version()}: cache entry names changed ({key!r}); "
            "update aiter/flydsl_bridge"
        )
    try:
        flydsl_vars = _flydsl_key_env_vars(jf)
    except (AttributeError, TypeError) as exc:
        raise ReplayHookBroken(
            f"flydsl {flydsl_version()}: cannot read the cache key's environment variables "
            f"({exc}); update aiter/flydsl_bridge"
        ) from exc
    if sorted(flydsl_vars) != sorted(KEY_ENV_VARS):
        raise ReplayHookBroken(
            f"flydsl {flydsl_version()} folds {list(flydsl_vars)} into its cache keys, "
            f"KEY_ENV_VARS lists {list(KEY_ENV_VARS)}; update aiter/flydsl_bridge"
        )
    _check_env_names()


def register_stream_type(stream_type: type) -> None:
    """Let kernels take `stream_type` objects (the dry run's stream stand-in) as streams."""
    from flydsl.compiler.jit_argument import JitArgumentRegistry
    from flydsl.expr.typing import Stream

    constructor, _ = JitArgumentRegistry.get(stream_type)
    if constructor is None:
        JitArgumentRegistry.register(stream_type)(Stream)


@contextmanager
def guard_kernel_execution(raise_reached) -> Iterator[None]:
    """Make any attempt to run (not just compile) a FlyDSL kernel call `raise_reached`."""
    jf = jit_function()
    original = jf._build_call_state
    jf._build_call_state = raise_reached
    try:
        yield
    finally:
        jf._build_call_state = original


def flydsl_target_arch() -> str:
    """The arch FlyDSL compiles for in this process (read from FLYDSL_GPU_ARCH, else hardware)."""
    from flydsl.runtime.device import get_rocm_arch

    return get_rocm_arch()
