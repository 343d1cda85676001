"""The HIP runtime FlyDSL's launches run on under aiter.emulation: a small C library standing in
for libamdhip64.so.7, the tensors each launch names, and the FlyDSL internals both rely on.

FlyDSL's runtime library needs libamdhip64.so.7. The library of csrc/emulated_hip.c has that
SONAME; loaded globally before FlyDSL loads its runtime, it satisfies the dependency. Its module
loads keep the code object, and its kernel launch calls the handler `install` was given with the
code object, the grid and the launch's raw arguments. aiter.ops.shared.kernel_tensors calls
`track` for every tensor it hands FlyDSL, so that the handler finds the tensors' memory
(`regions`).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiter.flydsl_bridge.env import (
    ENV_ARCH,
    ENV_COMPILE_ONLY,
    ENV_GPU_ARCH,
    TESTED_FLYDSL,
    flydsl_version,
)
from aiter.flydsl_bridge.internals import ReplayHookBroken, jit_function, register_stream_type

SONAME = "libamdhip64.so.7"  # the HIP runtime FlyDSL's runtime library was linked against
RUNTIME_LIBRARY = "libfly_jit_runtime.so"  # FlyDSL's host runtime, the one that needs HIP
# setup.py builds the library beside this module, named as the extension module
# aiter.flydsl_bridge._emulated_hip (a plain C library: it only borrows setuptools' extension
# build, which installs and lands in the sources of an editable install).
PACKAGED_DIR = Path(__file__).resolve().parent
PACKAGED_GLOB = "_emulated_hip*.so"
SOURCE = Path(__file__).resolve().parents[2] / "csrc" / "emulated_hip.c"
VERSION_SCRIPT = SOURCE.with_suffix(".map")
SHIM_ENV = "AITER_EMULATED_HIP"  # a prebuilt library to use instead
CACHE_ENV = "AITER_EMULATED_HIP_DIR"  # where a library compiled on first use goes
HIP_LAUNCH_FAILURE = 719  # hipErrorLaunchFailure: the emulator raised; the error is kept here
HIP_INVALID_VALUE = 1


class EmulationUnavailable(RuntimeError):
    """This process cannot run FlyDSL launches in the emulator (say why and what to do)."""


@dataclass(frozen=True)
class EmulatedStream:
    """The launch stream kernels get under `emulated` (FlyDSL reads `cuda_stream`): the default
    stream, which the emulated runtime runs synchronously."""

    cuda_stream: int = 0


# --- the library standing in for HIP --------------------------------------------------------


def _c_compiler() -> list[str]:
    named = os.environ.get("CC", "").strip()
    if named:
        return shlex.split(named)
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return [name]
    raise EmulationUnavailable(
        f"no C compiler to build aiter's emulated HIP runtime ({SOURCE.name}): install one "
        "(Debian/Ubuntu: apt-get install gcc), set CC, or reinstall aiter so that setup.py builds "
        f"it (pip install --no-build-isolation -e .), or point {SHIM_ENV} at a built {SONAME}"
    )


def compile_command(source: Path, version_script: Path, output: Path) -> list[str]:
    """How the library is built (setup.py uses the same flags): a plain C shared object with
    HIP's SONAME and its symbol version."""
    return [
        *_c_compiler(),
        "-O2",
        "-g0",
        "-std=c11",
        "-fPIC",
        "-shared",
        f"-Wl,-soname,{SONAME}",
        f"-Wl,--version-script={version_script}",
        "-o",
        str(output),
        str(source),
    ]


def _cache_root() -> Path:
    named = os.environ.get(CACHE_ENV)
    if named:
        return Path(named)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "aiter" / "emulated_hip"


