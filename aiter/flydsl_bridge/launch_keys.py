"""FlyDSL's cache key of a launch, built without its per-launch overheads, for naming mode.

FlyDSL builds a launch's key (a tuple, then its string) on every call: a second signature bind,
a runtime-checkable Protocol test per argument, a drift check of every global the kernel reads
and `str()` of the whole tuple, about 0.3 ms per launch, most of a probe's time in the launchers.
`LaunchKeys.key` builds the same tuple from the same pieces (FlyDSL's own per-argument
signatures, its environment and target parts, its memoized globals segment) with the per-type
answers cached, int and bool arguments' signatures remembered by value, and the arguments bound
by position and name where every parameter is a plain one (inspect's bind is a tenth of a
launch); it maps the tuple to the string FlyDSL produced when the tuple was first seen. Naming
mode checks the first string of every tuple against FlyDSL's real path, so a FlyDSL change to
the key's composition is an error, never a wrong name.
"""

from __future__ import annotations

import functools
import inspect
from types import SimpleNamespace
from typing import Any

from aiter.flydsl_bridge.internals import jit_function

_EMPTY = inspect.Parameter.empty
_CONSTEXPR, _TYPE, _ANNOTATED, _VALUE = "constexpr", "type", "annotated", "value"


_SCALARS = (int, bool)


@functools.cache
def _flydsl() -> SimpleNamespace:
    """FlyDSL's names the key reads on every launch, imported once."""
    from flydsl.compiler.jit_argument import JitArgumentRegistry
    from flydsl.compiler.protocol import JitArgument, cache_signature

    return SimpleNamespace(
        JitArgumentRegistry=JitArgumentRegistry,
        JitArgument=JitArgument,
        cache_signature=cache_signature,
    )


class Unsupported(Exception):
    """A launch whose key this module does not build: the caller takes FlyDSL's own path."""


class LaunchKeys:
    """The key pieces of one JitFunction that do not change between its launches."""

    def __init__(self, jit_fn: Any) -> None:
        from flydsl.compiler.jit_argument import is_type_param_annotation
        from flydsl.compiler.protocol import JitArgument
        from flydsl.expr.typing import Constexpr

        jit_fn._ensure_sig()
        if jit_fn._has_self_param:
            raise Unsupported("a method: its key carries the owner's type")
        self.jit_fn = jit_fn
        self.signature = jit_fn._sig
        self.kinds: dict[str, tuple[str, Any]] = {}
        for name, param in self.signature.parameters.items():
            ann = param.annotation
            if ann is not _EMPTY and Constexpr.is_constexpr_annotation(ann):
                self.kinds[name] = (_CONSTEXPR, ann)
            elif ann is not _EMPTY and is_type_param_annotation(ann):
                self.kinds[name] = (_TYPE, ann)
            elif isinstance(ann, type) and issubclass(ann, JitArgument):
                self.kinds[name] = (_ANNOTATED, ann)
            else:
                self.kinds[name] = (_VALUE, ann)
        self._value_signature = Constexpr.value_signature
        self._is_jit_argument: dict[type, bool] = {}
        self._scalar_signatures: dict[tuple[str, type, Any], tuple] = {}
        self.strings: dict[tuple, str] = {}
        # Binding by position and name is inspect's bind when every parameter is a plain one.
        params = list(self.signature.parameters.values())
        plain = all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
        self._names = tuple(p.name for p in params) if plain else None
        self._name_set = frozenset(self._names or ())
        self._defaults = {p.name: p.default for p in params if p.default is not _EMPTY}

    def _jit_argument(self, name: str, arg: Any, kind: str, ann: Any) -> Any:
        """The JitArgument FlyDSL makes of `arg`, by its own rules in its own order."""
        cls = type(arg)
        known = self._is_jit_argument.get(cls)
        if known is None:
            known = self._is_jit_argument[cls] = isinstance(arg, _flydsl().JitArgument)
        if known:
            return arg
        if kind is _ANNOTATED:
            return ann(arg)
        constructor, _ = _flydsl().JitArgumentRegistry.get(cls)
        if constructor is None:
            raise Unsupported(f"{name}: {cls.__name__} has no JitArgument constructor")
        return constructor(arg)

    def _signature_of(self, name: str, arg: Any, kind: str, ann: Any) -> Any:
        """cache_signature of the JitArgument of `arg`; of an int or bool, remembered by the
        parameter, type and value (the JitArgument FlyDSL makes of it is a function of them)."""
        if type(arg) in _SCALARS:
            known = self._scalar_signatures.get((name, type(arg), arg))
            if known is None:
                jit_arg = self._jit_argument(name, arg, kind, ann)
                known = self._scalar_signatures[(name, type(arg), arg)] = (
                    _flydsl().cache_signature(jit_arg),
                )
            return known[0]
        return _flydsl().cache_signature(self._jit_argument(name, arg, kind, ann))

    def _bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """The launch's arguments by parameter name, in signature order, defaults applied."""
        names = self._names
        if (
            names is None
            or len(args) > len(names)
            or not kwargs.keys() <= self._name_set
            or any(name in kwargs for name in names[: len(args)])
        ):
            bound = self.signature.bind(*args, **kwargs)  # raises what a bad call gets
            bound.apply_defaults()
            return bound.arguments
        arguments = dict(zip(names, args, strict=False))  # the rest by name or default
        for name in names[len(args) :]:
            if name in kwargs:
                arguments[name] = kwargs[name]
            elif name in self._defaults:
                arguments[name] = self._defaults[name]
            else:
                raise TypeError(f"missing a required argument: {name!r}")
        return arguments

    def key(self, args: tuple, kwargs: dict) -> tuple:
        """The tuple FlyDSL's `_build_full_cache_key` returns for this launch."""
        jf = jit_function()
        fn = self.jit_fn
        arguments = self._bind(args, kwargs)
        parts: list[tuple[str, Any]] = [
            ("_env_", jf._cache_invalidating_env_values(fn._backend_target)),
            ("_target_", fn._backend_target),
        ]
        hints = fn._effective_compile_hints()
        if hints:
            parts.append(
                (
                    "_hints_",
                    tuple(
                        sorted(
                            (k, type(v).__module__, type(v).__qualname__, repr(v))
                            for k, v in hints.items()
                        )
                    ),
                )
            )
        for name, arg in arguments.items():
            kind, ann = self.kinds[name]
            if kind is _CONSTEXPR:
                parts.append((name, self._value_signature(arg)))
            elif kind is _TYPE:
                if getattr(arg, "__dsl_member_behavior__", False):
                    arg = (arg, arg.__cache_signature__())
                parts.append((name, arg))
            else:
                parts.append((name, self._signature_of(name, arg, kind, ann)))
        return fn._globals_key_prefix(None) + tuple(parts)
