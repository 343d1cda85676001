"""A CPU emulation of the chunk_gdn_h launch, work-group by work-group, from the kernel's index
arithmetic (aiter/ops/chunk_gdn_h/kernels/chunk_h_index.py) over flat tensors: each work-group
finds its sequence, head and V tile, walks its chunks and reads and writes only through the
offset formulas. A wrong offset, chunk row or tail mask shows as a mismatch with the reference,
and `written` counts every output element's writes (each exactly once).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aiter.ops.chunk_gdn_h.kernels import chunk_h_index as ix


def _select(cond, a, b):
    return a if cond else b


@dataclass
class Outputs:
    h: torch.Tensor
    v_new: torch.Tensor | None
    final: torch.Tensor | None
    written: dict[str, torch.Tensor]


def emulate(k, w, u, g, gk, initial_state, output_final_state, chunk_size, save_new_value,
            cu_seqlens, block_v: int) -> Outputs:  # fmt: skip
    batch, seqlen, key_heads, head_dim = k.shape
    heads, head_dim_v = u.shape[2], u.shape[3]
    io = k.dtype
    if cu_seqlens is not None:
        cu = [int(v) for v in cu_seqlens.tolist()]
        offsets = ix.chunk_offsets(cu, chunk_size)
        num_seqs, chunk_rows = len(cu) - 1, offsets[-1]
    else:
        num_seqs, chunk_rows = batch, ix.num_chunks(seqlen, chunk_size)
    flat = {name: t.reshape(-1) for name, t in (("k", k), ("w", w), ("u", u)) if t is not None}
    g_flat = g.reshape(-1).float() if g is not None else None
    gk_flat = gk.reshape(-1).float() if gk is not None else None
    h0_flat = initial_state.reshape(-1) if initial_state is not None else None
    h = torch.zeros(batch * chunk_rows * heads * head_dim * head_dim_v, dtype=io)
    v_new = torch.zeros(u.numel(), dtype=u.dtype)
    final = torch.zeros(num_seqs * heads * head_dim * head_dim_v, dtype=torch.float32)
    written = {name: torch.zeros(t.numel(), dtype=torch.int32) for name, t in
               (("h", h), ("v_new", v_new), ("final", final))}  # fmt: skip

    kk = torch.arange(head_dim)
    for pid in range(ix.grid_size(num_seqs, heads, head_dim_v, block_v)):
        seq, head, tile = ix.work_group(pid, heads, head_dim_v, block_v)
        if cu_seqlens is not None:
            bos, tokens, chunk0 = ix.varlen_sequence(cu[seq], cu[seq + 1], offsets[seq])
        else:
            bos, tokens, chunk0 = ix.dense_sequence(seq, seqlen, chunk_size)
        kh = ix.key_head(head, heads, key_heads)
        cols = tile * block_v + torch.arange(block_v)
        live = cols < head_dim_v
        vv = cols[live]
        state_at = ix.state_offset(seq, head, kk[:, None], vv[None, :], heads, head_dim, head_dim_v)
        state = torch.zeros(head_dim, int(live.sum()))
        if h0_flat is not None:
            state = h0_flat[state_at].float()
        for c in range(ix.num_chunks(tokens, chunk_size)):
            n = ix.chunk_tokens(c, tokens, chunk_size, _select)
            rows = ix.token_row(bos, c * chunk_size + torch.arange(n))
            at = ix.h_offset(chunk0 + c, head, kk[:, None], vv[None, :], heads, head_dim,
                             head_dim_v)  # fmt: skip
            h[at] = state.to(io)
            written["h"][at] += 1
            k_tile = flat["k"][ix.k_offset(rows[:, None], kh, kk[None, :], key_heads, head_dim)]
            w_tile = flat["w"][ix.w_offset(rows[:, None], head, kk[None, :], heads, head_dim)]
            u_at = ix.u_offset(rows[:, None], head, vv[None, :], heads, head_dim_v)
            values = flat["u"][u_at].float() - w_tile.float() @ state.to(io).float()
            if save_new_value:
                v_new[u_at] = values.to(u.dtype)
                written["v_new"][u_at] += 1
            last = ix.token_row(bos, ix.last_token(c, tokens, chunk_size, _select))
            if g_flat is not None:
                g_last = g_flat[ix.g_offset(last, head, heads)]
                g_rows = g_flat[ix.g_offset(rows, head, heads)]
                values = values * torch.exp2(g_last - g_rows)[:, None]
                state = state * torch.exp2(g_last)
            if gk_flat is not None:
                gk_last = gk_flat[ix.w_offset(last, head, kk, heads, head_dim)]
                state = state * torch.exp2(gk_last)[:, None]
            state = state + k_tile.float().transpose(0, 1) @ values.to(io).float()
        if output_final_state:
            final[state_at] = state
            written["final"][state_at] += 1

    h = h.view(batch, chunk_rows, heads, head_dim, head_dim_v)
    return Outputs(
        h=h,
        v_new=v_new.view(u.shape) if save_new_value else None,
        final=final.view(num_seqs, heads, head_dim, head_dim_v) if output_final_state else None,
        written=written,
    )
