"""Tuned CSV tables: the single source of which kernel an operator launches for a shape.

Load (merge, validate, dedupe) with `load_table`, then `TunedTable.lookup` per call.
"""

from .errors import TableError
from .kinds import Column
from .row import Row
from .table import TunedTable, load_table

__all__ = ["Column", "Row", "TableError", "TunedTable", "load_table"]
