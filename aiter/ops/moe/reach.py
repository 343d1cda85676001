"""The reachers of moe's listed kernels (aiter.verify.reachers).

A listed MoE kernel is reached by one small `aiter.fused_moe` call (`aiter.moe_sorting` for the
sorting kernels). Dtypes, activation, gate mode, expert biases, where the routing weight applies
and, through inter_dim, stage 2's K tail are the call's own; a one-row user table
(AITER_CONFIG_FMOE, at the call's padded token count) names the block size, stage 1's K split
and the stage tiles and stage-2 mode the kernel was listed with, as a tuned deployment does.
The sizes give each choice work: two k-tiles per stage-1 split, partial column tiles, several
sorted blocks. Checked against aiter.ops.moe.reference (fused_moe_reference); the sorting
exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aiter.ops.moe.reference import fused_moe_reference
from aiter.verify.checks import ROUNDOFF, CaseContext
from aiter.verify.reachers import Unreachable, as_bool, reaches

MODEL_DIM, INTER, EXPERTS, TOPK = 128, 96, 4, 2


def weights(ctx: CaseContext, dtype, experts=EXPERTS, inter=INTER, model_dim=MODEL_DIM):
    """Expert weights w1 [E, 2 inter, model_dim] and w2 [E, model_dim, inter], unit-variance
    outputs."""
    w1 = ctx.randn(experts, 2 * inter, model_dim, scale=model_dim**-0.5, dtype=dtype)
    w2 = ctx.randn(experts, model_dim, inter, scale=inter**-0.5, dtype=dtype)
    return w1, w2


def route(ctx: CaseContext, x: torch.Tensor, experts: int, topk: int = TOPK):
    """fused_topk over random logits: (weights, ids) of `topk` of `experts` per token."""
    import aiter

    logits = ctx.randn(x.shape[0], experts)
    return aiter.fused_topk(x, logits, topk, True)


TABLE = "AITER_CONFIG_FMOE"
# With fp8 experts: a stage-1 value one ulp from the reference's can round
# to the neighbouring fp8 value (2^-4 relative), diluted over stage 2's inter_dim terms.
FP8_TOLERANCE = 2.0**-6
# Sorting is exact: int32 values (the weights compared by their bits) differ by at least one
# part in 2^31 of the largest.
EXACT = 2.0**-32


def _tolerance(dtype: torch.dtype, quant: bool) -> float:
    """A few roundings of the output dtype (4 ROUNDOFF: stage 1 rounds its rows to the
    activations' dtype, the output rounds once), or FP8_TOLERANCE."""
    return FP8_TOLERANCE if quant else 4 * ROUNDOFF[dtype]


def _check_mma(params: dict[str, str]) -> None:
    from aiter import device

    mma = device.arch_info().mma
    if params.get("mma", mma) != mma:
        raise Unreachable(f"a {params['mma']} kernel; {device.arch()} runs {mma} kernels")


def _is_fp8(name: str) -> bool:
    """Whether a listed dtype is fp8; it must then be the arch's flavour, the one fused_moe
    quantizes to."""
    from aiter import device

    if not name.startswith("float8"):
        return False
    fp8 = str(device.fp8_dtype()).removeprefix("torch.")
    if name != fp8:
        raise Unreachable(f"{name} experts; fused_moe quantizes to {fp8} on {device.arch()}")
    return True


def _bias_activation(has_bias: bool, activation: str) -> str:
    """fused_moe takes expert biases with swiglu (gpt-oss) only."""
    if has_bias and activation != "swiglu":
        raise Unreachable(f"expert biases with {activation}: fused_moe takes them with swiglu only")
    return activation


@dataclass(frozen=True)
class MoeCall:
    """One fused_moe call and what its tuned row names: stage1 (tile_n, tile_k) and stage2
    (tile_n, tile_k, mode), each None to leave it to the planner's defaults."""

    dtype: torch.dtype  # the activations' and the output's
    quant: bool  # per-token fp8 experts
    block_m: int
    ksplit: int = 1
    stage1: tuple[int, int] | None = None
    stage2: tuple[int, int, str] | None = None
    activation: str = "silu"
    gate_mode: str = "separated"
    bias1: bool = False
    bias2: bool = False
    doweight: bool = False
    k_tail: bool = False  # inter_dim ends inside a k-block (stage 2's K)
    topk: int = TOPK
    experts: int = EXPERTS
    tokens: int | None = None  # default: block_m + 5, blocks of each expert partly filled
    model_dim: int | None = None  # default: two k-tiles per stage-1 split, two stage-2 N tiles
    inter: int | None = None  # default: three k-blocks (less 16 for a K tail)

    def sizes(self) -> tuple[int, int, int]:
        """(tokens, model_dim, inter_dim)."""
        from aiter.ops.moe.plan import DEFAULT_TILE_K, DEFAULT_TILE_N
        from aiter.ops.shared.mainloop_index import k_block

        tile_k1 = self.stage1[1] if self.stage1 else DEFAULT_TILE_K[self.quant]
        tile_n2 = self.stage2[0] if self.stage2 else DEFAULT_TILE_N
        model_dim = self.model_dim or max(2 * self.ksplit * tile_k1, tile_n2 + 64)
        kb = k_block(1 if self.quant else 2)
        inter = self.inter or 3 * kb - (16 if self.k_tail else 0)
        return self.tokens or self.block_m + 5, model_dim, inter

    def row(self, mma: str) -> tuple[str, str]:
        """(header, row) of the tuned table serving this call ({arch} and {cu} left to fill)."""
        from aiter.ops.moe import table as moe_table

        m, model_dim, inter = self.sizes()
        cells = dict.fromkeys(moe_table.FMOE.header, "")
        if self.stage1:
            n, k = self.stage1
            cells["kernelName1"] = f"{moe_table.STAGE1_KERNELS}_{mma}_{self.block_m}x{n}x{k}"
        if self.stage2:
            n, k, mode = self.stage2
            cells["kernelName2"] = f"{moe_table.STAGE2_KERNELS}_{mma}_{self.block_m}x{n}x{k}_{mode}"
        cells.update(
            gfx="{arch}", cu_num="{cu}", token=str(1 << (m - 1).bit_length()),
            model_dim=str(model_dim), inter_dim=str(inter), expert=str(self.experts),
            topk=str(self.topk), act_type=moe_table.ACTIVATION_CELLS[self.activation],
            dtype=str(self.dtype), q_dtype_a=str(self.dtype), q_dtype_w=str(self.dtype),
            q_type=moe_table.QUANT_CELLS[None], use_g1u1="1",
            doweight_stage1=str(int(self.doweight)), block_m=str(self.block_m),
            ksplit=str(self.ksplit), run_1stage="0",
        )  # fmt: skip
        if self.quant:
            from aiter import device

            fp8 = str(device.fp8_dtype())
            cells.update(q_dtype_a=fp8, q_dtype_w=fp8, q_type=moe_table.QUANT_CELLS["per_token"])
        return ",".join(cells), ",".join(cells.values())

    def describe(self) -> str:
        stage1 = "x".join(map(str, (self.block_m, *self.stage1))) if self.stage1 else "planner"
        stage2 = "x".join(map(str, (self.block_m, *self.stage2))) if self.stage2 else "planner"
        flags = [f for f, on in (("bias1", self.bias1), ("bias2", self.bias2),
                                 ("doweight_stage1", self.doweight)) if on]  # fmt: skip
        kind = "fp8" if self.quant else str(self.dtype).removeprefix("torch.")
        m, model_dim, inter = self.sizes()
        return " ".join([
            f"fused_moe {kind} {self.activation} {self.gate_mode}", *flags,
            f"M={m} E={self.experts} topk={self.topk} model_dim={model_dim} inter={inter}",
            f"stage1 {stage1} ksplit {self.ksplit}, stage2 {stage2}",
        ])  # fmt: skip


def _fp8_experts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row fp8 weights and their fp32 scales [E, rows, 1]."""
    from aiter import device

    fp8 = device.fp8_dtype()
    scale = w.abs().amax(dim=2, keepdim=True) / torch.finfo(fp8).max
    return (w / scale).to(fp8), scale


def run_call(ctx: CaseContext, call: MoeCall) -> None:
    """Make `call` under its one-row table and check it against the torch reference."""
    import aiter

    m, model_dim, inter = call.sizes()
    x = ctx.randn(m, model_dim, dtype=call.dtype)
    w1, w2 = weights(ctx, torch.float32 if call.quant else call.dtype, call.experts, inter,
                      model_dim)  # fmt: skip
    tw, ti = route(ctx, x, call.experts, call.topk)
    kw = dict(activation=call.activation, gate_mode=call.gate_mode, doweight_stage1=call.doweight)
    if call.bias1:
        kw["bias1"] = ctx.randn(call.experts, 2 * inter, scale=0.1)
    if call.bias2:
        kw["bias2"] = ctx.randn(call.experts, model_dim, scale=0.1)
    scales = {}
    if call.quant:
        (w1, s1), (w2, s2) = _fp8_experts(w1), _fp8_experts(w2)
        scales = dict(w1_scale=s1, w2_scale=s2)
    from aiter import device

    header, row = call.row(device.arch_info().mma)
    with ctx.table(TABLE, header, [row]):
        if call.quant:
            out = aiter.fused_moe(x, aiter.shuffle_weight(w1), aiter.shuffle_weight(w2), tw, ti,
                                  quant_type="per_token", **scales, **kw)  # fmt: skip
        else:
            out = aiter.fused_moe(x, w1, w2, tw, ti, **kw)
    ref = fused_moe_reference(x, w1, w2, tw, ti, quant=call.quant, **scales, **kw)
    ctx.check(call.describe(), out, ref, _tolerance(call.dtype, call.quant))


@reaches("moe_stage1")
def stage1(ctx: CaseContext, params: dict[str, str]) -> None:
    """The listed tiles and K split. With ksplit > 1 the kernel only sums partials, compiled as
    silu without bias or weight whatever the call's (the activation kernel applies those)."""
    _check_mma(params)
    quant = as_bool(params["quant"])
    if _is_fp8(params["a"]) != quant:
        raise Unreachable(f"a={params['a']} with quant={quant}")
    ksplit = int(params["ksplit"])
    if ksplit > 1:
        dtype = torch.bfloat16 if quant else getattr(torch, params["a"])
    else:
        dtype = getattr(torch, params["out"])
    call = MoeCall(dtype, quant, int(params["tile_m"]), ksplit,
                   stage1=(int(params["tile_n"]), int(params["tile_k"])),
                   **_stage1_options(params))  # fmt: skip
    run_call(ctx, call)


def _stage1_options(params: dict[str, str]) -> dict:
    """The activation, gate, bias and weighting a listed stage-1 kernel was compiled with."""
    has_bias = as_bool(params["has_bias"])
    return dict(activation=_bias_activation(has_bias, params["activation"]),
                gate_mode=params["gate_mode"], bias1=has_bias,
                doweight=as_bool(params["doweight"]))  # fmt: skip


@reaches("moe_stage1_activation")
def stage1_activation(ctx: CaseContext, params: dict[str, str]) -> None:
    """Launched after a stage-1 split: a row with ksplit 2 at the listed block size."""
    call = MoeCall(getattr(torch, params["out"]), False, int(params["tile_m"]), ksplit=2,
                   **_stage1_options(params))  # fmt: skip
    run_call(ctx, call)


@reaches("moe_stage2")
def stage2(ctx: CaseContext, params: dict[str, str]) -> None:
    """The listed tile and mode; a K tail by an inter_dim that ends inside a k-block; the
    routing weight in stage 1 when stage 2 does not apply it."""
    _check_mma(params)
    quant = as_bool(params["quant"])
    if _is_fp8(params["a2"]) != quant:
        raise Unreachable(f"a2={params['a2']} with quant={quant}")
    has_bias = as_bool(params["has_bias"])
    # "reduce" stores fp32 rows to a workspace (out=float32): the activations' dtype is free.
    dtype = params["out"] if params["out"] != "float32" else "bfloat16" if quant else params["a2"]
    call = MoeCall(
        getattr(torch, dtype), quant, int(params["tile_m"]),
        stage2=(int(params["tile_n"]), int(params["tile_k"]), params["mode"]),
        activation="swiglu" if has_bias else "silu", bias2=has_bias,  # biases need swiglu
        doweight=not as_bool(params["apply_weight"]), k_tail=as_bool(params["k_tail"]),
    )  # fmt: skip
    run_call(ctx, call)


@reaches("moe_topk_reduce")
def topk_reduce(ctx: CaseContext, params: dict[str, str]) -> None:
    """Stage 2's "reduce" mode sums each token's topk rows: a row naming it, the listed topk."""
    from aiter.ops.moe.plan import DEFAULT_TILE_K, DEFAULT_TILE_N

    call = MoeCall(
        getattr(torch, params["out"]), False, 16, topk=int(params["topk"]),
        experts=max(EXPERTS, int(params["topk"])),
        stage2=(DEFAULT_TILE_N, DEFAULT_TILE_K[False], "reduce"),
    )  # fmt: skip
    run_call(ctx, call)


@reaches("moe_quant_per_token")
def quant_per_token(ctx: CaseContext, params: dict[str, str]) -> None:
    """fused_moe quantizes the tokens (rows of model_dim) and the stage-1 rows (of inter_dim):
    model_dim ends 64 elements into the listed number of runs per thread, inter_dim takes one.
    A token's single expert out of two keeps the long GEMMs to a block or two."""
    from aiter.ops.moe.kernels.quant_index import ROW_STEP

    if not _is_fp8(params["q"]):
        raise Unreachable(f"q={params['q']} is not fp8")
    chunks = int(params["chunks"])
    call = MoeCall(
        getattr(torch, params["x"]), True, 16, topk=1, experts=2, tokens=5,
        model_dim=(chunks - 1) * ROW_STEP + 64, inter=64,
    )  # fmt: skip
    run_call(ctx, call)


@reaches("moe_sorting_count", "moe_sorting_scan", "moe_sorting_scatter")
def sorting(ctx: CaseContext, params: dict[str, str]) -> None:
    """aiter.moe_sorting with an expert mask and a local token count as listed, over routed
    entries of two chunks (counting and scattering blocks) into 40 experts' blocks of 32."""
    import aiter
    from aiter.ops.moe.kernels.sorting_index import CHUNK, moe_sorting_reference

    topk, experts, block = 8, 40, 32
    m = CHUNK // topk + 44
    tw, ti = route(ctx, torch.empty(m, 1), experts, topk)
    mask = None
    if as_bool(params.get("has_mask", "False")):
        mask = (torch.rand(experts, generator=ctx.gen) < 0.5).to(torch.int32)
    local = None
    if as_bool(params["has_num_local"]):
        local = torch.tensor([m - 37], dtype=torch.int32)  # fewer than M
    out = aiter.moe_sorting(ti, tw, experts, 128, torch.bfloat16, block, mask, local)
    ref = moe_sorting_reference(ti, tw, experts, block, mask, local)
    used = int(ref[3][0])  # the kernels write the slots and blocks in use
    routed = m if local is None else int(local[0])
    what = f"moe_sorting M={m} topk={topk} E={experts} mask={mask is not None} routed={routed}"
    pairs = {
        "num_valid_ids": (out[3], ref[3]),
        "sorted_ids": (out[0][:used], ref[0][:used]),
        "sorted_weights bits": (out[1][:used].view(torch.int32), ref[1][:used].view(torch.int32)),
        "sorted_expert_ids": (out[2][: used // block], ref[2][: used // block]),
        "moe_buf": (out[4], torch.zeros(m, 128, dtype=torch.bfloat16)),
    }
    for name, (got, want) in pairs.items():
        ctx.check(f"{what}: {name}", got, want, EXACT)


# --- routing ---------------------------------------------------------------------------------


def routing_call(ctx: CaseContext, tokens: int, experts: int, groups: int, topk_group: int,
                 topk: int, scoring: str, biased: bool, renormalize: bool,
                 dtype=torch.float32, scaling: float = 1.0) -> None:  # fmt: skip
    """grouped_topk / biased_grouped_topk over logits spaced 0.05 apart (a permutation per
    token: no ties, and choices a few ulps cannot flip), checked against
    aiter.ops.moe.reference.grouped_topk: the ids exactly, the weights to float32 roundoff."""
    import aiter
    from aiter.ops.moe import reference

    gen = ctx.gen
    logits = torch.stack(
        [torch.randperm(experts, generator=gen).float() * 0.05 - experts * 0.025
         for _ in range(tokens)]
    ).to(dtype)  # fmt: skip
    bias = torch.randperm(experts, generator=gen).float() * 0.01 if biased else None
    weights = torch.empty(tokens, topk)
    ids = torch.empty(tokens, topk, dtype=torch.int32)
    if biased:
        aiter.biased_grouped_topk(logits, bias, weights, ids, groups, topk_group, renormalize,
                                  scaling)  # fmt: skip
    else:
        aiter.grouped_topk(logits, weights, ids, groups, topk_group, renormalize,
                           scoring == "softmax", scaling)  # fmt: skip
    ref_w, ref_ids = reference.grouped_topk(logits, bias, topk, groups, topk_group, scoring,
                                            renormalize, scaling)  # fmt: skip
    what = f"routing E={experts} G={groups}/{topk_group} top{topk} {scoring}"
    ctx.check(f"{what} ids", ids.float(), ref_ids.float(), EXACT)
    ctx.check(f"{what} weights", weights, ref_w, 4 * ROUNDOFF[torch.float32])


@reaches("moe_grouped_topk")
def grouped_topk_listed(ctx: CaseContext, params: dict[str, str]) -> None:
    """The listed routing kernel's own configuration, at 9 tokens (a partial block)."""
    dtype = getattr(torch, params["gating"])
    routing_call(ctx, 9, int(params["experts"]), int(params["groups"]),
                 int(params["topk_group"]), int(params["topk"]), params["scoring"],
                 as_bool(params["biased"]), as_bool(params["renormalize"]), dtype,
                 scaling=2.5)  # fmt: skip
