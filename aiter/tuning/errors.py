"""Errors raised while reading tuned tables.

One exception type so callers can catch every table problem and show its message.
"""

from __future__ import annotations

import os


class TableError(ValueError):
    """A tuned table is missing, malformed or holds a cell of the wrong kind.

    The message names the file, and where known the line (1-based, the header is line 1)
    and the column; the same facts are kept as attributes for callers that report them.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike | None = None,
        line: int | None = None,
        column: str | None = None,
    ) -> None:
        super().__init__(message)
        self.path = None if path is None else os.fspath(path)
        self.line = line
        self.column = column
