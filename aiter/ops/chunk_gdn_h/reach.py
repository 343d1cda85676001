"""Listed chunk_gdn_h kernels reached by small calls (see aiter.verify.reachers).

The launcher's one compile-time choice is the V-tile width BV, from a tuned row when one serves
the call, else from the grid-fill rule (aiter/ops/chunk_gdn_h/plan.py), which at a small grid
takes the narrowest. A one-row user table of the call's layer, sequence count and tokens names
the listed BV, as a deployment's tuned row does; the gates, states and layout are the call's
own arguments.

Tolerance: the reference (aiter/ops/chunk_gdn_h/reference.py, rounded=True) rounds where the
kernel does (the state to the input dtype before w h and when stored, v_new before k^T v_new),
so what remains is fp32 sums in another order and the odd value rounding the other way: 2
ROUNDOFF of the input dtype.
"""

from __future__ import annotations

import torch

from aiter.ops.chunk_gdn_h.reference import chunk_states
from aiter.verify.checks import ROUNDOFF, CaseContext
from aiter.verify.reachers import Unreachable, as_bool, reaches

HEAD_DIM_V = 128  # two V tiles at the widest BV
SEQS = 2
DENSE_TOKENS = 70  # per sequence: a full chunk and a partial one
VARLEN_CU = [0, 40, 150]  # a sequence inside one chunk, then one across a chunk boundary
# The tuned table's flag columns and the listed parameters they match.
FLAG_PARAMS = {"is_varlen": "varlen", "use_g": "use_g", "use_gk": "use_gk", "use_h0": "use_h0",
               "store_fs": "store_final_state", "save_vn": "save_new_value"}  # fmt: skip
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def gdn_case(
    ctx: CaseContext,
    what,
    b,
    t,
    hg,
    h,
    dk,
    dv,
    *,
    dtype=torch.bfloat16,
    scalar_g=True,
    key_g=False,
    initial=False,
    final=False,
    save_new=True,
    cu=None,
) -> None:
    """One chunk_gated_delta_rule_fwd_h call of these sizes and options on normal inputs,
    checked against the rounded reference."""
    import aiter

    k = ctx.randn(b, t, hg, dk, dtype=dtype, scale=dk**-0.5)
    w = ctx.randn(b, t, h, dk, dtype=dtype, scale=dk**-0.5)
    u = ctx.randn(b, t, h, dv, dtype=dtype, scale=0.5)
    g = -(torch.rand(b, t, h, generator=ctx.gen) * 0.05).cumsum(1) if scalar_g else None
    gk = -(torch.rand(b, t, h, dk, generator=ctx.gen) * 0.05).cumsum(1) if key_g else None
    cu_seqlens = torch.tensor(cu, dtype=torch.int32) if cu else None
    n = len(cu) - 1 if cu else b
    h0 = ctx.randn(n, h, dk, dv, scale=0.1) if initial else None
    args = dict(g=g, gk=gk, initial_state=h0, output_final_state=final, save_new_value=save_new,
                cu_seqlens=cu_seqlens)  # fmt: skip
    got = aiter.chunk_gated_delta_rule_fwd_h(k, w, u, **args)
    ref = chunk_states(k, w, u, **args)
    tol = 2 * ROUNDOFF[dtype]
    for name, out, expected in zip(("h", "v_new", "final_state"), got, ref, strict=True):
        if expected is None:
            assert out is None, f"{what}: {name} returned where none was asked for"
            continue
        ctx.check(f"{what} {name}", out.float(), expected.float(), tol)


@reaches("chunk_gdn_h")
def chunk_h(ctx: CaseContext, params: dict[str, str]) -> None:
    """The listed dtype, head dim, chunk, gates, states and layout, at the listed BV by a tuned
    row, checked against the rounded reference."""
    from aiter import device
    from aiter.ops.chunk_gdn_h.kernels.chunk_h_index import CHUNK_SIZES
    from aiter.ops.chunk_gdn_h.table import CHUNK_GDN_H

    mma = device.arch_info().mma
    if params.get("mma", mma) != mma:
        raise Unreachable(f"mma={params['mma']}: {device.arch()} runs {mma}")
    if int(params["chunk_size"]) not in CHUNK_SIZES:
        raise Unreachable(f"chunk_size={params['chunk_size']}: the kernel walks {CHUNK_SIZES}")
    if params["k"] not in DTYPES:
        raise Unreachable(f"k={params['k']}: the entry takes {' or '.join(DTYPES)} inputs")
    dtype, head_dim = DTYPES[params["k"]], int(params["head_dim"])
    flags = {column: as_bool(params[name]) for column, name in FLAG_PARAMS.items()}
    varlen = flags["is_varlen"]
    row = {
        "gfx": "{arch}", "cu_num": "{cu}", "dtype": dtype, "K": head_dim, "V": HEAD_DIM_V,
        "BT": params["chunk_size"], "H": 1, "Hg": 1, **{c: int(f) for c, f in flags.items()},
        "T_flat": VARLEN_CU[-1] if varlen else SEQS * DENSE_TOKENS, "N": SEQS,
        "BV": params["block_v"], "us": "",
    }  # fmt: skip
    what = "gdn listed " + " ".join(f"{n}={params[n]}" for n in ("block_v", "use_h0", "varlen"))
    header = CHUNK_GDN_H.header
    with ctx.table(CHUNK_GDN_H.env_var, ",".join(header), [",".join(str(row[c]) for c in header)]):
        gdn_case(ctx, what, 1 if varlen else SEQS, VARLEN_CU[-1] if varlen else DENSE_TOKENS, 1, 1,
             head_dim, HEAD_DIM_V, dtype=dtype, scalar_g=flags["use_g"], key_g=flags["use_gk"],
             initial=flags["use_h0"], final=flags["store_fs"], save_new=flags["save_vn"],
             cu=VARLEN_CU if varlen else None)  # fmt: skip
