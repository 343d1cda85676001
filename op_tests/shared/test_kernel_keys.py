"""A kernel's cache key depends on the plan's choices only, never on a size that varies at
serving: FlyDSL keys a tensor by its first unit-stride axis, which a size of 1 can move (an lse of
[H, 1] has strides (1, 1)), so every launcher hands tensors over through
`aiter.ops.shared.kernel_tensors`.
"""

from __future__ import annotations

import random
from contextlib import contextmanager

import pytest
import torch
from flydsl.compiler.jit_argument import JitArgumentRegistry, TorchTensorJitArg

from aiter import dispatch
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl import chunk_gdn_h, conv3d, fmha_fp8, gemm, moe
from aiter.aot.flydsl.dry_run import dry_run
from aiter.ops.shared.kernel_tensors import kernel_tensor

ARCH, CU_NUM = "gfx942", 304
FAMILIES = {"gemm": gemm, "moe": moe, "conv3d": conv3d, "fmha_fp8": fmha_fp8,
            "chunk_gdn_h": chunk_gdn_h}  # fmt: skip
JOBS_PER_FAMILY = 8


def _signature(arg) -> tuple:
    return arg.__cache_signature__()


def test_flydsl_keys_a_size_one_axis_apart() -> None:
    """The trap itself: the same row-major layout keys apart when its last size is 1."""
    one, many = torch.empty(8, 1), torch.empty(8, 5)
    assert _signature(TorchTensorJitArg(one)) != _signature(TorchTensorJitArg(many))


@pytest.mark.parametrize(
    "tensor",
    [
        torch.empty(8, 1),
        torch.empty(1, 1),
        torch.empty(1, 64),
        torch.empty(64, 1).t(),  # [1, 64] with strides (1, 1)
        torch.empty(8, 1, 1),
        torch.empty(2, 1, 4)[:, :, :1],  # a size-1 last axis of stride 1 inside a wider row
    ],
    ids=["Hx1", "1x1", "1xK", "1xK-transposed", "Hx1x1", "sliced"],
)
def test_kernel_tensor_keys_every_size_alike(tensor) -> None:
    reference = kernel_tensor(torch.empty((3,) * tensor.dim()))  # no size of 1
    assert _signature(kernel_tensor(tensor)) == _signature(reference)


def test_kernel_tensor_keeps_every_stepped_stride() -> None:
    """Only strides of size-1 axes change, so the kernel addresses the same elements."""
    base = torch.empty(6, 1, 4)[:, :, 1:2]  # strides (4, 4, 1)
    arg = kernel_tensor(base)
    assert arg.torch_tensor.stride()[0] == base.stride(0)
    assert arg.torch_tensor.data_ptr() == base.data_ptr()


def test_kernel_tensor_refuses_a_strided_last_axis() -> None:
    with pytest.raises(ValueError, match="unit stride on the last axis"):
        kernel_tensor(torch.empty(4, 6)[:, ::2])


@contextmanager
def _raw_tensors_refused():
    """FlyDSL wraps a raw torch tensor through its registry: make that an error."""
    constructor, dsl_type = JitArgumentRegistry.registry[torch.Tensor]

    def refuse(value, *args, **kwargs):
        raise AssertionError(
            f"a launcher passed a raw tensor {list(value.shape)} to a FlyDSL kernel; "
            "hand it over through aiter.ops.shared.kernel_tensors"
        )

    JitArgumentRegistry.registry[torch.Tensor] = (refuse, dsl_type)
    try:
        yield
    finally:
        JitArgumentRegistry.registry[torch.Tensor] = (constructor, dsl_type)


