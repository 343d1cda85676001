"""Why bisection finds every kernel a GEMM or MoE row serves: along the replayed axis (M, tokens)
each choice the runtime's heuristics make holds on one run of values and never comes back once it
changed, so two probes that ask for the same kernels bound a run of those kernels.

The argument, checked here densely over random shapes: the primary choice (GEMM's tile, MoE's
block size) never decreases as the axis grows, and within a run of it the secondary choice
(split-K, MoE's K split) never increases; so the pair takes each value on one interval. The
kernels a call asks for are a function of the plan's choices alone
(op_tests/shared/test_kernel_keys.py), and table lookups change only at tabled values and bucket
edges, which naming probes on both sides. conv3d's split-K over frames does flip back and forth,
so its module probes every frame instead; fmha_fp8 states its own argument.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from aiter.ops.gemm import plan as gemm_plan
from aiter.ops.moe import host_planner as moe_host
from aiter.ops.moe.plan import MoeShape, heuristic_choice

FAST = dict(max_examples=25, deadline=None, database=None, derandomize=True)
CU_NUMS = (80, 104, 256, 304)
GEMM_FAMILIES = {
    "a16w16": gemm_plan.A16W16,
    "bpreshuffle": gemm_plan.BPRESHUFFLE,
    "blockscale": gemm_plan.BLOCKSCALE,
}


def _runs(values: list) -> list:
    """The distinct values of a sequence in order, one per run."""
    runs: list = []
    for value in values:
        if not runs or runs[-1] != value:
            runs.append(value)
    return runs


def _each_value_on_one_run(values: list) -> None:
    runs = _runs(values)
    recurring = [v for i, v in enumerate(runs) if v in runs[:i]]
    assert not recurring, f"choices that come back after another: {recurring[:3]} in {runs}"


@st.composite
def gemm_shapes(draw):
    family = GEMM_FAMILIES[draw(st.sampled_from(sorted(GEMM_FAMILIES)))]
    mma = draw(st.sampled_from(sorted(family.tiles)))
    tile = draw(st.none() | st.sampled_from(family.tiles[mma]))
    split_k = draw(st.sampled_from((0, 0, 1, 2, 4)))
    n = 128 * draw(st.integers(1, 128))
    k = 128 * draw(st.integers(1, 64))
    return family, mma, tile, split_k, n, k, draw(st.sampled_from(CU_NUMS))


@settings(**FAST)
@given(gemm_shapes())
def test_a_gemm_choice_never_comes_back_along_m(shape) -> None:
    family, mma, tile, split_k, n, k, cu_num = shape
    choices = [
        family.choose(m, n, k, cu_num, mma, tile, split_k) for m in range(1, 2049)
    ]  # past every tile_m, where ceil(M / tile_m) grows
    _each_value_on_one_run(choices)


@st.composite
def moe_shapes(draw):
    experts = draw(st.sampled_from((8, 32, 64, 128, 256)))
    shape = MoeShape(
        model_dim=64 * draw(st.integers(1, 112)),
        inter_dim=64 * draw(st.integers(1, 64)),
        experts=experts,
        topk=draw(st.integers(1, min(experts, 8))),
        activation="silu",
        dtype="torch.bfloat16",
        q_dtype_a="torch.bfloat16",
        q_dtype_w="torch.bfloat16",
        quantized=False,
        doweight_stage1=False,
    )
    tuned_block_m = draw(st.sampled_from((0, 0, 16, 32, 64)))  # 0: the planner's
    return shape, tuned_block_m, draw(st.sampled_from(CU_NUMS))


def _moe_choice(shape: MoeShape, block_m: int, tokens: int, cu_num: int) -> tuple[int, int]:
    if not block_m:
        choice = heuristic_choice(shape, tokens, cu_num, "mfma")
        return choice.block_m, choice.ksplit
    args = (tokens, shape.topk, shape.experts, shape.model_dim, shape.inter_dim, block_m, cu_num)
    return block_m, moe_host.moe_ksplit(*args)


@settings(**FAST)
@given(moe_shapes())
def test_a_moe_choice_never_comes_back_along_tokens(shape) -> None:
    moe_shape, block_m, cu_num = shape
    # Within one padded-token run (a job), and across them: the planner never looks at the run.
    choices = [_moe_choice(moe_shape, block_m, tokens, cu_num) for tokens in range(1, 2049)]
    _each_value_on_one_run(choices)


def test_the_check_sees_a_choice_that_comes_back() -> None:
    try:
        _each_value_on_one_run([1, 1, 2, 2, 1])
    except AssertionError as err:
        assert "come back" in str(err)
    else:
        raise AssertionError("a recurring choice passed")
