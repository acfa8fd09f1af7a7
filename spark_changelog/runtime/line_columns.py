"""Columns a reader's line task computes itself, with the values Spark's
expression gives (docs/runtime.md, "Packing in the line task": a window
reading a source with a computed event-time column).

A :class:`LineColumn` is a reader's column as it is, or one of Spark's
integer-to-timestamp functions over one: ``timestamp_seconds``,
``timestamp_millis``, ``timestamp_micros`` of a TINYINT/SMALLINT/INT/BIGINT
column (Flink's ``TO_TIMESTAMP_LTZ(x, 0)`` and ``(x, 3)`` lower to the first
two, docs/sql.md).  Spark's value is the integer times 10^6, 10^3 or 1
microseconds since the epoch (an instant: no time zone enters it), NULL for
NULL, and the query fails on a product outside a 64-bit integer
(``Math.multiplyExact``); here the same product, and a row whose product
would overflow is left to Spark (:func:`computable`), which fails the query
as before.  Any other expression is not a :class:`LineColumn`: the lowering
keeps Spark's path for it (``plan.lower``).

No Spark import: this runs in the Python workers.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Spark's integer-to-timestamp functions: microseconds per unit of the argument
TIMESTAMP_FUNCTIONS = {"timestamp_seconds": 1_000_000, "timestamp_millis": 1_000, "timestamp_micros": 1}
#: the Arrow type of Spark's TIMESTAMP as operators see it (``keyed_rows.arrow_schema_of``)
UTC_MICROS = pa.timestamp("us", tz="UTC")
_INT64 = np.iinfo(np.int64)


@dataclasses.dataclass(frozen=True)
class LineColumn:
    """Output column ``name``: the reader's column ``source`` as it is
    (``function`` None), or ``function(source)``, one of
    :data:`TIMESTAMP_FUNCTIONS` over an integer column."""

    name: str
    source: str
    function: Optional[str] = None

    def __post_init__(self):
        if self.function is not None and self.function not in TIMESTAMP_FUNCTIONS:
            raise ValueError(f"a line task cannot compute {self.function}()")

    @property
    def scale(self) -> int:
        return TIMESTAMP_FUNCTIONS[self.function]

    def accepts(self, source_type: pa.DataType) -> bool:
        """Whether the line task computes this column from a ``source`` column
        of ``source_type`` as Spark does (integers only: Spark casts anything
        else first, with its own rules)."""
        return self.function is None or pa.types.is_integer(source_type)

    def in_range(self, values: pa.Array) -> np.ndarray:
        """Per row, whether Spark's product fits (NULL: yes, it stays NULL)."""
        if self.function is None or self.scale == 1:
            return np.ones(len(values), dtype=bool)
        v = np.asarray(pc.fill_null(values.cast(pa.int64()), 0).to_numpy(zero_copy_only=False), dtype=np.int64)
        # Math.multiplyExact(v, scale) fits when MIN <= v * scale <= MAX
        low, high = -((-_INT64.min) // self.scale), _INT64.max // self.scale
        return (v >= low) & (v <= high)

    def evaluate(self, values: pa.Array) -> pa.Array:
        """The column's values from ``source``'s (rows :meth:`in_range`)."""
        if self.function is None:
            return values
        micros = pc.multiply(values.cast(pa.int64()), pa.scalar(self.scale, pa.int64()))
        return micros.cast(UTC_MICROS)


def computable(columns: Sequence[LineColumn], rows: pa.Table) -> np.ndarray:
    """Per row of ``rows`` (the reader's columns), whether every column of
    ``columns`` is computed here as Spark computes it."""
    ok = np.ones(rows.num_rows, dtype=bool)
    for c in columns:
        if c.function is not None:
            ok &= c.in_range(_flat(rows.column(c.source)))
    return ok


def project(columns: Sequence[LineColumn], rows: pa.Table) -> dict[str, pa.Array]:
    """The values of ``columns`` over ``rows`` (all :func:`computable`), by name."""
    return {c.name: c.evaluate(_flat(rows.column(c.source))) for c in columns}


def _flat(column) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


__all__ = ["LineColumn", "TIMESTAMP_FUNCTIONS", "computable", "project"]