def _compile_on_first_use() -> Path:
    """Build the library from csrc/ into a per-source cache directory (a machine whose aiter was
    installed without it: an editable install made before the library existed)."""
    if not (SOURCE.is_file() and VERSION_SCRIPT.is_file()):
        raise EmulationUnavailable(
            f"aiter's emulated HIP runtime is neither built ({PACKAGED_DIR / PACKAGED_GLOB}) nor "
            f"buildable here ({SOURCE} is missing): reinstall aiter from its sources, or point "
            f"{SHIM_ENV} at a built {SONAME}"
        )
    digest = hashlib.sha256(SOURCE.read_bytes() + VERSION_SCRIPT.read_bytes()).hexdigest()[:16]
    target = _cache_root() / digest / SONAME
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside and rename: a concurrent process never loads half a library.
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / SONAME
        done = subprocess.run(
            compile_command(SOURCE, VERSION_SCRIPT, built),
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            raise EmulationUnavailable(
                f"building aiter's emulated HIP runtime failed ({shlex.join(done.args)}):\n"
                f"{done.stderr.strip()}"
            )
        os.replace(built, target)
    return target


def shim_path() -> Path:
    """The emulated HIP library to load: $AITER_EMULATED_HIP, else the one setup.py built into
    the package, else one compiled on first use."""
    named = os.environ.get(SHIM_ENV)
    if named:
        if not Path(named).is_file():
            raise EmulationUnavailable(f"{SHIM_ENV}={named}: no such file")
        return Path(named)
    packaged = sorted(PACKAGED_DIR.glob(PACKAGED_GLOB))
    return packaged[0] if packaged else _compile_on_first_use()


def _loaded_hip_libraries() -> set[str]:
    """Paths of every libamdhip64 this process has mapped."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return set()
    return {line.split()[-1] for line in maps.splitlines() if "libamdhip64" in line}


def _runtime_library_path() -> Path:
    import flydsl

    return Path(flydsl.__file__).resolve().parent / "_mlir" / "_mlir_libs" / RUNTIME_LIBRARY


_LAUNCH_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_void_p,  # code object image
    ctypes.c_size_t,  # its size
    ctypes.c_char_p,  # kernel name
    *(ctypes.c_uint,) * 7,  # grid x, y, z (work-groups), block x, y, z, dynamic LDS bytes
    ctypes.c_void_p,  # stream
    ctypes.POINTER(ctypes.c_void_p),  # kernelParams: params[i] points at argument i
    ctypes.c_void_p,  # or a packed argument buffer (`extra`)
    ctypes.c_size_t,  # its size
)


@dataclass
class _Shim:
    library: ctypes.CDLL
    path: Path
    callback: Any  # the ctypes callback object: it must outlive every launch


_shim: _Shim | None = None
_shim_lock = threading.Lock()


def load_shim() -> _Shim:
    """Load the emulated HIP library globally (once per process), then FlyDSL's runtime library,
    and check that the runtime's HIP calls reach the emulated library."""
    global _shim
    with _shim_lock:
        if _shim is not None:
            return _shim
        path = shim_path().resolve()
        foreign = {p for p in _loaded_hip_libraries() if Path(p).resolve() != path}
        if foreign:
            raise EmulationUnavailable(
                f"this process already loaded a HIP runtime ({', '.join(sorted(foreign))}), so "
                "FlyDSL launches would run on it: run emulated entries in a process that has not "
                "used a GPU"
            )
        # RTLD_GLOBAL before FlyDSL's runtime is loaded: the dynamic loader then satisfies that
        # library's DT_NEEDED libamdhip64.so.7 with this already-loaded object (same SONAME).
        library = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        library.aiter_emu_stream_token.restype = ctypes.c_void_p
        library.aiter_emu_set_launch_callback.argtypes = [_LAUNCH_CALLBACK]
        library.aiter_emu_allocations.restype = ctypes.c_size_t
        library.aiter_emu_allocations.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.c_size_t,
        ]
        runtime = ctypes.CDLL(str(_runtime_library_path()))
        runtime.mgpuStreamCreate.restype = ctypes.c_void_p
        runtime.mgpuStreamDestroy.argtypes = [ctypes.c_void_p]
        stream = runtime.mgpuStreamCreate()
        runtime.mgpuStreamDestroy(stream)
        if stream != library.aiter_emu_stream_token():
            raise EmulationUnavailable(
                f"FlyDSL's {RUNTIME_LIBRARY} does not call the emulated HIP runtime ({path}); it "
                f"was bound to {sorted(_loaded_hip_libraries())} first: run emulated entries in "
                "a fresh process"
            )
        callback = _LAUNCH_CALLBACK(_on_launch)
        library.aiter_emu_set_launch_callback(callback)
        _shim = _Shim(library, path, callback)
        return _shim


def allocations() -> list[tuple[int, int]]:
    """(address, bytes) of each live block FlyDSL allocated through hipMalloc."""
    shim = load_shim()
    count = shim.library.aiter_emu_allocations(None, None, 0)
    ptrs, sizes = (ctypes.c_void_p * count)(), (ctypes.c_size_t * count)()
    shim.library.aiter_emu_allocations(ptrs, sizes, count)
    return [(int(p), int(s)) for p, s in zip(ptrs, sizes, strict=True) if p]


# --- the tensors of the launches ------------------------------------------------------------

# Live FlyDSL tensor arguments -> the storage each was made from. An entry holds its storage, so
# no address it names is reused while the argument (held by the launcher until it launched)
# lives; it goes when the argument is collected.
_tracked: dict[int, tuple[weakref.ref, Any]] = {}
active = False  # read by kernel_tensor on every launch: while installed it calls `track`


def track(tensor: Any, argument: Any) -> None:
    """Register the CPU storage behind `argument` (a FlyDSL tensor argument made from `tensor`),
    so that launches which receive it find its memory."""
    if tensor.device.type != "cpu":
        return
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0:
        return
    key = id(argument)
    _tracked[key] = (weakref.ref(argument, lambda _ref: _tracked.pop(key, None)), storage)


