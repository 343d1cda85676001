"""CPU emulations of the chunk_gdn_h launch from the kernel's index arithmetic
(aiter/ops/chunk_gdn_h/kernels/chunk_h_index.py) over flat tensors:

- `emulate`: work-group by work-group, each finding its sequence, head and V tile and walking
  its chunks with whole-tile products;
- `emulate_lanes`: lane by lane as the kernel runs, with the MMA operand layouts, the LDS tile
  and its barriers.

A wrong offset, chunk row, lane layout or tail mask shows as a mismatch with the reference;
`written` counts every output element's writes (each exactly once).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from aiter.ops.chunk_gdn_h.kernels import chunk_h_index as ix
from op_tests.shared.mainloop_emulation import Lds, _mma, mma_k_of


def _select(cond, a, b):
    return a if cond else b


@dataclass
class Outputs:
    h: torch.Tensor
    v_new: torch.Tensor | None
    final: torch.Tensor | None
    written: dict[str, torch.Tensor]


@dataclass(frozen=True)
class _Batch:
    """The sequences of a dense or varlen batch, as the kernel finds them."""

    num_seqs: int
    chunk_rows: int  # of h, per batch row
    seqlen: int
    chunk_size: int
    cu: list[int] | None  # varlen: cu_seqlens's values, and each sequence's first chunk row
    offsets: list[int] | None

    def sequence(self, seq: int) -> tuple[int, int, int]:
        """(first token row, tokens, first chunk row) of sequence seq."""
        if self.cu is not None:
            return ix.varlen_sequence(self.cu[seq], self.cu[seq + 1], self.offsets[seq])
        return ix.dense_sequence(seq, self.seqlen, self.chunk_size)


def _batch(k, cu_seqlens, chunk_size: int) -> _Batch:
    batch, seqlen = k.shape[:2]
    if cu_seqlens is None:
        return _Batch(batch, ix.num_chunks(seqlen, chunk_size), seqlen, chunk_size, None, None)
    cu = [int(v) for v in cu_seqlens.tolist()]
    offsets = ix.chunk_offsets(cu, chunk_size)
    return _Batch(len(cu) - 1, offsets[-1], seqlen, chunk_size, cu, offsets)


def emulate(k, w, u, g, gk, initial_state, output_final_state, chunk_size, save_new_value,
            cu_seqlens, block_v: int) -> Outputs:  # fmt: skip
    batch, seqlen, key_heads, head_dim = k.shape
    heads, head_dim_v = u.shape[2], u.shape[3]
    io = k.dtype
    seqs = _batch(k, cu_seqlens, chunk_size)
    num_seqs, chunk_rows = seqs.num_seqs, seqs.chunk_rows
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
        bos, tokens, chunk0 = seqs.sequence(seq)
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


# --- lane by lane, as the kernel runs ---------------------------------------------------------


@dataclass
class LaneOutputs(Outputs):
    lds_races: list[str]


def _round(values, dtype) -> list[float]:
    return torch.tensor(values, dtype=torch.float32).to(dtype).double().tolist()


def emulate_lanes(k, w, u, g, gk, initial_state, output_final_state, chunk_size, save_new_value,
                  cu_seqlens, block_v: int, arch: str) -> LaneOutputs:  # fmt: skip
    """The kernel's work-groups lane by lane (aiter/ops/chunk_gdn_h/kernels/chunk_h.py), every
    address from chunk_h_index: the state strips in per-lane accumulators, k^T staged through
    an emulated LDS between barriers (races recorded), both products as the arch's MMA steps
    on the lanes' operand runs, and the kernel's roundings."""
    mma = "wmma" if arch == "gfx1250" else "mfma"
    wsz, rpl = ix.WAVE_SIZE[mma], ix.rows_per_lane(ix.WAVE_SIZE[mma])
    mma_k = mma_k_of(arch, 2)
    batch, seqlen, key_heads, head_dim = k.shape
    heads, head_dim_v = u.shape[2], u.shape[3]
    io = k.dtype
    seqs = _batch(k, cu_seqlens, chunk_size)
    num_seqs, chunk_rows = seqs.num_seqs, seqs.chunk_rows
    kf, wf, uf = (t.reshape(-1).double() for t in (k, w, u))
    gf = g.reshape(-1).float().double() if g is not None else None
    gkf = gk.reshape(-1).float().double() if gk is not None else None
    h0 = initial_state.reshape(-1).double() if initial_state is not None else None
    h = torch.zeros(batch * chunk_rows * heads * head_dim * head_dim_v, dtype=torch.float64)
    v_new = torch.zeros(u.numel(), dtype=torch.float64)
    final = torch.zeros(num_seqs * heads * head_dim * head_dim_v, dtype=torch.float64)
    written = {name: torch.zeros(t.numel(), dtype=torch.int32) for name, t in
               (("h", h), ("v_new", v_new), ("final", final))}  # fmt: skip
    races: list[str] = []
    nwaves, block_threads = ix.waves(block_v), ix.threads(block_v, mma)
    k_tiles, t_tiles = head_dim // ix.MMA_MN, chunk_size // ix.MMA_MN
    k_blocks, t_blocks = head_dim // ix.CONTRACTION_BLOCK, chunk_size // ix.CONTRACTION_BLOCK
    lanes = range(wsz)

    def rows(lane, r):
        return [r * ix.MMA_MN + ix.lane_row(lane, e, wsz) for e in range(rpl)]

    for pid in range(ix.grid_size(num_seqs, heads, head_dim_v, block_v)):
        seq, head, tile = ix.work_group(pid, heads, head_dim_v, block_v)
        bos, tokens, chunk0 = seqs.sequence(seq)
        kh = ix.key_head(head, heads, key_heads)
        cols = [
            [ix.value_col(tile, wave, lane, block_v) for lane in lanes] for wave in range(nwaves)
        ]
        state = [[[[0.0] * rpl for _ in range(k_tiles)] for _ in lanes] for _ in range(nwaves)]
        if h0 is not None:
            for wave, lane, r in itertools.product(range(nwaves), lanes, range(k_tiles)):
                state[wave][lane][r] = [
                    float(h0[ix.state_offset(seq, head, kk, cols[wave][lane], heads, head_dim,
                                             head_dim_v)]) for kk in rows(lane, r)
                ]  # fmt: skip
        lds = Lds(2 * ix.kt_lds_elements(head_dim, chunk_size))
        for c in range(ix.num_chunks(tokens, chunk_size)):
            n = ix.chunk_tokens(c, tokens, chunk_size, _select)
            t0, chunk_row = c * chunk_size, chunk0 + c
            for wave, lane, r in itertools.product(range(nwaves), lanes, range(k_tiles)):
                values = _round(state[wave][lane][r], io)
                for kk, value in zip(rows(lane, r), values, strict=True):
                    at = ix.h_offset(chunk_row, head, kk, cols[wave][lane], heads, head_dim,
                                     head_dim_v)  # fmt: skip
                    h[at] = value
                    written["h"][at] += 1
            # k^T into LDS: every thread's items, wave by wave, between two barriers.
            lds.barrier()
            for s in range(ix.k_copy_steps(head_dim, chunk_size, block_threads)):
                for wave in range(nwaves):
                    writes = {j: [None] * wsz for j in range(ix.K_PIECE)}
                    for lane in lanes:
                        tq, kk0, real = ix.k_copy_item(s, wave * wsz + lane, block_threads,
                                                       head_dim, chunk_size)  # fmt: skip
                        if not real:
                            continue
                        for j in range(ix.K_PIECE):
                            column = []
                            for i in range(ix.TOKEN_QUAD):
                                live = tq + i < n
                                row = ix.token_row(bos, t0 + (tq + i if live else 0))
                                at = ix.k_offset(row, kh, kk0 + j, key_heads, head_dim)
                                column.append(float(kf[at]) if live else 0.0)
                            byte = 2 * ix.kt_lds_offset(kk0 + j, tq, chunk_size)
                            lds.store(wave, byte, column, 2)
                            writes[j][lane] = byte
                    for j in range(ix.K_PIECE):
                        if any(b is not None for b in writes[j]):
                            lds.instruction("kt_write", wave, writes[j], 2 * ix.TOKEN_QUAD)
            lds.barrier()
            last = ix.token_row(bos, ix.last_token(c, tokens, chunk_size, _select))
            for wave in range(nwaves):
                st = state[wave]
                news = []
                for tt in range(t_tiles):
                    acc = [[0.0] * rpl for _ in lanes]
                    for b in range(k_blocks):
                        a_runs, b_runs = [], []
                        for lane in lanes:
                            t_op = tt * ix.MMA_MN + ix.lane_col(lane)
                            row = ix.token_row(bos, t0 + (t_op if t_op < n else 0))
                            run = []
                            for sub in range(2):
                                kk = ix.contraction_index(b, lane, sub * rpl, wsz)
                                at = ix.w_offset(row, head, kk, heads, head_dim)
                                run += wf[at : at + rpl].tolist()
                            a_runs.append(run)
                            b_runs.append(_round(st[lane][2 * b] + st[lane][2 * b + 1], io))
                        _mma(acc, a_runs, b_runs, mma, mma_k)
                    tile_values = []
                    for lane in lanes:
                        col, values = cols[wave][lane], []
                        for e in range(rpl):
                            t = tt * ix.MMA_MN + ix.lane_row(lane, e, wsz)
                            live = t < n
                            row = ix.token_row(bos, t0 + (t if live else 0))
                            at = ix.u_offset(row, head, col, heads, head_dim_v)
                            value = float(uf[at]) - acc[lane][e] if live else 0.0
                            value = float(torch.tensor(value, dtype=torch.float32))
                            if save_new_value and live:
                                v_new[at] = _round([value], u.dtype)[0]
                                written["v_new"][at] += 1
                            if gf is not None:
                                g_last = gf[ix.g_offset(last, head, heads)]
                                value *= 2.0 ** float(g_last - gf[ix.g_offset(row, head, heads)])
                            values.append(value)
                        tile_values.append(values)
                    news.append(tile_values)
                for lane, r in itertools.product(lanes, range(k_tiles)):
                    if gf is not None:
                        decay = 2.0 ** float(gf[ix.g_offset(last, head, heads)])
                        st[lane][r] = [v * decay for v in st[lane][r]]
                    if gkf is not None:
                        st[lane][r] = [
                            v * 2.0 ** float(gkf[ix.w_offset(last, head, kk, heads, head_dim)])
                            for v, kk in zip(st[lane][r], rows(lane, r), strict=True)
                        ]
                for r in range(k_tiles):
                    acc = [list(st[lane][r]) for lane in lanes]
                    for b in range(t_blocks):
                        a_runs, b_runs, reads = [], [], []
                        for lane in lanes:
                            kk = r * ix.MMA_MN + ix.lane_col(lane)
                            run = []
                            for sub in range(2):
                                t = ix.contraction_index(b, lane, sub * rpl, wsz)
                                byte = 2 * ix.kt_lds_offset(kk, t, chunk_size)
                                run += lds.load(byte, rpl, 2)
                                reads.append((lane, sub, byte))
                            a_runs.append(run)
                            b_runs.append(_round(news[2 * b][lane] + news[2 * b + 1][lane], io))
                        for sub in range(2):
                            lane_bytes = [None] * wsz
                            for lane, s, byte in reads:
                                if s == sub:
                                    lane_bytes[lane] = byte
                            lds.instruction("kt_read", wave, lane_bytes, 2 * rpl)
                        _mma(acc, a_runs, b_runs, mma, mma_k)
                    for lane in lanes:
                        st[lane][r] = acc[lane]
        lds.barrier()
        races += lds.races
        if output_final_state:
            for wave, lane, r in itertools.product(range(nwaves), lanes, range(k_tiles)):
                for kk, value in zip(rows(lane, r), state[wave][lane][r], strict=True):
                    at = ix.state_offset(seq, head, kk, cols[wave][lane], heads, head_dim,
                                         head_dim_v)  # fmt: skip
                    final[at] = value
                    written["final"][at] += 1

    return LaneOutputs(
        h=h.to(io).view(batch, chunk_rows, heads, head_dim, head_dim_v),
        v_new=v_new.to(u.dtype).view(u.shape) if save_new_value else None,
        final=(
            final.float().view(num_seqs, heads, head_dim, head_dim_v)
            if output_final_state
            else None
        ),
        written=written,
        lds_races=races,
    )
