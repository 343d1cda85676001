"""Tests of aiter.device, the one seam to the GPU: no-GPU errors and simulated devices.

These machines have no GPU, so every real question must fail with NoGpuError.
"""

from __future__ import annotations

import pytest
import torch

from aiter import device
from aiter.arch import ARCHS

NO_GPU_MESSAGE = (
    "no AMD GPU is visible to torch; run on a ROCm machine, or build kernels with the "
    "AOT builder (python -m aiter.aot.flydsl.gemm), which needs no GPU"
)


@pytest.fixture(autouse=True)
def _no_gpu_here() -> None:
    if torch.cuda.is_available():
        pytest.skip("these tests pin behaviour on a machine without a GPU")
    assert not device.is_simulated()


@pytest.mark.parametrize(
    "ask", [device.arch, device.cu_num, device.arch_info, device.fp8_dtype, device.native_target]
)
def test_no_gpu_raises_no_gpu_error_with_the_fix(ask) -> None:
    with pytest.raises(device.NoGpuError) as info:
        ask()
    assert str(info.value) == NO_GPU_MESSAGE
    assert isinstance(info.value, RuntimeError)


def test_no_gpu_error_is_not_cached_away() -> None:
    # Asked twice, it must fail twice the same way (the cache must not keep a bad answer).
    for _ in range(2):
        with pytest.raises(device.NoGpuError):
            device.arch()


def test_simulate_answers_every_question() -> None:
    stream = object()
    with device.simulate("gfx942", 304, stream) as facts:
        assert device.is_simulated()
        assert facts == device.DeviceFacts("gfx942", 304, stream)
        assert device.arch() == "gfx942"
        assert device.cu_num() == 304
        assert device.fp8_dtype() is torch.float8_e4m3fnuz
        assert device.current_stream() is stream
        assert device.arch_info() is ARCHS["gfx942"]
    assert not device.is_simulated()
    with pytest.raises(device.NoGpuError):
        device.arch()


def test_simulate_normalizes_the_arch_and_cu_num() -> None:
    with device.simulate("GFX942:sramecc+:xnack-", "228") as facts:  # type: ignore[arg-type]
        assert facts.arch == "gfx942"
        assert device.arch() == "gfx942"
        assert device.cu_num() == 228
        assert isinstance(device.cu_num(), int)
        assert device.current_stream() is None


def test_simulate_gfx950_and_gfx1250() -> None:
    with device.simulate("gfx950", 256):
        assert device.fp8_dtype() is torch.float8_e4m3fn
        assert device.arch_info().mma == "mfma"
    with device.simulate("gfx1250", 128):
        assert device.fp8_dtype() is torch.float8_e4m3fn
        assert device.arch_info().mma == "wmma"
        assert device.arch_info().wave_size == 32
        assert device.cu_num() == 128


def test_simulate_nested_restores_each_level() -> None:
    outer_stream, inner_stream = object(), object()
    with device.simulate("gfx942", 80, outer_stream):
        with device.simulate("gfx950", 256, inner_stream):
            assert (device.arch(), device.cu_num()) == ("gfx950", 256)
            assert device.current_stream() is inner_stream
            assert device.fp8_dtype() is torch.float8_e4m3fn
        assert (device.arch(), device.cu_num()) == ("gfx942", 80)
        assert device.current_stream() is outer_stream
        assert device.fp8_dtype() is torch.float8_e4m3fnuz
    assert not device.is_simulated()


def test_simulate_restores_after_an_exception() -> None:
    with pytest.raises(KeyError), device.simulate("gfx942", 304), device.simulate("gfx950", 256):
        raise KeyError("boom")
    assert not device.is_simulated()
    with pytest.raises(device.NoGpuError):
        device.cu_num()


def test_simulate_unknown_arch_raises_and_changes_nothing() -> None:
    with device.simulate("gfx942", 304):
        with (
            pytest.raises(ValueError, match="unknown GPU arch 'gfx90a'"),
            device.simulate("gfx90a", 104),
        ):
            pass
        assert device.arch() == "gfx942"
    assert not device.is_simulated()


def test_on_gpu_answers_as_is_cuda_does() -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from aiter import device as aiter_device

    with FakeTensorMode():
        on_cuda = torch.empty((2,), device="cuda")
        on_cpu = torch.empty((2,), device="cpu")
        assert aiter_device.on_gpu(on_cuda) is on_cuda.is_cuda is True
        assert aiter_device.on_gpu(on_cpu) is on_cpu.is_cuda is False
    meta = torch.empty((2,), device="meta")
    assert aiter_device.on_gpu(meta) is meta.is_cuda is False
    assert aiter_device.on_gpu(torch.zeros(2)) is False
