"""Recording the FlyDSL kernels launched inside a block, for the AOT replay: name them without
compiling (MODE_NAME) or compile what is missing (MODE_COMPILE).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiter.flydsl_bridge.env import ENV_CACHE_DIR
from aiter.flydsl_bridge.internals import ReplayHookBroken, jit_function, self_test_once
from aiter.flydsl_bridge.requests import KernelRequest, compile_time_params

MODE_NAME = "name"  # record the kernels a call needs, compile nothing
MODE_COMPILE = "compile"  # compile what is missing, record every kernel the call needed


class _StandInArtifact:
    """Handed back instead of a compiled kernel in naming mode; never reaches the disk cache."""

    _ktrace_names: dict = {}
    _link_libs: list = []


@dataclass
class _Call:
    function: Any
    params: tuple[tuple[str, str], ...]
    keys: list[tuple[str, str]] = field(default_factory=list)  # (cache_dir, key)


_state = threading.local()


def _calls() -> list[_Call]:
    if not hasattr(_state, "calls"):
        _state.calls = []
    return _state.calls


@contextmanager
def record_launches(mode: str) -> Iterator[list[KernelRequest]]:
    """Record every FlyDSL kernel launched inside the block.

    MODE_NAME: no compile and no disk write; each launch returns after naming its key.
    MODE_COMPILE: launches behave as usual (compile on a miss, or load), and are recorded.
    Either way FlyDSL's in-process artifact cache is bypassed, so every launch is seen.
    """
    if mode not in (MODE_NAME, MODE_COMPILE):
        raise ValueError(f"mode must be {MODE_NAME!r} or {MODE_COMPILE!r}, got {mode!r}")
    self_test_once()
    jf = jit_function()
    requests: list[KernelRequest] = []
    original_get = jf.JitCacheManager.get
    original_lock = jf.JitCacheManager.compile_lock
    original_call = jf.JitFunction._compile_or_execute

    def note(manager: Any, key: str) -> None:
        calls = _calls()
        if calls:
            calls[-1].keys.append((str(manager.cache_dir), key))

    def get(self, cache_key):
        note(self, cache_key)
        if mode == MODE_NAME:
            return _StandInArtifact()
        return original_get(self, cache_key)

    def compile_lock(self, cache_key, **kwargs):
        if mode == MODE_NAME:
            raise ReplayHookBroken("naming mode reached FlyDSL's compile path")
        return original_lock(self, cache_key, **kwargs)

    def compile_or_execute(self, args, kwargs, **options):
        from flydsl._mlir import ir

        if ir.Context.current is not None:  # a nested jit call while tracing
            return original_call(self, args, kwargs, **options)
        self._ensure_cache_manager(None)
        if self.cache_manager is None:
            raise ReplayHookBroken(
                "FlyDSL's disk cache is off (FLYDSL_RUNTIME_ENABLE_CACHE=0 or an empty "
                f"{ENV_CACHE_DIR}); the AOT builder needs it on"
            )
        call = _Call(self, compile_time_params(self, args, kwargs))
        _calls().append(call)
        saved_mem_cache, self._mem_cache = self._mem_cache, {}
        try:
            result = original_call(self, args, kwargs, **options)
        finally:
            _calls().pop()
            fresh, self._mem_cache = self._mem_cache, saved_mem_cache
            if mode == MODE_COMPILE:
                self._mem_cache.update(fresh)
        if not call.keys:
            raise ReplayHookBroken(
                f"a launch of {self.func.__name__} went past FlyDSL's cache manager unseen"
            )
        cache_dir, key = call.keys[0]
        requests.append(KernelRequest(self.func.__name__, cache_dir, key, call.params))
        return result

    with ExitStack() as stack:
        for owner, name, replacement in (
            (jf.JitCacheManager, "get", get),
            (jf.JitCacheManager, "compile_lock", compile_lock),
            (jf.JitFunction, "_compile_or_execute", compile_or_execute),
        ):
            original = getattr(owner, name)
            setattr(owner, name, replacement)
            stack.callback(setattr, owner, name, original)
        yield requests
