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
from enum import Enum
from typing import Any, TypeVar

T = TypeVar("T")


def to_json(record: Any) -> Any:
    """A record (or list of records) as plain JSON data."""
    if isinstance(record, list):
        return [to_json(r) for r in record]
    return dataclasses.asdict(record)


def from_json(cls: type[T], data: Any) -> T:
    """Rebuild a record of type `cls` from what `to_json` made of it. Data of the wrong shape
    raises TypeError, KeyError or AttributeError."""
    return _convert(cls, data)


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, Any], ...]:
    """(name, type hint) of each field; resolving the hints is the costly part of a conversion."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))


def _convert(tp: Any, value: Any) -> Any:
    if isinstance(tp, type) and issubclass(tp, Enum):
        return tp(value)
    if dataclasses.is_dataclass(tp):
        kwargs = {name: _convert(hint, value[name]) for name, hint in _fields(tp) if name in value}
        return tp(**kwargs)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list:
        return [_convert(args[0], v) for v in value]
    if origin is dict:
        return {k: _convert(args[1], v) for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        return _convert(next(a for a in args if a is not type(None)), value)
    return value
