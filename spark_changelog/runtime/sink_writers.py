"""The sink writers: the layer between the keyed step and the driver's commit
(docs/runtime.md, "Sink writers on the executors").

A micro-batch's output stays distributed.  It is repartitioned by the sink
key (every change of a key in one partition; not when every stage keeps
nothing, ``needs_key_together = False``: blackhole) and each partition, on an
executor, is: put back in the order the driver would have collected it (its
position before the shuffle, ``monotonically_increasing_id``, which orders
like ``toArrow``), split into side rows, changes with a null sink key and
data rows, and its data rows handed to each stage's writer
(``stage.write_partition``): the changelog output's part file, then the
upsert sink's (PostgreSQL ``COPY`` into the batch's staging table, Delta data
files and deletion-vector positions).  What comes back to the driver is
small: the side rows (counters, dead letters), the null-key rejects, and per
partition and stage its counts.  The driver then commits each stage in one
step (``stage.commit``).

Only picklable config travels: the stage objects (paths, connection string,
table names, columns), the key and the table name.

The last keyed operator's output may reach the writers *packed*
(:func:`pack_output`: one Arrow blob per key group, made by its processor)
instead of as rows: every change then crossed from the operator's Python
worker to the JVM as a Spark row and back to the writer's Python worker as
Arrow, about two changes per input row for keep-last dedup (docs/runtime.md,
"Where the time goes").  The writers unpack it (:func:`unpack_output`).  A
key group's output is one blob, in one partition, so when the sink key
contains the operator's key (the condition ``plan/execute.py`` checks before
it asks for the packed output) every change of a sink key is in one
partition already and the writers do not repartition.
"""
from __future__ import annotations

import json
from typing import Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ..model import KIND_COL, METRICS_COL, METRICS_KIND, PACKED_GROUP_COL, PACKED_ROWS_COL
from ..model.source_watermarks import is_watermark_payload

#: what each partition sends back to the driver: ``kind`` = ``side`` (a side
#: row's payload), ``reject`` (a null-key change's dead-letter record) or
#: ``written`` (the partition's counts), ``payload`` as JSON
RESULT_SCHEMA = "kind string, payload string"
_RESULT_ARROW = pa.schema([("kind", pa.string()), ("payload", pa.string())])
POSITION_COL = "__spark_changelog_pos"


def split_side_rows(table: pa.Table) -> tuple[pa.Table, list[dict]]:
    """Operator output (Arrow) -> (data rows, still Arrow, and the side-row
    payloads); only the few side rows are decoded."""
    if METRICS_COL not in table.column_names:
        return table, []
    is_metric = pc.fill_null(pc.equal(table[KIND_COL], METRICS_KIND), False)
    if not pc.any(is_metric).as_py():
        return table.drop_columns([METRICS_COL]), []
    # watermark rows no event-time operator consumed (a stream with a
    # watermark and no window) carry nothing for the report
    metrics = [p for p in (json.loads(s) for s in table.filter(is_metric)[METRICS_COL].to_pylist())
               if not is_watermark_payload(p)]
    return table.filter(pc.invert(is_metric)).drop_columns([METRICS_COL]), metrics


def pack_output(table: pa.Table) -> list[tuple[int, bytes]]:
    """A keyed step's output (one key group's rows, side rows and metrics
    row; ``KeyGroupProcessor``'s ``pack``) as one blob for the sink
    writers: uncompressed, since it stays in its stage (no shuffle between
    the keyed step and the writers)."""
    from .arrow_packing import pack
    return [(0, pack(table, compress=False))] if table.num_rows else []


def is_packed(columns) -> bool:
    return PACKED_ROWS_COL in columns


def unpack_output(table: pa.Table) -> pa.Table:
    """A batch's rows (Arrow, as collected or as a partition's batches) with
    packed rows (:func:`pack_output`) unpacked, in the blobs' order, with the
    columns and types of the rows beside them (the keyed step's output as
    Spark types it); rows without packed columns as they are."""
    if not is_packed(table.column_names):
        return table
    from .arrow_packing import conform, unpack
    schema = pa.schema([f for f in table.schema if f.name not in (PACKED_GROUP_COL, PACKED_ROWS_COL)])
    blobs = [b for b in table.column(PACKED_ROWS_COL).to_pylist() if b is not None]
    return conform(unpack(blobs), schema) if blobs else schema.empty_table()


class PartitionWriter:
    """``mapInArrow`` function of the sink writers (picklable)."""

    def __init__(self, stages: Sequence, key: Sequence[str], table_name: str):
        self.stages, self.key, self.table_name = tuple(stages), tuple(key), table_name

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        from ..sinks.base import split_null_keys_arrow
        batches = list(batches)
        if not batches:
            return
        table = unpack_output(pa.Table.from_batches(batches))
        if POSITION_COL in table.column_names:
            table = table.sort_by(POSITION_COL).drop_columns([POSITION_COL])
        data, payloads = split_side_rows(table)
        data, rejects = split_null_keys_arrow(data, self.key, self.table_name)
        kinds, out = [], []
        for p in payloads:
            kinds.append("side")
            out.append(json.dumps(p, default=str))
        for r in (json.loads(rejects.to_json(orient="records")) if len(rejects) else []):
            kinds.append("reject")
            out.append(json.dumps(r, default=str))
        partition = TaskContext.get().partitionId()
        for i, stage in enumerate(self.stages):
            counts = stage.write_partition(data, partition)
            kinds.append("written")
            out.append(json.dumps(dict(counts, rows=data.num_rows, stage=i)))
        yield pa.RecordBatch.from_arrays([pa.array(kinds, pa.string()), pa.array(out, pa.string())],
                                         schema=_RESULT_ARROW)


def write_partitions(df, stages: Sequence, key: Sequence[str], table_name: str
                     ) -> tuple[list[dict], list[dict], list[list[dict]]]:
    """Run the sink writers of ``stages`` over the batch ``df`` -> (side-row
    payloads, null-key rejects, per stage its per-partition counts), the only
    things collected."""
    from pyspark.sql import functions as F
    if key and not is_packed(df.columns) and any(getattr(stage, "needs_key_together", True)
                                                 for stage in stages):
        tagged = df.withColumn(POSITION_COL, F.monotonically_increasing_id())
        shuffled = tagged.repartition(*[F.col(k) for k in key])
    else:
        # a sink without a key, sinks that keep nothing (blackhole), or a
        # packed output (a sink key's changes in one blob, module docstring):
        # the partitions as they are, in their own order (no shuffle, as
        # Flink's blackhole has none)
        shuffled = df
    side, rejects, written = [], [], [[] for _ in stages]
    for row in shuffled.mapInArrow(PartitionWriter(stages, key, table_name), RESULT_SCHEMA).collect():
        payload = json.loads(row["payload"])
        if row["kind"] == "written":
            written[payload.pop("stage")].append(payload)
        else:
            (side if row["kind"] == "side" else rejects).append(payload)
    return side, rejects, written
