"""Which kernel serves one conv3d call: the exact tuned row, else a row of the same layer whose
output positions are within 4x (its tile is borrowed), else the heuristic; torch where the row
says so or the chosen kernel cannot serve the call (`cannot_serve`); reports the choice.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiter import device, dispatch
from aiter.ops.conv3d import table as conv3d_table
from aiter.ops.conv3d.table import BORROW_RATIO, CONV3D, LAYER_COLUMNS
from aiter.tuning import Row, TableError, TunedTable

OP = "conv3d"
MAX_SPLIT_K = 8
SPLIT_KS = tuple(1 << i for i in range(MAX_SPLIT_K.bit_length()))  # 1, 2, 4, 8: what fallbacks try
MIN_STEPS_PER_SPLIT = 4  # a split shorter than this costs more in its epilogue than it saves
TILE_N_LADDER = (32, 64, 128)  # by output channels per group
# (output positions at or above which, tile_m), largest first.
TILE_M_LADDER = ((32768, 128), (2048, 64), (0, 32))
DEFAULT_WAVES = (2, 2)
# (M tiles at or above which, wgm), largest first: group M tiles so neighbours share weights.
WGM_LADDER = ((64, 8), (16, 4), (4, 2), (0, 1))
EXACT, BORROWED, HEURISTIC = "exact", "borrowed", "heuristic"
INDEX_LIMIT = 2**31  # launch_conv3d indexes in 32 bits
MAX_GRID_ROWS = 65535  # launch_conv3d: groups * split_k work-group rows (the grid's y)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _flag(text: str) -> int:
    return 1 if text.strip().lower() in ("1", "true", "1.0") else 0


def _layer_of_row(row: Row) -> tuple:
    return tuple(
        row[name] if name == "gfx" else _flag(row[name]) if name == "bias" else row.int(name)
        for name in LAYER_COLUMNS
    )


def layer_key(geometry: Any, has_bias: bool, arch: str, cu_num: int) -> tuple:
    """The layer a call belongs to, in LAYER_COLUMNS order."""
    g = geometry
    values = {
        "gfx": arch, "cu_num": cu_num, "C": g.c, "K": g.k, "kT": g.kt, "kH": g.kh, "kW": g.kw,
        "stride_d": g.stride[0], "stride_h": g.stride[1], "stride_w": g.stride[2],
        "pad_d": g.padding[0], "pad_h": g.padding[1], "pad_w": g.padding[2],
        "dil_d": g.dilation[0], "dil_h": g.dilation[1], "dil_w": g.dilation[2],
        "groups": g.groups, "bias": int(has_bias),
    }  # fmt: skip
    return tuple(values[name] for name in LAYER_COLUMNS)


def row_geometry(row: Row) -> Any:
    """The conv a row describes (batch, frames and size included)."""
    from aiter.ops.conv3d.kernels.implicit_gemm import Conv3dGeometry

    return Conv3dGeometry(
        n=row.int("N"), c=row.int("C"), d=row.int("D"), h=row.int("H"), w=row.int("W"),
        k=row.int("K"), kt=row.int("kT"), kh=row.int("kH"), kw=row.int("kW"),
        stride=(row.int("stride_d"), row.int("stride_h"), row.int("stride_w")),
        padding=(row.int("pad_d"), row.int("pad_h"), row.int("pad_w")),
        dilation=(row.int("dil_d"), row.int("dil_h"), row.int("dil_w")),
        groups=row.int("groups"),
    )  # fmt: skip


@functools.lru_cache(maxsize=8)
def _layers(table: TunedTable) -> dict[tuple, list[tuple[Row, tuple[int, ...], int]]]:
    """Rows by layer, each with its (N, D, H, W) and output positions."""
    layers: dict[tuple, list[tuple[Row, tuple[int, ...], int]]] = {}
    for row in table.rows:
        volume = tuple(row.int(n) for n in conv3d_table.VOLUME_COLUMNS)
        try:
            positions = row_geometry(row).positions
        except ValueError as err:
            raise TableError(
                f"{row.source}:{row.line}: not a valid conv3d: {err}", path=row.source,
                line=row.line,
            ) from None  # fmt: skip
        layers.setdefault(_layer_of_row(row), []).append((row, volume, positions))
    return layers


def find_row(geometry: Any, has_bias: bool, arch: str, cu_num: int) -> tuple[Row | None, str]:
    """(row, EXACT | BORROWED) or (None, HEURISTIC): the exact shape first, else the row of the
    same layer whose output positions are nearest (by ratio) and within BORROW_RATIO; on a tie
    the row with fewer positions, then the earlier row. Torch rows serve only their shape."""
    g = geometry
    candidates = _layers(CONV3D.load()).get(layer_key(g, has_bias, arch, cu_num), [])
    volume = (g.n, g.d, g.h, g.w)
    for row, row_volume, _ in candidates:
        if row_volume == volume:
            return row, EXACT
    best = None
    for index, (row, _, positions) in enumerate(candidates):
        if row["libtype"] == conv3d_table.LIBTYPE_TORCH:
            continue  # a torch row serves its own shape only: it has no tile to lend
        ratio = max(positions, g.positions) / min(positions, g.positions)
        if ratio <= BORROW_RATIO:
            rank = (abs(math.log(positions / g.positions)), positions, index)
            if best is None or rank < best[0]:
                best = (rank, row)
    return (best[1], BORROWED) if best else (None, HEURISTIC)


@dataclass(frozen=True)
class ConvChoice:
    mma: str
    tile: Any  # the kernel module's ConvTile
    split_k: int

    @property
    def name(self) -> str:
        t = self.tile
        return (
            f"{conv3d_table.KERNELS}_{self.mma}_{t.tile_m}x{t.tile_n}"
            f"_w{t.wave_m}x{t.wave_n}_g{t.wgm}"
        )


@dataclass(frozen=True)
class ConvPlan:
    row: Row | None
    match: str  # EXACT, BORROWED or HEURISTIC
    choice: ConvChoice | None  # None: torch serves
    planned: ConvChoice | None = None  # set when a fallback replaced this choice
    # Why the kernel the row or the heuristic chose cannot serve the call (`cannot_serve`);
    # None when FlyDSL serves or the row says torch.
    reason: str | None = None
    frames: int = 0  # the call's D, on the axis a build replays
    geometry: Any = None  # the call's conv and bias, for the row a record suggests
    has_bias: bool = False

    @property
    def use_torch(self) -> bool:
        return self.choice is None

    def report(self, args: Callable[[], dict[str, str]] | None = None, **params: object) -> None:
        """Tell aiter.dispatch how the call is served; `args` describes the call's arguments."""
        dispatch.report(lambda: self._record(params, args))

    def _record(
        self, params: dict[str, object], args: Callable[[], dict[str, str]] | None = None
    ) -> dispatch.DispatchRecord:
        row = f"{self.row.source}:{self.row.line}" if self.row is not None else None
        source = "table" if self.row is not None else "heuristic"
        described = args() if args is not None else {}
        if self.choice is None:
            return dispatch.DispatchRecord(
                OP,
                dispatch.BACKEND_TORCH,
                None,
                source,
                row,
                {"reason": self.reason} if self.reason else {},
                args=described,
                table=CONV3D.short_name,
            )
        return dispatch.DispatchRecord(
            OP,
            dispatch.BACKEND_FLYDSL,
            self.choice.name,
            source,
            row,
            {"match": self.match, "split_k": self.choice.split_k, **self._fallback(), **params},
            args=described,
            table=CONV3D.short_name,
            table_row=self._row_as_served() if self.row is None else None,
            axis={CONV3D.axis.name: self.frames} if self.frames else {},
        )

    def _row_as_served(self) -> dict[str, str] | None:
        """The cells of a tuned row of this call's exact shape that would serve it with the
        heuristic's tile and split-K (what `capture suggest` prints)."""
        if self.geometry is None or self.choice is None:
            return None
        g, t = self.geometry, self.choice.tile
        arch, cu_num = device.arch(), device.cu_num()
        layer = layer_key(g, self.has_bias, arch, cu_num)
        cells = {n: str(v) for n, v in zip(conv3d_table.LAYER_COLUMNS, layer, strict=True)}
        cells.update(
            N=str(g.n), D=str(g.d), H=str(g.h), W=str(g.w),
            tile_m=str(t.tile_m), tile_n=str(t.tile_n), wave_m=str(t.wave_m),
            wave_n=str(t.wave_n), wgm=str(t.wgm), splitK=str(self.choice.split_k),
            kernelName=self.choice.name, libtype=conv3d_table.LIBTYPE_FLYDSL,
        )  # fmt: skip
        return cells

    def _fallback(self) -> dict[str, str]:
        return {"fallback_from": describe(self.planned)} if self.planned is not None else {}


