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

from ..model import KIND_COL, METRICS_COL, METRICS_KIND, SEQ_COL
from ..operators.base import KeyedOperator, OpContext
from .keygroup import sort_rows
from .keyed_rows import (arrow_input, arrow_output, output_schema_with_metrics, spark_schema,
                         split_upstream_metrics)


#: apply_seen_keys: a unique id per side row (null for data rows), so Spark's
#: deduplication never takes a side row for a duplicate
SIDE_ID_COL = "_side_id"
#: Spark conf: tasks of the step choosing each key's first row of a micro-batch.
#: 1: the batch in one Python task, no shuffle before it; more: the batch
#: repartitioned by key over that many tasks, and shuffled again for the
#: deduplication (docs/runtime.md, "Keep first on processing time").  Default:
#: :func:`default_first_step_tasks`.
FIRST_STEP_TASKS_CONF = "spark_changelog.keepFirst.firstStepTasks"
#: a data row's position in the micro-batch partition (pandas side only)
_POS = "__position"


def default_first_step_tasks(spark) -> int:
    """1 on a local master (a laptop's micro-batches, where a Python task's
    fixed cost outweighs its work); on a cluster the shuffle partitions, so
    a large micro-batch is not read and deduplicated in one task."""
    from ..connectors.session_info import master_of
    if master_of(spark).startswith("local"):
        return 1
    return int(spark.conf.get("spark.sql.shuffle.partitions"))


def _task_scope() -> str:
    """Micro-batch and partition of the running task (``batch/partition``)."""
    from pyspark import TaskContext
    task = TaskContext.get()
    if task is None:
        return "-/-"
    return f"{task.getLocalProperty('streaming.sql.batchId') or '-'}/{task.partitionId()}"


def apply_seen_keys(df, operator: KeyedOperator):
    """Streaming run of an operator whose state is only the set of keys seen
    (``operator.state_is_seen_keys``: keep first on processing time): a
    ``mapInArrow`` step over all of a key's rows of the micro-batch keeps each
    key's first row of the batch by ``_seq`` (``operator.first_in_batch``: its
    ``process`` on an empty state);
    Spark's streaming ``dropDuplicates`` on the key then drops the keys seen in
    earlier batches, with the seen keys in its state store (key only, no row
    payload).

    On a local master the step runs in one task per micro-batch (conf
    :data:`FIRST_STEP_TASKS_CONF`, :func:`default_first_step_tasks`): the input partitions of the batch are
    coalesced (no shuffle), so the batch has one shuffle, the one the
    deduplication needs, and one Python task: a Python task has a fixed cost
    of ~40-50 ms here, more than its work on a 100k-row batch (~0.1 s of
    Python CPU per batch in one task against ~0.22 s in four).  The stage
    before the step (reading the files, say) runs in that one task too: for
    large batches on a cluster, set the conf to the parallelism wanted.

    Spark cannot sort a streaming DataFrame, and its ``dropDuplicates`` keeps
    whichever row of a batch it meets first, so it alone would not be exact;
    after the step each key has one row per batch.  Only the key columns,
    ``_kind`` and ``_seq`` go to pandas; the kept rows are taken from the
    Arrow input as they are (the emitted row is the input row).  Side rows
    pass with a unique id in :data:`SIDE_ID_COL` (dropped after), so they are
    never duplicates; they stay in the deduplication state as ids (a few per
    batch).  The operator's counters cover each batch (``duplicates``: within
    the batch); rows of keys seen in earlier batches are counted by Spark's
    query progress (``numDroppedDuplicateRows``)."""
    import pyarrow.compute as pc
    from pyspark.sql import functions as F
    key = list(operator.key)
    columns = df.columns
    narrow = key + [KIND_COL, SEQ_COL]
    time_zone = df.sparkSession.conf.get("spark.sql.session.timeZone")
    data_schema = operator.output_schema
    out_schema = output_schema_with_metrics(operator).append(pa.field(SIDE_ID_COL, pa.string()))

    def first_rows(batches):
        batches = [b for b in batches if b.num_rows]
        if not batches:
            return
        # Spark may hand "_"-prefixed columns over renamed: restore the names
        table = pa.Table.from_batches(batches).rename_columns(columns)
        is_side = np.zeros(table.num_rows, dtype=bool)
        if METRICS_COL in columns:
            is_side = pc.fill_null(pc.equal(table.column(KIND_COL), METRICS_KIND),
                                   False).to_numpy(zero_copy_only=False)
        ctx = OpContext(processing_time_ms=int(time.time() * 1000))
        parts = []
        data_pos = np.flatnonzero(~is_side)
        if len(data_pos):
            rows = arrow_input(table.select(narrow).take(data_pos), narrow, time_zone)
            rows[_POS] = data_pos
            rows = sort_rows(rows, key)
            keep = np.sort(rows[_POS].to_numpy()[operator.first_in_batch(rows, ctx)])
            kept = table.take(keep)
            n = kept.num_rows
            # the emitted rows are the input rows as they are (first_in_batch)
            arrays = [kept.column(f.name).cast(f.type) for f in data_schema]
            arrays += [pa.nulls(n, pa.string()), pa.nulls(n, pa.string())]
            parts.append(pa.Table.from_arrays(arrays, schema=out_schema))
        passed = None
        if is_side.any():
            _, passed = split_upstream_metrics(
                arrow_input(table.filter(pa.array(is_side)), columns, time_zone), operator)
        side = arrow_output(None, passed, operator, ctx, {"state_rows": 0})
        # a unique id on the few side rows only, the same when a micro-batch
        # is replayed (docs/runtime.md, "Replay is deterministic")
        scope = _task_scope()
        ids = pa.array([f"{scope}/{i}" for i in range(side.num_rows)], pa.string())
        parts.append(side.append_column(SIDE_ID_COL, ids).cast(out_schema))
        yield from pa.concat_tables(parts).to_batches()

    tasks = int(df.sparkSession.conf.get(FIRST_STEP_TASKS_CONF, "0")) or default_first_step_tasks(df.sparkSession)
    # one task: the batch's partitions are read in one task (coalesce: no
    # shuffle), so the only shuffle is the one the deduplication needs
    grouped = (df.coalesce(1) if tasks == 1 else
               df.repartition(tasks, *[F.col(k) for k in key]))
    firsts = grouped.mapInArrow(first_rows, spark_schema(out_schema))
    return firsts.dropDuplicates(key + [SIDE_ID_COL]).drop(SIDE_ID_COL)