def regions() -> list[tuple[int, Any]]:
    """(base address, uint8 numpy view) of every storage a live argument names, one per
    storage; a storage inside another is reached through the larger one."""
    import torch

    spans: dict[int, Any] = {}
    for ref, storage in list(_tracked.values()):
        if ref() is None:
            continue
        base = storage.data_ptr()
        if base not in spans or spans[base].nbytes() < storage.nbytes():
            spans[base] = storage
    out: list[tuple[int, Any]] = []
    end = 0
    for base in sorted(spans):
        storage = spans[base]
        if base + storage.nbytes() <= end:
            continue
        if base < end:
            raise EmulationUnavailable(
                f"two tensors' storages overlap in part ({out[-1][0]:#x}.. and {base:#x}..): the "
                "emulator's memory holds whole storages; pass a copy (.clone()) of one of them"
            )
        flat = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
        out.append((base, flat.numpy()))  # a view: the kernel's writes land in the tensor
        end = base + storage.nbytes()
    return out


# --- launches -------------------------------------------------------------------------------

# handler(code object, kernel name, grid, block, dynamic LDS bytes, kernelParams, packed buffer)
LaunchHandler = Callable[[bytes, str, tuple, tuple, int, Any, "bytes | None"], None]
_handler: LaunchHandler | None = None
_pending: list[BaseException] = []  # raised by the handler inside a launch, re-raised after it


def _on_launch(
    image, size, name, gx, gy, gz, bx, by, bz, shared, _stream, params, buffer, buffer_size
) -> int:
    """hipModuleLaunchKernel of the emulated runtime. An exception cannot cross the C frames
    between here and the Python caller: it is kept and raised when the FlyDSL call returns."""
    try:
        kernel = name.decode()
        if _handler is None:
            raise EmulationUnavailable(
                f"FlyDSL launched {kernel} outside aiter.emulated(arch): on a machine without a "
                "GPU, launch kernels inside `with aiter.emulated(arch):`"
            )
        data = ctypes.string_at(image, size)
        packed = ctypes.string_at(buffer, buffer_size) if buffer else None
        _handler(data, kernel, (gx, gy, gz), (bx, by, bz), shared, params, packed)
        return 0
    except BaseException as exc:  # noqa: BLE001  (re-raised by _raise_pending)
        _pending.append(exc)
        return HIP_LAUNCH_FAILURE


def _raise_pending() -> None:
    if _pending:
        first = _pending[0]
        _pending.clear()
        raise first


def self_test() -> None:
    """Raise ReplayHookBroken unless the FlyDSL internals the stand-in relies on are in place:
    the per-call dispatcher it wraps and the runtime library it stands under."""
    jf = jit_function()
    state = getattr(jf, "CallState", None)
    if state is None or "__call__" not in vars(state):
        raise ReplayHookBroken(
            f"flydsl {flydsl_version()}: flydsl.compiler.jit_function.CallState.__call__ moved "
            f"(the bridge was written against {TESTED_FLYDSL}); update "
            "aiter/flydsl_bridge/hip_standin.py"
        )
    if not _runtime_library_path().is_file():
        raise ReplayHookBroken(
            f"flydsl {flydsl_version()}: no {RUNTIME_LIBRARY} at {_runtime_library_path()}; "
            "update aiter/flydsl_bridge/hip_standin.py"
        )


@contextmanager
def _raise_launch_errors() -> Iterator[None]:
    """Make every FlyDSL call re-raise what its emulated launches raised (FlyDSL's runtime only
    prints a failed launch's error code)."""
    state = jit_function().CallState
    original = vars(state)["__call__"]

    def call(self, args_tuple):
        _pending.clear()
        try:
            result = original(self, args_tuple)
        finally:
            _raise_pending()
        return result

    state.__call__ = call
    try:
        yield
    finally:
        state.__call__ = original


_process_arch: str | None = None


def _claim_arch(arch: str) -> None:
    """One arch per process: FlyDSL freezes its target at the first compile."""
    global _process_arch
    frozen = _process_arch or os.environ.get(ENV_GPU_ARCH)
    if frozen and frozen != arch:
        raise ValueError(
            f"this process targets {frozen} and cannot emulate {arch}: FlyDSL freezes its target "
            "per process; run one process per arch"
        )
    _process_arch = arch
    # For the process, not the block: a kernel compiled later in the process must not silently
    # target another arch.
    os.environ[ENV_ARCH] = arch
    os.environ[ENV_GPU_ARCH] = arch


def _without_compile_only(stack: ExitStack) -> None:
    """COMPILE_ONLY would make every launch return without running: off inside the block."""
    saved = os.environ.pop(ENV_COMPILE_ONLY, None)
    if saved is not None:
        stack.callback(os.environ.__setitem__, ENV_COMPILE_ONLY, saved)


@contextmanager
def installed(arch: str, handler: LaunchHandler) -> Iterator[EmulatedStream]:
    """Inside the block every FlyDSL launch of this process calls `handler` instead of a GPU
    (FlyDSL targets `arch`, compiles rather than only compiling, and tensors are tracked); yields
    the stream object launches are given. One arch per process."""
    global _handler, active
    _claim_arch(arch)
    self_test()
    load_shim()
    register_stream_type(EmulatedStream)
    previous = (_handler, active)
    with ExitStack() as stack:
        _without_compile_only(stack)
        stack.enter_context(_raise_launch_errors())
        _handler, active = handler, True
        try:
            yield EmulatedStream()
        finally:
            _handler, active = previous
