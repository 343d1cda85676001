"""Public fused-MoE entries with aiter's semantics: routing (`fused_topk`), sorting tokens into
expert blocks (`moe_sorting`) and the two-stage layer (`fused_moe`). Validate, plan, launch.
"""

from __future__ import annotations

import dataclasses

import torch

from aiter import capture, device, dispatch, jit_monitor
from aiter.ops.moe import host_planner as moe_host
from aiter.ops.moe.kernels.quant_index import MAX_K as QUANT_MAX_K
from aiter.ops.moe.kernels.sorting_index import MAX_TOPK
from aiter.ops.moe.kernels.stages_index import (
    ELEMENTWISE_BLOCK,
    MODEL_DIM_MULTIPLE,
    inter_dim_multiple,
)
from aiter.ops.moe.plan import OP, MoeChoice, MoeShape, describe, equivalent_choices, plan

__all__ = ["fused_moe", "fused_topk", "moe_sorting"]

ACTIVATIONS = ("silu", "swiglu")
QUANT_TYPES = (None, "per_token")
GATE_MODES = ("separated", "interleave")
ACTIVATION_DTYPES = (torch.bfloat16, torch.float16)
IDS_DTYPE = torch.int32
WEIGHTS_DTYPE = torch.float32
SCALE_DTYPE = torch.float32
BIAS_DTYPE = torch.float32
MASK_DTYPE = torch.int32
MAX_TOKENS = 1 << 24  # sorted ids pack the token into 24 bits
INDEX_LIMIT = 2**31  # the kernels index their buffers with int32


