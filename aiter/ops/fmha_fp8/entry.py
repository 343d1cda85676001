"""Public fp8 flash-attention forward entry (prefill): dense [B, S, H, D] or variable-length
[total, H, D] inputs, grouped-query heads, causal or not; validate, plan, allocate, launch.

FlyDSL is its only backend, so a call the kernels cannot serve (layout, sizes past their 32-bit
indices) is an error raised here, naming the argument, before anything is reported or allocated.
"""

from __future__ import annotations

import math

import torch

from aiter import capture, device, dispatch, jit_monitor
from aiter.ops.fmha_fp8 import plan as fmha_plan
from aiter.ops.fmha_fp8.kernels.flash_attn_index import COMBINE_BLOCK, grid_size, num_q_blocks

__all__ = ["flash_attn_fp8"]

OUT_DTYPE = torch.bfloat16
LSE_DTYPE = torch.float32
DESCALE_DTYPE = torch.float32
SEQLENS_DTYPE = torch.int32
HEAD_DIM_MULTIPLE = 32
HEAD_DIM_RANGE = (64, 256)


def _tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not device.on_gpu(t):
        raise ValueError(f"{name} must be on a GPU device, got {t.device}")
    return t


def _contiguous(name: str, t: torch.Tensor) -> None:
    # The kernels address [rows, heads, dim] with dim innermost (the launcher's contract).
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {list(t.stride())}")


def _head_dim(name: str, value: int) -> None:
    low, high = HEAD_DIM_RANGE
    if value % HEAD_DIM_MULTIPLE or value < low:
        raise ValueError(
            f"{name}: head dims must be multiples of {HEAD_DIM_MULTIPLE} from {low}, got {value}"
        )
    if value > high:
        raise NotImplementedError(f"{name}: head dims above {high} have no kernel, got {value}")


def _descale(name: str, t: object) -> torch.Tensor:
    t = _tensor(name, t)
    if t.dtype != DESCALE_DTYPE or tuple(t.shape) != (1,):
        raise ValueError(
            f"{name} must be an fp32 tensor of shape [1], got {t.dtype} {list(t.shape)}"
        )
    return t


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


