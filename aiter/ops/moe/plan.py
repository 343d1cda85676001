"""Which FlyDSL kernels serve one fused-MoE call: the tuned row (padded token count, then aiter's
fallback tiers), its kernel names, else the C++ planner's block size and K split; reports it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from aiter import device, dispatch
from aiter.ops.moe import host_planner as moe_host
from aiter.ops.moe import table as moe_table
from aiter.ops.shared.tiles import GemmTile
from aiter.tuning import Row, TableError

OP = "fused_moe"
# Untuned tiles: 64 output columns per work-group, and the K depth per main-loop iteration that
# a quantized (fp8, 64-wide k-blocks) or plain (bf16/fp16, 32-wide k-blocks) kernel prefers.
DEFAULT_TILE_N = 64
DEFAULT_TILE_K = {False: 64, True: 128}
DEFAULT_STAGE2_MODE = "atomic"  # "reduce" where the output dtype has no packed atomic add
KSPLITS = (1, 2, 4)  # the stage-1 K splits the C++ planner chooses from, and fallbacks try


@dataclass(frozen=True)
class MoeShape:
    """What the table keys on, besides the token count."""

    model_dim: int
    inter_dim: int
    experts: int  # global experts: the range of topk_ids
    topk: int
    activation: str  # "silu" | "swiglu"
    dtype: str  # str(torch dtype) of the activations
    q_dtype_a: str
    q_dtype_w: str
    quantized: bool
    doweight_stage1: bool

    def key(self, arch: str, cu_num: int) -> dict[str, object]:
        return {
            "gfx": arch,
            "cu_num": cu_num,
            "model_dim": self.model_dim,
            "inter_dim": self.inter_dim,
            "expert": self.experts,
            "topk": self.topk,
            "act_type": moe_table.ACTIVATION_CELLS[self.activation],
            "dtype": self.dtype,
            "q_dtype_a": self.q_dtype_a,
            "q_dtype_w": self.q_dtype_w,
            "q_type": moe_table.QUANT_PER_TOKEN if self.quantized else moe_table.QUANT_NONE,
            "use_g1u1": 1,
            "doweight_stage1": int(self.doweight_stage1),
        }


@dataclass(frozen=True)
class MoeChoice:
    mma: str
    block_m: int
    stage1_tile: GemmTile
    stage2_tile: GemmTile
    ksplit: int
    stage2_mode: str

    @property
    def stage1_name(self) -> str:
        t = self.stage1_tile
        return f"{moe_table.STAGE1_KERNELS}_{self.mma}_{t.tile_m}x{t.tile_n}x{t.tile_k}"

    @property
    def stage2_name(self) -> str:
        t = self.stage2_tile
        return (
            f"{moe_table.STAGE2_KERNELS}_{self.mma}_{t.tile_m}x{t.tile_n}x{t.tile_k}"
            f"_{self.stage2_mode}"
        )


@dataclass(frozen=True)
class MoePlan:
    tokens: int
    padded: int  # the token count the table was searched at
    row: Row | None
    choice: MoeChoice
    planned: MoeChoice | None = None  # set when a fallback replaced this choice
    shape: MoeShape | None = None  # what the table keys on, for the row a record suggests
    # For a row of aiter's own stage kernels (CK, asm): how its calls are served instead.
    served_as: str | None = None

    def report(self, args: Callable[[], dict[str, str]] | None = None) -> None:
        """Tell aiter.dispatch how the call is served; `args` describes the call's arguments."""
        dispatch.report(lambda: self._record(args))

    def _record(self, args: Callable[[], dict[str, str]] | None = None) -> dispatch.DispatchRecord:
        c = self.choice
        return dispatch.DispatchRecord(
            OP,
            dispatch.BACKEND_FLYDSL,
            f"{c.stage1_name}+{c.stage2_name}",
            "table" if self.row is not None else "heuristic",
            f"{self.row.source}:{self.row.line}" if self.row is not None else None,
            {
                "padded_tokens": self.padded,
                "block_m": c.block_m,
                "ksplit": c.ksplit,
                "stage2_mode": c.stage2_mode,
                **({"fallback_from": describe(self.planned)} if self.planned else {}),
                **({"row_backend": moe_table.backend_of(self.row)} if self.served_as else {}),
                **({"served_as": self.served_as} if self.served_as else {}),
            },
            args=args() if args is not None else {},
            table=moe_table.FMOE.short_name,
            table_row=self._row_as_served() if self.row is None else None,
            axis={moe_table.TOKENS_AXIS.name: self.tokens},
        )

    def _row_as_served(self) -> dict[str, str] | None:
        """The cells of a tuned row that would serve this untuned call as the planner did: at
        the padded token count the table is searched at (what `capture suggest` prints)."""
        if self.shape is None:
            return None
        c = self.choice
        cells = {n: str(v) for n, v in self.shape.key(device.arch(), device.cu_num()).items()}
        cells.update(
            token=str(self.padded),
            block_m=str(c.block_m),
            ksplit=str(c.ksplit),
            kernelName1=c.stage1_name,
            kernelName2=c.stage2_name,
            run_1stage="0",
        )
        return cells


