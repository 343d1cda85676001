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
from aiter.flydsl_bridge.launch_keys import LaunchKeys, Unsupported
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

# Naming mode's memo, per JitFunction: its key pieces, and the request each key tuple named.
_named: dict[Any, tuple[LaunchKeys, Any, dict[tuple, KernelRequest]] | None] = {}


def _memo_of(jit_fn: Any) -> tuple[LaunchKeys, Any, dict[tuple, KernelRequest]] | None:
    """The naming memo of `jit_fn` for its current cache manager; None for a function whose key
    LaunchKeys does not build."""
    memo = _named.get(jit_fn, False)
    if memo is False or (memo is not None and memo[1] is not jit_fn.cache_manager):
        try:
            memo = (LaunchKeys(jit_fn), jit_fn.cache_manager, {})
        except Unsupported:
            memo = None
        _named[jit_fn] = memo
    return memo


def _fast_key(memo: Any, args: tuple, kwargs: dict) -> tuple | None:
    if memo is None:
        return None
    try:
        return memo[0].key(args, kwargs)
    except (Unsupported, TypeError):  # FlyDSL's own path reports a bad call
        return None


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
    # JitFunctions whose cache manager this block has set up: the environment it reads is the
    # block's, so once per kernel, not at every launch.
    managed: set[int] = set()
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
        if id(self) not in managed:
            self._ensure_cache_manager(None)
            if self.cache_manager is None:
                raise ReplayHookBroken(
                    "FlyDSL's disk cache is off (FLYDSL_RUNTIME_ENABLE_CACHE=0 or an empty "
                    f"{ENV_CACHE_DIR}); the AOT builder needs it on"
                )
            managed.add(id(self))
        memo = _memo_of(self) if mode == MODE_NAME else None
        fast_key = _fast_key(memo, args, kwargs)
        if fast_key is not None and fast_key in memo[2]:
            requests.append(memo[2][fast_key])
            return None  # what FlyDSL returns for a launch in compile-only mode
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
        request = KernelRequest(self.func.__name__, cache_dir, key, call.params)
        requests.append(request)
        if fast_key is not None:
            if jit_function().JitFunction._cache_key_to_str(fast_key) != key:
                raise ReplayHookBroken(
                    f"the naming memo's key of {self.func.__name__} differs from FlyDSL's "
                    f"({key[:96]}...); update aiter/flydsl_bridge/launch_keys.py"
                )
            if result is not None:
                raise ReplayHookBroken(
                    f"a named launch of {self.func.__name__} returned {type(result).__name__}; "
                    "naming mode expects None"
                )
            memo[2][fast_key] = request
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
