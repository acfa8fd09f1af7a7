"""A sink table that holds the SCD type 2 history of what is inserted into it
(docs/sql.md, "History tables"; docs/operators.md, "SCD type 2 history").

The choice: table options of the sink, not a new statement.  A Flink SQL
script stays a Flink SQL script (``CREATE TABLE`` + ``INSERT INTO``), the
history is a property of where the rows go (like Databricks' ``STORED AS SCD
TYPE 2`` on the target), and every query can feed one: a join's or an
aggregation's result too::

    CREATE TABLE customers_history (
      id BIGINT, name STRING, city STRING,
      __START_AT BIGINT, __END_AT BIGINT,
      PRIMARY KEY (id, __START_AT) NOT ENFORCED
    ) WITH ('connector' = 'delta', 'path' = '...',
            'spark-changelog.scd-type' = '2',
            'spark-changelog.track-history' = 'name',         -- optional
            'spark-changelog.ignore-null-updates' = 'true',   -- optional
            'spark-changelog.sequence-by' = 'ts');            -- optional
    INSERT INTO customers_history SELECT id, name, city FROM customers;

The query gives the columns other than ``__START_AT``/``__END_AT``; the
history's key is the primary key without ``__START_AT``.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from ..model import as_key
from ..model.history import history_columns
from .context import Context
from .script import TableDef


@dataclasses.dataclass(frozen=True)
class HistorySink:
    key: tuple
    sequence_by: tuple
    track_history: Optional[tuple]
    ignore_null_updates: bool

    @property
    def columns(self) -> tuple:
        """The ``__START_AT``/``__END_AT`` columns (not given by the query)."""
        start, end = history_columns(self.sequence_by)
        return start + end

    def apply(self, stream):
        return stream.history(self.key, sequence_by=self.sequence_by or None,
                              track_history=self.track_history,
                              ignore_null_updates=self.ignore_null_updates)


def history_sink(ctx: Context, table: TableDef) -> Optional[HistorySink]:
    """The table's history options, or ``None`` for a plain upsert table."""
    c = table.connector
    scd = c.option("spark-changelog.scd-type", "1")
    if scd == "1":
        extra = [k for k in ("spark-changelog.track-history", "spark-changelog.ignore-null-updates",
                             "spark-changelog.sequence-by") if c.option(k) is not None]
        if extra:
            raise ctx.error(f"table {table.name}: {', '.join(map(repr, extra))} need "
                            "'spark-changelog.scd-type' = '2'", table.position)
        return None
    if scd != "2":
        raise ctx.error(f"table {table.name}: 'spark-changelog.scd-type' must be '1' or '2', "
                        f"got {scd!r}", table.position)
    ignore = c.option("spark-changelog.ignore-null-updates", "false").lower()
    if ignore not in ("true", "false"):
        raise ctx.error(f"table {table.name}: 'spark-changelog.ignore-null-updates' must be "
                        f"'true' or 'false', got {ignore!r}", table.position)
    tracked = c.option("spark-changelog.track-history")
    spec = HistorySink((), as_key(c.option("spark-changelog.sequence-by")),
                       as_key(tracked) if tracked is not None else None, ignore == "true")
    start = history_columns(spec.sequence_by)[0]
    missing = [n for n in spec.columns if n not in table.column_names]
    if missing or not set(start) <= set(table.primary_key):
        raise ctx.error(f"table {table.name}: an SCD type 2 history table declares the columns "
                        f"{', '.join(spec.columns)} and has PRIMARY KEY (key..., "
                        f"{', '.join(start)}) NOT ENFORCED", table.position)
    key = tuple(k for k in table.primary_key if k not in start)
    if not key:
        raise ctx.error(f"table {table.name}: the primary key needs the history's key columns "
                        f"besides {', '.join(start)}", table.position)
    return dataclasses.replace(spec, key=key)


__all__ = ["HistorySink", "history_sink"]
