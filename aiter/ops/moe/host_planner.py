"""The fused-MoE host planner for Python callers: table bucket, sorting sizes, block_m, K split.
Each function calls its torch.ops.aiter op from csrc/moe_plan.cpp, the one implementation.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

try:
    import aiter._moe_host  # noqa: F401  (registers torch.ops.aiter.*)
except ImportError as error:
    raise ImportError(
        f"aiter's C++ extension aiter._moe_host (csrc/) is not built or does not load ({error}); "
        "reinstall aiter with `pip install --no-build-isolation -e .`"
    ) from error

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _call(op: str, **args: object) -> Any:
    """torch.ops.aiter.<op> on `args` (ints, in schema order); its argument errors as ValueError."""
    values = []
    for name, value in args.items():
        if isinstance(value, bool):
            raise TypeError(f"{op}: {name} must be an int, got bool")
        try:
            value = operator.index(value)
        except TypeError:
            raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__}") from None
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"{op}: {name} must fit in int64, got {value}")
        values.append(value)
    try:
        # Ints in, ints out: no tensor subclass or dispatch mode has anything to do with these
        # ops, and under a fake mode (the AOT dry run) its Python dispatch would cost 5x the op.
        with torch._C._DisableTorchDispatch():
            return getattr(torch.ops.aiter, op)(*values)
    except RuntimeError as error:  # a TORCH_CHECK: "<op>: <argument> must ..., got ..."
        raise ValueError(str(error)) from None


def get_padded_M(tokens: int) -> int:
    """The token count a tuned-table lookup uses (C++: aiter::get_padded_M, the one implementation).

    tokens >= 1. Below 32768: the smallest power of two >= tokens (1->1, 3->4, 16385->32768).
    Else the tier at or below it: [32768, 65536) -> 32768, [65536, 131072) -> 65536,
    >= 131072 -> 131072.
    """
    return _call("get_padded_M", tokens=tokens)


def moe_padded_tiers(padded: int) -> list[int]:
    """The lookup order for a padded count (C++: aiter::moe_padded_tiers, the one implementation).

    [padded], then the smaller tiers at or above 32768 in decreasing order: 131072 ->
    [131072, 65536, 32768], 65536 -> [65536, 32768], padded <= 32768 -> [padded]. padded is a
    value get_padded_M returns (a power of two in [1, 131072]).
    """
    return list(_call("moe_padded_tiers", padded=padded))


def moe_sorting_sizes(tokens: int, topk: int, num_experts: int, block_size: int) -> tuple[int, int]:
    """(P, num_blocks) of the token sorting (C++: aiter::moe_sorting_sizes, the one implementation).

    P = tokens * topk + num_experts * block_size - topk (sorted slots, an upper bound for any
    routing); num_blocks = ceil(P / block_size). All arguments >= 1; topk <= num_experts.
    """
    slots, num_blocks = _call(
        "moe_sorting_sizes",
        tokens=tokens,
        topk=topk,
        num_experts=num_experts,
        block_size=block_size,
    )
    return slots, num_blocks


def moe_block_m(tokens: int, topk: int, num_experts: int, inter_dim: int, cu_num: int) -> int:
    """The untuned block size, tile_m of both stages (C++: aiter::moe_block_m, the one
    implementation).

    r = ceil(tokens * topk / num_experts); block_m = 16 if r <= 16, 32 if r <= 64, else 64; then
    while block_m > 16 and blocks(block_m) < cu_num, halve block_m, where
    blocks(b) = num_experts * ceil(r / b) * ceil(inter_dim / 64). All arguments >= 1;
    topk <= num_experts.
    """
    return _call(
        "moe_block_m",
        tokens=tokens,
        topk=topk,
        num_experts=num_experts,
        inter_dim=inter_dim,
        cu_num=cu_num,
    )


def moe_ksplit(
    tokens: int,
    topk: int,
    num_experts: int,
    model_dim: int,
    inter_dim: int,
    block_m: int,
    cu_num: int,
) -> int:
    """The untuned stage-1 K split, K = model_dim (C++: aiter::moe_ksplit, the one implementation).

    blocks = ceil(tokens * topk / block_m) * ceil(inter_dim / 64); the largest s in {1, 2, 4}
    with blocks * s <= cu_num, model_dim % (s * 256) == 0 and model_dim / s >= 1024; 1 if none.
    All arguments >= 1; topk <= num_experts.
    """
    return _call(
        "moe_ksplit",
        tokens=tokens,
        topk=topk,
        num_experts=num_experts,
        model_dim=model_dim,
        inter_dim=inter_dim,
        block_m=block_m,
        cu_num=cu_num,
    )
