"""The emulated numerics suite's cases: each calls aiter's public entries under
`aiter.emulated(arch)` on CPU tensors and compares them with a torch reference.

A case is a function of a `CaseContext` (aiter.verify.checks), registered per family with
`@case(family)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aiter.verify.checks import ROUNDOFF, CaseContext, Check

__all__ = ["ROUNDOFF", "CaseContext", "Case", "Check", "FAMILIES", "all_cases", "case"]

FAMILIES = ("gemm", "moe", "conv3d", "fmha_fp8", "chunk_gdn_h")


@dataclass(frozen=True)
class Case:
    family: str
    name: str
    run: Callable[[CaseContext], None]
    archs: tuple[str, ...] = ("gfx942", "gfx950", "gfx1250")

    @property
    def id(self) -> str:
        return f"{self.family}/{self.name}"


CASES: list[Case] = []


def case(family: str, archs: tuple[str, ...] = ("gfx942", "gfx950", "gfx1250")):
    """Register a case of `family`, named after its function."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")

    def register(fn: Callable[[CaseContext], None]) -> Callable[[CaseContext], None]:
        CASES.append(Case(family, fn.__name__, fn, archs))
        return fn

    return register


def all_cases() -> list[Case]:
    """Every registered case, the family modules imported."""
    from op_tests.emulated import (  # noqa: F401  (they register their cases)
        cases_chunk_gdn_h,
        cases_conv3d,
        cases_fmha_fp8,
        cases_gemm,
        cases_moe,
    )

    return list(CASES)
