"""Generates the default bf16 GEMM table from the linear layers of real models.

No AMD GPU was measured for it: every choice is the runtime's documented heuristic, `us` is empty.
Run `python -m aiter.configs.generate` to rewrite aiter/configs/bf16_tuned_gemm.csv.
"""

from __future__ import annotations

import argparse
import csv
import io
from dataclasses import dataclass
from pathlib import Path

from aiter.arch import ARCHS
from aiter.ops import gemm_a16w16_config as a16w16

M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
COLUMNS = (
    "gfx", "cu_num", "M", "N", "K", "bias", "dtype", "outdtype",
    "libtype", "splitK", "us", "kernelName",
)  # fmt: skip


@dataclass(frozen=True)
class Model:
    name: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int

    def linear_shapes(self, tp: int) -> dict[str, tuple[int, int]]:
        """(N, K) of each projection on one of `tp` GPUs (column- then row-parallel)."""
        qkv = (self.heads + 2 * self.kv_heads) * self.head_dim
        return {
            "qkv_proj": (qkv // tp, self.hidden),
            "o_proj": (self.hidden, self.heads * self.head_dim // tp),
            "gate_up_proj": (2 * self.intermediate // tp, self.hidden),
            "down_proj": (self.hidden, self.intermediate // tp),
        }


MODELS = (
    Model("Llama-3.1-8B", hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128),
    Model("Qwen3-32B", hidden=5120, intermediate=25600, heads=64, kv_heads=8, head_dim=128),
)
TENSOR_PARALLEL = (1, 8)
# Shapes too small for a kernel launch to pay off: served by torch.
TORCH_SHAPES = ((64, 64), (128, 64))
TORCH_M = (1, 2, 4, 8, 16)


def model_shapes() -> list[tuple[int, int]]:
    shapes = []
    for model in MODELS:
        for tp in TENSOR_PARALLEL:
            for n, k in model.linear_shapes(tp).values():
                if (n, k) not in shapes:
                    shapes.append((n, k))
    return shapes


def rows() -> list[dict[str, str]]:
    out = []
    for arch in ARCHS.values():
        cu_num = arch.default_cu_num
        base = {"gfx": arch.name, "cu_num": str(cu_num), "bias": "0", "us": ""}
        base |= {"dtype": "torch.bfloat16", "outdtype": "torch.bfloat16"}
        for n, k in model_shapes():
            for m in M_BUCKETS:
                tile = a16w16.heuristic_tile(m, n, k, cu_num, arch.mma)
                # splitK 0: the runtime picks split-K per call, so it adapts inside the bucket.
                out.append(
                    base
                    | {"M": str(m), "N": str(n), "K": str(k), "libtype": "flydsl"}
                    | {"splitK": "0", "kernelName": a16w16.kernel_name(arch.mma, tile)}
                )
        for n, k in TORCH_SHAPES:
            for m in TORCH_M:
                out.append(
                    base
                    | {"M": str(m), "N": str(n), "K": str(k), "libtype": "torch"}
                    | {"splitK": "0", "kernelName": ""}
                )
    return out


def render() -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows())
    return buffer.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(Path(__file__).with_name("bf16_tuned_gemm.csv")))
    args = parser.parse_args()
    Path(args.out).write_text(render())
    print(f"wrote {len(rows())} rows to {args.out}")


if __name__ == "__main__":
    main()
