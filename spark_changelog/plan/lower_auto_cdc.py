"""Lowering of the Auto CDC nodes (``ApplyAs``, ``History``); part of
``plan.lower``, the one place that builds operators and DataFrames.

docs/operators.md, "Auto CDC" and "SCD type 2 history".
"""
from __future__ import annotations

import dataclasses

from ..model import KIND_COL, METRICS_COL, METRICS_KIND, SEQ_COL
from ..model.rowkind import RowKind
from ..runtime.keyed_rows import arrow_schema_of
from .nodes import ApplyAs, History
from .rules import PlanError


def _condition(condition):
    """A Spark SQL condition (text, or the user's Column); null is false."""
    from pyspark.sql import functions as F
    return F.coalesce(F.expr(condition) if isinstance(condition, str) else condition,
                      F.lit(False))


def lower_apply_as(node: ApplyAs, inp):
    """Deletes by condition, truncates as key-wise deletes, the sequence
    column as ``_seq``; side rows pass unchanged."""
    from pyspark.sql import functions as F
    df = inp.df
    kind = F.col(KIND_COL)
    is_data = kind != F.lit(METRICS_KIND)
    if node.resequence:
        (column,) = node.sequence_by
        dtype = dict(df.dtypes)[column]
        value = F.col(column)
        if dtype.startswith("timestamp"):
            value = F.unix_micros(value.cast("timestamp"))
        elif dtype not in ("tinyint", "smallint", "int", "bigint"):
            raise PlanError(f"sequence_by column {column!r} has type {dtype}: the table (SCD "
                            "type 1) orders by one integer or timestamp column")
        df = df.withColumn(SEQ_COL, F.when(is_data, value.cast("bigint")).otherwise(F.col(SEQ_COL)))
    if node.delete_when:
        delete = F.lit(int(RowKind.DELETE)).cast(df.schema[KIND_COL].dataType)
        df = df.withColumn(KIND_COL, F.when(is_data & _condition(node.delete_when), delete)
                           .otherwise(kind))
    if node.truncate_when:
        df = _truncates_as_deletes(df, node)
    return dataclasses.replace(inp, frame=df, reader=None)


def _truncates_as_deletes(df, node: ApplyAs):
    """A truncate at sequence T deletes every key at T: one delete per (key
    seen in the input, truncate), so the keyed operators apply it like any
    delete, in sequence order, whatever order changes arrive in.  The pairs
    are an equi-join on a constant of the distinct keys with the truncates:
    in a streaming run a stream-stream join whose state keeps both sides, so
    a key first seen after a truncate still gets its delete (a no-op when the
    key's changes are all later) and a truncate reaches every key seen
    before it.  The input is read three times (changes, keys, truncates)."""
    from pyspark.sql import functions as F
    if not node.key:
        raise PlanError("apply_as_truncates needs the keys")
    is_data = F.col(KIND_COL) != F.lit(METRICS_KIND)
    truncate = is_data & _condition(node.truncate_when)
    rest = df.where(~truncate)
    one = "__truncate_join"
    keys = (rest.where(is_data).select(*node.key).dropDuplicates(list(node.key))
            .withColumn(one, F.lit(1)))
    placed = [c for c in node.sequence_by if c not in node.key]
    at = df.where(truncate).select(*placed, SEQ_COL).withColumn(one, F.lit(1))
    deletes = keys.join(at, one).drop(one).withColumn(
        KIND_COL, F.lit(int(RowKind.DELETE)).cast(df.schema[KIND_COL].dataType))
    return rest.unionByName(deletes, allowMissingColumns=True)


def lower_history(node: History, inp, keyed):
    """The history operator (or the type 1 table of the same changes) over
    the history's columns and the sequence columns: one keyed step."""
    from ..operators.scd2 import ScdType1Table, ScdType2History
    from .lower import data_rows
    columns = node.data_columns
    keep = list(dict.fromkeys(list(columns) + list(node.sequence_by)))
    df = inp.df
    wanted = keep + [KIND_COL, SEQ_COL] + ([METRICS_COL] if METRICS_COL in df.columns else [])
    if list(df.columns) != wanted:
        df = df.select(*wanted)
        inp = dataclasses.replace(inp, frame=df, reader=None)
    cls = ScdType2History if node.scd_type == 2 else ScdType1Table
    op = cls(arrow_schema_of(data_rows(df)), node.key, sequence_by=node.sequence_by,
                         columns=columns, track_history=node.track_history,
                         ignore_null_updates=node.ignore_null_updates)
    return keyed(inp, df, op, node.key_groups)


__all__ = ["lower_apply_as", "lower_history"]
