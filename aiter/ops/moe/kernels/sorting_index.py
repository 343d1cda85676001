"""Index arithmetic of the MoE sorting kernels, and the CPU reference of moe_sorting.

moe_sorting groups the routed (token, slot) entries of a top-k routing by expert: each local
expert's entries occupy a run of sorted slots padded to a multiple of the block size, and
every block of slots names the local expert that owns it.

The kernels are a stable counting sort in three launches:

1. count: the flat entries t * topk + k are cut into chunks of CHUNK; one block per chunk
   counts its entries per expert in an LDS histogram and writes the chunk's row of counts;
2. scan: one block, a thread per expert, turns each expert's column of chunk counts into
   exclusive prefixes (where the chunk's entries of that expert start inside its run), sums
   them, scans the padded totals across experts in LDS (each expert's first slot) and writes
   sorted_expert_ids, the sentinel padding and num_valid_ids;
3. scatter: one block per chunk again ranks each entry among the same expert's entries of
   the chunk and writes it at first slot + chunk prefix + rank.

Inside a chunk, wave w owns the contiguous entries [w * ROUNDS * W, (w + 1) * ROUNDS * W) (W
the wave size), ROUNDS rounds of one entry per lane. A round ranks its lanes by expert with
ballots (the lanes that share an expert: one ballot per bit of the expert id) and lane masks;
the lowest-ranked lanes of each group do not need to be singled out, since every lane of a
group writes the same new count. Each wave keeps its own row of counts in LDS, so no two
waves touch one word inside a phase and no atomics are needed: an entry's rank is the counts
of the waves before it, plus its wave's count before its round, plus its rank in the round.
That is flat order, so the result is deterministic and equals the serial definition.
"""

# Only +, -, *, //, %, &, |, <<, >> and comparisons appear in the index functions, so the same
# functions run on Python ints (CPU tests) and on FlyDSL Int32/Int64 values (inside the
# kernels). Operands are never negative, so floor and truncating division agree. `flag`
# arguments are 0 or 1 (ints, not booleans), which keeps choices arithmetic.

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Low bits of a sorted id hold the token, the bits above them the top-k slot.
TOKEN_BITS = 24
TOKEN_MASK = (1 << TOKEN_BITS) - 1
# Largest M and topk a sorted id (and the sentinel (topk << 24) | M) can hold in an int32.
MAX_TOKENS = TOKEN_MASK
MAX_TOPK = (1 << (31 - TOKEN_BITS)) - 1
# Block sizes must be positive multiples of this (16, 32 and 64 are the usual ones).
BLOCK_SIZE_MULTIPLE = 16
# Experts the kernels' LDS tables and the scan block hold; an expert id takes EXPERT_BITS.
MAX_EXPERTS = 512
EXPERT_BITS = 9
# Threads of a count or scatter block and the entries each lane takes per pass: a block's
# chunk of flat entries is THREADS * ROUNDS long on both wave sizes.
THREADS = 256
ROUNDS = 8
CHUNK = THREADS * ROUNDS
# The scan's one block: a thread per expert; chunk counts it loads per wait.
SCAN_THREADS = MAX_EXPERTS
SCAN_BATCH = 8
# Largest P whose byte offsets (4-byte elements) stay inside a buffer's 32-bit range.
MAX_SLOTS = 1 << 29


# --- sizes -------------------------------------------------------------------------------


def sorting_sizes(m, topk, num_experts, block_size):
    """(P sorted slots, number of blocks): P = M * topk + E * B - topk, blocks = ceil(P / B).

    P bounds the padded rows when each row of topk_ids names distinct experts (so topk <= E):
    the entries fill M * topk slots and each of at most E experts pads at most B - 1 more.
    """
    p = m * topk + num_experts * block_size - topk
    return p, (p + block_size - 1) // block_size


