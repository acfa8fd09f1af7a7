"""Streaming keep first on processing time: Spark's own deduplication state.

An operator whose whole cross-batch state is the set of keys it has seen
(``KeyedOperator.state_is_seen_keys``) needs no run stack: Spark's streaming
``dropDuplicates`` keeps exactly that set in its state store
(docs/runtime.md, "Keep first on processing time: Spark's own dedup state").
"""
from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from ..model import KIND_COL, METRICS_KIND
from ..operators.base import KeyedOperator, OpContext
from .keygroup import process_key_group
from .spark_keyed import (_arrow_input, _arrow_output, output_schema_with_metrics, spark_schema,
                          split_upstream_metrics)


#: apply_seen_keys: a unique id per side row (null for data rows), so Spark's
#: deduplication never takes a side row for a duplicate
SIDE_ID_COL = "_side_id"


def apply_seen_keys(df, operator: KeyedOperator):
    """Streaming run of an operator whose state is only the set of keys seen
    (``operator.state_is_seen_keys``: keep first on processing time): the
    operator's own ``process`` on an empty state, in a ``mapInArrow`` step over
    all of a key's rows of the micro-batch (repartitioned by the key), keeps
    each key's first row of the batch by ``_seq``; Spark's streaming
    ``dropDuplicates`` on the key then drops the keys seen in earlier batches,
    with the seen keys in its state store (key only, no row payload).

    Spark cannot sort a streaming DataFrame, and its ``dropDuplicates`` keeps
    whichever row of a batch it meets first, so it alone would not be exact;
    after the step each key has one row per batch.  Side rows pass with a
    unique id in :data:`SIDE_ID_COL` (dropped after), so they are never
    duplicates; they stay in the deduplication state as ids (a few per batch).
    The operator's counters cover each batch (``duplicates``: within the
    batch); rows of keys seen in earlier batches are counted by Spark's query
    progress (``numDroppedDuplicateRows``)."""
    import uuid

    from pyspark.sql import functions as F
    key = list(operator.key)
    columns = df.columns
    time_zone = df.sparkSession.conf.get("spark.sql.session.timeZone")
    partitions = int(df.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    out_schema = output_schema_with_metrics(operator).append(pa.field(SIDE_ID_COL, pa.string()))

    def first_rows(batches):
        batches = [b for b in batches if b.num_rows]
        if not batches:
            return
        table = pa.Table.from_batches(batches)
        pdf, passed = split_upstream_metrics(_arrow_input(table, columns, time_zone), operator)
        ctx = OpContext(processing_time_ms=int(time.time() * 1000))
        out = process_key_group(operator, None, pdf, ctx) if not pdf.empty else None
        result = _arrow_output(out, passed, operator, ctx, {"state_rows": 0})
        # a unique id on the few side rows only, null on the data rows (no per-row Python)
        side = np.flatnonzero(result.column(KIND_COL).to_numpy(zero_copy_only=False) == METRICS_KIND)
        ids = np.full(result.num_rows, None, dtype=object)
        ids[side] = [uuid.uuid4().hex for _ in range(len(side))]
        yield from result.append_column(SIDE_ID_COL, pa.array(ids, pa.string())).to_batches()

    firsts = (df.repartition(partitions, *[F.col(k) for k in key])
              .mapInArrow(first_rows, spark_schema(out_schema)))
    return firsts.dropDuplicates(key + [SIDE_ID_COL]).drop(SIDE_ID_COL)
