"""Generates the default fp8 attention shapes (`fmha_fp8_shapes.csv`): the prefill attention of
Llama-3.1-70B and gpt-oss-120b at TP8 and DeepSeek-V3's prefill MLA heads at TP8, dense and
variable-length, causal, for every arch. `python -m aiter.configs.generate` rewrites it; `--scale
F` writes a table F times its size instead (see `scaled_models`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from aiter.arch import ARCHS
from aiter.ops.fmha_fp8.table import FMHA_FP8, LAYOUTS
from aiter.tuning.scaling import scaled

MAX_BATCH = 8
MAX_SEQLEN = 8192


@dataclass(frozen=True)
class Heads:
    model: str
    num_heads: int  # per GPU
    num_kv_heads: int
    head_dim: int
    head_dim_v: int


MODELS = (
    Heads("Llama-3.1-70B TP8", 64 // 8, 8 // 8, 128, 128),
    # MLA prefill: each query head has its own key (192 = 128 nope + 64 rope) and value (128).
    Heads("DeepSeek-V3 MLA prefill TP8", 128 // 8, 128 // 8, 192, 128),
    Heads("gpt-oss-120b TP8", 64 // 8, 8 // 8, 64, 64),
)


def scaled_models(scale: int) -> list[Heads]:
    """The default models, each also with `scale - 1` more synthetic head counts (query and key
    heads both times 2, 3, ...: the same grouping): a table `scale` times the default's size, to
    measure the builder on more model shapes than the defaults hold."""

    def grow(heads: Heads, step: int) -> Heads:
        times = step + 1
        return replace(
            heads,
            model=f"{heads.model} x{times} heads",
            num_heads=heads.num_heads * times,
            num_kv_heads=heads.num_kv_heads * times,
        )

    return scaled(MODELS, scale, grow)


def rows(scale: int = 1) -> list[dict[str, str]]:
    out = []
    for arch in ARCHS.values():
        for heads in scaled_models(scale):
            for layout in LAYOUTS:
                out.append(
                    {
                        "gfx": arch.name,
                        "cu_num": str(arch.default_cu_num),
                        "num_heads": str(heads.num_heads),
                        "num_kv_heads": str(heads.num_kv_heads),
                        "head_dim": str(heads.head_dim),
                        "head_dim_v": str(heads.head_dim_v),
                        "layout": layout,
                        "causal": "1",
                        "max_batch": str(MAX_BATCH),
                        "max_seqlen": str(MAX_SEQLEN),
                        "model": heads.model,
                    }
                )
    return out


def render(scale: int = 1) -> str:
    import pandas as pd

    frame = pd.DataFrame(rows(scale), columns=list(FMHA_FP8.header), dtype=str)
    return frame.to_csv(index=False, lineterminator="\n")


def write(out_dir: Path, scale: int = 1) -> None:
    path = Path(out_dir) / FMHA_FP8.name
    path.write_text(render(scale))
    print(f"wrote {len(rows(scale))} rows to {path}")
