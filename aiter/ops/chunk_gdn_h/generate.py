"""Generates the default chunk_gdn_h table (`bf16_tuned_chunk_gdn_h.csv`): the Gated DeltaNet
layers of Qwen3-Next-80B-A3B (K = V = 128, 32 value heads over 16 key heads, chunk 64, scalar
gates, states kept across calls) at TP1 and TP4, dense and varlen, bf16, for every arch.

No GPU has measured these rows: `us` is empty and BV is the grid-fill rule's (plan.py), so a
row names what the rule would choose; tuning on a GPU would fill in `us` and may change BV.
`python -m aiter.configs.generate` rewrites the file; `--scale F` writes a table F times its size
instead (see `scaled_layers`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from aiter.arch import ARCHS
from aiter.ops.chunk_gdn_h.plan import grid_fill_block_v
from aiter.ops.chunk_gdn_h.table import CHUNK_GDN_H
from aiter.tuning.scaling import scaled


@dataclass(frozen=True)
class Layer:
    model: str
    heads: int  # value heads per GPU
    key_heads: int
    head_dim: int
    head_dim_v: int


LAYERS = (
    Layer("Qwen3-Next-80B-A3B TP1", 32, 16, 128, 128),
    Layer("Qwen3-Next-80B-A3B TP4", 32 // 4, 16 // 4, 128, 128),
)
CHUNK_SIZE = 64
SEQUENCES = (1, 8, 32)  # N: one long prompt, a batch, a busy prefill step
TOKENS = (8192, 32768)  # T_flat


def scaled_layers(scale: int) -> list[Layer]:
    """The default layers, each also with `scale - 1` more synthetic head counts (value and key
    heads both times 2, 3, ...: the same grouping): a table `scale` times the default's size, to
    measure the builder on more model shapes than the defaults hold."""

    def grow(layer: Layer, step: int) -> Layer:
        times = step + 1
        model = f"{layer.model} x{times} heads"
        return replace(
            layer, model=model, heads=layer.heads * times, key_heads=layer.key_heads * times
        )

    return scaled(LAYERS, scale, grow)


def rows(scale: int = 1) -> list[dict[str, str]]:
    out = []
    for arch in ARCHS.values():
        for layer in scaled_layers(scale):
            for varlen in (0, 1):
                for use_h0 in (0, 1):
                    for tokens in TOKENS:
                        for seqs in SEQUENCES:
                            block_v = grid_fill_block_v(
                                seqs, layer.heads, layer.head_dim_v, arch.default_cu_num
                            )
                            out.append(
                                {
                                    "gfx": arch.name,
                                    "cu_num": str(arch.default_cu_num),
                                    "dtype": "torch.bfloat16",
                                    "K": str(layer.head_dim),
                                    "V": str(layer.head_dim_v),
                                    "BT": str(CHUNK_SIZE),
                                    "H": str(layer.heads),
                                    "Hg": str(layer.key_heads),
                                    "is_varlen": str(varlen),
                                    "use_g": "1",
                                    "use_gk": "0",
                                    "use_h0": str(use_h0),
                                    "store_fs": "1",
                                    "save_vn": "1",
                                    "T_flat": str(tokens),
                                    "N": str(seqs),
                                    "BV": str(block_v),
                                    "us": "",
                                }
                            )
    return out


def render(scale: int = 1) -> str:
    import pandas as pd

    frame = pd.DataFrame(rows(scale), columns=list(CHUNK_GDN_H.header), dtype=str)
    return frame.to_csv(index=False, lineterminator="\n")


def write(out_dir: Path, scale: int = 1) -> None:
    path = Path(out_dir) / CHUNK_GDN_H.name
    path.write_text(render(scale))
    print(f"wrote {len(rows(scale))} rows to {path}")
