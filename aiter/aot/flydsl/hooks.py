"""Every use of FlyDSL internals (by the AOT builder, and by the serving JIT monitor and
fallback), and the one place FlyDSL's environment variable names are spelled. FlyDSL is imported
lazily; `self_test()` and `serving_self_test()` catch moved internals.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

TESTED_FLYDSL = "0.4.2"
MODE_NAME = "name"  # record the kernels a call needs, compile nothing
MODE_COMPILE = "compile"  # compile what is missing, record every kernel the call needed

# FlyDSL's environment variables: the only place aiter spells their names.
ENV_CACHE_DIR = "FLYDSL_RUNTIME_CACHE_DIR"
ENV_RUN_ONLY = "FLYDSL_RUNTIME_RUN_ONLY"
ENV_COMPILE_ONLY = "COMPILE_ONLY"
ENV_ARCH = "ARCH"  # the arch FlyDSL's compile pipeline targets
ENV_GPU_ARCH = "FLYDSL_GPU_ARCH"  # the arch kernel code sees through get_rocm_arch()
# Variables FlyDSL folds into every cache key (the last one only into gfx1250 keys);
# self_test() checks this list against the installed FlyDSL.
KEY_ENV_VARS: tuple[str, ...] = (
    "FLYDSL_COMPILE_OPT_LEVEL",
    "FLYDSL_COMPILE_BACKEND",
    "FLYDSL_COMPILE_LLVM_DIR",
    "FLYDSL_DEBUG_ENABLE_DEBUG_INFO",
    "FLYDSL_EXTRA_SOURCE_DIRS",
    "FLYDSL_KTRACE_ENABLE",
    "FLYDSL_KTRACE_BLOCKS",
    "FLYDSL_KTRACE_BUFFER_BYTES",
    "LLVM_GFX1250_ANY_XNACK_CODEGEN",
)


class ReplayHookBroken(RuntimeError):
    """A FlyDSL internal the replay relies on moved or changed behaviour."""


def _jit() -> ModuleType:
    """flydsl.compiler.jit_function, imported on first use: importing FlyDSL imports torch."""
    from flydsl.compiler import jit_function

    return jit_function


def __getattr__(name: str) -> Any:
    # `hooks._jf` is the module the hooks patch; resolving it lazily keeps this import light.
    if name == "_jf":
        return _jit()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def flydsl_version() -> str:
    """The installed FlyDSL's version, read from its metadata ("missing" when not installed)."""
    from importlib import metadata

    try:
        return metadata.version("flydsl")
    except metadata.PackageNotFoundError:
        return "missing"


def target_env(arch: str) -> dict[str, str]:
    """Environment that makes FlyDSL compile for `arch` without a GPU.

    Both arch variables are needed: the pipeline reads one, kernel code the other, and a
    kernel that finds neither silently builds for gfx942.
    """
    return {ENV_ARCH: arch, ENV_GPU_ARCH: arch, ENV_COMPILE_ONLY: "1"}


def run_only_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether FLYDSL_RUNTIME_RUN_ONLY is on in `environ` (default os.environ), as FlyDSL reads
    a boolean: 1, true, yes or on, in any case."""
    env = os.environ if environ is None else environ
    return env.get(ENV_RUN_ONLY, "").lower() in ("1", "true", "yes", "on")


def cache_dir_from_env(environ: Mapping[str, str] | None = None) -> str:
    """FlyDSL's cache root for `environ` (default os.environ), without importing FlyDSL.

    An empty FLYDSL_RUNTIME_CACHE_DIR turns FlyDSL's disk cache off; it is treated as unset
    here so that callers always get a directory.
    """
    env = os.environ if environ is None else environ
    return env.get(ENV_CACHE_DIR) or str(Path.home() / ".flydsl" / "cache")


def default_cache_dir() -> str:
    """The cache root FlyDSL's runtime uses in this process (see cache_dir_from_env)."""
    return cache_dir_from_env()