@capture.entry("flash_attn_fp8")
def flash_attn_fp8(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    q_descale: torch.Tensor,
    k_descale: torch.Tensor,
    v_descale: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_kv: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_kv: int | None = None,
    num_kv_splits: int | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T / sqrt(D)) v on fp8 inputs, bf16 output (and fp32 log-sum-exp if asked).

    Dense: q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv]; lse [B, Hq, Sq]. Varlen:
    q [Tq, Hq, D], k and v [Tk, Hkv, *] with int32 cu_seqlens_q / cu_seqlens_kv [B + 1] and the
    longest lengths max_seqlen_q / max_seqlen_kv; lse [Hq, Tq]. q, k, v in the arch's fp8
    flavour with fp32 descales of shape [1]; Hkv divides Hq; D and Dv multiples of 32 from 64 to
    256. Causal masks are bottom-right aligned (query i sees keys <= i + Sk - Sq). The launcher's
    choices (query block, KV splits, rescale threshold, batch interleave) follow aiter's
    fmha_plan; num_kv_splits overrides the split count.
    """
    from aiter.ops.fmha_fp8.kernels import flash_attn as kernels

    fp8 = device.fp8_dtype()
    for name, t in (("q", q), ("k", k), ("v", v)):
        t = _tensor(name, t)
        if t.dtype != fp8:
            raise TypeError(f"{name} must have dtype {fp8} on {device.arch()}, got {t.dtype}")
    descales = [_descale(n, t) for n, t in (("q_descale", q_descale), ("k_descale", k_descale),
                                            ("v_descale", v_descale))]  # fmt: skip
    varlen = cu_seqlens_q is not None or cu_seqlens_kv is not None
    dims = 3 if varlen else 4
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != dims:
            form = "[total, H, D] with cu_seqlens" if varlen else "[B, S, H, D]"
            raise ValueError(f"{name} must be {form}, got shape {list(t.shape)}")
    hq, d = int(q.shape[-2]), int(q.shape[-1])
    hkv, dv = int(k.shape[-2]), int(v.shape[-1])
    _head_dim("q", d)
    _head_dim("v", dv)
    if hkv < 1 or hq % hkv:
        raise ValueError(f"k: kv heads ({hkv}) must divide the query heads ({hq})")
    if int(k.shape[-1]) != d:
        raise ValueError(f"k must have head dim {d} (q's), got {int(k.shape[-1])}")
    if tuple(v.shape[:-1]) != tuple(k.shape[:-1]):
        raise ValueError(
            f"v must match k but in its last dim, got {list(v.shape)} vs {list(k.shape)}"
        )
    if num_kv_splits is not None:
        _positive("num_kv_splits", num_kv_splits)

    if varlen:
        if cu_seqlens_q is None or cu_seqlens_kv is None:
            raise ValueError("cu_seqlens_q and cu_seqlens_kv must be given together")
        for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_kv", cu_seqlens_kv)):
            t = _tensor(name, t)
            if t.dtype != SEQLENS_DTYPE or t.dim() != 1 or t.shape[0] < 2:
                raise ValueError(f"{name} must be int32 [B + 1], got {t.dtype} {list(t.shape)}")
        if cu_seqlens_q.shape != cu_seqlens_kv.shape:
            raise ValueError("cu_seqlens_q and cu_seqlens_kv must have the same length (B + 1)")
        if max_seqlen_q is None or max_seqlen_kv is None:
            raise ValueError("max_seqlen_q and max_seqlen_kv are required with cu_seqlens")
        batch = int(cu_seqlens_q.shape[0]) - 1
        sq = _positive("max_seqlen_q", max_seqlen_q)
        sk = _positive("max_seqlen_kv", max_seqlen_kv)
        rows = int(q.shape[0])
        out_shape, lse_shape = (rows, hq, dv), (hq, rows)
    else:
        if max_seqlen_q is not None or max_seqlen_kv is not None:
            raise ValueError("max_seqlen_q and max_seqlen_kv are only for varlen (cu_seqlens)")
        batch, sq = int(q.shape[0]), int(q.shape[1])
        sk = int(k.shape[1])
        if int(k.shape[0]) != batch:
            raise ValueError(f"k must have batch {batch} (q's), got {int(k.shape[0])}")
        if min(batch, sq, sk) < 1:
            raise ValueError(f"q and k must be non-empty, got {list(q.shape)} and {list(k.shape)}")
        rows = batch * sq
        out_shape, lse_shape = (batch, sq, hq, dv), (batch, hq, sq)

    for name, t in (("q", q), ("k", k), ("v", v)):
        _contiguous(name, t)
    if varlen:
        _contiguous("cu_seqlens_q", cu_seqlens_q)
        _contiguous("cu_seqlens_kv", cu_seqlens_kv)
    limit = kernels.INDEX_LIMIT
    k_rows = int(k.shape[0]) if varlen else batch * sk
    if max(rows, k_rows) >= limit:
        raise ValueError(
            f"q, k: {max(rows, k_rows)} token rows are too many for the kernels' 32-bit indices"
        )
    if rows * hq * dv + COMBINE_BLOCK >= limit:
        raise ValueError(
            f"q, v: the output's rows * Hq * Dv = {rows * hq * dv} elements are too many for "
            "the kernels' 32-bit indices"
        )

    mma = device.arch_info().mma
    if mma not in kernels.MMA_FLAVOURS:
        raise NotImplementedError(
            f"flash_attn_fp8 has no FlyDSL kernel for {device.arch()} ({mma})"
        )

    # The split decision counts rows as batch * max_seqlen_q, the most a varlen call can hold, so
    # that it depends on (batch, lengths) alone and a ragged batch asks for the same kernels.
    choice = fmha_plan.plan(
        mma=mma, batch=batch, num_heads=hq, max_seqlen_q=sq, max_seqlen_k=sk, rows=batch * sq,
        head_dim=d, head_dim_v=dv, causal=bool(causal), cu_num=device.cu_num(),
        num_kv_splits=num_kv_splits,
    )  # fmt: skip
    q_blocks = num_q_blocks(sq, choice.block_m)
    groups = grid_size(batch, hq, q_blocks, choice.num_kv_splits)
    if groups >= limit:
        raise ValueError(
            f"num_kv_splits: {choice.num_kv_splits} splits x {hq} heads x {q_blocks} query "
            f"blocks x {batch} batches = {groups} work-groups, too many for the kernels' 32-bit "
            "indices"
        )

    def described() -> dict[str, str]:
        shown = {n: dispatch.tensor_arg(t) for n, t in (("q", q), ("k", k), ("v", v))}
        if varlen:
            shown.update(max_seqlen_q=str(sq), max_seqlen_kv=str(sk), batch=str(batch))
        return shown | {"causal": str(bool(causal)), "return_lse": str(bool(return_lse))}

    def launch(choice: fmha_plan.AttnChoice) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = torch.empty(out_shape, dtype=OUT_DTYPE, device=q.device)
        lse = torch.empty(lse_shape, dtype=LSE_DTYPE, device=q.device) if return_lse else None
        workspace_out = workspace_lse = None
        if choice.num_kv_splits > 1:
            ws_out, ws_lse = kernels.split_workspace_shapes(rows, hq, dv, choice.num_kv_splits)
            workspace_out = torch.empty(ws_out, dtype=kernels.WORKSPACE_DTYPE, device=q.device)
            workspace_lse = torch.empty(ws_lse, dtype=kernels.WORKSPACE_DTYPE, device=q.device)
        kernels.launch_flash_attn_fp8(
            q, k, v, out, lse, *descales,
            softmax_scale=1.0 / math.sqrt(d),
            causal=bool(causal),
            block_m=choice.block_m,
            rescale_threshold=choice.rescale_threshold,
            num_kv_splits=choice.num_kv_splits,
            interleave=choice.interleave,
            mma=mma,
            cu_seqlens_q=cu_seqlens_q if varlen else None,
            cu_seqlens_k=cu_seqlens_kv if varlen else None,
            max_seqlen_q=sq if varlen else None,
            max_seqlen_k=sk if varlen else None,
            workspace_out=workspace_out,
            workspace_lse=workspace_lse,
            stream=device.current_stream(),
        )  # fmt: skip
        return out, lse

    params: dict[str, object] = {"layout": "varlen" if varlen else "dense"}
    params["return_lse"] = bool(return_lse)
    if jit_monitor.settings().fallback:
        planned = choice
        calls = dict(causal=bool(causal), batch=batch, max_seqlen_q=sq, max_seqlen_k=sk)
        variants = fmha_plan.equivalent_choices(planned, **calls)
        # What selects kernels besides the choices: the dtype, head counts and flags.
        signature = (device.arch(), device.cu_num(), q.dtype, hq, hkv,
                     tuple(sorted(params.items())), bool(causal))  # fmt: skip
        differs = "the sums tiled, rescaled or split differently"
        choice = jit_monitor.cached_equivalent(fmha_plan.OP, signature, planned, variants,
                                               launch, fmha_plan.describe, differs)  # fmt: skip
        if choice != planned:
            params["fallback_from"] = fmha_plan.describe(planned)

    def covering_row() -> dict[str, str]:
        """A fmha_fp8_shapes.csv row whose build serves this call (its maxima are the call's)."""
        cells = dict(gfx=device.arch(), cu_num=device.cu_num(), num_heads=hq, num_kv_heads=hkv,
                     head_dim=d, head_dim_v=dv, layout=params["layout"], causal=int(causal),
                     max_batch=batch, max_seqlen=max(sq, sk))  # fmt: skip
        return {name: str(value) for name, value in cells.items()}

    # The grid axes a build replays (aiter.aot.flydsl.fmha_fp8), for a miss message.
    axis = {"batch": batch, "seqlen_q": sq, "seqlen_k": sk}
    choice.report(described, covering_row, axis, **params)
    out, lse = launch(choice)
    return (out, lse) if return_lse else out