def _tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _check(
    name: str, t: object, dtypes: tuple[torch.dtype, ...], shape: tuple[int, ...], gpu=True
) -> torch.Tensor:
    t = _tensor(name, t)
    if t.dtype not in dtypes:
        expected = dtypes[0] if len(dtypes) == 1 else f"one of {dtypes}"
        raise TypeError(f"{name} must have dtype {expected}, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    if gpu and not device.on_gpu(t):
        raise ValueError(f"{name} must be on a GPU device, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")
    return t


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


@capture.entry("fused_topk")
def fused_topk(
    hidden_states: torch.Tensor, gating_output: torch.Tensor, topk: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax routing: the `topk` largest softmax(gating_output) experts of each token.

    Returns fp32 weights and int32 expert ids, both [M, topk]; with `renormalize` each token's
    weights are divided by their sum. hidden_states only fixes M (its rows must match).
    """
    hidden_states = _tensor("hidden_states", hidden_states)
    gating_output = _tensor("gating_output", gating_output)
    if gating_output.dim() != 2:
        raise ValueError(
            f"gating_output must be [M, num_experts], got shape {list(gating_output.shape)}"
        )
    m, experts = gating_output.shape
    if hidden_states.dim() < 1 or hidden_states.shape[0] != m:
        raise ValueError(
            f"hidden_states must have M = {m} rows (gating_output's), got shape "
            f"{list(hidden_states.shape)}"
        )
    _positive_int("topk", topk)
    if topk > experts:
        raise ValueError(f"topk must be at most num_experts = {experts}, got {topk}")
    if not gating_output.dtype.is_floating_point:
        raise TypeError(f"gating_output must be floating point, got {gating_output.dtype}")

    def record() -> dispatch.DispatchRecord:
        args = {
            "hidden_states": dispatch.tensor_arg(hidden_states),
            "gating_output": dispatch.tensor_arg(gating_output),
            "topk": str(topk),
            "renormalize": str(bool(renormalize)),
        }
        reason = "softmax top-k routing is computed in torch (no FlyDSL kernel)"
        return dispatch.DispatchRecord(
            "fused_topk", dispatch.BACKEND_TORCH, None, "heuristic", None,
            {"reason": reason}, args=args,
        )  # fmt: skip

    dispatch.report(record)
    probs = torch.softmax(gating_output.to(torch.float32), dim=-1)
    weights, ids = torch.topk(probs, topk, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(WEIGHTS_DTYPE), ids.to(IDS_DTYPE)


def _routing(topk_ids, topk_weights) -> tuple[int, int]:
    topk_ids = _tensor("topk_ids", topk_ids)
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be [M, topk], got shape {list(topk_ids.shape)}")
    m, topk = (int(d) for d in topk_ids.shape)
    if m < 1 or topk < 1:
        raise ValueError(f"topk_ids must have at least one row and column, got {[m, topk]}")
    if m >= MAX_TOKENS:
        raise ValueError(f"topk_ids: at most {MAX_TOKENS - 1} tokens fit a sorted id, got {m}")
    if topk > MAX_TOPK:
        raise ValueError(f"topk_ids: at most topk = {MAX_TOPK} fits a sorted id, got {topk}")
    _check("topk_ids", topk_ids, (IDS_DTYPE,), (m, topk))
    _check("topk_weights", topk_weights, (WEIGHTS_DTYPE,), (m, topk))
    return m, topk


def _expert_mask(expert_mask, num_experts: int) -> None:
    if expert_mask is not None:
        _check("expert_mask", expert_mask, (MASK_DTYPE,), (num_experts,))


def _local_tokens(num_local_tokens) -> None:
    if num_local_tokens is not None:
        _check("num_local_tokens", num_local_tokens, (IDS_DTYPE,), (1,))


def _sort(
    topk_ids, topk_weights, num_experts, block_size, expert_mask, num_local_tokens, m, topk
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from aiter.ops.moe.kernels.sorting import (
        WORKSPACE_DTYPE,
        launch_moe_sorting,
        sorting_workspace_size,
    )

    slots, blocks = moe_host.moe_sorting_sizes(m, topk, num_experts, block_size)
    dev = topk_ids.device
    sorted_ids = torch.empty((slots,), dtype=IDS_DTYPE, device=dev)
    sorted_weights = torch.empty((slots,), dtype=WEIGHTS_DTYPE, device=dev)
    sorted_expert_ids = torch.empty((blocks,), dtype=IDS_DTYPE, device=dev)
    num_valid_ids = torch.empty((2,), dtype=IDS_DTYPE, device=dev)
    workspace = torch.empty(
        (sorting_workspace_size(m, topk, num_experts),), dtype=WORKSPACE_DTYPE, device=dev
    )
    launch_moe_sorting(
        topk_ids,
        topk_weights,
        sorted_ids,
        sorted_weights,
        sorted_expert_ids,
        num_valid_ids,
        workspace,
        num_experts=num_experts,
        block_size=block_size,
        expert_mask=expert_mask,
        num_local_tokens=num_local_tokens,
        stream=device.current_stream(),
    )
    return sorted_ids, sorted_weights, sorted_expert_ids, num_valid_ids


@capture.entry("moe_sorting")
def moe_sorting(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_experts: int,
    model_dim: int,
    moebuf_dtype: torch.dtype,
    block_size: int,
    expert_mask: torch.Tensor | None = None,
    num_local_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort routed (token, slot) pairs into blocks of `block_size` rows of one expert each.

    Returns (sorted_ids, sorted_weights, sorted_expert_ids, num_valid_ids, moe_buf):
    sorted_ids int32 [P] packs (slot << 24) | token, padding is (topk << 24) | M;
    sorted_weights fp32 [P]; sorted_expert_ids int32, the local expert of each block;
    num_valid_ids int32 [2] = (rows in use, token count); moe_buf a zeroed [M, model_dim] of
    `moebuf_dtype`. P = M * topk + num_experts * block_size - topk. expert_mask (int32
    [num_experts], 0/1) keeps only local experts, numbered in order; num_local_tokens (int32
    [1]) routes only the first num_local_tokens[0] tokens.
    """
    m, topk = _routing(topk_ids, topk_weights)
    _positive_int("num_experts", num_experts)
    _positive_int("model_dim", model_dim)
    _positive_int("block_size", block_size)
    if block_size % 16:
        raise ValueError(f"block_size must be a multiple of 16, got {block_size}")
    if not isinstance(moebuf_dtype, torch.dtype):
        raise TypeError(f"moebuf_dtype must be a torch.dtype, got {moebuf_dtype!r}")
    _expert_mask(expert_mask, num_experts)
    _local_tokens(num_local_tokens)

    def record() -> dispatch.DispatchRecord:
        args = {
            "topk_ids": dispatch.tensor_arg(topk_ids),
            "topk_weights": dispatch.tensor_arg(topk_weights),
            "num_experts": str(num_experts),
            "model_dim": str(model_dim),
            "moebuf_dtype": str(moebuf_dtype).replace("torch.", ""),
            "block_size": str(block_size),
            "expert_mask": dispatch.tensor_arg(expert_mask),
            "num_local_tokens": dispatch.tensor_arg(num_local_tokens),
        }
        return dispatch.DispatchRecord(
            "moe_sorting", dispatch.BACKEND_FLYDSL, "moe_sorting", "heuristic", None,
            {"block_size": block_size}, args=args,
        )  # fmt: skip

    dispatch.report(record)
    sorted_ = _sort(
        topk_ids, topk_weights, num_experts, block_size, expert_mask, num_local_tokens, m, topk
    )
    moe_buf = torch.zeros((m, model_dim), dtype=moebuf_dtype, device=topk_ids.device)
    return (*sorted_, moe_buf)


def _quantize_per_token(x: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row fp8 quantization in one FlyDSL launch: x ~= q * scale, scale fp32 [rows, 1]
    (aiter.ops.moe.reference.per_token_quant is its arithmetic)."""
    from aiter.ops.moe.kernels.quant import launch_moe_quant_per_token

    rows, cols = x.shape
    q = torch.empty((rows, cols), dtype=fp8, device=x.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    launch_moe_quant_per_token(x, q, scale, stream=device.current_stream())
    return q, scale


def _shape(
    hidden_states, w1, w2, topk_ids, activation, quant_type, doweight_stage1, expert_mask
) -> MoeShape:
    hidden_states = _tensor("hidden_states", hidden_states)
    if hidden_states.dim() != 2:
        raise ValueError(
            f"hidden_states must be [M, model_dim], got shape {list(hidden_states.shape)}"
        )
    m, model_dim = (int(d) for d in hidden_states.shape)
    _check("hidden_states", hidden_states, ACTIVATION_DTYPES, (m, model_dim))
    if model_dim < 1 or model_dim % MODEL_DIM_MULTIPLE:
        raise ValueError(
            f"hidden_states: model_dim = hidden_states.shape[1] must be a positive multiple of "
            f"{MODEL_DIM_MULTIPLE}, got {model_dim}"
        )
    w1 = _tensor("w1", w1)
    if w1.dim() != 3 or w1.shape[2] != model_dim or w1.shape[1] % 2:
        raise ValueError(
            f"w1 must be [E, 2 * inter_dim, model_dim = {model_dim}], got shape {list(w1.shape)}"
        )
    experts, inter = int(w1.shape[0]), int(w1.shape[1]) // 2
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if quant_type not in QUANT_TYPES:
        raise ValueError(f"quant_type must be one of {QUANT_TYPES}, got {quant_type!r}")
    quantized = quant_type == "per_token"
    w_dtypes = (device.fp8_dtype(),) if quantized else (hidden_states.dtype,)
    _check("w1", w1, w_dtypes, (experts, 2 * inter, model_dim))
    multiple = inter_dim_multiple(w1.dtype.itemsize)
    if inter < 1 or inter % multiple:
        raise ValueError(
            f"w1: inter_dim = w1.shape[1] / 2 must be a positive multiple of {multiple} for "
            f"{w1.dtype} weights, got {inter}"
        )
    _check("w2", w2, w_dtypes, (experts, model_dim, inter))
    if quantized and max(model_dim, inter) > QUANT_MAX_K:
        raise ValueError(
            f"hidden_states, w1: per-token quantization serves model_dim and inter_dim up to "
            f"{QUANT_MAX_K}, got model_dim = {model_dim} and inter_dim = {inter}"
        )
    global_experts = (
        experts if expert_mask is None else int(_tensor("expert_mask", expert_mask).numel())
    )
    if topk_ids.shape[0] != m:
        raise ValueError(
            f"topk_ids must have M = {m} rows (hidden_states'), got {topk_ids.shape[0]}"
        )
    dtype = str(hidden_states.dtype)
    return MoeShape(
        model_dim=model_dim,
        inter_dim=inter,
        experts=global_experts,
        topk=int(topk_ids.shape[1]),
        activation=activation,
        dtype=dtype,
        q_dtype_a=str(device.fp8_dtype()) if quantized else dtype,
        q_dtype_w=str(w1.dtype),
        quantized=quantized,
        doweight_stage1=bool(doweight_stage1),
    )


@capture.entry("fused_moe")
def fused_moe(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    quant_type: str | None = None,
    w1_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    bias1: torch.Tensor | None = None,
    bias2: torch.Tensor | None = None,
    gate_mode: str = "separated",
    doweight_stage1: bool = False,
    expert_mask: torch.Tensor | None = None,
    num_local_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """A mixture-of-experts layer: out[t] = sum_k w[t, k] * down_e(act(gate_e(x_t), up_e(x_t))).

    hidden_states [M, model_dim] bf16/fp16. w1 [E, 2 * inter_dim, model_dim] holds each expert's
    gate and up rows: `gate_mode` "separated" (gate rows first, then up) or "interleave" (gate
    and up rows alternate). w2 [E, model_dim, inter_dim]. topk_weights fp32 and topk_ids int32
    [M, topk] (see fused_topk). activation "silu": silu(gate) * up; "swiglu" (gpt-oss): gate
    clamped above at 7, up to [-7, 7], gate * sigmoid(1.702 * gate) * (up + 1), expert biases
    bias1 [E, 2 * inter_dim] and bias2 [E, model_dim] (fp32) allowed. quant_type "per_token":
    w1 and w2 in the arch's fp8 flavour, preshuffled by `shuffle_weight`, with per-channel
    w1_scale [E, 2 * inter_dim, 1] and w2_scale [E, model_dim, 1] (fp32); the activations are
    quantized per token. doweight_stage1 applies the routing weight after stage 1 instead of
    stage 2. expert_mask (int32 [E_global], 0/1; then topk_ids hold global ids and w1/w2 the
    local experts in order) and num_local_tokens (int32 [1]: only the first tokens are routed)
    serve expert parallelism. Returns [M, model_dim] in hidden_states' dtype.
    """
    m, topk = _routing(topk_ids, topk_weights)
    shape = _shape(
        hidden_states, w1, w2, topk_ids, activation, quant_type, doweight_stage1, expert_mask
    )
    experts, model_dim, inter = int(w1.shape[0]), shape.model_dim, shape.inter_dim
    if gate_mode not in GATE_MODES:
        raise ValueError(f"gate_mode must be one of {GATE_MODES}, got {gate_mode!r}")
    if shape.quantized:
        _check("w1_scale", w1_scale, (SCALE_DTYPE,), (experts, 2 * inter, 1))
        _check("w2_scale", w2_scale, (SCALE_DTYPE,), (experts, model_dim, 1))
    elif w1_scale is not None or w2_scale is not None:
        raise ValueError("w1_scale and w2_scale are only for quant_type='per_token'; got a scale")
    if (bias1 is not None or bias2 is not None) and activation != "swiglu":
        raise NotImplementedError("expert biases (bias1, bias2) are supported with swiglu only")
    if bias1 is not None:
        _check("bias1", bias1, (BIAS_DTYPE,), (experts, 2 * inter))
    if bias2 is not None:
        _check("bias2", bias2, (BIAS_DTYPE,), (experts, model_dim))
    _expert_mask(expert_mask, shape.experts)
    if expert_mask is None and shape.topk > experts:
        raise ValueError(f"topk_ids: topk = {shape.topk} exceeds the {experts} experts of w1")
    _local_tokens(num_local_tokens)

    served = plan(shape, m)

    def args() -> dict[str, str]:
        tensors = {
            "hidden_states": hidden_states, "w1": w1, "w2": w2, "topk_weights": topk_weights,
            "topk_ids": topk_ids, "w1_scale": w1_scale, "w2_scale": w2_scale, "bias1": bias1,
            "bias2": bias2, "expert_mask": expert_mask, "num_local_tokens": num_local_tokens,
        }  # fmt: skip
        described = {name: dispatch.tensor_arg(t) for name, t in tensors.items() if t is not None}
        if shape.quantized:
            described["w1"] = dispatch.tensor_arg(w1, "preshuffled")
            described["w2"] = dispatch.tensor_arg(w2, "preshuffled")
        return {
            **described,
            "activation": activation,
            "quant_type": str(quant_type),
            "gate_mode": gate_mode,
            "doweight_stage1": str(bool(doweight_stage1)),
        }

    def launch(choice: MoeChoice) -> torch.Tensor:
        _check_index_range(m, topk, shape, choice.block_m)
        routing = _sort(
            topk_ids, topk_weights, shape.experts, choice.block_m, expert_mask, num_local_tokens,
            m, topk,
        )  # fmt: skip
        out1 = _stage1(hidden_states, w1, w1_scale, bias1, routing, choice, shape, gate_mode, topk)
        return _stage2(out1, w2, w2_scale, bias2, routing, choice, shape, m, topk,
                       hidden_states.dtype)  # fmt: skip

    if jit_monitor.settings().fallback:
        flags = (gate_mode, bias1 is not None, bias2 is not None, expert_mask is not None,
                 num_local_tokens is not None)  # fmt: skip
        served = _cached_variant(served, shape, flags, launch)
    served.report(args)
    return launch(served.choice)


def _check_index_range(m: int, topk: int, shape: MoeShape, block_m: int) -> None:
    """The launchers' int32 index limits, checked before the first kernel launches: sorted rows
    P, P * inter_dim (stage 1's activation grid) and M * model_dim (stage 2's reduction)."""
    slots, _ = moe_host.moe_sorting_sizes(m, topk, shape.experts, block_m)
    counts = {
        f"P = {slots} sorted rows": slots,
        f"P * inter_dim = {slots} * {shape.inter_dim}": slots * shape.inter_dim,
        f"M * model_dim = {m} * {shape.model_dim}": m * shape.model_dim,
    }
    for what, count in counts.items():
        if count + ELEMENTWISE_BLOCK > INDEX_LIMIT:
            raise ValueError(
                f"hidden_states: {what} (block size {block_m}) is too large for the kernels' "
                "int32 indices; pass fewer tokens per call"
            )


def _cached_variant(served, shape: MoeShape, flags: tuple, launch):
    """`served` when the cache holds its kernels, else the plan of the first equivalent kernel
    set it holds (logged once), else `served` (the JIT policy then decides). `flags` holds what
    besides `shape` and the choice selects kernels."""
    planned, cu_num = served.choice, device.cu_num()
    variants = equivalent_choices(planned, shape, served.tokens, cu_num)
    # The token count is a kernel argument, not a compile-time parameter: it enters the memo
    # only through the planner's variant, which its description carries.
    signature = (device.arch(), cu_num, shape, flags)
    differs = "the sums blocked, ordered and rounded differently"
    choice = jit_monitor.cached_equivalent(
        OP, signature, planned, variants, launch, describe, differs
    )
    if choice == planned:
        return served
    return dataclasses.replace(served, choice=choice, planned=planned)


def _stage1(hidden, w1, w1_scale, bias1, routing, choice: MoeChoice, shape, gate_mode, topk):
    from aiter.ops.moe.kernels.stages import (
        WORKSPACE_DTYPE,
        launch_moe_stage1,
        stage1_workspace_shape,
    )

    m = hidden.shape[0]
    a, a_scale = hidden, None
    if shape.quantized:
        a, a_scale = _quantize_per_token(hidden, device.fp8_dtype())
    # Zeroed: rows of tokens routed elsewhere (expert parallelism) stay defined for stage 2's
    # per-row quantization.
    out1 = torch.zeros((m * topk, shape.inter_dim), dtype=hidden.dtype, device=hidden.device)
    workspace = None
    if choice.ksplit > 1:
        ws_shape = stage1_workspace_shape(m, topk, shape.inter_dim)
        workspace = torch.zeros(ws_shape, dtype=WORKSPACE_DTYPE, device=hidden.device)
    launch_moe_stage1(
        a,
        w1,
        *routing,
        out1,
        topk=topk,
        tile=choice.stage1_tile,
        ksplit=choice.ksplit,
        activation=shape.activation,
        gate_mode=gate_mode,
        doweight=shape.doweight_stage1,
        mma=choice.mma,
        a_scale=a_scale,
        w1_scale=w1_scale,
        bias1=bias1,
        workspace=workspace,
        stream=device.current_stream(),
    )
    return out1


def _stage2(out1, w2, w2_scale, bias2, routing, choice: MoeChoice, shape, m, topk, out_dtype):
    from aiter.ops.moe.kernels.stages import (
        WORKSPACE_DTYPE,
        launch_moe_stage2,
        stage2_workspace_shape,
    )

    a2, a2_scale = out1, None
    if shape.quantized:
        a2, a2_scale = _quantize_per_token(out1, device.fp8_dtype())
    out = torch.zeros((m, shape.model_dim), dtype=out_dtype, device=out1.device)
    workspace = None
    if choice.stage2_mode == "reduce":
        ws_shape = stage2_workspace_shape(m, topk, shape.model_dim)
        workspace = torch.zeros(ws_shape, dtype=WORKSPACE_DTYPE, device=out1.device)
    launch_moe_stage2(
        a2,
        w2,
        *routing,
        out,
        topk=topk,
        tile=choice.stage2_tile,
        mode=choice.stage2_mode,
        apply_weight=not shape.doweight_stage1,
        mma=choice.mma,
        a2_scale=a2_scale,
        w2_scale=w2_scale,
        bias2=bias2,
        workspace=workspace,
        stream=device.current_stream(),
    )
    return out
