"""Recipes that hold at every size: pointwise ops and reductions over contiguous tensors.

The outputs of a pointwise op (broadcasting, type promotion, TensorIterator's output strides) or
of a reduction (its dims dropped, or kept as 1) over inputs with contiguous strides depend on
the sizes only through which of them are 0, which are 1 and which are equal to each other: the
strides TensorIterator compares are then products of sizes, ordered the same way whatever the
sizes are. So where two calls agree in that pattern and in everything else `fake_mode` keys a
recipe by, they make outputs of the same form. A build calls such ops at a new size in nearly
every probe (each M), where an exact recipe never repeats; a recipe with its sizes as symbols
serves them all. An output that is not contiguous, or has a size no input has, gets none.
"""

from __future__ import annotations

from typing import Any

import torch

SIZE_FREE_TAGS = frozenset({torch.Tag.pointwise, torch.Tag.reduction})
# Untagged ops of the same kind: a dtype or device conversion keeps its input's shape and, over
# contiguous strides (memory_format preserve), its strides.
SIZE_FREE_OPS = frozenset({torch.ops.aten._to_copy.default})


class NotSizeFree(Exception):
    """An argument or output outside the forms above."""


def applies_to(func: Any) -> bool:
    return func in SIZE_FREE_OPS or bool(SIZE_FREE_TAGS.intersection(func.tags))


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


class Sizes:
    """The sizes of one call as symbols: 0 and 1 stand for themselves, any other size for the
    order in which its value was first met (-1, -2, ...)."""

    __slots__ = ("values", "_symbols")

    def __init__(self) -> None:
        self.values: list[int] = []
        self._symbols: dict[int, int] = {}

    def symbol(self, size: int) -> int:
        if size < 2:
            return size
        symbol = self._symbols.get(size)
        if symbol is None:
            self.values.append(size)
            symbol = self._symbols[size] = -len(self.values)
        return symbol

    def known(self, size: int) -> int:
        """The symbol of an output's size; NotSizeFree for a size no input has."""
        if size < 2:
            return size
        symbol = self._symbols.get(size)
        if symbol is None:
            raise NotSizeFree
        return symbol

    def value(self, symbol: int) -> int:
        return symbol if symbol >= 0 else self.values[-1 - symbol]


def pattern(value: Any, sizes: Sizes, value_types: tuple[type, ...]) -> Any:
    """A hashable description of an argument with its sizes as symbols; NotSizeFree for a
    tensor without contiguous strides or a value outside `value_types`."""
    if isinstance(value, torch.Tensor):
        shape = tuple(value.shape)
        if value.layout != torch.strided or value.stride() != contiguous_strides(shape):
            raise NotSizeFree
        return (
            tuple(sizes.symbol(size) for size in shape),
            value.dtype,
            value.device,
            value.requires_grad,
            value.is_conj(),
            value.is_neg(),
        )
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(pattern(v, sizes, value_types) for v in value))
    if isinstance(value, value_types):
        return (type(value), value)
    raise NotSizeFree


def generalize(recipe: Any, sizes: Sizes) -> Any:
    """An exact recipe of `fake_mode` (tensors as (Tensor, shape, stride, dtype, device)) with
    its sizes as symbols; NotSizeFree where an output is not contiguous or has a size no input
    has."""
    kind = recipe[0]
    if kind is torch.Tensor:
        _, shape, stride, dtype, device = recipe
        if tuple(stride) != contiguous_strides(tuple(shape)):
            raise NotSizeFree
        return (torch.Tensor, tuple(sizes.known(size) for size in shape), dtype, device)
    if kind is None:
        return recipe
    return (kind, [generalize(item, sizes) for item in recipe[1]])


def instantiate(recipe: Any, sizes: Sizes) -> Any:
    """The exact recipe a generalized one stands for at this call's sizes."""
    kind = recipe[0]
    if kind is torch.Tensor:
        _, symbols, dtype, device = recipe
        shape = tuple(sizes.value(symbol) for symbol in symbols)
        return (torch.Tensor, shape, contiguous_strides(shape), dtype, device)
    if kind is None:
        return recipe
    return (kind, [instantiate(item, sizes) for item in recipe[1]])
