"""Every use of FlyDSL internals by the AOT builder, and the one place FlyDSL's environment
variable names are spelled. FlyDSL is imported lazily; `self_test()` catches moved internals.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

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
