"""Generates the default GEMM tables from the linear layers of real models.

No AMD GPU was measured for them: every choice is the runtime's documented heuristic at the row's
M, with splitK 0 (chosen per call) and `us` empty. `python -m aiter.configs.generate` rewrites
every family's default tables; `--scale F` writes tables F times their size instead (see
`scaled_shapes`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from aiter.arch import ARCHS, ArchInfo
from aiter.ops.gemm.plan import KernelFamily
from aiter.ops.gemm.table import (
    A4W4,
    A8W8_BLOCKSCALE,
    A8W8_BLOCKSCALE_BPRESHUFFLE,
    A8W8_BPRESHUFFLE,
    A16W16,
    LIBTYPE_FLYDSL,
    LIBTYPE_TORCH,
    MXFP8,
    MXFP8_Q_DTYPE,
)
from aiter.tuning import TableSpec
from aiter.tuning.scaling import scaled

M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
TORCH_M = (1, 2, 4, 8, 16)  # shapes too small for a kernel launch to pay off


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
LLAMA_3_1_405B = Model("Llama-3.1-405B", 16384, 53248, heads=128, kv_heads=8, head_dim=128)


def deepseek_v3_dense_shapes(tp: int = 8) -> dict[str, tuple[int, int]]:
    """(N, K) of DeepSeek-V3's dense linear layers at TP `tp`: MLA projections and the dense
    MLP of its first layers (hidden 7168, 128 heads, q_lora 1536, kv_lora 512, MLP 18432).
    kv_a_proj_with_mqa (N = 576) is not a multiple of the 128 scale block: the blockscale
    tables leave it out (blockscale_shapes)."""
    hidden, heads, q_lora, kv_lora, intermediate = 7168, 128, 1536, 512, 18432
    qk_head, v_head, qk_nope = 192, 128, 128
    return {
        "kv_a_proj_with_mqa": (kv_lora + 64, hidden),
        "q_a_proj": (q_lora, hidden),
        "q_b_proj": (heads * qk_head // tp, q_lora),
        "kv_b_proj": (heads * (qk_nope + v_head) // tp, kv_lora),
        "o_proj": (hidden, heads * v_head // tp),
        "gate_up_proj": (2 * intermediate // tp, hidden),
        "down_proj": (hidden, intermediate // tp),
    }


def blockscale_shapes(tp: int = 8) -> list[tuple[int, int]]:
    """DeepSeek-V3's dense layers whose N and K are multiples of the 128 scale block."""
    return [s for s in deepseek_v3_dense_shapes(tp).values() if s[0] % 128 == 0]


