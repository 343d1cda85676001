"""Generates the default conv3d table (`bf16_tuned_conv3d.csv`) from the 3-D convolutions of two
open video VAEs (Wan2.1's causal VAE, HunyuanVideo's VAE) and Wan2.1's patch embedding.

No AMD GPU was measured for it: each row holds the heuristic's tile at the row's shape, splitK 0
(resolved per call, so it follows the frame count) and an empty `us`.
`python -m aiter.configs.generate` rewrites it with the other tables; `--scale F` writes a table F
times its size instead (see `scaled_convs`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from aiter.arch import ARCHS
from aiter.ops.conv3d.table import CONV3D
from aiter.tuning.scaling import scaled


@dataclass(frozen=True)
class Conv:
    """One 3-D convolution of a model at one input size (batch 1; causal padding in time is
    applied by the model before the conv, so pad_d is 0 there)."""

    layer: str
    c: int
    k: int
    d: int
    h: int
    w: int
    kernel: tuple[int, int, int] = (3, 3, 3)
    stride: tuple[int, int, int] = (1, 1, 1)
    padding: tuple[int, int, int] = (0, 1, 1)


def _vae_decoder(
    channels: tuple[int, int, int, int], frames: tuple[int, int, int], height: int, width: int
) -> list[Conv]:
    """A causal VAE decoder's convs for an output of height x width: latent conv_in (16
    channels), residual convs at 1/8, 1/4, 1/2 and full size, a 1x1x1 shortcut where channels
    halve, and the 3-channel head. `frames` is D at the latent rate and after each temporal
    upsampling (2 causal frames included)."""
    c8, c4, c2, c1 = channels
    h8, w8 = height // 8, width // 8
    d_latent, d_up1, d_up2 = frames
    return [
        Conv("conv_in", 16, c8, d_latent, h8, w8),
        Conv("res_1/8", c8, c8, d_latent, h8, w8),
        Conv("res_1/4", c4, c4, d_up1, 2 * h8, 2 * w8),
        Conv("shortcut_1/2", c4, c2, d_up2, 4 * h8, 4 * w8, (1, 1, 1), padding=(0, 0, 0)),
        Conv("res_1/2", c2, c2, d_up2, 4 * h8, 4 * w8),
        Conv("res_1/1", c1, c1, d_up2, height, width),
        Conv("conv_out", c1, 3, d_up2, height, width),
    ]


MODELS: dict[str, list[Conv]] = {
    # Wan2.1 VAE (base 96 channels, x[4, 4, 2, 1]), decoding one latent frame at a time.
    **{
        f"Wan2.1-VAE {h}x{w}": _vae_decoder((384, 384, 192, 96), (3, 4, 6), h, w)
        for h, w in ((480, 832), (720, 1280))
    },
    # HunyuanVideo VAE (128, 256, 512, 512 channels): its 256x256 spatial decode tile and 544p.
    **{
        f"HunyuanVideo-VAE {h}x{w}": _vae_decoder((512, 512, 256, 128), (7, 12, 22), h, w)
        for h, w in ((256, 256), (544, 960))
    },
    # Wan2.1-T2V-1.3B patch embedding: 2x2 spatial patches of 21 latent frames at 480p.
    "Wan2.1-1.3B patch_embedding": [
        Conv("patch_embedding", 16, 1536, 21, 60, 104, (1, 2, 2), (1, 2, 2), (0, 0, 0))
    ],
}


def _unique_convs() -> list[Conv]:
    seen: dict[tuple, Conv] = {}
    for convs in MODELS.values():
        for conv in convs:
            key = (conv.c, conv.k, conv.d, conv.h, conv.w, conv.kernel, conv.stride, conv.padding)
            seen.setdefault(key, conv)
    return list(seen.values())


# A scaled table's extra convs grow the input's height and width by this step.
SIZE_STEP = 8


def scaled_convs(scale: int) -> list[Conv]:
    """The default convs, each also at `scale - 1` larger synthetic input sizes (H and W grown by
    SIZE_STEP per step): a table `scale` times the default's size, to measure the builder on
    more shapes than the defaults hold."""

    def grow(conv: Conv, step: int) -> Conv:
        return replace(conv, h=conv.h + SIZE_STEP * step, w=conv.w + SIZE_STEP * step)

    return scaled(_unique_convs(), scale, grow)


def rows(scale: int = 1) -> list[dict[str, str]]:
    from aiter.ops.conv3d import plan as conv3d_plan
    from aiter.ops.conv3d.kernels.implicit_gemm import Conv3dGeometry

    out = []
    for arch in ARCHS.values():
        for conv in scaled_convs(scale):
            geometry = Conv3dGeometry(
                n=1, c=conv.c, d=conv.d, h=conv.h, w=conv.w, k=conv.k, kt=conv.kernel[0],
                kh=conv.kernel[1], kw=conv.kernel[2], stride=conv.stride, padding=conv.padding,
                dilation=(1, 1, 1), groups=1,
            )  # fmt: skip
            row = dict.fromkeys(CONV3D.header, "")
            row.update(
                gfx=arch.name, cu_num=str(arch.default_cu_num), N="1", C=str(conv.c),
                D=str(conv.d), H=str(conv.h), W=str(conv.w), K=str(conv.k),
                kT=str(conv.kernel[0]), kH=str(conv.kernel[1]), kW=str(conv.kernel[2]),
                stride_d=str(conv.stride[0]), stride_h=str(conv.stride[1]),
                stride_w=str(conv.stride[2]), pad_d=str(conv.padding[0]),
                pad_h=str(conv.padding[1]), pad_w=str(conv.padding[2]),
                dil_d="1", dil_h="1", dil_w="1", groups="1", bias="1", splitK="0",
            )  # fmt: skip
            if conv.kernel == (1, 1, 1):  # served by torch.matmul before any lookup
                row.update(tile_m="0", tile_n="0", wave_m="0", wave_n="0", wgm="0")
            else:
                tile = conv3d_plan.heuristic_tile(geometry, arch.mma)
                name = conv3d_plan.ConvChoice(arch.mma, tile, 1).name
                row.update(
                    tile_m=str(tile.tile_m), tile_n=str(tile.tile_n),
                    wave_m=str(tile.wave_m), wave_n=str(tile.wave_n), wgm=str(tile.wgm),
                    kernelName=name,
                )  # fmt: skip
            out.append(row)
    return out


def render(scale: int = 1) -> str:
    """The table's CSV text, columns in the order its spec declares them."""
    import pandas as pd

    frame = pd.DataFrame(rows(scale), columns=list(CONV3D.header), dtype=str)
    return frame.to_csv(index=False, lineterminator="\n")


def write(out_dir: Path, scale: int = 1) -> None:
    path = Path(out_dir) / CONV3D.name
    path.write_text(render(scale))
    print(f"wrote {len(rows(scale))} rows to {path}")
