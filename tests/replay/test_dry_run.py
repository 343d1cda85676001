"""Tests of aiter.aot.flydsl.dry_run.context: the context that makes a CPU process look like one GPU.

In this process only gfx942 is replayed (FlyDSL freezes one arch per process); the
two-arch check runs in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

from aiter import device
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import (
    GUARDED_TORCH_CUDA,
    GpuRuntimeReached,
    SimulatedStream,
    dry_run,
)
from aiter.aot.flydsl.dry_run import context as dry_run_module

REPO = Path(__file__).resolve().parents[2]
ENV_NAMES = ("ARCH", "FLYDSL_GPU_ARCH", "COMPILE_ONLY")


def gfx942():
    return dry_run("gfx942", 304, bridge.MODE_NAME)


def test_tensors_are_fakes_on_cuda0() -> None:
    with gfx942() as requests:
        x = torch.empty(4, 8, dtype=torch.bfloat16, device="cuda")
        z = torch.zeros(3, device="cuda:0")
        like = torch.empty_like(x)
        for t in (x, z, like):
            assert isinstance(t, FakeTensor)
            assert t.device == torch.device("cuda", 0)
            assert t.is_cuda
        assert x.shape == (4, 8) and x.dtype is torch.bfloat16
        assert requests == []
    assert not isinstance(torch.empty(2), FakeTensor)


def test_device_answers_for_the_target() -> None:
    with gfx942():
        assert device.is_simulated()
        assert device.arch() == "gfx942"
        assert device.cu_num() == 304
        assert device.fp8_dtype() is torch.float8_e4m3fnuz
        stream = device.current_stream()
        assert isinstance(stream, SimulatedStream)
        assert stream.cuda_stream == 0
    assert not device.is_simulated()


def test_env_set_inside_and_restored_to_previous_values(monkeypatch) -> None:
    monkeypatch.setenv("ARCH", "before-arch")
    monkeypatch.setenv("FLYDSL_GPU_ARCH", "gfx942")  # a different one would be refused
    monkeypatch.setenv("COMPILE_ONLY", "0")
    with gfx942():
        assert [os.environ[k] for k in ENV_NAMES] == ["gfx942", "gfx942", "1"]
    assert [os.environ[k] for k in ENV_NAMES] == ["before-arch", "gfx942", "0"]


def test_env_unset_before_is_unset_after_even_on_error(monkeypatch) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(KeyError, match="inside"), gfx942():
        assert os.environ["COMPILE_ONLY"] == "1"
        raise KeyError("inside")
    for name in ENV_NAMES:
        assert name not in os.environ
    assert not device.is_simulated()


def test_guarded_list_is_pinned() -> None:
    assert GUARDED_TORCH_CUDA == (
        "current_stream",
        "default_stream",
        "synchronize",
        "get_device_properties",
        "current_device",
        "set_device",
        "device_count",
        "mem_get_info",
    )


@pytest.mark.parametrize("name", GUARDED_TORCH_CUDA)
def test_guarded_torch_cuda_raises_inside_and_is_restored(name: str) -> None:
    original = getattr(torch.cuda, name)
    with gfx942():
        with pytest.raises(GpuRuntimeReached) as info:
            getattr(torch.cuda, name)(0)
        assert str(info.value).startswith(f"torch.cuda.{name} was called inside an AOT dry run")
        assert "aiter.device" in str(info.value)
    assert getattr(torch.cuda, name) is original


def test_tensor_methods_are_restored() -> None:
    getitem, copy_ = torch.Tensor.__getitem__, torch.Tensor.copy_
    with gfx942():
        assert torch.Tensor.__getitem__ is not getitem
        assert torch.Tensor.copy_ is not copy_
    assert torch.Tensor.__getitem__ is getitem
    assert torch.Tensor.copy_ is copy_


INDEXES = [
    pytest.param(lambda x: x[1:3], id="x[1:3]"),
    pytest.param(lambda x: x[0], id="x[0]"),
    pytest.param(lambda x: x[-1], id="x[-1]"),
    pytest.param(lambda x: x[:, 2:4], id="x[:, 2:4]"),
    pytest.param(lambda x: x[None], id="x[None]"),
    pytest.param(lambda x: x[None, 1:3, None], id="x[None, 1:3, None]"),
    pytest.param(lambda x: x[1, 2:5], id="x[1, 2:5]"),
    pytest.param(lambda x: x[::2], id="x[::2]"),
    pytest.param(lambda x: x[2:], id="x[2:]"),
    pytest.param(lambda x: x[3, 4], id="x[3, 4]"),
    pytest.param(lambda x: x[:, -1], id="x[:, -1]"),
    pytest.param(lambda x: x[1:100], id="x[1:100]"),
]


@pytest.mark.parametrize("index", INDEXES)
def test_indexing_a_fake_matches_real_torch(index) -> None:
    real = index(torch.empty(8, 6))
    with gfx942():
        x = torch.empty(8, 6, device="cuda")
        view = index(x)
        assert isinstance(view, FakeTensor)
        assert view.device == torch.device("cuda", 0)
        got = (tuple(view.shape), view.stride(), view.storage_offset())
    assert got == (tuple(real.shape), real.stride(), real.storage_offset())


def test_indexing_with_a_bool_is_refused_not_misread() -> None:
    with gfx942():
        x = torch.empty(8, 6, device="cuda")
        with pytest.raises(TypeError, match="indexing a fake tensor with a bool"):
            x[True]


def test_unsupported_index_on_a_fake_is_named() -> None:
    with gfx942():
        x = torch.empty(8, 6, device="cuda")
        with pytest.raises(TypeError, match="indexing a fake tensor with ellipsis"):
            x[..., 1]


def test_copy_on_fakes() -> None:
    with gfx942():
        src = torch.empty(8, 6, device="cuda")
        dst = torch.empty(8, 6, dtype=torch.bfloat16, device="cuda")
        assert dst.copy_(src) is dst
        assert dst.dtype is torch.bfloat16
        row = torch.empty(6, device="cuda")
        assert dst.copy_(row) is dst  # broadcasts like torch
        assert dst.shape == (8, 6)
        with pytest.raises(RuntimeError):
            dst.copy_(torch.empty(5, device="cuda"))


def test_real_tensors_still_index_and_copy_inside() -> None:
    real = torch.arange(12.0).reshape(3, 4)
    with gfx942():
        pass
    # After the block the originals serve real tensors.
    assert real[1, 2].item() == 6.0
    out = torch.empty(3, 4)
    out.copy_(real)
    assert out[2, 3].item() == 11.0


def test_kernel_execution_is_guarded_and_restored() -> None:
    original = bridge.jit_function()._build_call_state
    with gfx942(), pytest.raises(GpuRuntimeReached, match="a FlyDSL kernel launch was called"):
        bridge.jit_function()._build_call_state(None, (), None)
    assert bridge.jit_function()._build_call_state is original


def test_a_real_launch_that_would_run_raises(monkeypatch, tmp_path: Path) -> None:
    # Without COMPILE_ONLY a launch goes on to run its kernel: that must never reach a GPU.
    monkeypatch.setenv("FLYDSL_RUNTIME_CACHE_DIR", str(tmp_path))
    from tests.fixtures.tiny_kernels import scale

    with gfx942() as requests:
        x = torch.empty(256, device="cuda")
        y = torch.empty_like(x)
        del os.environ["COMPILE_ONLY"]
        with pytest.raises(GpuRuntimeReached, match="a FlyDSL kernel launch was called"):
            scale(x, y, 256, 64)
        assert requests == []
    assert list(tmp_path.rglob("*.pkl")) == []


def test_second_arch_refused_in_process(monkeypatch) -> None:
    monkeypatch.setattr(dry_run_module, "_process_arch", "gfx942")
    with pytest.raises(ValueError) as info, dry_run("gfx950", 256, bridge.MODE_NAME):
        pass
    assert str(info.value) == (
        "this process was started for gfx942 and cannot replay gfx950: run one process per arch"
    )
    assert not device.is_simulated()


def test_arch_frozen_by_environment_refused(monkeypatch) -> None:
    monkeypatch.setattr(dry_run_module, "_process_arch", None)
    monkeypatch.setenv("FLYDSL_GPU_ARCH", "gfx1250")
    with pytest.raises(ValueError, match="started for gfx1250 and cannot replay gfx942"), gfx942():
        pass
    assert dry_run_module._process_arch is None


def test_bad_mode_refused(monkeypatch) -> None:
    monkeypatch.delenv("COMPILE_ONLY", raising=False)
    getitem, guarded = torch.Tensor.__getitem__, torch.cuda.synchronize
    with (
        pytest.raises(ValueError, match="mode must be 'name' or 'compile', got 'build'"),
        dry_run("gfx942", 304, "build"),
    ):
        pass
    assert not device.is_simulated()
    assert torch.Tensor.__getitem__ is getitem
    assert torch.cuda.synchronize is guarded
    assert "COMPILE_ONLY" not in os.environ


@pytest.mark.slow  # compiles for two archs in a fresh process
def test_two_archs_in_one_fresh_process() -> None:
    script = textwrap.dedent("""
        from aiter import flydsl_bridge as bridge
        from aiter.aot.flydsl.dry_run import dry_run
        with dry_run("gfx942", 304, bridge.MODE_NAME):
            pass
        with dry_run("gfx942", 80, bridge.MODE_NAME):  # same arch, other CU count: fine
            pass
        try:
            with dry_run("gfx950", 256, bridge.MODE_NAME):
                pass
        except ValueError as err:
            print("REFUSED:", err)
        """)
    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "REFUSED: this process was started for gfx942 and cannot replay gfx950: "
        "run one process per arch"
    )


def test_contiguous_on_fakes_matches_real_torch() -> None:
    real = torch.empty(4, 8, 16, 16).permute(0, 2, 1, 3).contiguous()
    original = torch.Tensor.contiguous
    with gfx942():
        assert torch.Tensor.contiguous is not original
        x = torch.empty(4, 8, 16, 16, device="cuda")
        assert x.contiguous() is x
        view = x.permute(0, 2, 1, 3).contiguous()
        got = (tuple(view.shape), view.stride(), view.is_contiguous())
    assert got == (tuple(real.shape), real.stride(), True)
    assert torch.Tensor.contiguous is original