def _unique(shapes: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    return list(dict.fromkeys(shapes))


def _kernels(name: str) -> Callable[[], KernelFamily]:
    def family() -> KernelFamily:
        from aiter.ops.gemm import plan as gemm_plan

        return getattr(gemm_plan, name)

    return family


@dataclass(frozen=True)
class TableRecipe:
    spec: TableSpec  # file name and columns
    family: Callable[[], KernelFamily]  # imported late: kernel modules import FlyDSL
    shapes: list[tuple[int, int]]
    dtype_cells: Callable[[ArchInfo], dict[str, str]]
    torch_shapes: tuple[tuple[int, int], ...]
    m_buckets: tuple[int, ...] = M_BUCKETS
    only_archs: tuple[str, ...] | None = None  # the archs with kernels, where not every one

    @property
    def file(self) -> str:
        return self.spec.name

    def archs(self) -> list[ArchInfo]:
        """The archs whose MMA flavour the family has kernels for (of only_archs, if set)."""
        names = self.only_archs or tuple(ARCHS)
        return [ARCHS[n] for n in names if ARCHS[n].mma in self.family().tiles]


RECIPES = (
    TableRecipe(
        spec=A16W16,
        family=_kernels("A16W16"),
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
        spec=A8W8_BPRESHUFFLE,
        family=_kernels("BPRESHUFFLE"),
        shapes=_unique(LLAMA_3_1_70B.linear_shapes(8).values()),
        dtype_cells=lambda arch: {"q_dtype_w": f"torch.{arch.fp8_dtype_name}"},
        torch_shapes=((64, 128),),
    ),
    TableRecipe(
        spec=A8W8_BLOCKSCALE,
        family=_kernels("BLOCKSCALE"),
        shapes=_unique(blockscale_shapes(8)),
        dtype_cells=lambda arch: {},
        torch_shapes=((128, 128),),
    ),
    # A small table: DeepSeek-V3's q_a and o projections at decode, mid and prefill M.
    TableRecipe(
        spec=A8W8_BLOCKSCALE_BPRESHUFFLE,
        family=_kernels("BLOCKSCALE_BPRESHUFFLE"),
        shapes=[deepseek_v3_dense_shapes(8)[name] for name in ("q_a_proj", "o_proj")],
        dtype_cells=lambda arch: {},
        torch_shapes=(),
        m_buckets=(16, 128, 1024),
    ),
    # MXFP4 checkpoints: DeepSeek-R1's dense layers and Llama-3.1-405B, both at TP8; gfx950 only
    # (gfx942 has no MX instructions, gfx1250 no MX kernel here yet).
    TableRecipe(
        spec=A4W4,
        family=_kernels("A4W4"),
        shapes=_unique(
            [*deepseek_v3_dense_shapes(8).values(), *LLAMA_3_1_405B.linear_shapes(8).values()]
        ),
        dtype_cells=lambda arch: {},
        torch_shapes=(),
        only_archs=("gfx950",),
    ),
    # An MXFP8 deployment: Llama-3.1-70B at TP8.
    TableRecipe(
        spec=MXFP8,
        family=_kernels("MXFP8"),
        shapes=_unique(LLAMA_3_1_70B.linear_shapes(8).values()),
        dtype_cells=lambda arch: {"q_dtype_w": MXFP8_Q_DTYPE},
        torch_shapes=(),
        only_archs=("gfx950",),
    ),
)


# A scaled table's extra layer shapes grow N and K by this step, which keeps every divisibility
# the kernels ask of N and K (the 128-wide scale blocks included).
WIDTH_STEP = 256


def scaled_shapes(shapes: Iterable[tuple[int, int]], scale: int) -> list[tuple[int, int]]:
    """The shapes, each also at `scale - 1` wider synthetic sizes (N and K grown by WIDTH_STEP per
    step): a table `scale` times the default's size, to measure the builder on more model shapes
    than the defaults hold."""

    def grow(shape: tuple[int, int], step: int) -> tuple[int, int]:
        return shape[0] + WIDTH_STEP * step, shape[1] + WIDTH_STEP * step

    return _unique(scaled(list(shapes), scale, grow))


def rows(recipe: TableRecipe, scale: int = 1) -> list[dict[str, str]]:
    family = recipe.family()
    out = []
    for arch in recipe.archs():
        cu_num = arch.default_cu_num
        base = {"gfx": arch.name, "cu_num": str(cu_num), "us": "", **recipe.dtype_cells(arch)}
        if "kernelId" in recipe.spec.header:
            base["kernelId"] = "0"
        for n, k in scaled_shapes(recipe.shapes, scale):
            for m in recipe.m_buckets:
                tile = family.heuristic_tile(m, n, k, cu_num, arch.mma)
                # splitK 0: the runtime picks split-K per call, so it adapts inside the bucket.
                out.append(
                    base
                    | {"M": str(m), "N": str(n), "K": str(k), "libtype": LIBTYPE_FLYDSL}
                    | {"splitK": "0", "kernelName": family.kernel_name(arch.mma, tile)}
                )
        for n, k in scaled_shapes(recipe.torch_shapes, scale):
            for m in TORCH_M:
                out.append(
                    base
                    | {"M": str(m), "N": str(n), "K": str(k), "libtype": LIBTYPE_TORCH}
                    | {"splitK": "0", "kernelName": ""}
                )
    return out


def render(recipe: TableRecipe, scale: int = 1) -> str:
    """The table's CSV text, columns in the order its spec declares them."""
    import pandas as pd

    frame = pd.DataFrame(rows(recipe, scale), columns=list(recipe.spec.header), dtype=str)
    return frame.to_csv(index=False, lineterminator="\n")


def write(out_dir: Path, scale: int = 1) -> None:
    for recipe in RECIPES:
        path = Path(out_dir) / recipe.file
        text = render(recipe, scale)
        path.write_text(text)
        print(f"wrote {text.count(chr(10)) - 1} rows to {path}")
