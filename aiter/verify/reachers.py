"""The reachers of listed kernels: for a kernel the builder lists (a FlyDSL function and its
compile-time parameters: tiles, split-K, modes, dtypes), a small call of aiter's public entries
that launches the same cache entry, checked against torch.

The shapes the tables name are runtime arguments of a code object, so a small problem with the
same parameters, routed to them by a user tuned table where the runtime would choose otherwise,
runs the very code object a deployment runs, at a size the emulator executes in seconds. Each
family's `reach` module (aiter/ops/<family>/reach.py) registers a reacher per FlyDSL function
with `@reaches(...)`; a reacher raises `Unreachable` with the reason when no public call reaches
a kernel.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from aiter.verify.checks import CaseContext

FAMILIES = ("gemm", "moe", "conv3d", "fmha_fp8", "chunk_gdn_h")

Reacher = Callable[[CaseContext, dict[str, str]], None]
REACHERS: dict[str, Reacher] = {}


class Unreachable(Exception):
    """No public call reaches this kernel; the message says why."""


def reaches(*functions: str) -> Callable[[Reacher], Reacher]:
    """Register a reacher for the FlyDSL functions named."""

    def register(fn: Reacher) -> Reacher:
        for function in functions:
            if function in REACHERS:
                raise ValueError(f"{function} already has a reacher: {REACHERS[function]}")
            REACHERS[function] = fn
        return fn

    return register


def all_reachers() -> dict[str, Reacher]:
    """Every registered reacher, the family modules imported."""
    import importlib

    for family in FAMILIES:
        importlib.import_module(f"aiter.ops.{family}.reach")

    return dict(REACHERS)


_PARAM = re.compile(r"(\w+)=(\([^)]*\)|'[^']*'|\S+)")


def parse_params(text: str) -> dict[str, str]:
    """The listing's `name=value ...` text as a dict of value texts, quotes removed:
    "tile_m=16 kernel_size=(3, 3, 3) mma='mfma'" -> {"tile_m": "16", "kernel_size": "(3, 3, 3)",
    "mma": "mfma"}."""
    return {name: value.strip("'") for name, value in _PARAM.findall(text)}


def as_tuple(value: str) -> tuple[int, ...]:
    """ "(3, 3, 3)" -> (3, 3, 3)."""
    return tuple(int(x) for x in value.strip("()").split(",") if x.strip())


def as_bool(value: str) -> bool:
    if value not in ("True", "False"):
        raise ValueError(f"expected True or False, got {value!r}")
    return value == "True"


def listed_kernels(listing: dict, arch: str) -> list[tuple[str, str, dict[str, str]]]:
    """(cache entry, function, params) of every distinct kernel `--list` names for `arch`, in
    entry order."""
    kernels: dict[str, tuple[str, dict[str, str]]] = {}
    for report in listing["archs"]:
        if report["arch"] != arch:
            continue
        for result in report["results"]:
            for segment in result["segments"]:
                for kernel in segment["kernels"]:
                    entry = f"{Path(kernel['cache_dir']).name}/{kernel['file']}"
                    kernels.setdefault(entry, (kernel["function"], parse_params(kernel["params"])))
    return [(entry, fn, params) for entry, (fn, params) in sorted(kernels.items())]
