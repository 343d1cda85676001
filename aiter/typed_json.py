"""Typed records (dataclasses) to plain JSON data and back, for the runtime and the builder alike:
`to_json` and `from_json(cls, data)`. Imports neither torch nor FlyDSL.

`from_json` rebuilds nested dataclasses, lists, dicts, optional fields and enums (from their
values) from the type hints; any other value is taken as it is. A field the data lacks takes its default.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar

T = TypeVar("T")


_ATOMS = (str, int, float, bool, type(None))  # an Enum of str or int stays the member


def to_json(record: Any) -> Any:
    """A record (or list of records) as plain JSON data."""
    return _plain(record)


def from_json(cls: type[T], data: Any) -> T:
    """Rebuild a record of type `cls` from what `to_json` made of it. Data of the wrong shape
    raises TypeError, KeyError or AttributeError."""
    return _converter(cls)(data)


@functools.cache
def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _plain(value: Any) -> Any:
    """What dataclasses.asdict makes of records, without its deep copies (reports of tens of
    thousands of jobs are converted in seconds, not tens of them)."""
    convert = _plain_by_type.get(type(value))
    if convert is None:
        convert = _plain_by_type[type(value)] = _plain_for(type(value))
    return convert(value)


def _plain_for(cls: type) -> Callable[[Any], Any]:
    if issubclass(cls, _ATOMS):
        return _same
    if dataclasses.is_dataclass(cls):
        names = _names(cls)
        return lambda value: {name: _plain(getattr(value, name)) for name in names}
    if issubclass(cls, list):
        return lambda value: [_plain(v) for v in value]
    if issubclass(cls, tuple):
        return lambda value: tuple(_plain(v) for v in value)
    if issubclass(cls, dict):
        return lambda value: {k: _plain(v) for k, v in value.items()}
    return _same


_plain_by_type: dict[type, Callable[[Any], Any]] = {}


def _same(value: Any) -> Any:
    return value


@functools.cache
def _converter(tp: Any) -> Callable[[Any], Any]:
    """The function rebuilding a value of type hint `tp` from plain data, made once per hint:
    resolving the hints is the costly part, and a report holds many records of few types."""
    if isinstance(tp, type) and issubclass(tp, Enum):
        return tp
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        fields = tuple((f.name, _converter(hints[f.name])) for f in dataclasses.fields(tp))

        def record(value: Any) -> Any:
            return tp(**{name: convert(value[name]) for name, convert in fields if name in value})

        return record
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list:
        item = _converter(args[0])
        return list if item is _same else lambda value: [item(v) for v in value]
    if origin is dict:
        item = _converter(args[1])
        return dict if item is _same else lambda value: {k: item(v) for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        inner = _converter(next(a for a in args if a is not type(None)))
        return lambda value: None if value is None else inner(value)
    return _same
