"""Generates the default GEMM tables from the linear layers of real models.

No AMD GPU was measured for them: every choice is the runtime's documented heuristic at the row's
M, with splitK 0 (chosen per call) and `us` empty. `python -m aiter.configs.generate` rewrites
every table in aiter/configs.
"""

from __future__ import annotations

import argparse
import csv
import io
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from aiter.arch import ARCHS, ArchInfo
from aiter.ops.gemm_config import KernelFamily

M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
TORCH_M = (1, 2, 4, 8, 16)  # shapes too small for a kernel launch to pay off
HERE = Path(__file__).resolve().parent


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


LLAMA_3_1_8B = Model("Llama-3.1-8B", 4096, 14336, heads=32, kv_heads=8, head_dim=128)
QWEN3_32B = Model("Qwen3-32B", 5120, 25600, heads=64, kv_heads=8, head_dim=128)
LLAMA_3_1_70B = Model("Llama-3.1-70B", 8192, 28672, heads=64, kv_heads=8, head_dim=128)


def deepseek_v3_dense_shapes(tp: int = 8) -> dict[str, tuple[int, int]]:
    """(N, K) of DeepSeek-V3's dense linear layers at TP `tp`: MLA projections and the dense
    MLP of its first layers (hidden 7168, 128 heads, q_lora 1536, kv_lora 512, MLP 18432).
    kv_a_proj_with_mqa (N = 576) is left out: N is not a multiple of the 128 scale block."""
    hidden, heads, q_lora, kv_lora, intermediate = 7168, 128, 1536, 512, 18432
    qk_head, v_head, qk_nope = 192, 128, 128
    return {
        "q_a_proj": (q_lora, hidden),
        "q_b_proj": (heads * qk_head // tp, q_lora),
        "kv_b_proj": (heads * (qk_nope + v_head) // tp, kv_lora),
        "o_proj": (hidden, heads * v_head // tp),
        "gate_up_proj": (2 * intermediate // tp, hidden),
        "down_proj": (hidden, intermediate // tp),
    }


def _unique(shapes: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    return list(dict.fromkeys(shapes))


def _a16w16_family() -> KernelFamily:
    from aiter.ops.gemm_a16w16_config import FAMILY

    return FAMILY


def _bpreshuffle_family() -> KernelFamily:
    from aiter.ops.gemm_a8w8_config import BPRESHUFFLE

    return BPRESHUFFLE


def _blockscale_family() -> KernelFamily:
    from aiter.ops.gemm_a8w8_config import BLOCKSCALE

    return BLOCKSCALE


@dataclass(frozen=True)
class TableRecipe:
    file: str
    columns: tuple[str, ...]
    family: Callable[[], KernelFamily]  # imported late: kernel modules import FlyDSL
    shapes: list[tuple[int, int]]
    dtype_cells: Callable[[ArchInfo], dict[str, str]]
    torch_shapes: tuple[tuple[int, int], ...]

    def archs(self) -> list[ArchInfo]:
        """The archs whose MMA flavour the family has kernels for."""
        return [arch for arch in ARCHS.values() if arch.mma in self.family().tiles]


RECIPES = (
    TableRecipe(
        file="bf16_tuned_gemm.csv",
        columns=("gfx", "cu_num", "M", "N", "K", "bias", "dtype", "outdtype",
                 "libtype", "splitK", "us", "kernelName"),  # fmt: skip
        family=_a16w16_family,
        shapes=_unique(
            shape
            for model in (LLAMA_3_1_8B, QWEN3_32B)
            for tp in (1, 8)
            for shape in model.linear_shapes(tp).values()
        ),
        dtype_cells=lambda arch: {
            "bias": "0", "dtype": "torch.bfloat16", "outdtype": "torch.bfloat16",
        },  # fmt: skip
        torch_shapes=((64, 64), (128, 64)),
    ),
    TableRecipe(
        file="a8w8_bpreshuffle_tuned_gemm.csv",
        columns=("gfx", "cu_num", "M", "N", "K", "q_dtype_w", "libtype", "kernelId",
                 "splitK", "us", "kernelName"),  # fmt: skip
        family=_bpreshuffle_family,
        shapes=_unique(LLAMA_3_1_70B.linear_shapes(8).values()),
        dtype_cells=lambda arch: {"q_dtype_w": f"torch.{arch.fp8_dtype_name}"},
        torch_shapes=((64, 128),),
    ),
    TableRecipe(
        file="a8w8_blockscale_tuned_gemm.csv",
        columns=("gfx", "cu_num", "M", "N", "K", "libtype", "kernelId",
                 "splitK", "us", "kernelName"),  # fmt: skip
        family=_blockscale_family,
        shapes=_unique(deepseek_v3_dense_shapes(8).values()),
        dtype_cells=lambda arch: {},
        torch_shapes=((128, 128),),
    ),
)


def rows(recipe: TableRecipe) -> list[dict[str, str]]:
    family = recipe.family()
    out = []
    for arch in recipe.archs():
        cu_num = arch.default_cu_num
        base = {"gfx": arch.name, "cu_num": str(cu_num), "us": "", **recipe.dtype_cells(arch)}
        if "kernelId" in recipe.columns:
            base["kernelId"] = "0"
        for n, k in recipe.shapes:
            for m in M_BUCKETS:
                tile = family.heuristic_tile(m, n, k, cu_num, arch.mma)
                # splitK 0: the runtime picks split-K per call, so it adapts inside the bucket.
                out.append(
                    base
                    | {"M": str(m), "N": str(n), "K": str(k), "libtype": "flydsl"}
                    | {"splitK": "0", "kernelName": family.kernel_name(arch.mma, tile)}
                )
        for n, k in recipe.torch_shapes:
            for m in TORCH_M:
                out.append(
                    base
                    | {"M": str(m), "N": str(n), "K": str(k), "libtype": "torch"}
                    | {"splitK": "0", "kernelName": ""}
                )
    return out


def render(recipe: TableRecipe) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=recipe.columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows(recipe))
    return buffer.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default=str(HERE))
    args = parser.parse_args()
    for recipe in RECIPES:
        path = Path(args.out_dir) / recipe.file
        path.write_text(render(recipe))
        print(f"wrote {len(rows(recipe))} rows to {path}")


if __name__ == "__main__":
    main()
