"""LaunchKeys' shortcuts give what FlyDSL's own steps give: the binding inspect makes, and the
cache signature of the JitArgument FlyDSL makes of a scalar."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

from aiter.flydsl_bridge.launch_keys import LaunchKeys


def _keys_of(fn) -> LaunchKeys:
    stand_in = SimpleNamespace(_sig=inspect.signature(fn), _has_self_param=False)
    stand_in._ensure_sig = lambda: None
    return LaunchKeys(stand_in)


def plain(a, b: int, c=3, d=None):
    pass


def with_star(a, *rest, key=1):
    pass


CALLS = [
    ((1, 2), {}),
    ((1, 2, 4), {}),
    ((1,), {"b": 2}),
    ((), {"d": 5, "b": 2, "a": 1}),
    ((1, 2, 3, 4), {}),
    ((1,), {}),  # b missing
    ((1, 2, 3, 4, 5), {}),  # one too many
    ((1, 2), {"a": 1}),  # a twice
    ((1, 2), {"e": 1}),  # no such parameter
]


def _inspect_bind(fn, args, kwargs):
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return list(bound.arguments.items())


@pytest.mark.parametrize("fn", [plain, with_star], ids=["plain", "star"])
@pytest.mark.parametrize("args, kwargs", CALLS)
def test_bind_is_inspects_bind(fn, args, kwargs) -> None:
    keys = _keys_of(fn)
    try:
        expected = _inspect_bind(fn, args, kwargs)
    except TypeError:
        with pytest.raises(TypeError):
            keys._bind(args, kwargs)
        return
    assert list(keys._bind(args, kwargs).items()) == expected


def test_scalar_signature_is_flydsls_and_tells_types_apart() -> None:
    from flydsl.compiler.jit_argument import JitArgumentRegistry
    from flydsl.compiler.protocol import cache_signature

    keys = _keys_of(plain)
    for value in (0, 1, 7, True, False):
        constructor, _ = JitArgumentRegistry.get(type(value))
        expected = cache_signature(constructor(value))
        for _ in range(2):  # computed, then remembered
            assert keys._signature_of("a", value, "value", inspect.Parameter.empty) == expected
    assert ("a", bool, True) in keys._scalar_signatures
    assert ("a", int, 1) in keys._scalar_signatures