@dataclass(frozen=True)
class KernelRequest:
    """One FlyDSL kernel specialization a call asked for, as FlyDSL's cache names it."""

    function: str  # the @flyc.jit function
    cache_dir: str  # <cache root>/<function>_<manager key>
    key: str  # FlyDSL's full cache key
    params: tuple[tuple[str, str], ...] = ()  # compile-time parameters, for reports
    module: str = field(default="", compare=False)  # the Python module defining `function`

    @property
    def file_name(self) -> str:
        return _jit().JitCacheManager._safe_key(self.key) + ".pkl"

    @property
    def path(self) -> Path:
        return Path(self.cache_dir) / self.file_name

    @property
    def name(self) -> str:
        """Short, stable name: function and entry file."""
        return f"{self.function}/{self.file_name[:-4]}"

    def describe_params(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.params)

    def exists(self) -> bool:
        return self.path.is_file()


# FlyDSL 0.4.2 has no public way to ask which kernels a call needs; the hooks patch its cache
# manager. These are the attribute paths inside flydsl.compiler.jit_function they rely on; a
# path is checked only when its owner exists, so a moved class is reported once.
_REQUIRED = (
    "JitCacheManager",
    "JitFunction",
    "JitCacheManager.get",
    "JitCacheManager.compile_lock",
    "JitCacheManager._safe_key",
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
                f"aiter sets {expected!r}; update aiter/aot/flydsl/hooks.py"
            )
    try:
        arch_source = inspect.getsource(device.get_rocm_arch)
    except (OSError, TypeError):  # an install without sources: nothing to check against
        arch_source = ENV_GPU_ARCH
    if ENV_GPU_ARCH not in arch_source:
        raise ReplayHookBroken(
            f"flydsl {flydsl_version()}: get_rocm_arch() no longer reads {ENV_GPU_ARCH}; "
            "update aiter/aot/flydsl/hooks.py"
        )
    option = getattr(type(env.runtime), "cache_dir", None)
    default = getattr(option, "default", None)
    if default != cache_dir_from_env({}):
        raise ReplayHookBroken(
            f"flydsl {flydsl_version()}: the default cache directory is {default!r}, "
            f"aiter computes {cache_dir_from_env({})!r}; update aiter/aot/flydsl/hooks.py"
        )


@functools.cache
def _self_test_once() -> None:
    """self_test(), once per process: FlyDSL's internals do not move while it runs."""
    self_test()


def self_test() -> None:
    """Raise ReplayHookBroken unless every FlyDSL internal the hooks use is where expected."""
    jf = _jit()
    missing = _missing_internals(jf)
    if missing:
        raise ReplayHookBroken(
            f"flydsl {flydsl_version()} moved internals the AOT replay uses: {', '.join(missing)}"
            f" (hooks were written against {TESTED_FLYDSL}); update aiter/aot/flydsl/hooks.py"
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
                f" {expected}; update aiter/aot/flydsl/hooks.py"
            )
    key = jf.JitCacheManager._safe_key("k")
    if not (isinstance(key, str) and len(key) == 16):
        raise ReplayHookBroken(
            f"flydsl {flydsl_version()}: cache entry names changed ({key!r}); "
            "update aiter/aot/flydsl/hooks.py"
        )
    try:
        flydsl_vars = _flydsl_key_env_vars(jf)
    except (AttributeError, TypeError) as exc:
        raise ReplayHookBroken(
            f"flydsl {flydsl_version()}: cannot read the cache key's environment variables "
            f"({exc}); update aiter/aot/flydsl/hooks.py"
        ) from exc
    if sorted(flydsl_vars) != sorted(KEY_ENV_VARS):
        raise ReplayHookBroken(
            f"flydsl {flydsl_version()} folds {list(flydsl_vars)} into its cache keys, "
            f"KEY_ENV_VARS lists {list(KEY_ENV_VARS)}; update aiter/aot/flydsl/hooks.py"
        )
    _check_env_names()


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


