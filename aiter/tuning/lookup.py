"""M buckets: which tabled row serves a given M for one shape.

A row serves every M above the previous tabled M up to its own, so lookup is a bisect.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Hashable, Iterable

from .row import Row


class MBuckets:
    """Rows grouped by their non-M key, each group sorted by M (M unique per group)."""

    def __init__(self, entries: Iterable[tuple[Hashable, int, Row]]) -> None:
        groups: dict[Hashable, list[tuple[int, Row]]] = {}
        for key, m, row in entries:
            groups.setdefault(key, []).append((m, row))
        self._groups: dict[Hashable, tuple[list[int], list[Row]]] = {}
        for key, items in groups.items():
            items.sort(key=lambda item: item[0])
            self._groups[key] = ([m for m, _ in items], [row for _, row in items])

    def find(self, key: Hashable, m: int) -> Row | None:
        """The row with the smallest tabled M >= m, or None when m is above every one."""
        group = self._groups.get(key)
        if group is None:
            return None
        ms, rows = group
        index = bisect_left(ms, m)
        return rows[index] if index < len(ms) else None

    def bucket(self, key: Hashable, m: int, row: Row) -> tuple[int, int]:
        """Inclusive range of M that `row` (tabled at `m` under `key`) serves."""
        group = self._groups.get(key)
        if group is not None:
            ms, rows = group
            index = bisect_left(ms, m)
            if index < len(ms) and ms[index] == m and rows[index] == row:
                return (ms[index - 1] + 1 if index else 1, m)
        raise ValueError(
            f"{row.source}:{row.line}: row is not in this table "
            "(a duplicate shape with a lower us replaced it, or it came from another table)"
        )

    def is_top(self, key: Hashable, m: int) -> bool:
        """Whether `m` is the largest value tabled under `key`: above it no row serves."""
        group = self._groups.get(key)
        return group is not None and group[0][-1] == m
