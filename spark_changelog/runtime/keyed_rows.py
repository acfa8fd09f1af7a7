"""The rows of a keyed step on Spark, shared by its streaming variants
(:mod:`~spark_changelog.runtime.spark_keyed`, :mod:`~spark_changelog.runtime.spark_seen_keys`,
:mod:`~spark_changelog.runtime.spark_event_time`): the Arrow and Spark schemas
operators see, a key group's rows between Arrow and pandas, and the side rows
that carry operator counters (docs/runtime.md, "Packed key groups").

The runtime's layers import one way (tests/plan/test_layers.py): these
helpers, then the keyed steps that use them, then the pipeline.
"""
from __future__ import annotations

import json
import zlib
from typing import Iterator, Optional

import numpy as np
import pandas as pd
import pyarrow as pa

from ..model import KIND_COL, METRICS_COL, METRICS_KIND
from ..operators.base import KeyedOperator, Metrics, OpContext
from ..operators.kernels import arrow_to_pandas

#: the key-group column of a keyed step's input (``pmod(hash(key), G)``)
KEY_GROUP_COL = "_kg"


def arrow_schema_of(df) -> pa.Schema:
    """The Arrow schema operators see of ``df`` (a DataFrame or its Spark
    schema).  TIMESTAMP columns are UTC instants
    (``timestamp[us, tz=UTC]``): the runtime hands operators tz-aware UTC
    values whatever the session time zone, so state and event times never
    depend on it (:func:`utc_timestamps`)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType
    return to_arrow_schema(df if isinstance(df, StructType) else df.schema, timezone="UTC")


def operator_schema_of(df) -> pa.Schema:
    """:func:`arrow_schema_of` with every field nullable: what an operator is
    built with.  Operators emit side rows (every data column null) among
    their rows, and an outer join or an aggregate may emit nulls, so a
    ``NOT NULL`` input column (a DataFrame's) must not make their Arrow
    output ``NOT NULL`` (pyarrow refuses the side row)."""
    return pa.schema([f.with_nullable(True) for f in arrow_schema_of(df)])


def output_schema_with_metrics(operator: KeyedOperator) -> pa.Schema:
    return operator.output_schema.append(pa.field(METRICS_COL, pa.string()))


def spark_schema(schema: pa.Schema):
    from pyspark.sql.pandas.types import from_arrow_schema
    return from_arrow_schema(schema)


def operator_instance(operator: KeyedOperator) -> int:
    """Tells apart two operators of one kind in a plan (the normalizes of both
    join sides) in the same way in every worker process: a checksum of what
    the operator reads (Python's ``hash`` of a string differs per process)."""
    return zlib.crc32(",".join([operator.name, *operator.key, *operator.input_schema.names]).encode())


def metrics_row(operator: KeyedOperator, metrics: Metrics, extra: Optional[dict] = None) -> pd.DataFrame:
    payload = {"operator": operator.name, "instance": operator_instance(operator),
               "counters": dict(metrics.counters), "warnings": metrics.warnings[:20]}
    if metrics.side_rows:
        # side outputs (late rows of windows) travel on the side-row channel too
        payload["side"] = metrics.side_rows
    if extra:
        payload.update(extra)
    row = {f.name: [None] for f in operator.output_schema}
    row[KIND_COL] = [METRICS_KIND]
    row[METRICS_COL] = [json.dumps(payload)]
    return pd.DataFrame(row)


def with_metrics(out: pd.DataFrame, operator: KeyedOperator, ctx: OpContext,
                  extra=None) -> Iterator[pd.DataFrame]:
    """The output frame (with an empty metrics column), then the metrics row:
    two frames rather than one ``pd.concat``, which re-checked every column
    for all-NA blocks (a fifth of a batch's Python time, py-spy)."""
    if not out.empty:
        out[METRICS_COL] = None
        yield out
    yield metrics_row(operator, ctx.metrics, extra)


#: how a key group's frames go to Arrow: pyarrow converts a frame of more
#: than 100 rows per column on a thread pool it starts for the call
#: (``pandas_compat.dataframe_to_arrays``), two new threads per key group and
#: link that cost more than the conversion itself, and Spark already runs one
#: Python worker per task slot (docs/runtime.md, "Chained keyed operators")
FROM_PANDAS = {"preserve_index": False, "nthreads": 1}


def arrow_output(out: pd.DataFrame, passed: Optional[pd.DataFrame], operator: KeyedOperator,
                  ctx: OpContext, extra=None) -> pa.Table:
    """One key group's batch output as Arrow: data rows, pass-through side
    rows, the metrics row (``pa.concat_tables``: no copy of the data)."""
    schema = output_schema_with_metrics(operator)
    parts = []
    if passed is not None:
        parts.append(pa.Table.from_pandas(passed, schema=schema, **FROM_PANDAS))
    if out is not None and not out.empty:
        data = pa.Table.from_pandas(out, schema=operator.output_schema, **FROM_PANDAS)
        parts.append(data.append_column(METRICS_COL, pa.nulls(len(data), pa.string())))
    if ctx is not None:
        parts.append(pa.Table.from_pandas(metrics_row(operator, ctx.metrics, extra), schema=schema,
                                          **FROM_PANDAS))
    return pa.concat_tables(parts)


def arrow_input(table: pa.Table, columns, time_zone: Optional[str]) -> pd.DataFrame:
    """A key group's rows (Arrow, as Spark sends them to ``applyInArrow``) as
    the operator's pandas frame (:func:`arrow_rows`)."""
    return arrow_to_pandas(arrow_rows(table, columns, time_zone))


def arrow_rows(table: pa.Table, columns, time_zone: Optional[str]) -> pa.Table:
    """A key group's rows (Arrow, as Spark sends them) under the operator's
    column names, without the key-group column, TIMESTAMP columns tz-aware
    UTC as in :func:`utc_timestamps` (a zoned value keeps its instant; a
    naive one is read in the session time zone)."""
    import pyarrow.compute as pc
    table = table.rename_columns(list(columns))
    for i, f in enumerate(table.schema):
        if pa.types.is_timestamp(f.type) and f.type.tz != "UTC":
            col = table.column(i)
            if f.type.tz is None:
                col = pc.assume_timezone(col, time_zone or "UTC", ambiguous="latest", nonexistent="latest")
            table = table.set_column(i, f.name, col.cast(pa.timestamp(f.type.unit, tz="UTC")))
    if KEY_GROUP_COL in table.column_names:
        table = table.drop_columns([KEY_GROUP_COL])
    return table


#: the key group of an upstream operator's metric rows: passed through, no state
METRICS_GROUP = -1


def split_upstream_metrics(pdf: pd.DataFrame, operator: KeyedOperator
                           ) -> tuple[pd.DataFrame, Optional[pd.DataFrame]]:
    """An upstream operator's metric rows travel through this operator (in key
    group :data:`METRICS_GROUP`), re-shaped to its output schema, so a
    pipeline's report has every operator's counters.  Returns (data rows
    without the metrics column, pass-through rows or None)."""
    if METRICS_COL not in pdf.columns:
        return pdf, None
    is_metric = pdf[KIND_COL].to_numpy(dtype=np.int64) == METRICS_KIND
    passed = _passed_rows(pdf.loc[is_metric, METRICS_COL].tolist(), operator) if is_metric.any() else None
    data = pdf[~is_metric].drop(columns=[METRICS_COL]).reset_index(drop=True)
    return data, passed


def _passed_rows(payloads: list, operator: KeyedOperator) -> pd.DataFrame:
    """Upstream metric rows' ``payloads`` re-shaped to ``operator``'s output
    schema, to pass through it."""
    row = {f.name: [None] * len(payloads) for f in operator.output_schema}
    row[KIND_COL] = [METRICS_KIND] * len(payloads)
    row[METRICS_COL] = payloads
    return pd.DataFrame(row)


def split_upstream_metrics_arrow(table: pa.Table, operator: KeyedOperator
                                 ) -> tuple[pa.Table, Optional[pd.DataFrame]]:
    """:func:`split_upstream_metrics` of Arrow rows: (the data rows, still
    Arrow, without the metrics column; the pass-through rows or None)."""
    if METRICS_COL not in table.column_names:
        return table, None
    is_metric = table.column(KIND_COL).to_numpy(zero_copy_only=False).astype(np.int64) == METRICS_KIND
    passed = None
    if is_metric.any():
        passed = _passed_rows(table.column(METRICS_COL).filter(pa.array(is_metric)).to_pylist(), operator)
        table = table.filter(pa.array(~is_metric))
    return table.drop_columns([METRICS_COL]), passed


def utc_timestamps(pdf: pd.DataFrame, time_zone: Optional[str]) -> pd.DataFrame:
    """Spark gives TIMESTAMP columns to pandas as naive wall-clock times of the
    session time zone; operators get them as tz-aware UTC instants (the type
    of :func:`arrow_schema_of`), so event times and stored state do not depend
    on the session's zone.  Spark converts tz-aware output back itself."""
    for c in pdf.columns:
        col = pdf[c]
        if pd.api.types.is_datetime64_dtype(col.dtype):   # naive only
            local = col.dt.tz_localize(time_zone or "UTC", ambiguous=np.zeros(len(col), dtype=bool),
                                       nonexistent="shift_forward")
            pdf[c] = local.dt.tz_convert("UTC")
    return pdf
