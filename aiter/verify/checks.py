"""What a check of an emulated call records.

A `CaseContext` is what a case or a reacher gets: a seeded generator for its inputs, `check`,
which compares one output with its torch reference by the error relative to the reference's
largest magnitude against a tolerance the caller states and justifies (the rounding the kernel
does that the fp32 reference does not), and `table`, which installs a user tuned table for the
calls inside it, the way a deployment does, to reach a kernel the runtime would not choose at a
small shape.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

# Unit roundoff of each output dtype: half an ulp at 1.0, the error of one rounding.
ROUNDOFF = {torch.bfloat16: 2.0**-9, torch.float16: 2.0**-11, torch.float32: 2.0**-24}


@dataclass
class Check:
    what: str
    error: float  # max |out - ref| / max |ref|
    tolerance: float
    first_bad: str = ""  # the first element past the tolerance: "[3, 17] = 1.25, expected 1.5"

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
        self.checks.append(
            Check(what, error, tolerance, _first_bad(out64, ref64, tolerance * scale))
        )

    @contextmanager
    def table(self, env_var: str, header: str, rows: list[str]) -> Iterator[Path]:
        """The calls inside see a user tuned table of `rows` (its `{arch}`, `{cu}` and `{mma}`,
        the arch's MMA flavour, filled) through `env_var`, as a deployment installs one."""
        from aiter import device

        fields = {"arch": self.arch, "cu": device.cu_num(), "mma": device.arch_info().mma}
        text = "\n".join([header, *rows]).format(**fields) + "\n"
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


def _first_bad(out: torch.Tensor, ref: torch.Tensor, bound: float) -> str:
    """The first element (row-major) whose error passes `bound` or is NaN, as text; "" if none."""
    diff = (out - ref).abs()
    bad = (diff > bound) | torch.isnan(diff)
    if not bad.any():
        return ""
    flat = int(bad.flatten().nonzero()[0].item())
    index = list(torch.unravel_index(torch.tensor(flat), out.shape))
    at = ", ".join(str(int(i)) for i in index)
    return f"[{at}] = {out.flatten()[flat].item():.6g}, expected {ref.flatten()[flat].item():.6g}"
