"""The chunk_gdn_h entry's argument checks: shapes, dtypes, devices and flags, each error naming
the argument, before anything is planned, allocated or launched. What the checks accept is one
`ChunkHCall`: the sizes the plan, the allocation and the launch read.

Head naming follows flash-linear-attention's chunk_gated_delta_rule_fwd_h: k has Hg key heads,
w, u, the gates and the states have H value heads, and H is a multiple of Hg. The gates g and
gk are chunk-local cumulative log2 gates: a chunk's state decays by exp2(gate at its last
token).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aiter import device
from aiter.ops.chunk_gdn_h.kernels.chunk_h_index import (
    CHUNK_SIZES,
    HEAD_DIMS,
    chunk_offsets,
    num_chunks,
)

INPUT_DTYPES = (torch.bfloat16, torch.float16)
STATE_DTYPE = torch.float32
SEQLENS_DTYPES = (torch.int32, torch.int64)
HEAD_DIM_V_MULTIPLE = 16
HEAD_DIM_V_MAX = 512
MAX_ELEMENTS = 2**31 - 1  # the kernel's element offsets are 32-bit


@dataclass(frozen=True)
class ChunkHCall:
    """One call's sizes: B rows of T tokens (varlen: B = 1, N sequences), H value heads over
    Hg key heads, head dims K and V, chunk_size BT, NT chunk rows of h per batch row."""

    batch: int
    seqlen: int
    num_seqs: int
    heads: int
    key_heads: int
    head_dim: int
    head_dim_v: int
    chunk_size: int
    num_chunk_rows: int
    dtype: torch.dtype
    use_g: bool
    use_gk: bool
    use_h0: bool
    store_final_state: bool
    save_new_value: bool
    varlen: bool
    cu_seqlens: tuple[int, ...] | None  # varlen only: cu_seqlens's values
    chunk_offsets: tuple[int, ...] | None  # varlen only: each sequence's first chunk row


def _tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _on_gpu(name: str, t: torch.Tensor) -> None:
    if not device.on_gpu(t):
        raise ValueError(f"{name} must be on a GPU device, got {t.device}")


def _contiguous(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {list(t.stride())}")


def _shape(name: str, t: torch.Tensor, want: tuple[int, ...], form: str) -> None:
    if tuple(t.shape) != want:
        raise ValueError(f"{name} must have shape {form} = {list(want)}, got {list(t.shape)}")


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def _seqlens(cu_seqlens: object, total: int) -> list[int]:
    t = _tensor("cu_seqlens", cu_seqlens)
    if t.dtype not in SEQLENS_DTYPES or t.dim() != 1 or t.shape[0] < 2:
        raise ValueError(
            f"cu_seqlens must be an int32 or int64 tensor [N + 1] with N >= 1, got {t.dtype} "
            f"{list(t.shape)}"
        )
    try:
        values = [int(v) for v in t.tolist()]
    except RuntimeError as err:  # a FakeTensor's values are unknown
        raise ValueError(
            "cu_seqlens: its values decide h's chunk count, and this tensor has none to read "
            "(in a dry run, pass a real host tensor)"
        ) from err
    if values[0] != 0 or values[-1] != total:
        raise ValueError(
            f"cu_seqlens must run from 0 to the {total} tokens of k, got {values[0]} to "
            f"{values[-1]}"
        )
    for i, (start, end) in enumerate(zip(values, values[1:], strict=False)):
        if end < start:
            raise ValueError(f"cu_seqlens must not decrease: entry {i + 1} is {end}, after {start}")
    return values


def check_call(k, w, u, g, gk, initial_state, output_final_state, chunk_size, save_new_value,
               cu_seqlens) -> ChunkHCall:  # fmt: skip
    """The call's sizes, or the first error found, naming its argument."""
    k, w, u = _tensor("k", k), _tensor("w", w), _tensor("u", u)
    if k.dim() != 4:
        raise ValueError(f"k must be [B, T, Hg, K], got {k.dim()} dims {list(k.shape)}")
    batch, seqlen, key_heads, head_dim = map(int, k.shape)
    if batch < 1 or (seqlen < 1 and cu_seqlens is None):
        raise ValueError(f"k must hold at least one token per batch row, got {list(k.shape)}")
    if k.dtype not in INPUT_DTYPES:
        raise ValueError(f"k must be bfloat16 or float16, got {k.dtype}")
    if u.dim() != 4:
        raise ValueError(f"u must be [B, T, H, V], got {u.dim()} dims {list(u.shape)}")
    heads, head_dim_v = int(u.shape[2]), int(u.shape[3])
    _shape("u", u, (batch, seqlen, heads, head_dim_v), "[B, T, H, V]")
    _shape("w", w, (batch, seqlen, heads, head_dim), "[B, T, H, K]")
    for name, t in (("w", w), ("u", u)):
        if t.dtype != k.dtype:
            raise ValueError(f"{name} must have k's dtype {k.dtype}, got {t.dtype}")
    if key_heads < 1 or heads % key_heads:
        raise ValueError(f"u's heads H = {heads} must be a multiple of k's heads Hg = {key_heads}")
    if head_dim not in HEAD_DIMS:
        raise NotImplementedError(f"k: head dim K must be one of {HEAD_DIMS}, got {head_dim}")
    if head_dim_v % HEAD_DIM_V_MULTIPLE or not 0 < head_dim_v <= HEAD_DIM_V_MAX:
        raise NotImplementedError(
            f"u: head dim V must be a multiple of {HEAD_DIM_V_MULTIPLE} up to {HEAD_DIM_V_MAX}, "
            f"got {head_dim_v}"
        )
    if isinstance(chunk_size, bool) or chunk_size not in CHUNK_SIZES:
        raise NotImplementedError(f"chunk_size must be one of {CHUNK_SIZES}, got {chunk_size!r}")
    output_final_state = _flag("output_final_state", output_final_state)
    save_new_value = _flag("save_new_value", save_new_value)

    gates = {}
    for name, t, form, dims in (
        ("g", g, "[B, T, H]", (batch, seqlen, heads)),
        ("gk", gk, "[B, T, H, K]", (batch, seqlen, heads, head_dim)),
    ):
        if t is not None:
            t = _tensor(name, t)
            _shape(name, t, dims, form)
            if t.dtype not in (STATE_DTYPE, *INPUT_DTYPES):
                raise ValueError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
            gates[name] = t

    varlen = cu_seqlens is not None
    offsets = values = None
    if varlen:
        if batch != 1:
            raise ValueError(f"k: a varlen batch (cu_seqlens) must have B = 1, got B = {batch}")
        values = _seqlens(cu_seqlens, seqlen)
        num_seqs = len(values) - 1
        offsets = tuple(chunk_offsets(values, chunk_size))
        num_chunk_rows = offsets[-1]
    else:
        num_seqs = batch
        num_chunk_rows = num_chunks(seqlen, chunk_size)
    if initial_state is not None:
        initial_state = _tensor("initial_state", initial_state)
        _shape(
            "initial_state", initial_state, (num_seqs, heads, head_dim, head_dim_v),
            "[N, H, K, V]",
        )  # fmt: skip
        if initial_state.dtype != STATE_DTYPE:
            raise ValueError(f"initial_state must be float32, got {initial_state.dtype}")

    named = {"k": k, "w": w, "u": u, **gates}
    if initial_state is not None:
        named["initial_state"] = initial_state
    if varlen and device.on_gpu(cu_seqlens):
        named["cu_seqlens"] = cu_seqlens
    for name, t in named.items():
        _on_gpu(name, t)
        _contiguous(name, t)
        if t.device != k.device:
            raise ValueError(f"{name} must be on k's device {k.device}, got {t.device}")
    h_elements = batch * num_chunk_rows * heads * head_dim * head_dim_v
    for name, elements in (("k", k.numel()), ("w", w.numel()), ("u", u.numel()),
                           ("h (the per-chunk states)", h_elements)):  # fmt: skip
        if elements > MAX_ELEMENTS:
            raise NotImplementedError(
                f"{name} would hold {elements} elements, past the kernel's 32-bit offsets "
                f"({MAX_ELEMENTS})"
            )
    return ChunkHCall(
        batch=batch,
        seqlen=seqlen,
        num_seqs=num_seqs,
        heads=heads,
        key_heads=key_heads,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        chunk_size=chunk_size,
        num_chunk_rows=num_chunk_rows,
        dtype=k.dtype,
        use_g="g" in gates,
        use_gk="gk" in gates,
        use_h0=initial_state is not None,
        store_final_state=output_final_state,
        save_new_value=save_new_value,
        varlen=varlen,
        cu_seqlens=tuple(values) if varlen else None,
        chunk_offsets=offsets,
    )
