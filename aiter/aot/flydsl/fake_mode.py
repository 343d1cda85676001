"""The FakeTensorMode of a dry run: the same tensors as torch's, made at the cost of their meta
kernels.

A probe makes tensors of shapes FakeTensorMode has not seen (every new M), and there torch's
mode spends ~0.2-0.8 ms per op in its general machinery (its dispatch cache's miss path,
constant propagation, argument normalization) before it runs the op's meta kernel. A dry run
has no constants, no symbolic shapes and no real tensors inside, so for an op that torch's mode
would settle by its meta kernel, its own constructor impl or its own per-op impl, this mode
takes that last step directly. Every other op, and every call with an argument outside those
assumptions, goes through torch's mode unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch._decomp import decomposition_table, meta_table
from torch._ops import OpOverload
from torch._subclasses import fake_impls
from torch._subclasses.fake_tensor import (
    _DISPATCH_HANDLE_DIRECTLY,
    _DISPATCH_META_HANDLERS,
    FakeTensor,
    FakeTensorMode,
    has_meta,
    in_kernel_invocation_manager,
    should_allow_numbers_as_tensors,
    stride_incorrect_op,
    torch_decomp_decompositions,
)

_SLOW = "slow"  # torch's mode decides
_FACTORY = "factory"  # torch's `constructors` impl: the op on the meta device, then wrapped
_IMPL = "impl"  # torch's own per-op fake impl
_META = "meta"  # the op's meta kernel, outputs wrapped on the inputs' device
_DECOMPOSE = "decompose"  # torch's decomposition, run inside this mode
_PRIM = "prim"  # a prim's own meta impl, run inside this mode

# Ops whose fake behaviour depends on more than shapes: left to torch's mode.
_SLOW_TAGS = {
    torch.Tag.inplace_view,
    torch.Tag.dynamic_output_shape,
    torch.Tag.data_dependent_output,
    torch.Tag.nondeterministic_seeded,
}


def _decomposition(func: OpOverload, mode: FakeTensorMode) -> Any:
    """The decomposition torch's mode would run for `func` rather than its meta kernel: an
    entry of torch's table, `func.decompose`, or None."""
    if func in meta_table or mode.cpp_meta_supports_symint(func):
        return None
    if func in decomposition_table and torch_decomp_decompositions(func):
        return decomposition_table[func]
    implicit = torch._C.DispatchKey.CompositeImplicitAutograd
    if implicit in func.py_kernels or torch._C._dispatch_has_kernel_for_dispatch_key(
        func.name(), "CompositeImplicitAutograd"
    ):
        return func.decompose
    return None


def _first_impl(func: OpOverload) -> Any:
    for check, impl in fake_impls.op_implementations_checks:
        if check(func):
            return impl
    return None


def _route(func: Any, mode: FakeTensorMode) -> tuple[str, Any]:
    """How torch's mode settles `func` when no argument is a constant or symbolic: the same
    branches its `_dispatch_impl` takes, decided once per op."""
    if not isinstance(func, OpOverload):
        return _SLOW, None
    if func in _DISPATCH_META_HANDLERS or func in _DISPATCH_HANDLE_DIRECTLY:
        return _SLOW, None
    if func in mode.lift_fns or _SLOW_TAGS.intersection(func.tags):
        return _SLOW, None
    decomposition = _decomposition(func, mode)
    if decomposition is not None:
        return _DECOMPOSE, decomposition
    if "prims::" in func._schema.name:
        prim = hasattr(func, "prim_meta_impl") and not stride_incorrect_op(func)
        return (_PRIM, func.prim_meta_impl) if prim else (_SLOW, None)
    if torch._library.simple_registry.singleton.find(func.name()).fake_impl.kernel is not None:
        return _SLOW, None
    impl = _first_impl(func)
    if impl is fake_impls.constructors:
        device_args = [a for a in func._schema.arguments if a.name == "device"]
        plain = (
            func not in fake_impls._like_tensor_constructors
            and func not in fake_impls._non_kwarg_device_constructors
            and all(a.kwarg_only for a in device_args)
            and not should_allow_numbers_as_tensors(func)
        )
        return (_FACTORY, None) if plain else (_SLOW, None)
    if impl is not None:
        return _IMPL, impl
    return (_META, None) if has_meta(func) else (_SLOW, None)


def _leaves(args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any] | None:
    """The arguments with lists and tuples opened one level; None for anything deeper."""
    leaves: list[Any] = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, (list, tuple, dict)):
                    return None
                leaves.append(item)
        elif isinstance(value, dict):
            return None
        else:
            leaves.append(value)
    return leaves


class DryRunFakeMode(FakeTensorMode):
    """FakeTensorMode (no non-fake inputs, no shape env) with the direct path above."""

    def __init__(self) -> None:
        super().__init__(allow_non_fake_inputs=False)
        self._routes: dict[Any, tuple[str, Any]] = {}

    def _plain(self, leaves: list[Any]) -> list[FakeTensor] | None:
        """The fake tensors among `leaves`, if every tensor is one of ours without a constant
        and no leaf is symbolic; else None."""
        fakes = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                if not (
                    isinstance(leaf, FakeTensor)
                    and leaf.fake_mode is self
                    and leaf.constant is None
                    and leaf.real_tensor is None
                ):
                    return None
                fakes.append(leaf)
            elif isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return None
        return fakes

    def dispatch(
        self,
        func: OpOverload,
        types: Sequence[type],
        args: Sequence[object] = (),
        kwargs: Mapping[str, object] | None = None,
    ) -> object:
        kwargs = kwargs or {}
        route = self._routes.get(func)
        if route is None:
            route = self._routes[func] = _route(func, self)
        kind, impl = route
        if kind is _SLOW or self.shape_env is not None or self.propagate_real_tensors:
            return super().dispatch(func, types, args, kwargs)
        leaves = _leaves(args, kwargs)
        fakes = None if leaves is None else self._plain(leaves)
        if fakes is None:
            return super().dispatch(func, types, args, kwargs)
        if kind is _FACTORY:
            if fakes:
                return super().dispatch(func, types, args, kwargs)
            device = kwargs.get("device")
            meta_kwargs = {**kwargs, "device": torch.device("meta")}
            with in_kernel_invocation_manager(self):
                out = func(*args, **meta_kwargs)
            return FakeTensor(self, out, device if device is not None else torch.device("cpu"))
        if not fakes and should_allow_numbers_as_tensors(func):
            return super().dispatch(func, types, args, kwargs)  # torch's constant path
        if kind is _DECOMPOSE or kind is _PRIM:
            with self:
                out = impl(*args, **kwargs)
            if out is not NotImplemented:
                return out
            return super().dispatch(func, types, args, kwargs)
        if kind is _IMPL:
            out = impl(self, func, *args, **kwargs)
            if out is not NotImplemented:
                return out
            if not has_meta(func):
                return super().dispatch(func, types, args, kwargs)
        try:
            with in_kernel_invocation_manager(self):
                out = func(*args, **kwargs)
        except NotImplementedError:
            return super().dispatch(func, types, args, kwargs)  # torch's fallback kernels
        return self.wrap_meta_outputs_with_default_device_logic(
            out, func, leaves, device=kwargs.get("device")
        )
