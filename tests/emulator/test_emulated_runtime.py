"""The pieces of `aiter.emulated` that need no kernel: the emulated HIP library (built, exported
symbols, bound by FlyDSL's runtime), kernel arguments, tensor memory, the device seam, errors.
"""

from __future__ import annotations

import ctypes
import gc
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from aiter import device, emulation
from aiter.emulator import KernelArg
from aiter.flydsl_bridge import hip_standin
from tests.emulator.test_emulated_entries import _child, _env


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    """The library as aiter builds it on first use (the C compiler, into a cache directory)."""
    if not shutil.which("cc") and not shutil.which("gcc") and not shutil.which("clang"):
        pytest.skip("no C compiler to build the emulated HIP library")
    root = tmp_path_factory.mktemp("emulated_hip")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(hip_standin.CACHE_ENV, str(root))
        path = hip_standin._compile_on_first_use()
    assert path.is_relative_to(root) and path.name == hip_standin.SONAME
    return path


def _dynamic_symbols(path: Path, which: str) -> set[str]:
    if not shutil.which("nm"):
        pytest.skip("nm (binutils) is needed to list dynamic symbols")
    out = subprocess.run(["nm", "-D", which, str(path)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}


def test_the_library_defines_every_hip_function_flydsl_runtime_imports(shim: Path) -> None:
    """FlyDSL's runtime binds `hipX@hip_4.2`: each must be defined with that version (a FlyDSL
    upgrade that calls one more HIP function fails here, not at a launch)."""
    needed = {
        s for s in _dynamic_symbols(hip_standin._runtime_library_path(), "--undefined-only")
        if s.startswith("hip")
    }  # fmt: skip
    defined = _dynamic_symbols(shim, "--defined-only")
    assert needed and all(s.endswith("@hip_4.2") for s in needed)
    assert not {s.replace("@", "@@") for s in needed} - defined


def test_the_library_has_hips_soname_and_no_torch(shim: Path) -> None:
    if not shutil.which("readelf"):
        pytest.skip("readelf (binutils) is needed to read the dynamic section")
    dynamic = subprocess.run(["readelf", "-d", str(shim)], capture_output=True, text=True).stdout
    assert f"Library soname: [{hip_standin.SONAME}]" in dynamic
    assert "torch" not in dynamic and "c10" not in dynamic


_BIND_CHILD = """
import json
from aiter.flydsl_bridge import hip_standin

shim = hip_standin.load_shim()
print(json.dumps({"path": str(shim.path), "mapped": sorted(hip_standin._loaded_hip_libraries())}))
"""


def test_flydsl_runtime_binds_to_the_emulated_library(shim: Path, tmp_path: Path) -> None:
    """Loaded globally first, the library satisfies the runtime's DT_NEEDED: load_shim checks
    that the runtime's stream comes from it, and nothing else named libamdhip64 is mapped."""
    env = {**_env(tmp_path / "cache"), hip_standin.SHIM_ENV: str(shim)}
    report = _child(_BIND_CHILD, [], env, "loading the emulated HIP library")
    assert Path(report["path"]) == shim.resolve()
    assert [Path(p).resolve() for p in report["mapped"]] == [shim.resolve()]


def test_a_packaged_library_is_preferred_to_a_build(tmp_path: Path, monkeypatch) -> None:
    built = tmp_path / "_emulated_hip.cpython-311-x86_64-linux-gnu.so"
    built.write_bytes(b"")
    monkeypatch.delenv(hip_standin.SHIM_ENV, raising=False)
    monkeypatch.setattr(hip_standin, "PACKAGED_DIR", tmp_path)
    assert hip_standin.shim_path() == built
    monkeypatch.setenv(hip_standin.SHIM_ENV, str(tmp_path / "missing.so"))
    with pytest.raises(hip_standin.EmulationUnavailable, match="no such file"):
        hip_standin.shim_path()


# --- kernel arguments -----------------------------------------------------------------------


@dataclass
class _Kernel:
    name: str
    args: tuple[KernelArg, ...]
    kernarg_segment_size: int


def test_kernel_arguments_are_laid_out_from_the_metadata() -> None:
    """params[i] points at explicit argument i; hidden arguments are filled as HIP fills them
    (block counts in work-groups, group sizes, dynamic LDS), others zero."""
    kernel = _Kernel(
        "k",
        (
            KernelArg(0, 8, "global_buffer"),
            KernelArg(8, 4, "by_value"),
            KernelArg(16, 12, "by_value"),
            KernelArg(32, 4, "hidden_block_count_x"),
            KernelArg(36, 4, "hidden_block_count_y"),
            KernelArg(40, 2, "hidden_group_size_x"),
            KernelArg(48, 8, "hidden_global_offset_x"),
            KernelArg(56, 4, "hidden_dynamic_lds_size"),
            KernelArg(60, 2, "hidden_grid_dims"),
        ),
        64,
    )
    pointer, count = ctypes.c_uint64(0x7F00_1234_5678), ctypes.c_int32(-3)
    layout = ctypes.create_string_buffer(struct.pack("<iiI", 37, 200, 9), 12)
    params = (ctypes.c_void_p * 3)(
        ctypes.addressof(pointer), ctypes.addressof(count), ctypes.addressof(layout)
    )
    packed = emulation.pack_kernel_arguments(kernel, params, None, (4, 2, 1), (256, 1, 1), 512)
    assert len(packed) == 64
    assert struct.unpack_from("<Qi", packed, 0) == (0x7F00_1234_5678, -3)
    assert struct.unpack_from("<iiI", packed, 16) == (37, 200, 9)
    assert struct.unpack_from("<IIH", packed, 32) == (4, 2, 256)
    assert struct.unpack_from("<QIH", packed, 48) == (0, 512, 2)
    # The same arguments packed into one buffer (hipModuleLaunchKernel's `extra`).
    assert (
        emulation.pack_kernel_arguments(kernel, None, packed[:28], (4, 2, 1), (256, 1, 1), 512)
        == packed
    )
    with pytest.raises(hip_standin.EmulationUnavailable, match="explicit argument 1"):
        emulation.pack_kernel_arguments(kernel, (ctypes.c_void_p * 3)(params[0]), None,
                                        (1, 1, 1), (64, 1, 1), 0)  # fmt: skip


# --- tensor memory --------------------------------------------------------------------------


class _Argument:
    """Stands for a FlyDSL tensor argument: all `track` needs is an object to outlive."""


def test_tracked_storages_are_views_that_live_as_long_as_their_argument() -> None:
    t = torch.zeros(6, 5, dtype=torch.bfloat16)
    view = t[2:]  # a launcher's view: the whole storage is registered, at its own address
    arg = _Argument()
    hip_standin.track(view, arg)
    ((base, data),) = [r for r in hip_standin.regions() if r[0] == t.data_ptr()]
    assert data.nbytes == t.untyped_storage().nbytes() and data.base is not None
    data[:2] = [0x80, 0x3F]  # bf16 1.0, little-endian: the write lands in the tensor
    assert t[0, 0].item() == 1.0
    del arg
    gc.collect()
    assert all(b != base for b, _ in hip_standin.regions())


# --- the device seam and entries outside emulation ------------------------------------------


def test_cpu_tensors_are_on_the_device_only_inside_emulation() -> None:
    cpu = torch.empty(2)
    assert not device.on_gpu(cpu)
    with device.simulate("gfx950", 256):
        assert not device.on_gpu(cpu)
    with device.simulate("gfx950", 256, cpu_tensors=True):
        assert device.on_gpu(cpu) and device.cu_num() == 256
        assert device.fp8_dtype() == torch.float8_e4m3fn
    assert not device.on_gpu(cpu)


def test_entries_still_refuse_cpu_tensors_outside_emulation() -> None:
    import aiter

    a = torch.empty(4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="A must be on a GPU device"):
        aiter.gemm_a16w16(a, a)


_ARCH_CHILD = """
import json
import aiter

found = {}
with aiter.emulated("gfx942") as session:
    found["cu_num"] = session.cu_num
for arch in ("gfx950", "gfx1250"):
    try:
        with aiter.emulated(arch):
            pass
    except ValueError as exc:
        found[arch] = f"{type(exc).__name__}: {exc}"
print(json.dumps(found))
"""


def test_one_arch_per_process(tmp_path: Path) -> None:
    env = _env(tmp_path / "cache", run_only=True)
    found = _child(_ARCH_CHILD, [], env, "entering aiter.emulated")
    assert found["cu_num"] == 304  # gfx942's default CU count
    for arch in ("gfx950", "gfx1250"):
        assert found[arch].startswith("ValueError") and "one process per arch" in found[arch]
