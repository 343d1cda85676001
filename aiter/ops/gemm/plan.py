"""What serves one GEMM call, for every GEMM family: how each family names its kernels, which
shapes its kernels can serve, and how it picks a tile and split-K for an untuned call (the
heuristic); then the plan: the tuned row (exact M, then M's bucket), torch or a FlyDSL kernel
chosen by the row or the heuristic, torch when no kernel of the family can serve the call.
Reports to aiter.dispatch.

Under AITER_AOT_FALLBACK=1 (see aiter.jit_monitor) `Plan.launch` serves a call whose kernel the
cache lacks with an equivalent kernel it holds (KernelFamily.equivalent_choices).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from aiter import device, dispatch, jit_monitor
from aiter.ops.gemm import table as gemm_table
from aiter.ops.gemm.kernels.a8w8 import (
    BLOCKSCALE_BLOCK,
    BLOCKSCALE_TILES,
    BPRESHUFFLE_K_MULTIPLE,
    BPRESHUFFLE_N_MULTIPLE,
    BPRESHUFFLE_TILES,
    blockscale_tile_problem,
    bpreshuffle_tile_problem,
    k_major_x_scale_problem,
)
from aiter.ops.gemm.kernels.a16w16 import K_MULTIPLE as A16W16_K_MULTIPLE
from aiter.ops.gemm.kernels.a16w16 import N_MULTIPLE as A16W16_N_MULTIPLE
from aiter.ops.gemm.kernels.a16w16 import SUPPORTED_TILES as A16W16_TILES
from aiter.ops.gemm.kernels.a16w16 import tile_problem as a16w16_tile_problem
from aiter.ops.gemm.kernels.mx import MX_K_MULTIPLE, MX_N_MULTIPLE, MX_TILES, mx_tile_problem
from aiter.ops.gemm.table import LIBTYPE_FLYDSL, LIBTYPE_TORCH
from aiter.ops.shared.gemm_index import REDUCE_BLOCK
from aiter.ops.shared.mainloop_index import OFFSET_LIMIT
from aiter.tuning import Row, TableError, TableSpec
from aiter.tuning.foreign import parse_aiter_flydsl_name

MAX_SPLIT_K = 8
MIN_K_TILES_PER_SPLIT = 4  # a split shorter than this costs more in reduction than it saves
# Bytes of K one k-tile row may span in the heuristic: 128 (bf16 tile_k 64, fp8 128) keeps the
# registers of big tiles low; decode shapes (tile_m <= SMALL_TILE_M) are memory-bound and take
# 256 (bf16 128, fp8 256) for more loads in flight per iteration, as FlyDSL's tuning guide says.
K_TILE_BYTES = 128
SMALL_TILE_M = 32
SMALL_M_K_TILE_BYTES = 256
SPLIT_KS = tuple(1 << i for i in range(MAX_SPLIT_K.bit_length()))  # 1, 2, 4, 8: what fallbacks try
# launch_gemm_a16w16 indexes out and its split-K workspace in 32 bits: M * N + 255 < 2**31.
A16W16_MAX_MN = 2**31 - REDUCE_BLOCK


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KernelChoice:
    family: KernelFamily
    mma: str
    tile: Any  # the family's tile type: tile_m, tile_n, tile_k
    split_k: int

    @property
    def name(self) -> str:
        return self.family.kernel_name(self.mma, self.tile)


@dataclass(frozen=True)
class KernelFamily:
    """Kernel names `<prefix>_<mma>_<tile_m>x<tile_n>x<tile_k>` over the tiles each flavour has,
    and the shapes the kernels serve (their launcher's contract)."""

    prefix: str
    tiles: Mapping[str, tuple[Any, ...]]  # MMA flavour -> supported tiles
    n_multiple: int = 1
    k_multiple: int = 1
    max_mn: int | None = None  # the largest M * N the kernels index; None: no limit
    # Why a tile the kernel is written for does not fit the arch (LDS, registers), or None.
    tile_problem: Callable[[Any, str], str | None] | None = None
    # Bytes of one input element (0.5 for fp4): a block's rows x K must fit 32-bit offsets, and
    # the heuristic's tile_k spans K_TILE_BYTES of a row.
    elem_bytes: float = 2
    # Why the launcher refuses an (M, K) its other operands' layout cannot index, or None.
    operand_problem: Callable[[int, int], str | None] | None = None

    def cannot_serve(self, m: int, n: int, k: int, mma: str) -> str | None:
        """Why no kernel of the family can serve an [M, K] x [N, K] call on an arch of `mma`
        kernels (e.g. "K % 32 != 0 (K=100)"), None when they can.

        Every tile and split-K of a flavour serves every shape the family serves (the tail of
        K is looped over, rows and columns past M and N are predicated off), so a tuned row's
        tile never narrows this. The dtypes are the entry's contract, the same for every backend.
        """
        if mma not in self.tiles:
            return f"{self.prefix} has no {mma} kernels (only {', '.join(self.tiles)})"
        if n < 1 or k < 1:
            return f"empty operands (N={n}, K={k})"
        if k % self.k_multiple:
            return f"K % {self.k_multiple} != 0 (K={k})"
        if n % self.n_multiple:
            return f"N % {self.n_multiple} != 0 (N={n})"
        if self.max_mn is not None and m * n > self.max_mn:
            return f"M * N = {m * n} is above {self.max_mn}, the kernels' 32-bit index limit"
        rows = max(max(t.tile_m, t.tile_n) for t in self.tiles[mma])
        if rows * k * self.elem_bytes >= OFFSET_LIMIT:
            return f"K = {k} is too long for the main loop's 32-bit buffer offsets over {rows} rows"
        if self.operand_problem is not None:
            return self.operand_problem(m, k)
        return None

    def kernel_name(self, mma: str, tile: Any) -> str:
        return f"{self.prefix}_{mma}_{tile.tile_m}x{tile.tile_n}x{tile.tile_k}"

    def example_names(self, mma: str) -> str:
        """Two real kernel names, of `mma` where the family has it, else of its first flavour."""
        if mma not in self.tiles:
            mma = next(iter(self.tiles))
        return ", ".join(self.kernel_name(mma, t) for t in self.tiles[mma][:2])

    def parse_kernel_name(self, name: str, mma: str) -> Any:
        """The tile a kernelName names; ValueError saying what a name looks like otherwise."""
        match = re.fullmatch(gemm_table.kernel_name_pattern(self.prefix), name.strip(), re.ASCII)
        if not match:
            raise ValueError(
                f"{name!r} is not a {self.prefix} kernel name: expected "
                f"{self.prefix}_<{'|'.join(self.tiles)}>_<tile_m>x<tile_n>x<tile_k>, "
                f"e.g. {self.example_names(mma)}"
            )
        if match["mma"] != mma:
            raise ValueError(
                f"{name!r} names a {match['mma']} kernel, but this arch uses {mma} kernels"
            )
        if mma not in self.tiles:
            raise ValueError(f"{name!r}: {self.prefix} has no {mma} kernels")
        tile_type = type(self.tiles[mma][0])
        tile = tile_type(int(match["m"]), int(match["n"]), int(match["k"]))
        if tile not in self.tiles[mma]:
            problem = self.tile_problem(tile, mma) if self.tile_problem else None
            if problem is not None:
                raise ValueError(f"{name!r}: the tile does not fit: it {problem}")
            supported = ", ".join(f"{t.tile_m}x{t.tile_n}x{t.tile_k}" for t in self.tiles[mma])
            raise ValueError(
                f"{name!r}: tile not supported by the {mma} kernel; supported: {supported}"
            )
        return tile

    def heuristic_tile(self, m: int, n: int, k: int, cu_num: int, mma: str) -> Any:
        """Tile for an untuned shape.

        tile_m: the smallest supported tile_m >= M (capped at the largest), so small-M decode
        shapes waste no rows. tile_n: the widest supported tile_n that still gives at least one
        block per CU, else the narrowest. tile_k: the largest supported tile_k dividing K whose
        rows span at most K_TILE_BYTES (SMALL_M_K_TILE_BYTES when tile_m <= SMALL_TILE_M), else
        the smallest of those.
        """
        tiles = self.tiles[mma]
        tile_ms = sorted({t.tile_m for t in tiles})
        tile_m = next((tm for tm in tile_ms if tm >= m), tile_ms[-1])
        tile_ns = sorted({t.tile_n for t in tiles if t.tile_m == tile_m})
        tile_n = tile_ns[0]
        for tn in reversed(tile_ns):
            if _ceil_div(m, tile_m) * _ceil_div(n, tn) >= cu_num:
                tile_n = tn
                break
        row_bytes = SMALL_M_K_TILE_BYTES if tile_m <= SMALL_TILE_M else K_TILE_BYTES
        fitting = {t.tile_k for t in tiles if t.tile_m == tile_m and t.tile_n == tile_n}
        tile_ks = sorted(
            {tk for tk in fitting if tk * self.elem_bytes <= row_bytes} or fitting, reverse=True
        )
        tile_k = next((tk for tk in tile_ks if k % tk == 0), tile_ks[-1])
        return type(tiles[0])(tile_m, tile_n, tile_k)

    @staticmethod
    def heuristic_split_k(m: int, n: int, k: int, cu_num: int, tile: Any) -> int:
        """Split K when the output has fewer blocks than the GPU has CUs.

        The largest power of two s <= MAX_SPLIT_K such that blocks * s <= cu_num and each split
        keeps at least MIN_K_TILES_PER_SPLIT k-tiles; 1 when the output alone fills the GPU.
        """
        blocks = _ceil_div(m, tile.tile_m) * _ceil_div(n, tile.tile_n)
        k_tiles = _ceil_div(k, tile.tile_k)
        split = 1
        while (
            split * 2 <= MAX_SPLIT_K
            and blocks * split * 2 <= cu_num
            and k_tiles // (split * 2) >= MIN_K_TILES_PER_SPLIT
        ):
            split *= 2
        return split

    def choose(
        self, m: int, n: int, k: int, cu_num: int, mma: str, tile: Any | None, split_k: int
    ) -> KernelChoice:
        """The kernel for one call: the row's tile and split-K where given, the heuristic else."""
        if tile is None:
            tile = self.heuristic_tile(m, n, k, cu_num, mma)
        if split_k <= 0:
            split_k = self.heuristic_split_k(m, n, k, cu_num, tile)
        return KernelChoice(self, mma, tile, split_k)

    def equivalent_choices(
        self, choice: KernelChoice, m: int, n: int, k: int, cu_num: int
    ) -> list[KernelChoice]:
        """Kernels that compute what `choice` computes, in the order a fallback tries them:
        `choice`'s tile with split_k 1, then with the other SPLIT_KS, then the heuristic's
        tile and split-K (`choice` itself left out).

        Every kernel of a family takes the same inputs and writes the same output for any tile
        and split_k (the launchers' contracts); the tile and split-K change only how the K sum
        is blocked and in which order its fp32 partial sums are added. So the result is the
        same product, equal to the planned kernel's up to that rounding, as between two rows.
        """
        variants = [KernelChoice(self, choice.mma, choice.tile, s) for s in SPLIT_KS]
        variants.append(self.choose(m, n, k, cu_num, choice.mma, None, 0))
        unique: list[KernelChoice] = []
        for variant in variants:
            if variant != choice and variant not in unique:
                unique.append(variant)
        return unique


A16W16 = KernelFamily(
    gemm_table.A16W16_KERNELS,
    A16W16_TILES,
    A16W16_N_MULTIPLE,
    A16W16_K_MULTIPLE,
    A16W16_MAX_MN,
    a16w16_tile_problem,
)
BPRESHUFFLE = KernelFamily(
    gemm_table.BPRESHUFFLE_KERNELS,
    BPRESHUFFLE_TILES,
    BPRESHUFFLE_N_MULTIPLE,
    BPRESHUFFLE_K_MULTIPLE,
    tile_problem=bpreshuffle_tile_problem,
    elem_bytes=1,
)
# The kernels need N and K multiples of the scale block, as the scales' shapes do already.
BLOCKSCALE = KernelFamily(
    gemm_table.BLOCKSCALE_KERNELS,
    BLOCKSCALE_TILES,
    BLOCKSCALE_BLOCK,
    BLOCKSCALE_BLOCK,
    tile_problem=blockscale_tile_problem,
    elem_bytes=1,
)

# The blockscale kernel over a preshuffled weight, with aiter's [K / 128, M] x scales.
BLOCKSCALE_BPRESHUFFLE = KernelFamily(
    gemm_table.BLOCKSCALE_BPRESHUFFLE_KERNELS,
    BLOCKSCALE_TILES,
    BLOCKSCALE_BLOCK,
    BLOCKSCALE_BLOCK,
    tile_problem=blockscale_tile_problem,
    elem_bytes=1,
    operand_problem=k_major_x_scale_problem,
)


# The microscaled GEMMs (gfx950; the entries refuse other archs before planning).
A4W4 = KernelFamily(
    gemm_table.A4W4_KERNELS,
    MX_TILES["fp4"],
    MX_N_MULTIPLE,
    MX_K_MULTIPLE["fp4"],
    tile_problem=lambda tile, mma: mx_tile_problem(tile, "fp4", mma),
    elem_bytes=0.5,
)
MXFP8 = KernelFamily(
    gemm_table.MXFP8_KERNELS,
    MX_TILES["fp8"],
    MX_N_MULTIPLE,
    MX_K_MULTIPLE["fp8"],
    tile_problem=lambda tile, mma: mx_tile_problem(tile, "fp8", mma),
    elem_bytes=1,
)


def _row_ref(row: Row | None) -> str | None:
    return f"{row.source}:{row.line}" if row is not None else None


def _row_error(row: Row, column: str, message: str) -> TableError:
    return TableError(
        f"{row.source}:{row.line}: column {column!r}: {message}",
        path=row.source,
        line=row.line,
        column=column,
    )


T = TypeVar("T")
Args = Callable[[], dict[str, str]]  # the call's arguments as dispatch records show them


@dataclass(frozen=True)
class GemmCall:
    """What a plan was made for: the table lookup key (arch and CU count included) and M."""

    key: tuple[tuple[str, object], ...]
    m: int
    n: int
    k: int
    cu_num: int


@dataclass(frozen=True)
class Plan:
    op: str
    row: Row | None  # the tuned row that served the call, None for an untuned shape
    choice: KernelChoice | None  # the FlyDSL kernel, None when torch serves
    table: str | None = None  # the short name of the table looked up
    call: GemmCall | None = None
    planned: KernelChoice | None = None  # set when a fallback replaced this choice
    # Why no FlyDSL kernel serves the call although the row or the heuristic would have chosen
    # one (KernelFamily.cannot_serve); None when FlyDSL serves or the row says torch.
    reason: str | None = None
    # For a row whose own kernel this library does not have (another backend's, or an aiter
    # FlyDSL kernel whose tile does not carry over): how the row's calls are served instead.
    served_as: str | None = None

    @property
    def use_torch(self) -> bool:
        return self.choice is None

    def report(self, args: Args | None = None) -> None:
        """Tell aiter.dispatch how the call is served; call it once inputs passed every check."""
        dispatch.report(lambda: self._record(args))

    def launch(self, launch: Callable[[KernelChoice], T], args: Args | None = None) -> T:
        """Report the call and launch its kernel: `launch(choice)` allocates and launches.

        With AITER_AOT_FALLBACK=1, when the cache lacks a kernel the plan's choice launches, the
        first equivalent choice whose kernels it holds is launched instead, and logged once;
        when none is cached, the plan's choice is launched and the JIT policy decides. A
        fallback never changes what the call computes: the tile and split-K block the K sum
        differently, nothing else (gemm_plan.KernelFamily.equivalent_choices).
        """
        fallback = jit_monitor.settings().fallback and self.call is not None
        served = self._cached_variant(launch) if fallback else self
        served.report(args)
        return launch(served.choice)

    def _cached_variant(self, launch: Callable[[KernelChoice], object]) -> Plan:
        call, planned = self.call, self.choice
        variants = planned.family.equivalent_choices(planned, call.m, call.n, call.k, call.cu_num)
        # The kernels a choice launches do not depend on M, the variants only through the
        # heuristic's: the answer holds for every call with this key and these variants.
        choice = jit_monitor.cached_equivalent(
            self.op, call.key, planned, variants, launch, _describe
        )
        if choice == planned:
            return self
        return dataclasses.replace(self, choice=choice, planned=planned)

    def _record(self, args: Args | None = None) -> dispatch.DispatchRecord:
        source = "table" if self.row is not None else "heuristic"
        described = args() if args is not None else {}
        if self.choice is None:
            return dispatch.DispatchRecord(
                self.op,
                dispatch.BACKEND_TORCH,
                None,
                source,
                _row_ref(self.row),
                {"reason": self.reason} if self.reason else {},
                args=described,
                table=self.table,
            )
        params: dict[str, object] = {"split_k": self.choice.split_k}
        if self.row is not None and self.row["libtype"] != LIBTYPE_FLYDSL:
            params["row_backend"] = self.row["libtype"]
        if self.served_as is not None:
            params["served_as"] = self.served_as
        if self.planned is not None:
            params["fallback_from"] = _describe(self.planned)
        return dispatch.DispatchRecord(
            self.op,
            dispatch.BACKEND_FLYDSL,
            self.choice.name,
            source,
            _row_ref(self.row),
            params,
            args=described,
            table=self.table,
            table_row=self._row_as_served() if self.row is None else None,
            axis={gemm_table.M_AXIS.name: self.call.m} if self.call is not None else {},
        )

    def _row_as_served(self) -> dict[str, str] | None:
        """The cells of a tuned row that would serve this untuned call as the heuristic did
        (what `capture suggest` prints)."""
        if self.call is None or self.choice is None:
            return None
        cells = {name: str(value) for name, value in self.call.key}
        cells.update(
            M=str(self.call.m),
            libtype=LIBTYPE_FLYDSL,
            splitK=str(self.choice.split_k),
            kernelId="0",
            us="",
            kernelName=self.choice.name,
        )
        return cells


def _describe(choice: KernelChoice) -> str:
    return f"{choice.name} split_k={choice.split_k}"


def plan(
    op: str,
    spec: TableSpec,
    family: KernelFamily,
    key: Mapping[str, object],
    m: int,
    n: int,
    k: int,
) -> Plan:
    """Look the call up in `spec`'s table and decide what serves it; nothing is reported yet.

    torch serves when the row says so, and when the row or the heuristic would choose FlyDSL but
    no kernel of `family` can serve the call (`family.cannot_serve`: the arch's MMA flavour has
    no kernels, or N, K or M * N break the kernels' limits); the Plan's reason then says why.
    A row of another backend is served by this library's choice (`_row_choice`). A row naming a
    kernel of this library that the arch does not have is a TableError naming its file and line.
    """
    arch, cu_num = device.arch(), device.cu_num()
    lookup = {"gfx": arch, "cu_num": cu_num, **key}
    row = spec.lookup(lookup, m)
    call = GemmCall(tuple(sorted(lookup.items())), m, n, k, cu_num)
    if row is not None and row["libtype"] == LIBTYPE_TORCH:
        return Plan(op, row, None, spec.short_name, call)
    mma = device.arch_info().mma
    tile, split_k, served_as = _row_choice(row, family, mma)
    reason = family.cannot_serve(m, n, k, mma)
    if reason is not None:
        return Plan(op, row, None, spec.short_name, call, reason=reason)
    choice = family.choose(m, n, k, cu_num, mma, tile, split_k)
    return Plan(op, row, choice, spec.short_name, call, served_as=served_as)


def _row_choice(
    row: Row | None, family: KernelFamily, mma: str
) -> tuple[Any | None, int, str | None]:
    """The tile and split-K a row asks for (None and 0: the heuristic's), and, for a row whose
    own kernel this library does not have, how its calls are served instead.

    A row of this library's kernels names its tile; a row of aiter's own FlyDSL kernels states a
    tile and split-K that carry over where the family has that tile; a row of another backend
    (asm, ck, triton, ...) names a kernel this library does not have: its shapes are served by
    the heuristic, as an untuned call would be, and the dispatch record says so.
    """
    if row is None:
        return None, 0, None
    name, backend = row["kernelName"], row["libtype"]
    if backend.split("_")[0] != LIBTYPE_FLYDSL:  # aiter's flydsl_mxfp8 rows are FlyDSL's too
        return None, 0, f"the row names aiter's {backend} kernel; this library's heuristic serves"
    if mma not in family.tiles:  # no flavour's names to check a name against
        return None, row.int("splitK"), None
    if not name or name.startswith(family.prefix + "_"):
        try:
            return family.parse_kernel_name(name, mma), row.int("splitK"), None
        except ValueError as err:
            raise _row_error(row, "kernelName", str(err)) from None
    stated = parse_aiter_flydsl_name(name)
    split_k = stated.split_k if stated.split_k is not None else row.int("splitK")
    tile = _carried_tile(family, mma, stated.tile)
    if tile is None:
        return (
            None,
            0,
            (
                f"aiter's FlyDSL kernel {name} ({stated.describe()}) has no {mma} tile of "
                f"{family.prefix} here; this library's heuristic serves"
            ),
        )
    return tile, split_k, f"aiter's FlyDSL kernel {name}, as {family.kernel_name(mma, tile)}"


def _carried_tile(family: KernelFamily, mma: str, stated: tuple[int, int, int] | None) -> Any:
    """The family's tile of `mma` with the stated tile_m x tile_n x tile_k, None if it has none."""
    if stated is None:
        return None
    return next(
        (t for t in family.tiles[mma] if (t.tile_m, t.tile_n, t.tile_k) == tuple(stated)), None
    )