def _axis_values(job, rng: random.Random, count: int) -> list[dict[str, int]]:
    info = job.info
    if info.cell:
        corners = [{axis: bounds[0] for axis, bounds in info.cell.items()}]
        corners += [
            {axis: rng.randint(lo, hi) for axis, (lo, hi) in info.cell.items()}
            for _ in range(count)
        ]
        return corners
    picks = {info.lo, info.hi} | {rng.randint(info.lo, info.hi) for _ in range(count)}
    return [info.values(v) for v in sorted(picks)]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_kernel_keys_depend_on_the_plan_only(family) -> None:
    """Random calls of the family's default jobs (1 and every run's ends included): calls of one
    row and caller variant that the dispatch records describe alike ask for the same kernel
    files, and no launcher hands FlyDSL a raw tensor."""
    rng = random.Random(f"kernel-keys-{family}")
    jobs = FAMILIES[family].FAMILY.jobs(ARCH, None, {})
    assert jobs, f"{family} has no default jobs for {ARCH}"
    chosen = rng.sample(jobs, min(len(jobs), JOBS_PER_FAMILY))
    files_by_choice: dict[tuple, set] = {}
    calls = 0
    refused = _raw_tensors_refused()
    with (
        refused,
        dispatch.observe() as records,
        dry_run(ARCH, CU_NUM, bridge.MODE_NAME) as requests,
    ):
        for job in chosen:
            for values in _axis_values(job, rng, 3):
                first_request, first_record = len(requests), len(records)
                try:
                    job.call(**values)
                except NotImplementedError:
                    continue  # the runtime declines the point (past 32-bit offsets): no kernel
                calls += 1
                choice = (job.info.row, job.info.variant) + tuple(
                    (r.op, r.backend, r.kernel, repr(sorted(r.params.items())))
                    for r in records[first_record:]
                )
                files = frozenset((r.function, r.file_name) for r in requests[first_request:])
                files_by_choice.setdefault(choice, set()).add(files)
    assert calls >= 2 * len(chosen)
    apart = {choice: files for choice, files in files_by_choice.items() if len(files) > 1}
    assert not apart, f"one plan asks for different kernels: {apart}"


def test_one_varlen_query_row_with_lse_asks_for_the_kernel_of_many() -> None:
    """A varlen caller passing the longest length as an upper bound, one query row in all: its
    lse is [Hq, 1], and must key as [Hq, rows] does."""
    from aiter import device
    from aiter.ops.fmha_fp8.entry import flash_attn_fp8

    files = {}
    with dry_run(ARCH, CU_NUM, bridge.MODE_NAME) as requests:
        fp8 = device.fp8_dtype()

        def empty(shape, dtype=fp8):
            return torch.empty(shape, dtype=dtype, device="cuda")

        for rows in (1, 2, 7):
            first = len(requests)
            flash_attn_fp8(
                empty((rows, 8, 128)),
                empty((rows, 1, 128)),
                empty((rows, 1, 128)),
                causal=True,
                cu_seqlens_q=empty((2,), torch.int32),
                cu_seqlens_kv=empty((2,), torch.int32),
                max_seqlen_q=300,
                max_seqlen_kv=300,
                return_lse=True,
                **{n: empty((1,), torch.float32) for n in ("q_descale", "k_descale", "v_descale")},
            )
            files[rows] = sorted(r.file_name for r in requests[first:])
    assert files[1] == files[2] == files[7]


@pytest.mark.parametrize(
    "tensor",
    [
        torch.empty(8, 5),
        torch.empty(3, 4, 5),
        torch.empty(2, 3, 8)[:, :, 2:6],  # stepped rows, unit last stride
        torch.empty(7),
        torch.empty(8, 1),
        torch.empty(1, 64),
        torch.empty(6, 1, 4)[:, :, 1:2],
    ],
    ids=["MxK", "3d", "sliced-rows", "1d", "Hx1", "1xK", "size-1-last"],
)
def test_kernel_tensor_is_flydsl_marking_its_last_axis(tensor) -> None:
    """Whichever way kernel_tensor builds the argument, it is the one FlyDSL's explicit marking
    of the last axis gives: the same key, dynamic sizes and strides, and memref layout."""
    arg = kernel_tensor(tensor)
    strides = tuple(arg.torch_tensor.stride())
    marked = TorchTensorJitArg(arg.torch_tensor, dynamic_layout=False)
    marked.mark_layout_dynamic(leading_dim=tensor.dim() - 1)
    assert _signature(arg) == _signature(marked)
    assert arg.shape_dyn_indices == marked.shape_dyn_indices
    assert arg.stride_dyn_indices == marked.stride_dyn_indices
    assert arg._ensure_spec().get_cache_signature() == marked.spec.get_cache_signature()
    assert arg.is_layout_dynamic and strides[-1] == 1