def num_chunks(m, topk):
    """Chunks of flat entries (and blocks of the count and scatter kernels): at least one."""
    return max(1, (m * topk + CHUNK - 1) // CHUNK)


def workspace_size(m, topk, num_experts):
    """int32 elements of the kernels' workspace: a row of E counts per chunk, then the E first
    slots."""
    return (num_chunks(m, topk) + 1) * num_experts


def count_slot(chunk, g, num_experts):
    """Workspace index of chunk `chunk`'s count of expert g (after the scan: where the chunk's
    entries of g start inside g's run)."""
    return chunk * num_experts + g


def first_slot_index(g, num_experts, chunks):
    """Workspace index of expert g's first sorted slot (P for a non-local expert, so its
    entries are stored nowhere)."""
    return chunks * num_experts + g


# --- sorted ids --------------------------------------------------------------------------


def pack_sorted_id(token, slot):
    """The sorted id of entry (token, slot): (slot << 24) | token."""
    return (slot << TOKEN_BITS) | token


def unpack_sorted_id(v):
    """(token, slot) of a sorted id."""
    return v & TOKEN_MASK, v >> TOKEN_BITS


def sentinel_id(m, topk):
    """The padding id (topk << 24) | M: a slot and a token that do not exist."""
    return pack_sorted_id(m, topk)


# --- routing -----------------------------------------------------------------------------


def local_token_count(m, num_local, below_m, negative):
    """T, the routed tokens: min(M, max(num_local, 0)).

    below_m is 1 if num_local < M else 0, negative 1 if num_local < 0 else 0 (the kernels
    make them with a select, the CPU emulation with int()).
    """
    return m - below_m * (m - num_local) - negative * num_local


def routed_entries(t, topk):
    """Flat entries t * topk + k with t < T: the count and fill loops run over [0, this)."""
    return t * topk


def entry_token_slot(i, topk):
    """(t, k) of flat entry i = t * topk + k of topk_ids [M, topk]."""
    return i // topk, i % topk


# --- padded runs and blocks --------------------------------------------------------------


def padded_count(count, block_size):
    """count rounded up to a multiple of the block size (0 stays 0)."""
    return (count + block_size - 1) // block_size * block_size


def run_padding(first, count, block_size):
    """Half-open range of slots the sentinel fills after a run of `count` entries at first."""
    return first + count, first + padded_count(count, block_size)


# --- the chunks: waves, rounds and lanes -------------------------------------------------


def waves_per_block(wave_size: int) -> int:
    return THREADS // wave_size


def chunk_entry(chunk, wave, rnd, lane, wave_size: int):
    """Flat entry a lane takes in round rnd: increasing in (wave, round, lane), so ranking
    in that order is flat order."""
    return chunk * CHUNK + (wave * ROUNDS + rnd) * wave_size + lane


def table_word(wave, g):
    """LDS word of wave w's count of expert g."""
    return wave * MAX_EXPERTS + g


def spare_word(tid, wave_size: int):
    """LDS word a thread whose entry is not routed reads and writes instead: its own."""
    return waves_per_block(wave_size) * MAX_EXPERTS + tid


def table_words(wave_size: int) -> int:
    """int32 words of a count or scatter block's LDS: the waves' rows, then a spare word per
    thread."""
    return waves_per_block(wave_size) * MAX_EXPERTS + THREADS


def experts_of_thread(tid):
    """Experts a count or scatter thread sums or prefixes across the waves' rows."""
    return [i * THREADS + tid for i in range(MAX_EXPERTS // THREADS)]


# --- the scan ----------------------------------------------------------------------------


def scan_steps():
    """Distances of the scan's Hillis-Steele steps over SCAN_THREADS values."""
    return [1 << i for i in range(EXPERT_BITS)]


def search_steps():
    """Steps of the search for the expert owning a block: largest g with first[g] <= slot."""
    return [1 << i for i in reversed(range(EXPERT_BITS))]


# --- bounds ------------------------------------------------------------------------------
# With distinct expert ids in each row of topk_ids the used slots never exceed P. A row that
# repeats an expert can need more; then stores past the outputs are dropped and
# num_valid_ids[0] is capped, so no kernel and no consumer touches memory past P.


def capped(value, cap, over):
    """min(value, cap), given over = 1 if value > cap else 0."""
    return value - over * (value - cap)


def valid_rows_cap(p, block_size):
    """Largest multiple of the block size that fits in P slots: num_valid_ids[0] never
    exceeds it."""
    return p // block_size * block_size


# --- CPU reference -----------------------------------------------------------------------


def moe_sorting_reference(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_experts: int,
    block_size: int,
    expert_mask: torch.Tensor | None = None,
    num_local_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """moe_sorting in plain torch on CPU: (sorted_ids [P], sorted_weights [P],
    sorted_expert_ids [num_blocks], num_valid_ids [2]).

    Local experts (expert_mask[g] != 0, or all with no mask) in increasing global id order
    each own a run of their entries (t, k), t < T = min(M, num_local_tokens[0]) (M when None;
    a negative count routes nothing; ids outside [0, E) are routed nowhere), in flat order
    t * topk + k, padded to a multiple of
    block_size with the sentinel (topk << 24) | M and weight 0. sorted_expert_ids holds the
    local expert index of each used block; num_valid_ids = [used slots, T]. The tail the
    kernels leave unwritten is filled here with the sentinel, 0.0 and -1. A routing whose rows
    repeat an expert may need more than P slots: what falls past P (past num_blocks) is
    dropped, as the kernels drop it, and num_valid_ids[0] is capped at P // B * B.
    """
    import torch

    ids = topk_ids.detach().to("cpu", torch.int64)
    weights = topk_weights.detach().to("cpu", torch.float32)
    if ids.dim() != 2:
        raise ValueError(f"topk_ids: expected a 2-d [M, topk] tensor, got {list(ids.shape)}")
    if tuple(weights.shape) != tuple(ids.shape):
        raise ValueError(
            f"topk_weights: expected shape {list(ids.shape)}, got {list(weights.shape)}"
        )
    m, topk = ids.shape
    e, b = int(num_experts), int(block_size)
    if e < 1 or b < 1:
        raise ValueError(f"num_experts and block_size must be >= 1, got {e} and {b}")
    p, num_blocks = sorting_sizes(m, topk, e, b)
    t = m
    if num_local_tokens is not None:
        t = max(0, min(m, int(torch.as_tensor(num_local_tokens).reshape(-1)[0])))
    if expert_mask is None:
        local = torch.ones(e, dtype=torch.bool)
    else:
        local = expert_mask.detach().to("cpu").reshape(-1) != 0
        if local.numel() != e:
            raise ValueError(f"expert_mask: expected {e} elements, got {local.numel()}")

    sentinel = sentinel_id(m, topk)
    flat_ids = ids[:t].reshape(-1)
    flat_weights = weights[:t].reshape(-1)
    tokens = torch.arange(t, dtype=torch.int64).repeat_interleave(topk)
    slots = torch.arange(topk, dtype=torch.int64).repeat(t)
    packed = (slots << TOKEN_BITS) | tokens

    # Buffers with room for any routing; cut to [P] and [num_blocks] at the end (only rows
    # that repeat an expert can use more than P slots).
    room = m * topk + e * b
    sorted_ids = torch.full((room,), sentinel, dtype=torch.int32)
    sorted_weights = torch.zeros(room, dtype=torch.float32)
    sorted_expert_ids = torch.full((max(num_blocks, room // b),), -1, dtype=torch.int32)
    offset = 0
    local_idx = 0
    for g in range(e):
        if not bool(local[g]):
            continue
        # nonzero() lists matches in increasing flat order.
        sel = (flat_ids == g).nonzero().reshape(-1)
        n = int(sel.numel())
        sorted_ids[offset : offset + n] = packed[sel].to(torch.int32)
        sorted_weights[offset : offset + n] = flat_weights[sel]
        padded = (n + b - 1) // b * b
        sorted_expert_ids[offset // b : (offset + padded) // b] = local_idx
        offset += padded
        local_idx += 1
    num_valid_ids = torch.tensor([min(offset, p // b * b), t], dtype=torch.int32)
    return (
        sorted_ids[:p].clone(),
        sorted_weights[:p].clone(),
        sorted_expert_ids[:num_blocks].clone(),
        num_valid_ids,
    )
