"""Column kinds of tuned tables: parsing cells and normalizing shape values.

Numeric kinds compare on value, so "256", "256.0" and 256 are the same shape.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

KINDS = ("int", "float", "str", "optional_str", "bool01", "optional_float")
# The largest value an int cell may hold unless its column says less: every size a kernel takes
# is a 32-bit int, so a larger cell could only fail later, at a call, far from its file.
INT_CELL_MAXIMUM = 2**31 - 1

# What each kind accepts, worded for error messages.
EXPECTED = {
    "int": "an integer",
    "float": "a number",
    "str": "non-empty text",
    "optional_str": "text or an empty cell",
    "bool01": "0/1 or True/False",
    "optional_float": "a number or an empty cell",
}


@dataclass(frozen=True)
class Column:
    """A column the caller requires, with the kind its cells must parse as."""

    name: str
    kind: str
    choices: tuple[str, ...] = ()  # when set, the only texts a cell may hold
    minimum: int | None = None  # for numeric kinds: the smallest value allowed
    maximum: int | None = None  # and the largest (a kernel's documented limit)
    pattern: str | None = None  # for text kinds: a regular expression a cell must match
    pattern_help: str = ""  # what the pattern asks for, in words
    required: bool = True  # False: a file may leave the column out (its cells read as empty)
    multiple: int | None = None  # for int columns: what every value must be a multiple of
    # What a cell reads as in a file that leaves the column out (another of aiter's column sets):
    # a text, or a function of the row's cells as written that returns one (ValueError: the row
    # cannot say, and its message says why). None: a file must have the column (if required).
    absent: str | Callable[[Mapping[str, str]], str] | None = None

    @property
    def upper_bound(self) -> int | None:
        """The largest value allowed: the column's maximum, else INT_CELL_MAXIMUM for ints."""
        if self.maximum is not None or self.kind != "int":
            return self.maximum
        return INT_CELL_MAXIMUM

    @property
    def constrained(self) -> bool:
        return (
            bool(self.choices)
            or self.pattern is not None
            or (self.minimum is not None or self.upper_bound is not None)
            or self.multiple is not None
        )

    def violation(self, text: str) -> str | None:
        """Why a cell (already of this column's kind) breaks the column's constraints, or None.
        An empty cell of an optional kind is always allowed."""
        if text == "" and self.kind.startswith("optional"):
            return None
        if self.choices and text not in self.choices:
            return self.expected()
        if self.pattern is not None and not re.fullmatch(self.pattern, text):
            return self.expected()
        upper = self.upper_bound
        if self.minimum is not None or upper is not None:
            value = PARSERS[self.kind](text)
            if (self.minimum is not None and value < self.minimum) or (
                upper is not None and value > upper
            ):
                return self.expected()
            if self.multiple is not None and value % self.multiple:
                return f"a multiple of {self.multiple}"
        return None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"column {self.name!r}: unknown kind {self.kind!r}; expected one of {KINDS}"
            )
        if self.multiple is not None and (self.kind != "int" or self.multiple < 1):
            raise ValueError(f"column {self.name!r}: a multiple needs an int column and 1 or more")
        if not self.required and self.absent is None and not self.kind.startswith("optional"):
            raise ValueError(
                f"column {self.name!r}: a column files may leave out needs an optional kind"
            )

    def expected(self) -> str:
        """What a cell of this column must hold, worded for error messages."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.pattern is not None:
            return self.pattern_help or f"text matching {self.pattern}"
        kind, upper = EXPECTED[self.kind], self.upper_bound
        if self.minimum is not None and upper is not None:
            return f"{kind} from {self.minimum} to {upper}"
        if self.minimum is not None:
            return f"{kind} >= {self.minimum}"
        if upper is not None:
            return f"{kind} <= {upper}"
        return kind


def parse_int(text: str) -> int:
    """Parse an integer cell; integral floats such as "256.0" or "1e3" count."""
    if "_" in text:
        # Python accepts "1_000"; a table cell like that is more likely a typo.
        raise ValueError(text)
    try:
        return int(text)
    except ValueError:
        value = float(text)
        if not value.is_integer():
            raise ValueError(text) from None
        return int(value)


def parse_float(text: str) -> float:
    if "_" in text:
        raise ValueError(text)
    return float(text)


def parse_optional_float(text: str) -> float | None:
    return None if text == "" else parse_float(text)


def parse_bool01(text: str) -> int:
    lowered = text.lower()
    if lowered == "true":
        return 1
    if lowered == "false":
        return 0
    value = parse_float(text)
    if value not in (0.0, 1.0):
        raise ValueError(text)
    return int(value)


def parse_str(text: str) -> str:
    if text == "":
        raise ValueError(text)
    return text


# Cell text (already stripped) -> the value shapes are compared on.
PARSERS: dict[str, Callable[[str], object]] = {
    "int": parse_int,
    "float": parse_float,
    "str": parse_str,
    "optional_str": str,
    "bool01": parse_bool01,
    "optional_float": parse_optional_float,
}


def _normalize_int(value: object) -> object:
    if type(value) is int:
        return value
    if isinstance(value, str):
        return parse_int(value.strip())
    if isinstance(value, float):
        # A non-integral float matches no int row, which is the honest answer.
        return int(value) if value.is_integer() else value
    return operator.index(value)


def _normalize_float(value: object) -> object:
    if isinstance(value, str):
        return parse_float(value.strip())
    return float(value)  # type: ignore[arg-type]


def _normalize_optional_float(value: object) -> object:
    if value is None or (isinstance(value, str) and value.strip() == ""):
        return None
    return _normalize_float(value)


def _normalize_bool01(value: object) -> object:
    if isinstance(value, str):
        return parse_bool01(value.strip())
    return _normalize_int(value)


def _normalize_str(value: object) -> object:
    # str() also turns a torch dtype into its name, e.g. "torch.bfloat16".
    return value.strip() if isinstance(value, str) else str(value)


# A caller's lookup value -> the value shapes are compared on.
NORMALIZERS: dict[str, Callable[[object], object]] = {
    "int": _normalize_int,
    "float": _normalize_float,
    "str": _normalize_str,
    "optional_str": _normalize_str,
    "bool01": _normalize_bool01,
    "optional_float": _normalize_optional_float,
}