def describe(choice: ConvChoice) -> str:
    return f"{choice.name} split_k={choice.split_k}"


def equivalent_choices(choice: ConvChoice, geometry: Any, cu_num: int) -> list[ConvChoice]:
    """Kernels that compute what `choice` computes, in the order a fallback tries them:
    `choice`'s tile with split_k 1, then with the other SPLIT_KS, then the heuristic's tile and
    split-K (`choice` itself left out).

    Every tile and split-K reads the same padded input and packed weight and writes the same
    output (launch_conv3d's contract); they change only how the reduction over C * kT * kH * kW
    is blocked and in which order its fp32 partial sums are added.
    """
    variants = [ConvChoice(choice.mma, choice.tile, s) for s in SPLIT_KS]
    tile = heuristic_tile(geometry, choice.mma)
    variants.append(ConvChoice(choice.mma, tile, heuristic_split_k(geometry, tile, cu_num)))
    unique: list[ConvChoice] = []
    for variant in variants:
        fits = cannot_serve(geometry, variant.mma, variant) is None
        if fits and variant != choice and variant not in unique:
            unique.append(variant)
    return unique


def cannot_serve(geometry: Any, mma: str, choice: ConvChoice | None = None) -> str | None:
    """Why the implicit-GEMM kernel cannot serve the call on an arch of `mma` kernels (with
    `choice`'s tile and split-K, when given), None when it can: launch_conv3d's limits, so a
    kernel that would refuse the call is never chosen and torch serves it instead."""
    from aiter.ops.conv3d.kernels.implicit_gemm import SUPPORTED_TILES
    from aiter.ops.conv3d.kernels.implicit_gemm_index import (
        ELEMENTWISE_BLOCK,
        input_span_frames,
        tile_counts,
    )
    from aiter.ops.shared.mainloop_index import OFFSET_LIMIT

    g = geometry
    if mma not in SUPPORTED_TILES:
        return f"no {mma} conv3d kernels (only {', '.join(SUPPORTED_TILES)})"
    volume = g.n * g.d * g.h * g.w
    if volume >= INDEX_LIMIT:
        return f"N * D * H * W = {volume} is too large for the kernel's 32-bit indices"
    if g.positions >= INDEX_LIMIT:
        return f"M = {g.positions} output positions are too many for the kernel's 32-bit indices"
    if g.groups > MAX_GRID_ROWS:
        return f"groups = {g.groups} exceeds the kernel's {MAX_GRID_ROWS} grid rows"
    if choice is None:
        return None
    tile, split_k = choice.tile, choice.split_k
    m_tiles, n_tiles = tile_counts(g.positions, g.kg, tile.tile_m, tile.tile_n)
    if m_tiles * n_tiles >= INDEX_LIMIT:
        return f"{m_tiles} x {n_tiles} tiles of {choice.name} are too many for 32-bit indices"
    if g.groups * split_k > MAX_GRID_ROWS:
        return (
            f"groups * split_k = {g.groups * split_k} exceeds the kernel's {MAX_GRID_ROWS} "
            "grid rows"
        )
    if split_k > 1 and g.positions * g.k + ELEMENTWISE_BLOCK > INDEX_LIMIT:
        return (
            f"M * K = {g.positions * g.k} is too large for the split-K epilogue's 32-bit "
            f"indices (split_k={split_k})"
        )
    # The main loop's 32-bit buffer offsets (2-byte inputs): the input frames one block reads,
    # and one group's packed weight rows.
    frames = input_span_frames(tile.tile_m, g.n, g.d, g.out_d, g.out_h, g.out_w, g.kt,
                               g.stride[0], g.dilation[0])  # fmt: skip
    span = frames * g.h * g.w * g.padded_c * 2
    if span >= OFFSET_LIMIT:
        return f"one {choice.name} block's input frames span {span} bytes, over 32-bit offsets"
    if g.kg * g.reduction * 2 >= OFFSET_LIMIT:
        return f"one group's packed weight, {g.kg * g.reduction * 2} bytes, is over 32-bit offsets"
    return None


