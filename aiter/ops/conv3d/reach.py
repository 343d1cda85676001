"""The reachers of conv3d's listed kernels (aiter.verify.reachers).

conv3d_implicit's compile-time parameters are its tile, wave layout, wgm and split-K, the conv's
kernel size, stride, padding and dilation, the output layout and the bias; so a small conv with
exactly that kernel size, stride, padding and dilation reaches it, routed to the tile and split-K
by a one-row user table (AITER_CONFIG_CONV3D) for the call's exact shape, as a tuned deployment
does. The shape gives the tile its work: two N tiles (the second partial), M_TILES M tiles,
several k-tiles per split over padded channels, two samples. The NCDHW input also runs the
pre-transpose kernel. Checked by conv_case against torch's conv3d.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from aiter.verify.checks import ROUNDOFF, CaseContext
from aiter.verify.reachers import Unreachable, as_bool, as_tuple, reaches


def conv_case(
    ctx: CaseContext,
    what,
    x_shape,
    w_shape,
    *,
    dtype=torch.bfloat16,
    bias=True,
    stride=1,
    padding=0,
    dilation=1,
    groups=1,
    input_layout="NCDHW",
    output_layout="NCDHW",
) -> None:
    """aiter.conv3d on random inputs against torch's conv3d in fp32 (tolerance: one rounding,
    2 ROUNDOFF, plus fp32 sums in another order)."""
    import aiter

    x = ctx.randn(*x_shape, dtype=dtype)
    fan_in = w_shape[1] * w_shape[2] * w_shape[3] * w_shape[4]
    w = ctx.randn(*w_shape, dtype=dtype, scale=fan_in**-0.5)
    b = ctx.randn(w_shape[0], dtype=dtype) if bias else None
    x_in = x.permute(0, 2, 3, 4, 1).contiguous() if input_layout == "NDHWC" else x
    out = aiter.conv3d(x_in, w, b, stride=stride, padding=padding, dilation=dilation,
                       groups=groups, input_layout=input_layout, output_layout=output_layout)  # fmt: skip
    ref = F.conv3d(x.float(), w.float(), b.float() if bias else None, stride, padding,
                   dilation, groups)  # fmt: skip
    if output_layout == "NDHWC":
        ref = ref.permute(0, 2, 3, 4, 1)
    ctx.check(what, out, ref, 2 * ROUNDOFF[dtype] + 1e-5)


TABLE = "AITER_CONFIG_CONV3D"
BATCH, OUT_FRAMES, OUT_HEIGHT = 2, 2, 4
# Reduction k-tiles (of up to 64) each split should walk, at the least.
K_TILES_PER_SPLIT = 4
# M tiles of the output, the last half full. wgm (up to 8) groups them, here in one partial
# group; a full group as well would cost about wgm / 3 times as much to emulate.
M_TILES = 3


def _input_size(out: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """An input size with `out` outputs along an axis (more where padding outreaches the
    kernel: the input has at least one element)."""
    return max(1, (out - 1) * stride + dilation * (kernel - 1) + 1 - 2 * padding)


def _conv_call(ctx: CaseContext, params: dict[str, str], bias: bool, output_layout: str,
               split_k: int, tile: tuple[int, ...] | None) -> None:  # fmt: skip
    """A conv with the listed kernel size, stride, padding and dilation whose table row names
    `tile` (tile_m, tile_n, wave_m, wave_n, wgm; None: the heuristic's) and `split_k`."""
    from aiter import device
    from aiter.ops.conv3d import table as conv3d_table

    mma = device.arch_info().mma
    if params.get("mma", mma) != mma:
        raise Unreachable(f"a {params['mma']} kernel; {device.arch()} runs {mma} kernels")
    dtype = getattr(torch, params["x"])
    kernel = as_tuple(params.get("kernel_size", "(3, 3, 3)"))
    stride = as_tuple(params.get("stride", "(1, 1, 1)"))
    padding = as_tuple(params.get("padding", "(1, 1, 1)"))
    dilation = as_tuple(params.get("dilation", "(1, 1, 1)"))
    # A 1x1x1 unit-stride unpadded conv is a GEMM (torch.matmul) unless it is grouped.
    pointwise = kernel == (1, 1, 1) and stride == (1, 1, 1) and padding == (0, 0, 0)
    groups = 2 if pointwise else 1
    tile_m, tile_n = tile[:2] if tile else (64, 64)
    # Channels: per group a multiple of 16 less 4 (the kernel pads them back), enough for
    # K_TILES_PER_SPLIT k-tiles of 64 per split.
    taps = math.prod(kernel)
    cgp = 16 * math.ceil(K_TILES_PER_SPLIT * split_k * 64 / (16 * taps))
    c, k = groups * (cgp - 4), groups * (tile_n + tile_n // 2)
    positions = M_TILES * tile_m - tile_m // 2
    out_w = math.ceil(positions / (BATCH * OUT_FRAMES * OUT_HEIGHT))
    outs = (OUT_FRAMES, OUT_HEIGHT, out_w)
    d, h, w = (_input_size(*a) for a in zip(outs, kernel, stride, padding, dilation, strict=True))
    row = None
    if tile is not None:
        cells = dict.fromkeys(conv3d_table.CONV3D.header, "")
        names = ("tile_m", "tile_n", "wave_m", "wave_n", "wgm")
        cells.update(zip(names, map(str, tile), strict=True))
        cells.update(
            gfx="{arch}", cu_num="{cu}", N=str(BATCH), C=str(c), D=str(d), H=str(h), W=str(w),
            K=str(k), kT=str(kernel[0]), kH=str(kernel[1]), kW=str(kernel[2]),
            groups=str(groups), bias=str(int(bias)), splitK=str(split_k),
            kernelName=(f"{conv3d_table.KERNELS}_{mma}_{tile[0]}x{tile[1]}_w{tile[2]}x{tile[3]}"
                        f"_g{tile[4]}"),
            libtype=conv3d_table.LIBTYPE_FLYDSL,
        )  # fmt: skip
        for axis, s, p, dl in zip("dhw", stride, padding, dilation, strict=True):
            cells.update({f"stride_{axis}": str(s), f"pad_{axis}": str(p), f"dil_{axis}": str(dl)})
        row = (",".join(cells), ",".join(cells.values()))
    what = (
        f"conv3d {params['x']} x [{BATCH}, {c}, {d}, {h}, {w}] k {kernel} stride {stride} "
        f"pad {padding} dil {dilation} groups {groups} K {k} bias {bias} -> {output_layout}, "
        f"tile {tile or 'heuristic'} split_k {split_k}"
    )
    call = dict(dtype=dtype, bias=bias, stride=stride, padding=padding, dilation=dilation,
                groups=groups, output_layout=output_layout)  # fmt: skip
    x_shape, w_shape = (BATCH, c, d, h, w), (k, c // groups, *kernel)
    if row is None:
        conv_case(ctx, what, x_shape, w_shape, **call)
        return
    with ctx.table(TABLE, row[0], [row[1]]):
        conv_case(ctx, what, x_shape, w_shape, **call)


def _tile(params: dict[str, str]) -> tuple[int, ...]:
    return tuple(int(params[n]) for n in ("tile_m", "tile_n", "wave_m", "wave_n", "wgm"))


@reaches("conv3d_implicit")
def implicit(ctx: CaseContext, params: dict[str, str]) -> None:
    """The listed tile and split-K. With split_k > 1 the kernel stores fp32 partials, compiled
    as NDHWC without bias whatever the call's (the epilogue applies those)."""
    run = dict(bias=as_bool(params["has_bias"]), output_layout=params["output_layout"])
    _conv_call(ctx, params, split_k=int(params["split_k"]), tile=_tile(params), **run)


@reaches("conv3d_splitk_epilogue")
def splitk_epilogue(ctx: CaseContext, params: dict[str, str]) -> None:
    """Sums the listed number of splits, after a 64x64 tile's kernel."""
    params = {"x": params["out"], **params}
    run = dict(bias=as_bool(params["has_bias"]), output_layout=params["output_layout"])
    _conv_call(ctx, params, split_k=int(params["split_k"]), tile=(64, 64, 2, 2, 1), **run)


@reaches("conv3d_pretranspose")
def pretranspose(ctx: CaseContext, params: dict[str, str]) -> None:
    """Any conv of an NCDHW input of its dtype: a padded 3x3x3 one, as the heuristic serves it."""
    _conv_call(ctx, params, bias=True, output_layout="NCDHW", split_k=1, tile=None)