def _compile_time_params(jit_fn: Any, args: tuple, kwargs: dict) -> tuple[tuple[str, str], ...]:
    """Constexpr values and tensor dtypes of one launch: what tells specializations apart."""
    from flydsl.expr.typing import Constexpr

    jit_fn._ensure_sig()  # FlyDSL's signature has string annotations resolved
    signature = jit_fn._sig
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return ()
    params = []
    for name, value in bound.arguments.items():
        ann = signature.parameters[name].annotation
        if ann is not inspect.Parameter.empty and Constexpr.is_constexpr_annotation(ann):
            params.append((name, repr(value)))
        elif hasattr(value, "dtype") and hasattr(value, "shape"):
            params.append((name, str(value.dtype).replace("torch.", "")))
    return tuple(params)


@contextmanager
def record_launches(mode: str) -> Iterator[list[KernelRequest]]:
    """Record every FlyDSL kernel launched inside the block.

    MODE_NAME: no compile and no disk write; each launch returns after naming its key.
    MODE_COMPILE: launches behave as usual (compile on a miss, or load), and are recorded.
    Either way FlyDSL's in-process artifact cache is bypassed, so every launch is seen.
    """
    if mode not in (MODE_NAME, MODE_COMPILE):
        raise ValueError(f"mode must be {MODE_NAME!r} or {MODE_COMPILE!r}, got {mode!r}")
    _self_test_once()
    jf = _jit()
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
        call = _Call(self, _compile_time_params(self, args, kwargs))
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
    jf = _jit()
    original = jf._build_call_state
    jf._build_call_state = raise_reached
    try:
        yield
    finally:
        jf._build_call_state = original


# --- serving: what the JIT monitor (aiter.jit_monitor) and the AOT fallback use ---

# How FlyDSL's error on a miss under FLYDSL_RUNTIME_RUN_ONLY=1 begins (serving_self_test finds it).
RUN_ONLY_MISS = f"{ENV_RUN_ONLY}=1 but no usable AOT cache for "
AOT_BUILD_MAIN = "aiter.aot.flydsl.replay"  # the builder's per-arch process, run with python -m
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
    return _serving


