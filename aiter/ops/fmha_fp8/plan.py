"""The fp8 attention launcher's choices, as documented functions of batch, query and key lengths,
heads and CU count. Each compile-time choice is a one-axis function or a monotone predicate; the
AOT replay reads ONE_AXIS to put every one-axis switch on its grid (see the README).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from aiter import dispatch
from aiter.ops.fmha_fp8.table import FMHA_FP8

OP = "flash_attn_fp8"
SHORT_QUERIES = 256  # query block 64 up to this many queries, 128 above
QUERY_BLOCKS = (64, 128)
LAZY_RESCALE_KEYS = 4096  # up to this many keys the softmax rescales lazily
LAZY_RESCALE_LOG2 = 6.0  # ... only when a row's max grows by more than 2**6 (P then fits fp8)
SPLIT_MIN_QUERIES = 128  # KV splits serve long (prefill) queries only
SPLIT_MIN_KEY_BLOCKS = 16  # ... over at least this many key blocks
SPLIT_FILL = 2  # ... when the work-groups fill at most half the CUs
MAX_SPLITS = 16
WORKSPACE_CAP_BYTES = 256 << 20  # fp32 partial outputs of all splits
COMBINE_COST = 2  # the combine kernel, in key-block steps


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _block_n() -> int:
    from aiter.ops.fmha_fp8.kernels.flash_attn import BLOCK_N

    return BLOCK_N


def query_block(max_seqlen_q: int) -> int:
    """Query rows per work-group: 64 for short queries (<= SHORT_QUERIES), else 128."""
    return 64 if max_seqlen_q <= SHORT_QUERIES else 128


def rescale_threshold(max_seqlen_k: int) -> float:
    """Log2 growth of a row's max below which the output is not rescaled: lazy (6, so P stays
    within fp8) up to LAZY_RESCALE_KEYS keys, exact (0) above, where unscaled sums grow large."""
    return LAZY_RESCALE_LOG2 if max_seqlen_k <= LAZY_RESCALE_KEYS else 0.0


def queries_allow_split(max_seqlen_q: int) -> bool:
    return max_seqlen_q >= SPLIT_MIN_QUERIES


def keys_allow_split(max_seqlen_k: int) -> bool:
    return _ceil_div(max_seqlen_k, _block_n()) >= SPLIT_MIN_KEY_BLOCKS


# Every choice that depends on one axis only, by the axis the AOT grid calls it.
ONE_AXIS: dict[str, tuple[Callable[[int], object], ...]] = {
    "seqlen_q": (query_block, queries_allow_split),
    "seqlen_k": (rescale_threshold, keys_allow_split),
}


def work_groups(batch: int, num_heads: int, max_seqlen_q: int, block_m: int) -> int:
    return batch * num_heads * _ceil_div(max_seqlen_q, block_m)


def kv_splits(
    batch: int,
    num_heads: int,
    max_seqlen_q: int,
    max_seqlen_k: int,
    rows: int,
    head_dim_v: int,
    cu_num: int,
) -> int:
    """Splits of the key range. 1 unless the queries and keys are long enough (ONE_AXIS), the
    work-groups fill at most 1/SPLIT_FILL of the CUs and the workspace cap leaves room for two;
    then the count s in 2..min(16, key blocks, cap) minimising
    ceil(work-groups * s / cu_num) * ceil(key blocks / s) + COMBINE_COST (fewer on a tie).
    Whether it splits is monotone: never more likely with more batch or queries."""
    if not (queries_allow_split(max_seqlen_q) and keys_allow_split(max_seqlen_k)):
        return 1
    groups = work_groups(batch, num_heads, max_seqlen_q, query_block(max_seqlen_q))
    cap = WORKSPACE_CAP_BYTES // (rows * num_heads * head_dim_v * 4)
    blocks = _ceil_div(max_seqlen_k, _block_n())
    most = min(MAX_SPLITS, blocks, cap)
    if groups * SPLIT_FILL > cu_num or most < 2:
        return 1
    costs = {
        s: _ceil_div(groups * s, cu_num) * _ceil_div(blocks, s) + COMBINE_COST
        for s in range(2, most + 1)
    }
    return min(costs, key=lambda s: (costs[s], s))


def interleave(causal: bool, max_seqlen_q: int, max_seqlen_k: int, batch: int, splits: int) -> bool:
    """Causal self-attention over an even batch without splits pairs batch b with B-1-b. A
    runtime flag of the kernel: it changes the work-group mapping, not the compiled code."""
    return causal and max_seqlen_q == max_seqlen_k and batch % 2 == 0 and splits == 1


@dataclass(frozen=True)
class AttnChoice:
    mma: str
    block_m: int
    rescale_threshold: float
    num_kv_splits: int
    interleave: bool
    head_dim: int
    head_dim_v: int

    @property
    def name(self) -> str:
        split = "_split" if self.num_kv_splits > 1 else ""
        return (
            f"flydsl_fmha_fp8_{self.mma}_bm{self.block_m}_d{self.head_dim}x{self.head_dim_v}"
            f"_r{self.rescale_threshold:g}{split}"
        )

    def report(
        self,
        args: Callable[[], dict[str, str]],
        table_row: Callable[[], dict[str, str]] | None = None,
        axis: dict[str, int] | None = None,
        **params: object,
    ) -> None:
        """Tell aiter.dispatch how the call is served; `args` describes the call's arguments and
        `table_row` gives the cells of a shapes-table row covering it (both built only when
        someone listens)."""
        dispatch.report(
            lambda: dispatch.DispatchRecord(
                OP,
                dispatch.BACKEND_FLYDSL,
                self.name,
                "heuristic",
                None,
                {
                    "block_m": self.block_m,
                    "rescale_threshold": self.rescale_threshold,
                    "num_kv_splits": self.num_kv_splits,
                    "interleave": self.interleave,
                    **params,
                },
                args=args(),
                table=FMHA_FP8.short_name,
                table_row=table_row() if table_row is not None else None,
                axis=axis or {},
            )
        )


def describe(choice: AttnChoice) -> str:
    runtime = f" splits={choice.num_kv_splits}" + (" interleave" if choice.interleave else "")
    return choice.name + runtime


def equivalent_choices(
    choice: AttnChoice, *, causal: bool, batch: int, max_seqlen_q: int, max_seqlen_k: int
) -> list[AttnChoice]:
    """Kernel sets that compute what `choice` computes, in the order a fallback tries them:
    the other query block; then exact rescaling (threshold 0) in place of lazy, with either
    block; then, for a split call, no split (batch interleaving then as `interleave` says),
    with each of those (`choice` itself left out).

    The query block only tiles the rows; the threshold only delays rescaling the running
    output (exact rescaling keeps P <= 1, always within fp8); a split adds the same
    exponentials in another order through the combine. The result is the same up to the order
    and scaling of the fp32 sums.
    """
    blocks = (choice.block_m, *(b for b in QUERY_BLOCKS if b != choice.block_m))
    thresholds = (choice.rescale_threshold, 0.0) if choice.rescale_threshold else (0.0,)
    splits = (choice.num_kv_splits, 1) if choice.num_kv_splits > 1 else (1,)
    variants = [
        dataclasses.replace(
            choice,
            block_m=block_m,
            rescale_threshold=threshold,
            num_kv_splits=split,
            interleave=interleave(causal, max_seqlen_q, max_seqlen_k, batch, split),
        )
        for split in splits
        for threshold in thresholds
        for block_m in blocks
    ]
    return [v for v in variants if v != choice]


def plan(
    *,
    mma: str,
    batch: int,
    num_heads: int,
    max_seqlen_q: int,
    max_seqlen_k: int,
    rows: int,
    head_dim: int,
    head_dim_v: int,
    causal: bool,
    cu_num: int,
    num_kv_splits: int | None = None,
) -> AttnChoice:
    """Every launcher choice for one call (the caller's num_kv_splits wins when given)."""
    splits = num_kv_splits or kv_splits(
        batch, num_heads, max_seqlen_q, max_seqlen_k, rows, head_dim_v, cu_num
    )
    return AttnChoice(
        mma=mma,
        block_m=query_block(max_seqlen_q),
        rescale_threshold=rescale_threshold(max_seqlen_k),
        num_kv_splits=splits,
        interleave=interleave(causal, max_seqlen_q, max_seqlen_k, batch, splits),
        head_dim=head_dim,
        head_dim_v=head_dim_v,
    )
