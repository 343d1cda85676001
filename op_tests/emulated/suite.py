"""The emulated numerics suite's cases: each calls aiter's public entries under
`aiter.emulated(arch)` on CPU tensors and compares them with a torch reference.

A case is a function of a `CaseContext`, registered per family with `@case(family)`. Its
`check` compares one output with its reference by the error relative to the reference's largest
magnitude, against a tolerance the case states and justifies (the rounding the kernel does that
the fp32 reference does not); `table` installs a user tuned table for the calls inside it, the
way a deployment does, to reach a kernel the heuristic would not choose at a small shape.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

FAMILIES = ("gemm", "moe", "conv3d", "fmha_fp8", "chunk_gdn_h")

# Unit roundoff of each output dtype: half an ulp at 1.0, the error of one rounding.
ROUNDOFF = {torch.bfloat16: 2.0**-9, torch.float16: 2.0**-11, torch.float32: 2.0**-24}


@dataclass
class Check:
    what: str
    error: float  # max |out - ref| / max |ref|
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.error <= self.tolerance


@dataclass
class CaseContext:
    arch: str
    gen: torch.Generator
    checks: list[Check] = field(default_factory=list)

    def randn(self, *shape: int, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=self.gen) * scale).to(dtype)

    def check(self, what: str, out: torch.Tensor, ref: torch.Tensor, tolerance: float) -> None:
        """Record max |out - ref| / max |ref| (NaN anywhere fails) against `tolerance`."""
        if tuple(out.shape) != tuple(ref.shape):
            raise AssertionError(f"{what}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
        out64, ref64 = out.double(), ref.double()
        scale = ref64.abs().max().item() or 1.0
        diff = (out64 - ref64).abs()
        error = float("inf") if torch.isnan(diff).any() else diff.max().item() / scale
        self.checks.append(Check(what, error, tolerance))

    @contextmanager
    def table(self, env_var: str, header: str, rows: list[str]) -> Iterator[Path]:
        """The calls inside see a user tuned table of `rows` (its `{arch}` and `{cu}` filled)
        through `env_var`, as a deployment installs one."""
        from aiter import device

        text = "\n".join([header, *rows]).format(arch=self.arch, cu=device.cu_num()) + "\n"
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / "tuned.csv"
            path.write_text(text)
            saved = os.environ.get(env_var)
            os.environ[env_var] = str(path)
            try:
                yield path
            finally:
                if saved is None:
                    os.environ.pop(env_var, None)
                else:
                    os.environ[env_var] = saved


@dataclass(frozen=True)
class Case:
    family: str
    name: str
    run: Callable[[CaseContext], None]
    archs: tuple[str, ...] = ("gfx942", "gfx950")

    @property
    def id(self) -> str:
        return f"{self.family}/{self.name}"


CASES: list[Case] = []


def case(family: str, archs: tuple[str, ...] = ("gfx942", "gfx950")):
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
