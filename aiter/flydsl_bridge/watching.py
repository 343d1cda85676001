"""Serving-side hooks: tell a listener (the JIT monitor) of every FlyDSL compile and every
FLYDSL_RUNTIME_RUN_ONLY=1 miss, and name the kernels a block would launch without running them.
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

from aiter.flydsl_bridge.env import ENV_RUN_ONLY, TESTED_FLYDSL, flydsl_version
from aiter.flydsl_bridge.internals import ReplayHookBroken, jit_function
from aiter.flydsl_bridge.requests import KernelRequest, compile_time_params

# How FlyDSL's error on a miss under FLYDSL_RUNTIME_RUN_ONLY=1 begins (serving_self_test finds it).
RUN_ONLY_MISS = f"{ENV_RUN_ONLY}=1 but no usable AOT cache for "
AOT_BUILD_MAIN = (
    "aiter.aot.flydsl.replay.arch_process"  # the builder's per-arch process, run with python -m
)
# JitFunction internals the serving hooks use, beside those of _REQUIRED.
_SERVING_REQUIRED = (
    "JitFunction.__call__",
    "JitFunction._trace_and_compile",
    "JitFunction._split_self",
    "JitFunction._ensure_cache_manager",
    "JitFunction._snapshot_or_check_globals",
    "JitFunction._effective_compile_hints",
    "JitFunction._build_full_cache_key",
    "JitFunction._cache_key_to_str",
)


class CompileListener(Protocol):
    """What the serving hooks tell about kernels the cache does not hold."""

    def compiling(self, request: KernelRequest) -> None:
        """FlyDSL is about to compile `request` (a cache miss); raise to refuse the compile."""

    def run_only_miss(self, request: KernelRequest, error: RuntimeError) -> BaseException | None:
        """FlyDSL refused to compile `request` under FLYDSL_RUNTIME_RUN_ONLY=1 with `error`;
        return the exception to raise in its place (chained to it), or None to raise `error`."""


_listener: CompileListener | None = None
_serving_installed = False
_install_lock = threading.Lock()
_serving = threading.local()


def _serving_state() -> threading.local:
    if not hasattr(_serving, "launches"):
        _serving.launches = []  # (jit function, args, kwargs) of the launches under way
        _serving.naming = None  # the list name_launches() fills, None outside it
        _serving.observed = None  # the list observe_launches() fills, None outside it
        _serving.outcomes = []  # the observed launches under way, innermost last
    return _serving


class LaunchOutcome:
    """One observed launch: its cache entry and how the cache served it."""

    HIT, COMPILED, REFUSED = "hit", "compiled", "refused"

    def __init__(self, request: KernelRequest) -> None:
        self.request = request
        self.cache = self.HIT  # no compile ran: loaded from the disk or in-memory cache


_marked_aot_build = False  # set by the arch process forked from the builder's driver


def mark_aot_build() -> None:
    """Make `in_aot_build` true in this process and the workers it forks (an arch process the
    driver forked runs under the driver's __main__)."""
    global _marked_aot_build
    _marked_aot_build = True


def in_aot_build() -> bool:
    """Whether this process is the AOT builder's per-arch process (`python -m
    aiter.aot.flydsl.replay.arch_process`, or forked by the driver and marked) or one of the workers it
    forks: there compiling is the point."""
    if _marked_aot_build:
        return True
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == AOT_BUILD_MAIN


def serving_self_test() -> None:
    """Raise ReplayHookBroken unless every FlyDSL internal the serving hooks use is in place."""
    jf = jit_function()
    missing = [p for p in _SERVING_REQUIRED if not hasattr(jf.JitFunction, p.split(".", 1)[1])]
    if missing:
        raise ReplayHookBroken(
            f"flydsl {flydsl_version()} moved internals the JIT monitor uses: {', '.join(missing)}"
            f" (the bridge was written against {TESTED_FLYDSL}); update aiter/flydsl_bridge"
        )
    if _serving_installed:
        return  # the methods checked below are the hooks' own by now
    found = list(inspect.signature(jf.JitFunction._trace_and_compile).parameters)
    if found[:5] != ["self", "ctx", "sig", "bound", "bound_self"]:
        raise ReplayHookBroken(
            f"flydsl {flydsl_version()}: JitFunction._trace_and_compile takes {found}, the JIT "
            "monitor expects ['self', 'ctx', 'sig', 'bound', 'bound_self', ...]; update "
            "aiter/flydsl_bridge"
        )
    try:
        source = inspect.getsource(jf)
    except (OSError, TypeError):  # an install without sources: nothing to check against
        source = RUN_ONLY_MISS
    if RUN_ONLY_MISS.split("=1 ", 1)[1] not in source:
        raise ReplayHookBroken(
            f"flydsl {flydsl_version()} words its {ENV_RUN_ONLY}=1 miss differently (aiter looks"
            f" for {RUN_ONLY_MISS!r}); update aiter/flydsl_bridge"
        )


def _request_of(jit_fn: Any, args: tuple, kwargs: dict) -> KernelRequest:
    """The cache entry a launch of `jit_fn` with these arguments uses, keyed exactly as
    JitFunction._compile_or_execute keys it; nothing is compiled or run."""
    bound_self, call_args = jit_fn._split_self(args)
    owner_cls = type(bound_self) if bound_self is not None else None
    jit_fn._ensure_cache_manager(owner_cls)
    jit_fn._snapshot_or_check_globals(owner_cls)
    bound = jit_fn._sig.bind(*call_args, **kwargs)
    bound.apply_defaults()
    key = jit_fn._build_full_cache_key(
        bound.arguments,
        owner_cls=owner_cls,
        bound_self=bound_self,
        effective_hints=jit_fn._effective_compile_hints(),
    )
    manager = jit_fn.cache_manager
    return KernelRequest(
        jit_fn.func.__name__,
        str(manager.cache_dir) if manager is not None else "",
        jit_fn._cache_key_to_str(key),
        compile_time_params(jit_fn, call_args, kwargs),
        module=getattr(jit_fn.func, "__module__", None) or "",
    )


def _compiling_request(jit_fn: Any, bound: Any) -> KernelRequest:
    """The request a compile is for: named from its launch when one is under way, else (a
    compile reached without a call, e.g. flyc.compile) from its Constexpr values alone."""
    from flydsl.expr.typing import Constexpr

    for fn, args, kwargs in reversed(_serving_state().launches):
        if fn is jit_fn:
            return _request_of(fn, args, kwargs)
    signature = jit_fn._sig
    params = tuple(
        (name, repr(value))
        for name, value in bound.arguments.items()
        if Constexpr.is_constexpr_annotation(signature.parameters[name].annotation)
    )
    manager = jit_fn.cache_manager
    return KernelRequest(
        jit_fn.func.__name__,
        str(manager.cache_dir) if manager is not None else "",
        "",
        params,
        module=getattr(jit_fn.func, "__module__", None) or "",
    )


def _install_serving_hooks() -> None:
    """Wrap JitFunction.__call__ (launches, naming, run-only misses) and _trace_and_compile
    (compiles), once per process. The AOT replay patches other methods (get, compile_lock,
    _compile_or_execute) for the length of a block, so the two never undo each other."""
    global _serving_installed
    with _install_lock:
        if _serving_installed:
            return
        serving_self_test()
        jf = jit_function()
        from flydsl._mlir import ir

        original_call = jf.JitFunction.__call__
        original_trace = jf.JitFunction._trace_and_compile

        def call(self, *args, **kwargs):
            state = _serving_state()
            if state.naming is not None and ir.Context.current is None:
                state.naming.append(_request_of(self, args, kwargs))
                return None
            listener = _listener
            if listener is None and state.observed is None:
                return original_call(self, *args, **kwargs)
            outcome = None
            if state.observed is not None and ir.Context.current is None:
                outcome = LaunchOutcome(_request_of(self, args, kwargs))
                state.observed.append(outcome)
                state.outcomes.append(outcome)
            state.launches.append((self, args, kwargs))
            try:
                return original_call(self, *args, **kwargs)
            except RuntimeError as err:
                if not str(err).startswith(RUN_ONLY_MISS):
                    raise
                if outcome is not None:
                    outcome.cache = LaunchOutcome.REFUSED
                if listener is None:
                    raise
                replacement = listener.run_only_miss(_request_of(self, args, kwargs), err)
                if replacement is None:
                    raise
                raise replacement from err
            finally:
                state.launches.pop()
                if outcome is not None:
                    state.outcomes.pop()

        def trace_and_compile(self, ctx, sig, bound, bound_self, **options):
            listener = _listener
            if listener is not None:
                listener.compiling(_compiling_request(self, bound))
            outcomes = _serving_state().outcomes
            if outcomes:
                outcomes[-1].cache = LaunchOutcome.COMPILED
            return original_trace(self, ctx, sig, bound, bound_self, **options)

        jf.JitFunction.__call__ = call
        jf.JitFunction._trace_and_compile = trace_and_compile
        _serving_installed = True


def watch_compiles(listener: CompileListener | None) -> None:
    """Tell `listener` of every FlyDSL compile and every FLYDSL_RUNTIME_RUN_ONLY=1 miss in this
    process (None: tell no one). The hooks are installed at the first listener and stay; with
    no listener a launch costs one extra Python call."""
    global _listener
    if listener is not None:
        _install_serving_hooks()
    _listener = listener


@contextmanager
def _collecting(attribute: str) -> Iterator[list]:
    """This thread's serving state collects into a new list at `attribute` inside the block."""
    _install_serving_hooks()
    state = _serving_state()
    previous = getattr(state, attribute)
    setattr(state, attribute, [])
    try:
        yield getattr(state, attribute)
    finally:
        setattr(state, attribute, previous)


def observe_launches() -> AbstractContextManager[list[LaunchOutcome]]:
    """Collect, for every FlyDSL launch of this thread inside the block, its cache entry and
    whether it was a cache hit, compiled, or refused under FLYDSL_RUNTIME_RUN_ONLY=1 (what a
    serving capture records). Launches run as they would without it."""
    return _collecting("observed")


def name_launches() -> AbstractContextManager[list[KernelRequest]]:
    """Name the FlyDSL kernels launched inside the block, compiling and running nothing: every
    jit call returns None once its cache entry is named (FlyDSL's own key, so
    `KernelRequest.exists()` says whether the cache holds it). Host code in the block must not
    use what a launch returns. Nests inside record_launches without adding to its list."""
    return _collecting("naming")