def _ladder(value: int, ladder: tuple[tuple[int, int], ...]) -> int:
    return next(choice for threshold, choice in ladder if value >= threshold)


def heuristic_tile(geometry: Any, mma: str) -> Any:
    """tile_n: the smallest of 32, 64, 128 holding a group's output channels (128 above);
    tile_m: 128 from 32768 output positions, 64 from 2048, else 32; waves 2x2; wgm by the
    number of M tiles: 8 from 64, 4 from 16, 2 from 4, else 1."""
    from aiter.ops.conv3d.kernels.implicit_gemm import SUPPORTED_TILES, ConvTile

    tile_n = next((t for t in TILE_N_LADDER if t >= geometry.kg), TILE_N_LADDER[-1])
    tile_m = _ladder(geometry.positions, TILE_M_LADDER)
    wgm = _ladder(_ceil_div(geometry.positions, tile_m), WGM_LADDER)
    tile = ConvTile(tile_m, tile_n, *DEFAULT_WAVES, wgm)
    if tile not in SUPPORTED_TILES[mma]:
        raise ValueError(f"heuristic tile {tile} is not a supported {mma} tile")
    return tile


def heuristic_split_k(geometry: Any, tile: Any, cu_num: int) -> int:
    """Split the reduction when the output has fewer work-groups than the GPU has CUs: the
    largest power of two s <= 8 with work-groups * s <= cu_num and at least 4 reduction steps
    per split; 1 when the output alone fills the GPU. Work-groups follow the output positions,
    so the split changes with the frame count."""
    from aiter.ops.conv3d.kernels.implicit_gemm import K_STEP

    groups = _ceil_div(geometry.positions, tile.tile_m) * _ceil_div(geometry.kg, tile.tile_n)
    groups *= geometry.groups
    steps = _ceil_div(geometry.reduction, K_STEP)
    split = 1
    while (
        split * 2 <= MAX_SPLIT_K
        and groups * split * 2 <= cu_num
        and steps // (split * 2) >= MIN_STEPS_PER_SPLIT
    ):
        split *= 2
    return split


