"""Tables F times the default size (`python -m aiter.configs.generate --scale F`): each default
model shape, then F - 1 synthetic siblings of it that each family's `generate` module grows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

Shape = TypeVar("Shape")


def scaled(shapes: Sequence[Shape], scale: int, grow: Callable[[Shape, int], Shape]) -> list[Shape]:
    """`shapes` in order, then each again as `grow(shape, step)` makes it for step 1 .. scale-1."""
    return [grow(shape, step) if step else shape for step in range(scale) for shape in shapes]
