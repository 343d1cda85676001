"""Tuned CSV tables: the single source of which kernel an operator launches for a shape.

Declare a table once with `TableSpec`; `spec.load()` merges and validates it, `lookup` per call.
"""

from .errors import TableError
from .kinds import Column
from .row import Row, row_name
from .spec import CONFIG_DIR, CONFIG_DIR_ENV, BucketAxis, TableSpec, find_spec
from .table import TunedTable, load_table

__all__ = [
    "CONFIG_DIR",
    "CONFIG_DIR_ENV",
    "BucketAxis",
    "Column",
    "Row",
    "TableError",
    "TableSpec",
    "TunedTable",
    "find_spec",
    "load_table",
    "row_name",
]
