"""Checks a kernel launcher makes of its arguments before FlyDSL sees them.

Every error names the argument and what was expected. A value of the wrong Python type is a
TypeError; a tensor of the wrong dtype, shape or layout, or a number out of range, a ValueError.
"""

from __future__ import annotations

from typing import Any

import torch


def check_choice(name: str, value: Any, choices: tuple) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}: expected one of {choices}, got {value!r}")
    return value


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected a bool, got {value!r}")
    return value


def check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    """value is an int (not a bool) in [low, high]; high None means unbounded."""
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < low
        or (high is not None and value > high)
    ):
        bound = f"an int >= {low}" if high is None else f"an int in [{low}, {high}]"
        raise ValueError(f"{name}: expected {bound}, got {value!r}")
    return value


def _require_tensor(name: str, t: Any, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        shown = f" ({what})" if what else ""
        raise TypeError(f"{name}: expected a torch.Tensor{shown}, got {type(t).__name__}")
    return t


def check_rank(name: str, t: Any, rank: int, what: str) -> tuple[int, ...]:
    """The shape of t, a tensor of `rank` dims; `what` names them (e.g. "[M, K]")."""
    _require_tensor(name, t, what)
    if t.dim() != rank:
        raise ValueError(f"{name}: expected a {rank}-D {what} tensor, got shape {list(t.shape)}")
    return tuple(int(d) for d in t.shape)


def check_tensor(
    name: str,
    t: Any,
    dtypes: torch.dtype | tuple[torch.dtype, ...],
    shape: tuple[int, ...],
    what: str = "",
) -> None:
    """t is a tensor of one of `dtypes`, exactly `shape` (`what` names its dims), laid out
    contiguously with a unit stride on its last axis."""
    _require_tensor(name, t, what)
    if isinstance(dtypes, torch.dtype):
        dtypes = (dtypes,)
    if t.dtype not in dtypes:
        wanted = f"dtype {dtypes[0]}" if len(dtypes) == 1 else f"dtype in {dtypes}"
        raise ValueError(f"{name}: expected {wanted}, got {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        named = f"{what} = " if what else ""
        raise ValueError(f"{name}: expected shape {named}{list(shape)}, got {list(t.shape)}")
    # torch calls a size-1 axis contiguous whatever its stride; the kernels need a unit stride.
    if not t.is_contiguous() or (t.dim() > 0 and t.stride(-1) != 1):
        raise ValueError(
            f"{name}: expected a contiguous tensor with a unit stride on its last axis, "
            f"got strides {list(t.stride())}"
        )