def _row_error(row: Row, column: str, message: str) -> TableError:
    return TableError(
        f"{row.source}:{row.line}: column {column!r}: {message}",
        path=row.source,
        line=row.line,
        column=column,
    )


def row_tile(row: Row, mma: str) -> Any | None:
    """The tile a row names (its tile columns, and kernelName agreeing with them), or None when
    the row leaves the tile to the heuristic (tile columns 0 and no name)."""
    from aiter.ops.conv3d.kernels.implicit_gemm import SUPPORTED_TILES, ConvTile

    fields = ("tile_m", "tile_n", "wave_m", "wave_n", "wgm")
    values = tuple(row.int(name) for name in fields)
    name = row["kernelName"]
    if name:
        match = re.fullmatch(conv3d_table.KERNEL_PATTERN, name, re.ASCII)
        if match["mma"] != mma:
            raise _row_error(
                row, "kernelName", f"{name!r} names a {match['mma']} kernel; this arch uses {mma}"
            )
        named = tuple(int(match[g]) for g in ("m", "n", "wm", "wn", "wgm"))
        if any(values) and values != named:
            raise _row_error(
                row, "kernelName", f"{name!r} disagrees with the row's tile columns {values}"
            )
        values = named
    if not any(values):
        return None
    if not all(values):
        raise _row_error(row, "tile_m", f"tile columns must be all set or all 0, got {values}")
    tile = ConvTile(*values)
    if tile not in SUPPORTED_TILES[mma]:
        raise _row_error(row, "tile_m", f"tile {values} is not a supported {mma} conv3d tile")
    return tile


def row_choice(row: Row, mma: str, cu_num: int) -> ConvChoice:
    """The kernel a row serves every call it serves with, its own shape's and those it lends to:
    its tile and split-K, the heuristic's at the row's own shape where it leaves them 0. So the
    kernels a row serves never depend on the call's size."""
    geometry = row_geometry(row)
    tile = row_tile(row, mma) or heuristic_tile(geometry, mma)
    split_k = row.int("splitK")
    if split_k <= 0:
        split_k = heuristic_split_k(geometry, tile, cu_num)
    return ConvChoice(mma, tile, split_k)


def plan(geometry: Any, has_bias: bool) -> ConvPlan:
    """What serves the call on the current device; nothing is reported yet. torch serves where
    the row says so, and where the kernel the row or the heuristic chose cannot serve the call
    (`cannot_serve`: the plan's reason says why); a bad row is still a TableError."""
    from aiter.ops.conv3d.kernels.implicit_gemm import SUPPORTED_TILES

    arch, cu_num = device.arch(), device.cu_num()
    row, match = find_row(geometry, has_bias, arch, cu_num)
    if row is not None and row["libtype"] == conv3d_table.LIBTYPE_TORCH:
        return ConvPlan(row, match, None, frames=geometry.d)
    mma = device.arch_info().mma
    choice = None
    if mma in SUPPORTED_TILES:  # else no names to check a row's against: cannot_serve says why
        choice = row_choice(row, mma, cu_num) if row is not None else None
        if choice is None:
            tile = heuristic_tile(geometry, mma)
            choice = ConvChoice(mma, tile, heuristic_split_k(geometry, tile, cu_num))
    reason = cannot_serve(geometry, mma, choice)
    if reason is not None:
        return ConvPlan(row, match, None, reason=reason, frames=geometry.d)
    return ConvPlan(row, match, choice, frames=geometry.d, geometry=geometry, has_bias=has_bias)
