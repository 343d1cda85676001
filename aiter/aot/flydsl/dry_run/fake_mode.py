"""The FakeTensorMode of a dry run: the tensors eager would make, at the cost of their meta
kernels.

A probe makes tensors of shapes FakeTensorMode has not seen (every new M), and there torch's
mode spends ~0.2-0.8 ms per op in its general machinery (its dispatch cache's miss path,
constant propagation, argument normalization) before it runs the op's meta kernel. A dry run
has no constants, no symbolic shapes and no real tensors inside, so for an op that torch's mode
would settle by its meta kernel, its own constructor impl or its own per-op impl, this mode
takes that last step directly; a view runs its C++ meta kernel and a composite op its composite
kernel, as eager does, where torch's mode runs Python references written for symbolic sizes.
Every other op, and every call with an argument outside those assumptions, goes through
torch's mode unchanged.

The meta kernels of elementwise ops and reductions are Python references (0.1-0.6 ms a call),
and a build meets the same op on the same shapes again and again (every job probes the same
powers of two, rows share models). So an aten or prims op whose outputs are fresh tensors is
settled once per distinct argument metadata per process: what it made is remembered by shape,
strides, dtype and device, and made again as new fake tensors. This is the rule torch's own fake
dispatch cache follows (outputs of these ops depend on the inputs' metadata only), restricted to
outputs that alias nothing, so a made-again tensor is indistinguishable from a computed one.
Pointwise ops and reductions over contiguous tensors also keep a recipe with their sizes as
symbols (`size_free`), which serves the same op at the next probe's sizes.
"""

from __future__ import annotations

import contextlib
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
    FakeTensorConfig,
    FakeTensorMode,
    has_meta,
    should_allow_numbers_as_tensors,
    stride_incorrect_op,
    torch_decomp_decompositions,
)

from aiter.aot.flydsl.dry_run import size_free

_SLOW = "slow"  # torch's mode decides
_FACTORY = "factory"  # torch's `constructors` impl: the op on the meta device, then wrapped
_IMPL = "impl"  # torch's own per-op fake impl
_META = "meta"  # the op's meta kernel, outputs wrapped on the inputs' device
_DECOMPOSE = "decompose"  # the composite kernel, else torch's decomposition, run in this mode
_PRIM = "prim"  # a prim's own meta impl, run inside this mode
_LIFT = "lift"  # a fresh host tensor made fake (`torch.tensor(data)` lifts its result)

# Ops whose fake behaviour depends on more than shapes: left to torch's mode.
_SLOW_TAGS = {
    torch.Tag.inplace_view,
    torch.Tag.dynamic_output_shape,
    torch.Tag.data_dependent_output,
    torch.Tag.nondeterministic_seeded,
}


def _implicit(func: OpOverload) -> bool:
    """Whether `func` has a CompositeImplicitAutograd kernel: eager runs it on every backend."""
    implicit = torch._C.DispatchKey.CompositeImplicitAutograd
    return implicit in func.py_kernels or torch._C._dispatch_has_kernel_for_dispatch_key(
        func.name(), "CompositeImplicitAutograd"
    )


def _decomposition(func: OpOverload, mode: FakeTensorMode) -> Any:
    """The decomposition to run for `func` rather than its meta kernel, or None: the composite
    kernel eager runs (its inner ops then come back here), else torch's table entry."""
    if func in meta_table or mode.cpp_meta_supports_symint(func):
        return None
    if _implicit(func):
        return func.decompose
    if func in decomposition_table and torch_decomp_decompositions(func):
        return decomposition_table[func]
    return None


# Ops whose Meta kernel is always the C++ one eager runs (torch registers no Python meta over a
# view): with concrete sizes it is exact, where torch's mode runs Python references written for
# symbolic sizes (`view` through `_reshape_view_helper`, about 0.3 ms a call).
_UNSAFE_VIEWS = (torch.ops.aten._unsafe_view.default,)


def _eager_view(func: OpOverload) -> bool:
    return (func.is_view or func in _UNSAFE_VIEWS) and has_meta(func) and not _implicit(func)


def _first_impl(func: OpOverload) -> Any:
    for check, impl in fake_impls.op_implementations_checks:
        if check(func):
            return impl
    return None


_META_FACTORY = {torch.ops.aten.zeros.default: torch.ops.aten.empty.memory_format}