def in_aot_build() -> bool:
    """Whether this process is the AOT builder's per-arch process (`python -m
    aiter.aot.flydsl.replay`) or one of the workers it forks: there compiling is the point."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == AOT_BUILD_MAIN


def serving_self_test() -> None:
    """Raise ReplayHookBroken unless every FlyDSL internal the serving hooks use is in place."""
    jf = _jit()
    missing = [p for p in _SERVING_REQUIRED if not hasattr(jf.JitFunction, p.split(".", 1)[1])]
    if missing:
        raise ReplayHookBroken(
            f"flydsl {flydsl_version()} moved internals the JIT monitor uses: {', '.join(missing)}"
            f" (hooks were written against {TESTED_FLYDSL}); update aiter/aot/flydsl/hooks.py"
        )
    if _serving_installed:
        return  # the methods checked below are the hooks' own by now
    found = list(inspect.signature(jf.JitFunction._trace_and_compile).parameters)
    if found[:5] != ["self", "ctx", "sig", "bound", "bound_self"]:
        raise ReplayHookBroken(
            f"flydsl {flydsl_version()}: JitFunction._trace_and_compile takes {found}, the JIT "
            "monitor expects ['self', 'ctx', 'sig', 'bound', 'bound_self', ...]; update "
            "aiter/aot/flydsl/hooks.py"
        )
    try:
        source = inspect.getsource(jf)
    except (OSError, TypeError):  # an install without sources: nothing to check against
        source = RUN_ONLY_MISS
    if RUN_ONLY_MISS.split("=1 ", 1)[1] not in source:
        raise ReplayHookBroken(
            f"flydsl {flydsl_version()} words its {ENV_RUN_ONLY}=1 miss differently (aiter looks"
            f" for {RUN_ONLY_MISS!r}); update aiter/aot/flydsl/hooks.py"
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
        _compile_time_params(jit_fn, call_args, kwargs),
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
        jf = _jit()
        from flydsl._mlir import ir

        original_call = jf.JitFunction.__call__
        original_trace = jf.JitFunction._trace_and_compile

        def call(self, *args, **kwargs):
            state = _serving_state()
            if state.naming is not None and ir.Context.current is None:
                state.naming.append(_request_of(self, args, kwargs))
                return None
            listener = _listener
            if listener is None:
                return original_call(self, *args, **kwargs)
            state.launches.append((self, args, kwargs))
            try:
                return original_call(self, *args, **kwargs)
            except RuntimeError as err:
                if not str(err).startswith(RUN_ONLY_MISS):
                    raise
                replacement = listener.run_only_miss(_request_of(self, args, kwargs), err)
                if replacement is None:
                    raise
                raise replacement from err
            finally:
                state.launches.pop()

        def trace_and_compile(self, ctx, sig, bound, bound_self, **options):
            listener = _listener
            if listener is not None:
                listener.compiling(_compiling_request(self, bound))
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
def name_launches() -> Iterator[list[KernelRequest]]:
    """Name the FlyDSL kernels launched inside the block, compiling and running nothing: every
    jit call returns None once its cache entry is named (FlyDSL's own key, so
    `KernelRequest.exists()` says whether the cache holds it). Host code in the block must not
    use what a launch returns. Nests inside record_launches without adding to its list."""
    _install_serving_hooks()
    state = _serving_state()
    previous, state.naming = state.naming, []
    try:
        yield state.naming
    finally:
        state.naming = previous


# --- code objects in cache entries ---


def extract_code_objects(entry_path: str | Path) -> list[bytes]:
    """The HSACO ELF files inside one FlyDSL cache entry (<cache>/<jit fn>_<key>/<file>.pkl).

    An entry pickles a CompiledArtifact whose state holds zlib-compressed, fully lowered MLIR;
    each `gpu.binary` object in it carries its code object as an MLIR string literal
    (`bin = "..."`, non-printable bytes escaped as \\XX). The pickle is read with a stand-in
    class, so no FlyDSL code runs while loading it.
    """
    import pickle
    import zlib

    artifact_class = ("flydsl.compiler.jit_executor", "CompiledArtifact")

    class _ArtifactState:
        state: Any = None

        def __setstate__(self, state: Any) -> None:
            self.state = state

    class _EntryUnpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if (module, name) == artifact_class:
                return _ArtifactState
            raise ReplayHookBroken(
                f"{entry_path}: cache entry pickles {module}.{name}, expected "
                f"{'.'.join(artifact_class)} (flydsl {flydsl_version()})"
            )

    with open(entry_path, "rb") as f:
        artifact = _EntryUnpickler(f).load()
    state = getattr(artifact, "state", None)
    if not isinstance(state, dict) or not ({"ir_zlib", "ir_text"} & state.keys()):
        raise ReplayHookBroken(
            f"{entry_path}: cache entry state has no 'ir_zlib' or 'ir_text' "
            f"(flydsl {flydsl_version()}); update aiter/aot/flydsl/hooks.py"
        )
    if "ir_zlib" in state:
        ir_text = zlib.decompress(state["ir_zlib"]).decode("utf-8")
    else:
        ir_text = state["ir_text"]

    def decode_string(text: str, pos: int) -> tuple[bytes, int]:
        # MLIR prints printable ASCII as is and every other byte (and the quote) as a
        # backslash and two hex digits; a backslash itself is doubled.
        out = bytearray()
        while True:
            if pos >= len(text):
                raise ReplayHookBroken(f"{entry_path}: unterminated string in the entry's MLIR")
            ch = text[pos]
            if ch == '"':
                return bytes(out), pos + 1
            if ch == "\\":
                if text[pos + 1] == "\\":
                    out.append(0x5C)
                    pos += 2
                else:
                    out.append(int(text[pos + 1 : pos + 3], 16))
                    pos += 3
            else:
                out.extend(ch.encode("ascii"))
                pos += 1

    codes = []
    marker = 'bin = "'
    start = ir_text.find(marker)
    while start >= 0:
        code, end = decode_string(ir_text, start + len(marker))
        codes.append(code)
        start = ir_text.find(marker, end)
    return codes


def flydsl_target_arch() -> str:
    """The arch FlyDSL compiles for in this process (read from FLYDSL_GPU_ARCH, else hardware)."""
    from flydsl.runtime.device import get_rocm_arch

    return get_rocm_arch()
