"""Torch references of the chunked gated delta rule's hidden-state pass, written from the math,
not from the kernel's index arithmetic:

- `naive_states`: the token-by-token gated delta rule, S_t = D_t S_{t-1} + k_t d_t^T with
  d_t = beta_t (v_t - (D_t S_{t-1})^T k_t), D_t the token's decay (scalar g, per-key gk);
- `wy_inputs`: the chunk-local WY form of those tokens (w, u and the gated k the pass takes);
- `chunk_states`: the pass itself, chunk by chunk per sequence and head: store the state,
  v_new = u - w h, decay, h = h * exp2(g_last) + k^T v_new'.

With `rounded`, chunk_states rounds where the kernel does (h to the input dtype before w h and
in the stored states, v_new' before k^T v_new', fp32 sums); without, it runs in the dtype it
is given (float64 for the exact comparison with the naive recurrence).
"""

from __future__ import annotations

import torch


def _sequences(batch: int, seqlen: int, cu_seqlens):
    """(batch row, first token, tokens) of each sequence."""
    if cu_seqlens is None:
        return [(b, 0, seqlen) for b in range(batch)]
    cu = [int(v) for v in cu_seqlens.tolist()]
    return [(0, s, e - s) for s, e in zip(cu, cu[1:], strict=False)]


def chunk_states(k, w, u, g=None, gk=None, initial_state=None, output_final_state=False,
                 chunk_size=64, save_new_value=True, cu_seqlens=None, rounded=True):  # fmt: skip
    """(h [B, NT, H, K, V], v_new [B, T, H, V] or None, final [N, H, K, V] or None)."""
    batch, seqlen, key_heads, head_dim = k.shape
    heads, head_dim_v = u.shape[2], u.shape[3]
    group = heads // key_heads
    acc = torch.float32 if rounded else k.dtype
    io = k.dtype
    seqs = _sequences(batch, seqlen, cu_seqlens)
    counts = [-(-n // chunk_size) for _, _, n in seqs]
    nt = sum(counts) if cu_seqlens is not None else -(-seqlen // chunk_size)
    h = torch.zeros(batch, nt, heads, head_dim, head_dim_v, dtype=io)
    v_new = torch.zeros_like(u) if save_new_value else None
    final = torch.zeros(len(seqs), heads, head_dim, head_dim_v, dtype=torch.float32)
    if not rounded:
        final = final.to(acc)
    first_chunk = 0
    for n, (row, start, tokens) in enumerate(seqs):
        chunk_row = first_chunk if cu_seqlens is not None else 0
        for head in range(heads):
            state = torch.zeros(head_dim, head_dim_v, dtype=acc)
            if initial_state is not None:
                state = initial_state[n, head].to(acc)
            for c in range(counts[n]):
                t0, t1 = start + c * chunk_size, start + min((c + 1) * chunk_size, tokens)
                h[row, chunk_row + c, head] = state.to(io)
                state_op = state.to(io).to(acc) if rounded else state
                kk = k[row, t0:t1, head // group].to(acc)
                ww = w[row, t0:t1, head].to(acc)
                vv = u[row, t0:t1, head].to(acc) - ww @ state_op
                if save_new_value:
                    v_new[row, t0:t1, head] = vv.to(u.dtype)
                if g is not None:
                    gg = g[row, t0:t1, head].to(acc)
                    vv = vv * torch.exp2(gg[-1] - gg)[:, None]
                    state = state * torch.exp2(gg[-1])
                if gk is not None:
                    state = state * torch.exp2(gk[row, t1 - 1, head].to(acc))[:, None]
                if rounded:
                    vv = vv.to(io).to(acc)
                state = state + kk.transpose(0, 1) @ vv
            final[n, head] = state.to(final.dtype)
        first_chunk += counts[n]
    return h, v_new, final if output_final_state else None


def naive_states(k, v, beta, g=None, gk=None, initial_state=None):
    """The state after every token of one sequence and head: k [T, K], v [T, V], beta [T],
    g [T] and gk [T, K] per-token log2 decays (not cumulative), initial_state [K, V].
    Returns [T + 1, K, V]: the initial state, then one per token."""
    tokens, head_dim = k.shape
    state = torch.zeros(head_dim, v.shape[1], dtype=k.dtype)
    if initial_state is not None:
        state = initial_state.clone()
    states = [state]
    for t in range(tokens):
        if g is not None:
            state = state * torch.exp2(g[t])
        if gk is not None:
            state = state * torch.exp2(gk[t])[:, None]
        delta = beta[t] * (v[t] - state.transpose(0, 1) @ k[t])
        state = state + torch.outer(k[t], delta)
        states.append(state)
    return torch.stack(states)


def wy_inputs(k, v, beta, g=None, gk=None, chunk_size=64):
    """The chunk_gdn_h inputs of one sequence and head, from per-token k [T, K], v [T, V],
    beta [T] and log2 decays g [T] / gk [T, K]: (k', w, u, g_cum, gk_cum), where g_cum and
    gk_cum are the chunk-local cumulative gates and k' is k decayed to its chunk's end when gk
    is given (the pass then decays the state by rows only).

    Per chunk, with G_t the cumulative decay from the chunk's start: the deltas d solve
    (I + L) d = beta v - beta (G k) h0, L strictly lower with L_tr = beta_t (G_t k_t).(k_r / G_r);
    so u = A beta v and w = A beta (G k) with A = (I + L)^-1, and v_new = u - w h0 = d."""
    tokens = k.shape[0]
    out_k, w, u = k.clone(), torch.zeros_like(k), torch.zeros_like(v)
    g_cum = torch.zeros(tokens, dtype=k.dtype) if g is not None else None
    gk_cum = torch.zeros_like(k) if gk is not None else None
    for t0 in range(0, tokens, chunk_size):
        t1 = min(t0 + chunk_size, tokens)
        kk, vv, bb = k[t0:t1], v[t0:t1], beta[t0:t1]
        decay = torch.zeros_like(kk)  # log2 of G_t, per key
        if g is not None:
            g_cum[t0:t1] = torch.cumsum(g[t0:t1], 0)
            decay = decay + g_cum[t0:t1, None]
        if gk is not None:
            gk_cum[t0:t1] = torch.cumsum(gk[t0:t1], 0)
            decay = decay + gk_cum[t0:t1]
        grown, shrunk = kk * torch.exp2(decay), kk * torch.exp2(-decay)
        lower = torch.tril(bb[:, None] * (grown @ shrunk.transpose(0, 1)), diagonal=-1)
        a = torch.linalg.inv(torch.eye(t1 - t0, dtype=k.dtype) + lower)
        u[t0:t1] = a @ (bb[:, None] * vv)
        w[t0:t1] = a @ (bb[:, None] * grown)
        if gk is not None:
            out_k[t0:t1] = kk * torch.exp2(gk_cum[t1 - 1] - gk_cum[t0:t1])
    return out_k, w, u, g_cum, gk_cum
