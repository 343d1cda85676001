"""Every use of FlyDSL internals by the AOT builder, and nothing else.

FlyDSL 0.4.2 has no public way to ask which kernels a call needs; these hooks observe its cache
manager. `self_test()` raises ReplayHookBroken when an upgrade moves what they rely on.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import flydsl
from flydsl.compiler import jit_function as _jf

TESTED_FLYDSL = "0.4.2"
MODE_NAME = "name"  # record the kernels a call needs, compile nothing
MODE_COMPILE = "compile"  # compile what is missing, record every kernel the call needed


class ReplayHookBroken(RuntimeError):
    """A FlyDSL internal the replay relies on moved or changed behaviour."""


@dataclass(frozen=True)
class KernelRequest:
    """One FlyDSL kernel specialization a call asked for, as FlyDSL's cache names it."""

    function: str  # the @flyc.jit function
    cache_dir: str  # <cache root>/<function>_<manager key>
    key: str  # FlyDSL's full cache key
    params: tuple[tuple[str, str], ...] = ()  # compile-time parameters, for reports

    @property
    def file_name(self) -> str:
        return _jf.JitCacheManager._safe_key(self.key) + ".pkl"

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


_REQUIRED = (
    (_jf, "JitCacheManager"),
    (_jf, "JitFunction"),
    (_jf.JitCacheManager, "get"),
    (_jf.JitCacheManager, "compile_lock"),
    (_jf.JitCacheManager, "_safe_key"),
    (_jf.JitFunction, "_compile_or_execute"),
    (_jf.JitFunction, "_ensure_cache_manager"),
    (_jf.JitFunction, "_ensure_sig"),
    (_jf, "_build_call_state"),
)


def self_test() -> None:
    """Raise ReplayHookBroken unless every FlyDSL internal the hooks use is where expected."""
    missing = [f"{getattr(o, '__name__', o)}.{a}" for o, a in _REQUIRED if not hasattr(o, a)]
    if missing:
        raise ReplayHookBroken(
            f"flydsl {flydsl.__version__} moved internals the AOT replay uses: {', '.join(missing)}"
            f" (hooks were written against {TESTED_FLYDSL}); update aiter/aot/flydsl/hooks.py"
        )
    checks = {
        "JitCacheManager.get": (_jf.JitCacheManager.get, ["self", "cache_key"]),
        "JitCacheManager.compile_lock": (_jf.JitCacheManager.compile_lock, ["self", "cache_key"]),
        "JitFunction._compile_or_execute": (
            _jf.JitFunction._compile_or_execute,
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
                f"flydsl {flydsl.__version__}: {label} takes {params}, the replay expects"
                f" {expected}; update aiter/aot/flydsl/hooks.py"
            )
    key = _jf.JitCacheManager._safe_key("k")
    if not (isinstance(key, str) and len(key) == 16):
        raise ReplayHookBroken(
            f"flydsl {flydsl.__version__}: cache entry names changed ({key!r}); "
            "update aiter/aot/flydsl/hooks.py"
        )


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
    self_test()
    requests: list[KernelRequest] = []
    original_get = _jf.JitCacheManager.get
    original_lock = _jf.JitCacheManager.compile_lock
    original_call = _jf.JitFunction._compile_or_execute

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
                "FLYDSL_RUNTIME_CACHE_DIR); the AOT builder needs it on"
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
            (_jf.JitCacheManager, "get", get),
            (_jf.JitCacheManager, "compile_lock", compile_lock),
            (_jf.JitFunction, "_compile_or_execute", compile_or_execute),
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


def flydsl_version() -> str:
    return flydsl.__version__


@contextmanager
def guard_kernel_execution(raise_reached) -> Iterator[None]:
    """Make any attempt to run (not just compile) a FlyDSL kernel call `raise_reached`."""
    original = _jf._build_call_state
    _jf._build_call_state = raise_reached
    try:
        yield
    finally:
        _jf._build_call_state = original


def default_cache_dir() -> str:
    """The directory FlyDSL's runtime reads kernels from (FLYDSL_RUNTIME_CACHE_DIR or its default)."""
    from flydsl.utils.env import runtime

    return str(runtime.cache_dir)


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
                f"{'.'.join(artifact_class)} (flydsl {flydsl.__version__})"
            )

    with open(entry_path, "rb") as f:
        artifact = _EntryUnpickler(f).load()
    state = getattr(artifact, "state", None)
    if not isinstance(state, dict) or not ({"ir_zlib", "ir_text"} & state.keys()):
        raise ReplayHookBroken(
            f"{entry_path}: cache entry state has no 'ir_zlib' or 'ir_text' "
            f"(flydsl {flydsl.__version__}); update aiter/aot/flydsl/hooks.py"
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