def describe(choice: MoeChoice) -> str:
    return f"{choice.stage1_name}+{choice.stage2_name} ksplit={choice.ksplit}"


def atomic_problem(shape: MoeShape, mma: str) -> str | None:
    """Why stage 2 cannot run in "atomic" mode for `shape`'s output dtype (the activations')
    on the archs of `mma`, or None (see stages.PACKED_ATOMIC_DTYPES)."""
    from aiter.ops.moe.kernels.stages import atomic_mode_problem

    return atomic_mode_problem(mma, getattr(torch, shape.dtype.removeprefix("torch.")))


def stage2_modes(shape: MoeShape, mma: str) -> tuple[str, ...]:
    """The stage-2 modes that can serve `shape` on the archs of `mma`."""
    from aiter.ops.moe.kernels.stages import STAGE_MODES

    problem = atomic_problem(shape, mma)
    return tuple(m for m in STAGE_MODES if m != "atomic" or problem is None)


def default_stage2_mode(shape: MoeShape, mma: str) -> str:
    """DEFAULT_STAGE2_MODE, or "reduce" where it cannot serve `shape` (atomic_problem)."""
    modes = stage2_modes(shape, mma)
    return DEFAULT_STAGE2_MODE if DEFAULT_STAGE2_MODE in modes else "reduce"


def heuristic_choice(shape: MoeShape, tokens: int, cu_num: int, mma: str) -> MoeChoice:
    """The C++ planner's block size and K split, the default tiles and stage-2 mode."""
    block_m = moe_host.moe_block_m(tokens, shape.topk, shape.experts, shape.inter_dim, cu_num)
    ksplit = moe_host.moe_ksplit(
        tokens, shape.topk, shape.experts, shape.model_dim, shape.inter_dim, block_m, cu_num
    )
    default = GemmTile(block_m, DEFAULT_TILE_N, DEFAULT_TILE_K[shape.quantized])
    return MoeChoice(mma, block_m, default, default, ksplit, default_stage2_mode(shape, mma))


def equivalent_choices(
    choice: MoeChoice, shape: MoeShape, tokens: int, cu_num: int
) -> list[MoeChoice]:
    """Kernel sets that compute what `choice` computes, in the order a fallback tries them:
    `choice`'s tiles with each K split of KSPLITS in its stage-2 mode, then in the other mode
    (when it can serve `shape`: stage2_modes), then the planner's choice (`choice` itself left
    out).

    Stage 1's K split only blocks the model_dim sum (fp32 partials, the activation after);
    stage 2's modes add the same weighted rows, atomically into the output (each addition
    rounded to its dtype) or per slot in fp32 and then summed; the block size only groups the
    sorted rows. Inputs and outputs are the same for all of them, the result equal up to the
    order and rounding of those additions, as between two tuned rows.
    """
    others = (m for m in stage2_modes(shape, choice.mma) if m != choice.stage2_mode)
    modes = (choice.stage2_mode, *others)
    variants = [
        dataclasses.replace(choice, ksplit=ksplit, stage2_mode=mode)
        for mode in modes
        for ksplit in KSPLITS
    ]
    variants.append(heuristic_choice(shape, tokens, cu_num, choice.mma))
    unique: list[MoeChoice] = []
    for variant in variants:
        if variant != choice and variant not in unique:
            unique.append(variant)
    return unique


def tuned_row(key: Mapping[str, object], tokens: int) -> tuple[int, Row | None]:
    """(padded token count, the row serving it): the exact padded count first, then aiter's
    smaller tiers above 32768; rows this library serves nothing of (tagged flydsl_fallback,
    one-stage, kinds it has no kernel for) were set aside at load."""
    padded = moe_host.get_padded_M(tokens)
    table = moe_table.FMOE.load()
    for tier in moe_host.moe_padded_tiers(padded):
        row = table.lookup(key, tier)
        if row is not None and row.int("token") == tier:
            return padded, row
    return padded, None