def _route(func: Any, mode: FakeTensorMode) -> tuple[str, Any]:
    """How to settle `func` when no argument is a constant or symbolic, decided once per op: the
    branches torch's `_dispatch_impl` takes, except that views run their C++ meta kernel and
    composite ops the composite kernel, as eager does."""
    if not isinstance(func, OpOverload):
        return _SLOW, None
    if func in _DISPATCH_META_HANDLERS or func in _DISPATCH_HANDLE_DIRECTLY:
        return _SLOW, None
    if func in mode.lift_fns:
        return _LIFT, None
    if _SLOW_TAGS.intersection(func.tags):
        return _SLOW, None
    if _eager_view(func):
        return _META, None
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
        if not plain:
            return _SLOW, None
        # A factory of no tensor argument needs no look at its arguments; on the meta device a
        # zeros is an empty (there are no values to fill).
        tensorless = not any("Tensor" in str(a.type) for a in func._schema.arguments)
        return _FACTORY, (_META_FACTORY.get(func, func), tensorless)
    if impl is not None:
        return _IMPL, impl
    return (_META, None) if has_meta(func) else (_SLOW, None)


# Ops settled once per argument metadata, process-wide: the output recipes, by op and argument
# description; and the ops seen to return an alias, an input or a constant, never remembered.
_MEMO_ROUTES = (_META, _DECOMPOSE, _PRIM, _IMPL)
_recipes: dict[tuple, Any] = {}
_not_memoized: set[Any] = set()
_routes: dict[Any, tuple[str, Any]] = {}
_MEMO_OPS = ("aten", "prims")
_VALUE_TYPES = (
    int,
    float,
    bool,
    str,
    type(None),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)


class _NoRecipe(Exception):
    """An argument or output the memo does not describe."""


def _describe(value: Any) -> Any:
    """A hashable description of an argument: everything about it an op's outputs can depend
    on without reading data."""
    if isinstance(value, torch.Tensor):
        return (
            tuple(value.shape),
            value.stride(),
            value.storage_offset(),
            value.dtype,
            value.device,
            value.layout,
            value.requires_grad,
            value.is_conj(),
            value.is_neg(),
        )
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_describe(v) for v in value))
    if isinstance(value, _VALUE_TYPES):
        return (type(value), value)
    raise _NoRecipe


# Recipes with sizes as symbols (see `size_free`), by op and argument pattern.
_size_free_recipes: dict[tuple, Any] = {}


