"""Generates the default fused-MoE table (`tuned_fmoe.csv`) from the MoE layers of real models.

No AMD GPU was measured for it: every row leaves block_m, ksplit and the kernel names to the C++
planner (0 and empty cells, chosen per call, so they adapt inside a bucket) and `us` empty.
`python -m aiter.configs.generate` rewrites it with the GEMM tables; `--scale F` writes a table F
times its size instead (see `scaled_layers`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from aiter.arch import ARCHS, ArchInfo
from aiter.ops.moe import table as moe_table
from aiter.ops.moe.table import FMOE
from aiter.tuning.scaling import scaled

# Padded token counts: get_padded_M rounds a call's tokens up to one of these.
TOKENS = tuple(2**i for i in range(16))  # 1 .. 32768


@dataclass(frozen=True)
class MoeLayer:
    """The routed experts of one model on one GPU."""

    model: str
    model_dim: int
    inter_dim: int  # per expert, after tensor parallelism
    experts: int  # global experts (the range of topk_ids)
    topk: int
    activation: str = "silu"


LAYERS = (
    MoeLayer("Mixtral-8x7B TP8", model_dim=4096, inter_dim=14336 // 8, experts=8, topk=2),
    MoeLayer("Qwen3-30B-A3B TP1", model_dim=2048, inter_dim=768, experts=128, topk=8),
    # Expert parallelism over 8 GPUs: 32 of the 256 routed experts are local (expert_mask).
    MoeLayer("DeepSeek-V3 EP8", model_dim=7168, inter_dim=2048, experts=256, topk=8),
)


# A scaled table's extra layers grow model_dim and inter_dim by these steps, which keep every
# divisibility the two stages ask of them. inter_dim grows slower: at 32768 tokens, 8 experts per
# token, the stage-2 input of DeepSeek-V3's widest sibling (2048 + 9 * 128) stays under 2 GiB, the
# kernels' 32-bit buffer offsets.
MODEL_DIM_STEP, INTER_DIM_STEP = 256, 128


def scaled_layers(scale: int) -> list[MoeLayer]:
    """The default layers, each also at `scale - 1` wider synthetic sizes (model_dim and
    inter_dim grown by MODEL_DIM_STEP and INTER_DIM_STEP per step): a table `scale` times the
    default's size, to measure the builder on more model shapes than the defaults hold."""

    def grow(layer: MoeLayer, step: int) -> MoeLayer:
        return replace(
            layer,
            model=f"{layer.model} wider x{step}",
            model_dim=layer.model_dim + MODEL_DIM_STEP * step,
            inter_dim=layer.inter_dim + INTER_DIM_STEP * step,
        )

    return scaled(LAYERS, scale, grow)


def _quant_cells(arch: ArchInfo) -> list[dict[str, str]]:
    """bf16 weights and activations; the arch's fp8 flavour per token and channel."""
    bf16, fp8 = "torch.bfloat16", f"torch.{arch.fp8_dtype_name}"
    return [
        {"q_dtype_a": bf16, "q_dtype_w": bf16, "q_type": moe_table.QUANT_NONE},
        {"q_dtype_a": fp8, "q_dtype_w": fp8, "q_type": moe_table.QUANT_PER_TOKEN},
    ]


def rows(scale: int = 1) -> list[dict[str, str]]:
    out = []
    planner = moe_table.PLANNER_CHOOSES
    for arch in ARCHS.values():
        for layer in scaled_layers(scale):
            for quant in _quant_cells(arch):
                for tokens in TOKENS:
                    row = dict.fromkeys(FMOE.header, "")
                    row.update(
                        gfx=arch.name,
                        cu_num=str(arch.default_cu_num),
                        token=str(tokens),
                        model_dim=str(layer.model_dim),
                        inter_dim=str(layer.inter_dim),
                        expert=str(layer.experts),
                        topk=str(layer.topk),
                        act_type=moe_table.ACTIVATION_CELLS[layer.activation],
                        dtype="torch.bfloat16",
                        use_g1u1="1",
                        doweight_stage1="0",
                        block_m=planner,
                        ksplit=planner,
                        run_1stage="0",
                        **quant,
                    )
                    out.append(row)
    return out


def render(scale: int = 1) -> str:
    """The table's CSV text, columns in the order its spec declares them."""
    import pandas as pd

    frame = pd.DataFrame(rows(scale), columns=list(FMOE.header), dtype=str)
    return frame.to_csv(index=False, lineterminator="\n")


@dataclass(frozen=True)
class Routing:
    """How one model routes its tokens to experts."""

    model: str
    experts: int
    topk: int
    groups: int = 1
    topk_group: int = 1
    scoring: str = "softmax"
    correction_bias: bool = False


ROUTINGS = (
    # DeepSeek-V3/R1: sigmoid scores plus the correction bias, 8 groups, 4 kept.
    Routing("DeepSeek-V3/R1", 256, 8, 8, 4, "sigmoid", True),
    Routing("Kimi-K2", 384, 8, 1, 1, "sigmoid", True),
    Routing("Qwen3-30B-A3B / Qwen3-235B-A22B", 128, 8),
    Routing("gpt-oss-120b", 128, 4),
)
ROUTING_MAX_TOKENS = 32768


def routing_rows() -> list[dict[str, str]]:
    """Every routing configuration on every arch, up to ROUTING_MAX_TOKENS tokens per call."""
    from aiter.ops.moe.routing_table import MOE_ROUTING

    out = []
    for arch in ARCHS.values():
        for r in ROUTINGS:
            out.append(
                {"gfx": arch.name, "cu_num": str(arch.default_cu_num),
                 "num_experts": str(r.experts), "topk": str(r.topk),
                 "num_expert_group": str(r.groups), "topk_group": str(r.topk_group),
                 "scoring": r.scoring, "correction_bias": str(int(r.correction_bias)),
                 "max_tokens": str(ROUTING_MAX_TOKENS), "model": r.model}  # fmt: skip
            )
    assert all(set(row) == set(MOE_ROUTING.header) for row in out)
    return out


def write(out_dir: Path, scale: int = 1) -> None:
    import pandas as pd

    from aiter.ops.moe.routing_table import MOE_ROUTING

    path = Path(out_dir) / FMOE.name
    path.write_text(render(scale))
    print(f"wrote {len(rows(scale))} rows to {path}")
    routing = pd.DataFrame(routing_rows(), columns=list(MOE_ROUTING.header), dtype=str)
    path = Path(out_dir) / MOE_ROUTING.name
    path.write_text(routing.to_csv(index=False, lineterminator="\n"))
    print(f"wrote {len(routing)} rows to {path}")
