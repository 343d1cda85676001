"""Index math of the routing kernel (routing.py): grouped top-k over a token's expert scores,
one wave per token, shared by the kernel and the host's checks.

Lane l of a wave holds experts l * per .. l * per + per - 1 (per = E / wave size), so an expert
group (E / G consecutive experts) is a run of lanes_per_group consecutive lanes, and a group's
score is a butterfly over those lanes alone (xor offsets below lanes_per_group): every group at
once. Choosing groups and experts is `topk_group` and `topk` wave-wide arg-max butterflies, ties
going to the lower index (the group, the expert).
"""

from __future__ import annotations

WAVES_PER_BLOCK = 4  # tokens per block
MAX_PER_LANE = 16  # experts a lane holds (its registers grow with them)
MAX_TOPK = 16


def experts_per_lane(experts: int, wave_size: int) -> int:
    return experts // wave_size


def lanes_per_group(experts: int, groups: int, wave_size: int) -> int:
    return (experts // groups) // experts_per_lane(experts, wave_size)


def group_offsets(experts: int, groups: int, wave_size: int) -> list[int]:
    """xor offsets of a butterfly inside one group's lanes."""
    offsets, step = [], lanes_per_group(experts, groups, wave_size) // 2
    while step:
        offsets.append(step)
        step //= 2
    return offsets


def wave_offsets(wave_size: int) -> list[int]:
    offsets, step = [], wave_size // 2
    while step:
        offsets.append(step)
        step //= 2
    return offsets


def layout_problem(experts: int, groups: int, topk_group: int, topk: int, wave_size: int):
    """Why the kernel cannot route E experts in G groups (topk_group of them, topk experts) on
    a wave of wave_size lanes, or None."""
    if experts % wave_size or not 1 <= experts // wave_size <= MAX_PER_LANE:
        return (
            f"num_experts {experts} is not a multiple of the wave size {wave_size} up to "
            f"{MAX_PER_LANE * wave_size}"
        )
    if experts % groups:
        return f"num_experts {experts} is not a multiple of num_expert_group {groups}"
    per = experts_per_lane(experts, wave_size)
    group = experts // groups
    lanes = group // per if group % per == 0 else 0
    if lanes < 1 or lanes & (lanes - 1):
        return (
            f"a group of {group} experts is not a power-of-two run of lanes holding {per} "
            "experts each"
        )
    if not 1 <= topk_group <= groups:
        return f"topk_group {topk_group} is not in [1, num_expert_group = {groups}]"
    if not 1 <= topk <= min(MAX_TOPK, topk_group * group):
        return f"topk {topk} is not in [1, {min(MAX_TOPK, topk_group * group)}]"
    return None


def token_of(block, wave):
    """The token a wave routes."""
    return block * WAVES_PER_BLOCK + wave


def blocks_for(tokens: int) -> int:
    return -(-tokens // WAVES_PER_BLOCK)
