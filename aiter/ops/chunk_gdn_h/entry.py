"""Public entry of chunk_gdn_h: `chunk_gated_delta_rule_fwd_h`, the hidden-state pass of the
chunked gated delta rule (flash-linear-attention's function of that name); validate, plan,
allocate, launch. FlyDSL is its only backend: a call the kernel cannot serve is an error raised
here, naming the argument, before anything is reported or allocated.
"""

from __future__ import annotations

import torch

from aiter import capture, device, dispatch, jit_monitor
from aiter.ops.chunk_gdn_h import plan as gdn_plan
from aiter.ops.chunk_gdn_h.arguments import STATE_DTYPE, check_call

__all__ = ["chunk_gated_delta_rule_fwd_h"]

SEQLENS_DTYPE = torch.int32  # what the kernel reads


@capture.entry("chunk_gated_delta_rule_fwd_h")
def chunk_gated_delta_rule_fwd_h(
    k: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    g: torch.Tensor | None = None,
    gk: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
    save_new_value: bool = True,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The per-chunk states of the gated delta rule, (h, v_new, final_state).

    k [B, T, Hg, K] (Hg key heads), w [B, T, H, K], u [B, T, H, V] (H value heads, a multiple of
    Hg), bf16 or fp16; g [B, T, H] and/or gk [B, T, H, K]: chunk-local cumulative log2 gates (a
    chunk decays the state by exp2 of the gate at its last token; fp32, or bf16/fp16, which is
    converted to fp32 first); initial_state [N, H, K, V]
    fp32. Varlen: B = 1 and cu_seqlens [N + 1] (int32 or int64; read on the host, so a host
    copy saves a device sync). Returns h [B, NT, H, K, V] (the state at each chunk's start, in
    k's dtype), v_new = u - w h per chunk (u's shape and dtype) when save_new_value, and the
    fp32 final state [N, H, K, V] when output_final_state.
    """
    call = check_call(k, w, u, g, gk, initial_state, output_final_state, chunk_size,
                      save_new_value, cu_seqlens)  # fmt: skip
    from aiter.ops.chunk_gdn_h.kernels import chunk_h as kernels

    mma = device.arch_info().mma
    if mma not in kernels.MMA_FLAVOURS:
        raise NotImplementedError(
            f"chunk_gated_delta_rule_fwd_h has no FlyDSL kernel for {device.arch()} ({mma})"
        )
    # The kernel reads fp32 gates: a gate of another dtype is converted here, so that a
    # table row (which does not record the gates' dtype) names one kernel.
    g = g if g is None or g.dtype == STATE_DTYPE else g.to(STATE_DTYPE)
    gk = gk if gk is None or gk.dtype == STATE_DTYPE else gk.to(STATE_DTYPE)
    choice = gdn_plan.choose_block_v(call, device.arch(), device.cu_num(), mma)
    cu_device = offsets_device = None
    if call.varlen:
        if device.on_gpu(cu_seqlens) and cu_seqlens.dtype == SEQLENS_DTYPE:
            cu_device = cu_seqlens
        else:
            cu_device = torch.tensor(call.cu_seqlens, dtype=SEQLENS_DTYPE, device=k.device)
        offsets_device = torch.tensor(call.chunk_offsets, dtype=SEQLENS_DTYPE, device=k.device)

    def launch(choice: gdn_plan.BlockVChoice):
        h = torch.empty(
            (call.batch, call.num_chunk_rows, call.heads, call.head_dim, call.head_dim_v),
            dtype=k.dtype, device=k.device,
        )  # fmt: skip
        v_new = torch.empty_like(u) if save_new_value else None
        final = None
        if output_final_state:
            final = torch.empty(
                (call.num_seqs, call.heads, call.head_dim, call.head_dim_v),
                dtype=STATE_DTYPE, device=k.device,
            )  # fmt: skip
        kernels.launch_chunk_gdn_h(
            k, w, u, g, gk, h, v_new, initial_state, final, cu_device, offsets_device,
            num_seqs=call.num_seqs, chunk_size=chunk_size, block_v=choice.block_v, mma=mma,
            stream=device.current_stream(),
        )  # fmt: skip
        return h, v_new, final

    flags = {
        "layout": "varlen" if call.varlen else "dense",
        "use_g": call.use_g,
        "use_gk": call.use_gk,
        "use_h0": call.use_h0,
        "store_final_state": call.store_final_state,
        "save_new_value": call.save_new_value,
    }
    params: dict[str, object] = dict(flags)
    if jit_monitor.settings().fallback:
        planned = choice
        variants = gdn_plan.equivalent_choices(planned, call.head_dim_v)
        # What selects kernels besides BV: the arch, dtypes, head dim and flags.
        signature = (device.arch(), device.cu_num(), k.dtype, call.head_dim,
                     tuple(sorted(flags.items())))  # fmt: skip
        differs = "another V-tile width (the same arithmetic per value column)"
        choice = jit_monitor.cached_equivalent(gdn_plan.OP, signature, planned, variants,
                                               launch, gdn_plan.describe, differs)  # fmt: skip
        if choice != planned:
            params["fallback_from"] = gdn_plan.describe(planned)

    def described() -> dict[str, str]:
        shown = {n: dispatch.tensor_arg(t) for n, t in
                 (("k", k), ("w", w), ("u", u), ("g", g), ("gk", gk),
                  ("initial_state", initial_state))}  # fmt: skip
        if call.varlen:
            shown["cu_seqlens"] = f"[{call.num_seqs + 1}] sequences={call.num_seqs}"
        return shown | {"output_final_state": str(output_final_state),
                        "save_new_value": str(save_new_value)}  # fmt: skip

    axis = {"seqs": call.num_seqs, "tokens": gdn_plan.total_tokens(call)}

    def as_row() -> dict[str, str]:
        return gdn_plan.row_as_served(call, choice, device.arch(), device.cu_num())

    choice.report(described, axis, as_row, **params)
    return launch(choice)
