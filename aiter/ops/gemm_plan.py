"""What serves one GEMM call: the tuned row (exact M, then M's bucket), then torch or a FlyDSL
kernel chosen by the row or the heuristic. Shared by every GEMM family; reports to aiter.dispatch.

Under AITER_AOT_FALLBACK=1 (see aiter.jit_monitor) `Plan.launch` serves a call whose kernel the
cache lacks with an equivalent kernel it holds (gemm_config.KernelFamily.equivalent_choices).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from aiter import device, dispatch, jit_monitor
from aiter.ops.gemm_config import KernelChoice, KernelFamily
from aiter.ops.gemm_tables import LIBTYPE_FLYDSL, LIBTYPE_TORCH
from aiter.tuning import Row, TableError, TableSpec


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
    choice: KernelChoice | None  # the FlyDSL kernel, None when the row says torch
    table: str | None = None  # the short name of the table looked up
    call: GemmCall | None = None
    planned: KernelChoice | None = None  # set when a fallback replaced this choice

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
        differently, nothing else (gemm_config.KernelFamily.equivalent_choices).
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
                args=described,
                table=self.table,
            )
        params: dict[str, object] = {"split_k": self.choice.split_k}
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
        )


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

    Raises NotImplementedError when FlyDSL would serve the call but `family` has no kernel for
    the device's MMA flavour.
    """
    arch, cu_num = device.arch(), device.cu_num()
    lookup = {"gfx": arch, "cu_num": cu_num, **key}
    row = spec.lookup(lookup, m)
    call = GemmCall(tuple(sorted(lookup.items())), m, n, k, cu_num)
    if row is not None and row["libtype"] == LIBTYPE_TORCH:
        return Plan(op, row, None, spec.short_name, call)
    if row is not None and row["libtype"] != LIBTYPE_FLYDSL:
        raise _row_error(
            row,
            "libtype",
            f"expected {LIBTYPE_FLYDSL!r} or {LIBTYPE_TORCH!r}, found {row['libtype']!r}",
        )
    mma = device.arch_info().mma
    if mma not in family.tiles:
        raise NotImplementedError(
            f"{op} has no FlyDSL kernel for {arch}: {family.prefix} kernels exist for "
            f"{', '.join(family.tiles)} archs, {arch} uses {mma}"
        )
    tile = None
    if row is not None:
        try:
            tile = family.parse_kernel_name(row["kernelName"], mma)
        except ValueError as err:
            raise _row_error(row, "kernelName", str(err)) from None
    choice = family.choose(m, n, k, cu_num, mma, tile, row.int("splitK") if row else 0)
    return Plan(op, row, choice, spec.short_name, call)