def _row_error(row: Row, column: str, message: str) -> TableError:
    return TableError(
        f"{row.source}:{row.line}: column {column!r}: {message}",
        path=row.source,
        line=row.line,
        column=column,
    )


def parse_stage_name(
    name: str, stage: int, mma: str, tiles: Mapping[str, tuple[GemmTile, ...]]
) -> tuple[GemmTile, str | None]:
    """(tile, stage-2 mode) a kernel name holds; ValueError saying what a name looks like."""
    pattern = moe_table.STAGE1_PATTERN if stage == 1 else moe_table.STAGE2_PATTERN
    help_text = moe_table.STAGE1_HELP if stage == 1 else moe_table.STAGE2_HELP
    match = re.fullmatch(pattern, name.strip(), re.ASCII)
    if not match:
        raise ValueError(f"{name!r} is not a stage-{stage} MoE kernel name: expected {help_text}")
    if match["mma"] != mma:
        raise ValueError(f"{name!r} names a {match['mma']} kernel, but this arch uses {mma}")
    tile = GemmTile(int(match["m"]), int(match["n"]), int(match["k"]))
    if tile not in tiles.get(mma, ()):
        supported = ", ".join(f"{t.tile_m}x{t.tile_n}x{t.tile_k}" for t in tiles.get(mma, ()))
        raise ValueError(
            f"{name!r}: tile not supported by the {mma} kernel; supported: {supported}"
        )
    return tile, match.groupdict().get("mode")


def plan(shape: MoeShape, tokens: int) -> MoePlan:
    """What serves `tokens` tokens of `shape` on the current device; nothing is reported yet.

    Raises NotImplementedError when the device's MMA flavour has no MoE kernels, TableError
    naming the row when its choices contradict each other or the kernels (a stage-2 kernel in
    "atomic" mode where the output dtype has no packed atomic add among them). Without a row's
    stage-2 kernel the mode is default_stage2_mode's.
    """
    from aiter.ops.moe.kernels.stages import STAGE_TILES

    arch, cu_num = device.arch(), device.cu_num()
    mma = device.arch_info().mma
    if mma not in STAGE_TILES:
        raise NotImplementedError(
            f"{OP} has no FlyDSL kernels for {arch} ({mma}); they exist for "
            f"{', '.join(STAGE_TILES)}"
        )
    padded, row = tuned_row(shape.key(arch, cu_num), tokens)
    served_as = None
    if row is not None and not moe_table.names_our_kernels(row):
        # aiter's CK or asm stage kernels: their block_m and ksplit are theirs, not ours.
        names = "+".join(row[c] for c in ("kernelName1", "kernelName2") if row[c])
        served_as = f"the row names aiter's {names}; this library's planner serves"
    ours = row is not None and served_as is None
    block_m = row.int("block_m") if ours else 0
    ksplit = row.int("ksplit") if ours else 0
    tile1 = tile2 = None
    mode = default_stage2_mode(shape, mma)
    if ours:
        for stage, column in ((1, "kernelName1"), (2, "kernelName2")):
            if not row[column]:
                continue
            try:
                tile, stage_mode = parse_stage_name(row[column], stage, mma, STAGE_TILES)
            except ValueError as err:
                raise _row_error(row, column, str(err)) from None
            if block_m and tile.tile_m != block_m:
                raise _row_error(
                    row, column, f"tile_m {tile.tile_m} differs from the row's block_m {block_m}"
                )
            if stage_mode == "atomic" and (problem := atomic_problem(shape, mma)) is not None:
                raise _row_error(row, column, f"{row[column]!r}: {problem}")
            block_m = tile.tile_m
            if stage == 1:
                tile1 = tile
            else:
                tile2, mode = tile, stage_mode
    if not block_m:
        block_m = moe_host.moe_block_m(tokens, shape.topk, shape.experts, shape.inter_dim, cu_num)
    if not ksplit:
        ksplit = moe_host.moe_ksplit(
            tokens, shape.topk, shape.experts, shape.model_dim, shape.inter_dim, block_m, cu_num
        )
    default = GemmTile(block_m, DEFAULT_TILE_N, DEFAULT_TILE_K[shape.quantized])
    choice = MoeChoice(mma, block_m, tile1 or default, tile2 or default, ksplit, mode)
    return MoePlan(tokens, padded, row, choice, shape=shape, served_as=served_as)