def _size_free_key(func: OpOverload, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """(the size-free key of this call, its Sizes), or None for an op or argument outside
    `size_free`'s forms."""
    if not size_free.applies_to(func):
        return None
    sizes = size_free.Sizes()
    try:
        key = (
            func,
            size_free.pattern(args, sizes, _VALUE_TYPES),
            size_free.pattern(tuple(kwargs.items()), sizes, _VALUE_TYPES),
            *_global_state(),
        )
    except size_free.NotSizeFree:
        return None
    return key, sizes


def _global_state() -> tuple[Any, ...]:
    """What besides the arguments an op's output metadata may read (as torch's cache keys it)."""
    return (
        torch.get_default_dtype(),
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
    )


def _storage_bytes(shape: Sequence[int], stride: Sequence[int], itemsize: int) -> int:
    if any(size == 0 for size in shape):
        return 0
    return (1 + sum((size - 1) * step for size, step in zip(shape, stride, strict=True))) * itemsize


def _recipe(out: Any, mode: FakeTensorMode, input_storages: set[int]) -> Any:
    """How to make `out` again: raise _NoRecipe unless every tensor in it is a fresh fake of
    `mode` (no constant, no grad, its own storage of exactly its extent, at offset 0)."""
    if isinstance(out, (list, tuple)):
        recipes = [_recipe(item, mode, input_storages) for item in out]
        return (type(out), recipes)
    if isinstance(out, torch.Tensor):
        storage = out.untyped_storage()
        fresh = (
            isinstance(out, FakeTensor)
            and out.fake_mode is mode
            and out.constant is None
            and not out.requires_grad
            and out.layout == torch.strided
            and out.storage_offset() == 0
            and storage.nbytes() == _storage_bytes(out.shape, out.stride(), out.element_size())
            and storage._cdata not in input_storages
        )
        if not fresh:
            raise _NoRecipe
        input_storages.add(storage._cdata)  # two outputs sharing one storage are not fresh
        return (torch.Tensor, tuple(out.shape), out.stride(), out.dtype, out.device)
    if isinstance(out, _VALUE_TYPES):
        return (None, out)
    raise _NoRecipe


def _make(recipe: Any, mode: DryRunFakeMode) -> Any:
    kind = recipe[0]
    if kind is torch.Tensor:
        _, shape, stride, dtype, device = recipe
        with torch._C._DisableTorchDispatch():
            meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        return mode.new_fake(meta, device)
    if kind is None:
        return recipe[1]
    return kind(_make(item, mode) for item in recipe[1])


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


class _InKernel:
    """torch's `in_kernel_invocation_manager` (meta kernels run on the fakes' meta tensors), the
    same steps in the same order, as a class: a generator context per op costs more than the op."""

    __slots__ = ("mode", "previous", "no_dispatch", "keys")

    def __init__(self, mode: FakeTensorMode) -> None:
        self.mode = mode

    def __enter__(self) -> None:
        self.previous = self.mode.in_kernel_invocation
        meta_in_tls = torch._C._meta_in_tls_dispatch_include()
        if meta_in_tls != self.previous:
            raise AssertionError(f"{meta_in_tls}, {self.previous}")
        self.no_dispatch = torch._C._DisableTorchDispatch()
        self.no_dispatch.__enter__()
        self.mode.in_kernel_invocation = True
        self.keys = torch._C._PreserveDispatchKeyGuard()
        self.keys.__enter__()
        torch._C._set_meta_in_tls_dispatch_include(True)

    def __exit__(self, *exc: object) -> None:
        self.mode.in_kernel_invocation = self.previous
        self.keys.__exit__(*exc)
        self.no_dispatch.__exit__(*exc)


class DryRunFakeMode(FakeTensorMode):
    """FakeTensorMode (no non-fake inputs, no shape env) with the direct path above."""

    def __init__(self) -> None:
        super().__init__(allow_non_fake_inputs=False)
        # Per device argument: the normalized device and the attributes torch's constructor
        # gave a fake made on it, which every later fake on that device gets too.
        self._fake_states: dict[Any, tuple[torch.device, dict[str, Any]]] = {}

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # no dry run is under torch.compile: no per-op dynamo-disabling wrapper

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        return self.dispatch(func, types, args, kwargs)

    def new_fake(self, meta: torch.Tensor, device: Any) -> FakeTensor:
        """`FakeTensor(self, meta, device)`: torch's constructor makes the first fake on each
        device, later ones are made the way it makes them (the subclass over `meta` with the
        device's backend keys, the mutable-data-pointer guard) and given the same attributes,
        without its argument checks and device normalization on every tensor."""
        if FakeTensorConfig.debug:  # torch records each fake's construction traceback
            return FakeTensor(self, meta, device)
        known = self._fake_states.get(device)
        if known is None:
            model = FakeTensor(self, meta, device)
            self._fake_states[device] = (model.fake_device, dict(vars(model)))
            return model
        normalized, state = known
        fake = torch.Tensor._make_subclass(
            FakeTensor,
            meta,
            meta.requires_grad,
            dispatch_device=True,
            device_for_backend_keys=normalized,
        )
        if self._allow_unsafe_data_ptr_access:
            torch._C._set_warn_deprecated_on_mutable_data_ptr(fake)
        else:
            torch._C._set_throw_on_mutable_data_ptr(fake)
        fake.__dict__.update(state)
        return fake

    def _from_meta(self, meta: torch.Tensor, device: Any) -> FakeTensor:
        """The converter's `from_meta_and_device`, its fakes made by `new_fake`."""
        converter = self.fake_tensor_converter
        known = converter._get_memo(meta)
        if known is not None:
            return known
        fake = self.new_fake(meta, device)
        converter.set_tensor_memo(meta, fake)
        return fake

    def _lift(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> FakeTensor | None:
        """torch's lift of a real tensor (its converter's `from_real_tensor`) for a plain dense
        host tensor with a storage of exactly its extent, made from its metadata alone: torch's
        converter walks views, storages and attributes first, ~0.15 ms where a host table
        (`torch.tensor(offsets, device=...)`) is lifted at every probe. None for any other."""
        if kwargs or len(args) != 1:
            return None
        t = args[0]
        plain = (
            type(t) is torch.Tensor
            and t.device.type == "cpu"
            and t.layout == torch.strided
            and not (t.requires_grad or t.is_quantized or t._is_view())
            and not (t.is_conj() or t.is_neg())
            and t.storage_offset() == 0
            and t.untyped_storage().nbytes()
            == _storage_bytes(t.shape, t.stride(), t.element_size())
        )
        if not plain:
            return None
        converter = self.fake_tensor_converter
        known = converter._get_memo(t)
        if known is not None:
            return known
        with torch._C._DisableTorchDispatch():
            meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        fake = self.new_fake(meta, t.device)
        converter.set_tensor_memo(t, fake)
        return fake

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

    def _factory(self, meta_op: OpOverload, args, kwargs) -> FakeTensor:
        """A factory's output: `meta_op` on the meta device, made fake on the asked device."""
        device = kwargs.get("device")
        meta_kwargs = {**kwargs, "device": torch.device("meta")}
        with _InKernel(self):
            out = meta_op(*args, **meta_kwargs)
        return self.new_fake(out, device if device is not None else torch.device("cpu"))

    def dispatch(
        self,
        func: OpOverload,
        types: Sequence[type],
        args: Sequence[object] = (),
        kwargs: Mapping[str, object] | None = None,
    ) -> object:
        kwargs = kwargs or {}
        route = _routes.get(func)
        if route is None:
            route = _routes[func] = _route(func, self)
        kind, impl = route
        if kind is _SLOW or self.shape_env is not None or self.propagate_real_tensors:
            return super().dispatch(func, types, args, kwargs)
        if kind is _LIFT:
            lifted = self._lift(args, kwargs)
            return super().dispatch(func, types, args, kwargs) if lifted is None else lifted
        if kind is _FACTORY and impl[1]:
            return self._factory(impl[0], args, kwargs)
        leaves = _leaves(args, kwargs)
        fakes = None if leaves is None else self._plain(leaves)
        if fakes is None:
            return super().dispatch(func, types, args, kwargs)
        if kind is _FACTORY:
            if fakes:
                return super().dispatch(func, types, args, kwargs)
            return self._factory(impl[0], args, kwargs)
        if not fakes and should_allow_numbers_as_tensors(func):
            return super().dispatch(func, types, args, kwargs)  # torch's constant path
        memo_key = None
        if kind in _MEMO_ROUTES and func not in _not_memoized and func.namespace in _MEMO_OPS:
            try:
                memo_key = (
                    func,
                    _describe(args),
                    _describe(tuple(kwargs.items())),
                    *_global_state(),
                )
            except _NoRecipe:
                memo_key = None
            recipe = _recipes.get(memo_key) if memo_key is not None else None
            if recipe is not None:
                return _make(recipe, self)
        sized = _size_free_key(func, args, kwargs) if memo_key is not None else None
        if sized is not None:
            general = _size_free_recipes.get(sized[0])
            if general is not None:
                return _make(size_free.instantiate(general, sized[1]), self)
        out = self._settle(kind, impl, func, types, args, kwargs, leaves, fakes)
        if memo_key is not None:
            try:
                recipe = _recipe(out, self, {f.untyped_storage()._cdata for f in fakes})
            except _NoRecipe:
                _not_memoized.add(func)
                return out
            _recipes[memo_key] = recipe
            if sized is not None:
                with contextlib.suppress(size_free.NotSizeFree):  # an output of another form
                    _size_free_recipes[sized[0]] = size_free.generalize(recipe, sized[1])
        return out

    def _settle(self, kind, impl, func, types, args, kwargs, leaves, fakes) -> object:
        """The outputs of `func` by the route `kind` (see `_route`)."""
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
            with _InKernel(self):
                out = func(*args, **kwargs)
        except NotImplementedError:
            return super().dispatch(func, types, args, kwargs)  # torch's fallback kernels
        return self._wrap(out, func, leaves, kwargs.get("device"))

    def _wrap(self, out: Any, func: OpOverload, leaves: list[Any], device: Any) -> Any:
        """torch's `wrap_meta_outputs_with_default_device_logic` for a tensor or a flat tuple or
        list of tensors (what meta kernels return), without its tree walk."""
        tensors = out if isinstance(out, (list, tuple)) else (out,)
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            return self.wrap_meta_outputs_with_default_device_logic(out, func, leaves, device)
        common, scalar_only = FakeTensor._find_common_device(func, leaves)
        if scalar_only and not all(self.is_our_fake(t) for t in tensors):
            return self.wrap_meta_outputs_with_default_device_logic(out, func, leaves, device)
        wrapped = []
        for t in tensors:
            if self.is_our_fake(t):
                torch._check(t.device == common, lambda: f"{func}: output device mismatch")
                wrapped.append(t)
            else:
                wrapped.append(self._from_meta(t, device or common))
        if not isinstance(out, (list, tuple)):
            return wrapped[0]
        return type(out)(wrapped)


_process_mode: list[DryRunFakeMode] = []


def process_mode() -> DryRunFakeMode:
    """The process's one DryRunFakeMode, which every dry run enters: building a mode costs more
    than a probe, and its memo of fakes and their attributes carries over from job to job."""
    if not _process_mode:
        _process_mode.append(DryRunFakeMode())
    return _process_mode[0]
