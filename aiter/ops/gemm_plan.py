"""What serves one GEMM call: the tuned row (exact M, then M's bucket), then torch or a FlyDSL
kernel chosen by the row or the heuristic. Shared by every GEMM family; reports to aiter.dispatch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aiter import device, dispatch
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


@dataclass(frozen=True)
class Plan:
    op: str
    row: Row | None  # the tuned row that served the call, None for an untuned shape
    choice: KernelChoice | None  # the FlyDSL kernel, None when the row says torch

    @property
    def use_torch(self) -> bool:
        return self.choice is None

    def report(self) -> None:
        """Tell aiter.dispatch how the call is served; call it once inputs passed every check."""
        dispatch.report(self._record)

    def _record(self) -> dispatch.DispatchRecord:
        source = "table" if self.row is not None else "heuristic"
        if self.choice is None:
            return dispatch.DispatchRecord(
                self.op, dispatch.BACKEND_TORCH, None, source, _row_ref(self.row)
            )
        return dispatch.DispatchRecord(
            self.op,
            dispatch.BACKEND_FLYDSL,
            self.choice.name,
            source,
            _row_ref(self.row),
            {"split_k": self.choice.split_k},
        )


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
    row = spec.lookup({"gfx": arch, "cu_num": cu_num, **key}, m)
    if row is not None and row["libtype"] == LIBTYPE_TORCH:
        return Plan(op, row, None)
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
    return Plan(op, row, choice)
