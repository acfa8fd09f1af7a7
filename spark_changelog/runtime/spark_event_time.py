"""Event-time operators on Spark with our own per-partition watermarks
(docs/windows.md, "On Spark").

Spark keeps one watermark per query and cannot express per-partition
watermarks, idleness or punctuated generators.  So the operators that wait
for event time (windows, event-time deduplication, ``ON CONFLICT DO
ERROR/NOTHING``) do not use Spark's watermark at all (``timeMode="None"``,
no timers):

1. one Arrow pass over the input (``mapInArrow``) assigns windows (the
   projection of :mod:`~spark_changelog.model.windows`) and
   summarises, per Spark partition, the progress each *source* partition's
   rows prove; the summary rows (``_kind = -2``) are copied to every key
   group, like Flink broadcasting watermarks to every downstream channel.
   Each key group's rows and the summary leave the pass as one row (a
   compressed Arrow IPC blob): Spark then shuffles and hands over a few rows
   per micro-batch instead of converting and sorting every input row;
2. ``transformWithStateInPandas`` groups by key group: each key group gets
   its data rows and the whole batch's summary rows, so every key group
   computes the same per-partition watermarks from the same state, keeps a
   copy of them in its checkpointed value state ``watermarks``, and fires its
   windows in the same call (:func:`~.event_time.run_event_time_batch`).

Processing time (idleness) is Spark's batch timestamp (``current_timestamp()``
in a streaming query), which Spark records in its offset log and reuses when
it replays a batch after a crash, so a replay judges idleness, lateness and
firing exactly as the first attempt did.
"""
from __future__ import annotations

import json
import time
from typing import Iterator, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import StringType, StructField, StructType

from ..model import KIND_COL, METRICS_COL, METRICS_KIND, PACKED_GROUP_COL, PACKED_ROWS_COL, SEQ_COL
from ..model.partitioning import spread_group_ids
from ..model.source_watermarks import is_watermark_payload, watermark_progress
from ..model.partition_watermarks import (FILE_PARTITIONS, EventTimeSpec,
                                          PartitionWatermarks)
from ..model.watermark import NO_WATERMARK
from ..model.windows import WindowAssigner, assign_windows
from ..operators.base import KeyedOperator
from .arrow_packing import PACKED_COL, conform, pack, packed_batch, packed_schema, unpack
from .line_columns import computable, project
from .source_watermarks import watermark_rows
from .event_time import batch_progress, run_event_time_batch
from .state_runs import RunStack
from .keyed_rows import (KEY_GROUP_COL, METRICS_GROUP, arrow_input, arrow_output, operator_schema_of,
                         output_schema_with_metrics, spark_schema, split_upstream_metrics,
                         with_metrics)
from .key_group_processor import BLOB_SCHEMA, META_SCHEMA, RUN_ID_SCHEMA, KeyGroupProcessor

#: ``_kind`` of a watermark summary row (never leaves the operator)
PROGRESS_KIND = -2
PART_COL = "_wm_partition"
PROGRESS_COL = "_wm_progress"
NOW_COL = "_wm_now"
_HELPERS = (PART_COL, PROGRESS_COL, NOW_COL)
#: key groups of an event-time operator unless the query says otherwise
EVENT_TIME_KEY_GROUPS = 2


#: the watermarks' value state, declared with a type (``key_group_processor.META_SCHEMA``)
_WATERMARKS = StructType([StructField("json", StringType())])


#: pandas' nullable dtype of each Arrow integer type (:func:`_key_groups_of`)
_NULLABLE = {pa.int8(): pd.Int8Dtype(), pa.int16(): pd.Int16Dtype(), pa.int32(): pd.Int32Dtype(),
             pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}


def _key_groups_of(table: pa.Table, key, key_groups: int) -> np.ndarray:
    """Each row's key group: a hash of its operator key, the same in every
    process and run (pandas' fixed-key SipHash), so a key's state stays in
    its key group across restarts.  Integer, boolean and timestamp columns
    convert to pandas' nullable types, whose hash of a value is the plain
    type's: a NULL among a piece's rows (a row without event time has no
    ``window_end``) does not turn the piece's integers into floats, which
    hash differently, so a key's group does not depend on the other rows
    of its piece."""
    cols = {}
    for k in key:
        col = table.column(k)
        if pa.types.is_timestamp(col.type):
            col = col.cast(pa.int64())
        cols[k] = col.to_pandas(types_mapper=_NULLABLE.get)
    h = pd.util.hash_pandas_object(pd.DataFrame(cols), index=False).to_numpy()
    return (h % np.uint64(key_groups)).astype(np.int32)


def _pack_by_key_group(data: pa.Table, key, key_groups: int, every: Optional[pa.Table] = None
                       ) -> list[tuple[int, bytes]]:
    """(key group id, packed rows) of ``data``'s rows per key group, in
    input order (the operator sorts by key and ``_seq`` itself); with
    ``every`` (the progress summary), one pair for every key group, also
    one without rows, each holding ``every``'s rows after its own."""
    kg = _key_groups_of(data, key, key_groups)
    order = np.argsort(kg, kind="stable")
    bounds = np.searchsorted(kg[order], np.arange(key_groups + 1))
    # one gather of the whole table (its chunks combined first: a take over
    # many chunks was the pass's largest cost), then a zero-copy slice per group
    data = data.combine_chunks().take(pa.array(order))
    out = []
    for g, group_id in enumerate(spread_group_ids(key_groups)):
        if every is None and bounds[g] == bounds[g + 1]:
            continue
        rows = data.slice(bounds[g], bounds[g + 1] - bounds[g])
        out.append((group_id, pack(rows if every is None else pa.concat_tables([rows, every]))))
    return out


def _watermark_rows(side: pa.Table) -> Optional[pd.DataFrame]:
    """The watermark rows among the side rows, as a progress table (None: none)."""
    payloads = [json.loads(m) if m else {} for m in side.column(METRICS_COL).to_pylist()]
    marks = [p for p in payloads if is_watermark_payload(p)]
    return watermark_progress(marks) if marks else None


def _project_and_pack(spec: EventTimeSpec, column: str, assigner: Optional[WindowAssigner],
                      key, key_groups: int, row_schema: pa.Schema, from_source: bool = False,
                      generate: Optional[tuple] = None):
    """The ``mapInArrow`` function of step 1 (module docstring): per key
    group, one output row holding all of this Spark partition's rows of the
    group plus the whole partition's progress summary, as one compressed
    Arrow IPC blob (``row_schema``).  ``from_source``: the progress is the
    watermark rows the sources generated, not the rows' own event times;
    they also pass on with the other side rows, so an event-time operator
    downstream (a window over this one's output) waits for the same
    watermarks, as Flink forwards them.  ``generate``: (generator, source,
    partition column) of the source's watermark, whose rows this pass
    generates itself, piece by piece as ``runtime.source_watermarks`` does
    (the window reads the source's rows with no step in between).  Rows a
    reader's line task packed (:class:`WindowLinePacker`) pass on as they
    are; their watermark rows count as received ones."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pieces, data_parts, side_parts = [], [], []
        #: the line task's packed data rows: (key group ids, blobs) arrays, passed on
        line_packed = []
        now = None
        for rb in batches:
            t = pa.Table.from_batches([rb])
            if not t.num_rows:
                continue
            if now is None:
                now = t.column(NOW_COL)[0]
            if PACKED_ROWS_COL in t.column_names:
                t, line_sides = _take_line_packed(t, line_packed)
                if line_sides is not None:
                    # the line task's watermark rows: side rows like the others
                    progress = _watermark_rows(line_sides)
                    if progress is not None:
                        pieces.append(progress)
                    side_parts.append(conform(line_sides, row_schema))
                if not t.num_rows:
                    continue
            kinds = t.column(KIND_COL).to_numpy(zero_copy_only=False)
            side = kinds == METRICS_KIND
            data = t.filter(pa.array(~side)) if side.any() else t
            if data.num_rows:
                if not from_source:
                    parts = data.column(PART_COL) if PART_COL in data.column_names else None
                    pieces.append(batch_progress(data, spec, parts))
                projected = (assign_windows(data, column, assigner) if assigner is not None
                             else data)
                data_parts.append(conform(projected, row_schema))
            rests = [t.filter(pa.array(side))] if side.any() else []
            if generate is not None:
                marks = watermark_rows(data, generate[0], generate[1], generate[2], data.schema)
                if marks is not None:
                    rests.append(pa.Table.from_batches([marks]))
            for rest in rests:
                if from_source:
                    progress = _watermark_rows(rest)
                    if progress is not None:
                        pieces.append(progress)
                side_parts.append(conform(rest, row_schema))
        packed = []
        if side_parts:
            packed.append((METRICS_GROUP, pack(pa.concat_tables(side_parts))))
        if pieces or data_parts or line_packed:
            prog = (pd.concat(pieces, ignore_index=True) if pieces else
                    pd.DataFrame({"partition": pd.Series([], dtype=object),
                                  "progress": np.zeros(0, dtype=np.int64)}))
            prog = prog.groupby("partition", sort=True)["progress"].max().reset_index()
            n = len(prog)
            cols = {}
            for f in row_schema:
                if f.name == KIND_COL:
                    cols[f.name] = pa.array(np.full(n, PROGRESS_KIND, np.int8))
                elif f.name == PART_COL:
                    cols[f.name] = pa.array(prog["partition"].to_numpy(object), pa.string())
                elif f.name == PROGRESS_COL:
                    cols[f.name] = pa.array(prog["progress"].to_numpy(np.int64))
                elif f.name == NOW_COL:
                    cols[f.name] = pa.array([now.as_py()] * n, f.type)
                else:
                    cols[f.name] = pa.nulls(n, f.type)
            summary = pa.table(cols, schema=row_schema)
            data = pa.concat_tables(data_parts) if data_parts else row_schema.empty_table()
            # every key group gets the summary, also one without rows: it may
            # have windows to fire
            packed += _pack_by_key_group(data, key, key_groups, every=summary)
        if packed or line_packed:
            out = packed_batch(packed, KEY_GROUP_COL)
            yield pa.record_batch([pa.concat_arrays([out.column(0)] + [g for g, _ in line_packed]),
                                   pa.concat_arrays([out.column(1)] + [b for _, b in line_packed])],
                                  schema=out.schema)

    return fn


def _take_line_packed(t: pa.Table, line_packed: list) -> tuple[pa.Table, Optional[pa.Table]]:
    """``t``'s rows the line task packed (:class:`WindowLinePacker`) taken
    out: each key group's data rows appended to ``line_packed`` as they are
    ((ids, blobs) Arrow arrays: no Python object per blob), its watermark
    rows (packed in :data:`METRICS_GROUP`) unpacked and returned.  Returns
    (the other rows without the packed columns, the watermark rows or None)."""
    is_packed = t.column(PACKED_ROWS_COL).is_valid()
    rest = t.filter(pc.invert(is_packed)).drop_columns([PACKED_GROUP_COL, PACKED_ROWS_COL])
    done = t.filter(is_packed).select([PACKED_GROUP_COL, PACKED_ROWS_COL]).combine_chunks()
    if not done.num_rows:
        return rest, None
    groups = done.column(0).chunk(0).cast(pa.int32())
    blobs = done.column(1).chunk(0).cast(pa.binary())
    side = pc.equal(groups, METRICS_GROUP)
    line_packed.append((groups.filter(pc.invert(side)), blobs.filter(pc.invert(side))))
    side_blobs = blobs.filter(side).to_pylist()
    return rest, (unpack(side_blobs) if side_blobs else None)


class WindowLinePacker:
    """What a reader's line task calls on the rows it finishes when a window
    reads the source's watermark with nothing but projections the line task
    computes between them (docs/runtime.md, "Packing in the line task";
    ``ReadResult.packed_rows``, ``debezium_arrow.PackingParser``): it does
    the work of :func:`_project_and_pack` on them.  It computes the
    projection's columns (``columns``, :mod:`.line_columns`), the source's
    watermark rows over them (``generate``: generator, source, as
    :func:`~.source_watermarks.watermark_rows` does per piece), the windows
    (``assigner`` on ``column``), and packs each key group's rows
    (``row_schema``, the packing pass's), the watermark rows in
    :data:`METRICS_GROUP`.  The packing pass passes the data blobs on and
    reads the watermark rows as it reads the ones it receives; every key
    group's progress summary it adds itself (it carries the batch's time).
    :meth:`leaves` names the rows Spark computes instead: those whose
    computed column Spark would fail on."""

    def __init__(self, columns: tuple, generate: tuple, column: str, assigner: WindowAssigner,
                 key, key_groups: int, row_schema: pa.Schema):
        self.columns, self.generate, self.column, self.assigner = columns, generate, column, assigner
        self.key, self.key_groups, self.row_schema = tuple(key), key_groups, row_schema

    def leaves(self, rows: pa.Table) -> np.ndarray:
        """Per finished row (the reader's columns, ``_kind``, ``_seq``),
        whether it is left to Spark's path."""
        return ~computable(self.columns, rows)

    def __call__(self, rows: pa.Table) -> list[tuple[int, bytes]]:
        values = project(self.columns, rows)
        values[KIND_COL], values[SEQ_COL] = rows.column(KIND_COL), rows.column(SEQ_COL)
        data = pa.table(values)
        generator, source = self.generate
        marks = watermark_rows(data, generator, source, None, self.row_schema)
        windowed = conform(assign_windows(data, self.column, self.assigner), self.row_schema)
        pairs = _pack_by_key_group(windowed, self.key, self.key_groups)
        if marks is not None:
            pairs.append((METRICS_GROUP, pack(pa.Table.from_batches([marks]))))
        return pairs


class EventTimeKeyGroupProcessor(KeyGroupProcessor):
    """A key group's run stack plus its copy of the watermark state (value
    state ``watermarks``, JSON), checkpointed by Spark with the rest."""

    def __init__(self, operator: KeyedOperator, spec: EventTimeSpec, columns, growth: float,
                 max_runs: int, time_zone: Optional[str] = None, report_group: int = 0,
                 key_groups: Optional[int] = None):
        super().__init__(operator, columns, growth, max_runs, time_zone, key_groups)
        self.spec = spec
        #: the key group (``_kg`` value) that reports the watermarks
        self.report_group = report_group

    def init(self, handle) -> None:
        # KeyGroupProcessor.init's variables
        self.handle = handle
        self.meta = handle.getValueState("meta", META_SCHEMA)
        self.runs = handle.getMapState("runs", RUN_ID_SCHEMA, BLOB_SCHEMA)
        # no "timer" variable: this processor fires from its own watermarks,
        # without Spark's timers (each declaration costs the JVM 10-130 ms per task)
        self.watermarks = handle.getValueState("watermarks", _WATERMARKS)

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        op = self.operator
        pdf, passed = split_upstream_metrics(self._unpacked(rows), op)
        if passed is not None:
            yield passed
        if pdf.empty:
            return
        t0 = time.perf_counter()
        kinds = pdf[KIND_COL].to_numpy(dtype=np.int64)
        summary = pdf[kinds == PROGRESS_KIND]
        data = pdf[kinds != PROGRESS_KIND].drop(columns=list(_HELPERS)).reset_index(drop=True)
        progress = now = None
        if len(summary):
            progress = pd.DataFrame({"partition": summary[PART_COL].astype(object).tolist(),
                                     "progress": summary[PROGRESS_COL].to_numpy(dtype=np.int64)})
            now = int(summary[NOW_COL].max().value // 1_000_000)
        stack, run_ids, next_seq, misses = self._load(key)
        stored = self.watermarks.get()   # None when absent (no exists() round trip)
        wms = PartitionWatermarks.from_json(stored[0] if stored else None)
        before = wms.combined_or_none
        out, wms, ctx = run_event_time_batch(op, stack, data, wms, progress, self.spec,
                                             now if now is not None else 0, next_seq)
        written = self._save(stack, run_ids, ctx.next_seq, key)
        self.watermarks.update((wms.to_json(),))
        extra = {"state_rows": stack.size, "key_group": int(key[0]), "runs": len(stack.runs),
                 "rows_written": written,
                 "cache_misses": misses, "seconds": time.perf_counter() - t0,
                 "watermark_ms": ctx.watermark_ms}
        if int(key[0]) == self.report_group:
            # every key group holds the same watermarks: one reports them
            batch_max = None if progress is None else int(progress["progress"].max())
            newest = max([p for p in [batch_max, *wms.table["progress"].tolist()]
                          if p is not None and p != NO_WATERMARK], default=None)
            extra["event_time"] = {"batch_time_ms": now, "watermark_before_ms": before,
                                   "watermark_ms": wms.combined_or_none,
                                   "partitions": wms.per_partition(),
                                   "idle_partitions": wms.idle_partitions(),
                                   "batch_max_event_ms": batch_max, "newest_event_ms": newest,
                                   "late_rows": int(ctx.metrics.counters.get("late_rows", 0))}
        yield from with_metrics(out, op, ctx, extra)


def project_windows(df, column: str, assigner: WindowAssigner):
    """The window table function alone (``SELECT * FROM TABLE(TUMBLE(...))``):
    ``df`` with each row repeated per window and ``window_start``/``window_end``
    added (one Arrow pass, the same arithmetic as the window aggregate's);
    side rows pass with null bounds."""
    in_schema = operator_schema_of(df)
    fields = list(in_schema)
    ts = pa.timestamp("us", tz="UTC")
    pos = [f.name for f in fields].index(KIND_COL)
    fields[pos:pos] = [pa.field("window_start", ts), pa.field("window_end", ts)]
    out_schema = pa.schema(fields)

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for rb in batches:
            t = pa.Table.from_batches([rb])
            side = t.column(KIND_COL).to_numpy(zero_copy_only=False) == METRICS_KIND
            data = t.filter(pa.array(~side)) if side.any() else t
            if data.num_rows:
                yield from conform(assign_windows(data, column, assigner), out_schema).to_batches()
            if side.any():
                yield from conform(t.filter(pa.array(side)), out_schema).to_batches()

    return df.mapInArrow(fn, spark_schema(out_schema))


def _row_schema(schema, spec: EventTimeSpec, assigner: Optional[WindowAssigner],
                generate: Optional[tuple]) -> pa.Schema:
    """The packed rows' schema (every field nullable) of an input of Spark
    schema ``schema``: its columns (plus ``_metrics`` when the pass
    generates watermark rows), the windows' bounds before ``_kind``, the
    batch time, the source partition and the progress."""
    fields = list(operator_schema_of(schema))
    if generate is not None and METRICS_COL not in schema.fieldNames():
        fields.append(pa.field(METRICS_COL, pa.string()))
    fields += [pa.field(NOW_COL, pa.timestamp("us", tz="UTC")), pa.field(PART_COL, pa.string()),
               pa.field(PROGRESS_COL, pa.int64())]
    if assigner is not None:
        ts = pa.timestamp("us", tz="UTC")
        pos = [f.name for f in fields].index(KIND_COL)
        fields[pos:pos] = [pa.field("window_start", ts), pa.field("window_end", ts)]
    return pa.schema(fields)


def pack_event_time_input(df, spec: EventTimeSpec, key, key_groups: int,
                          assigner: Optional[WindowAssigner] = None, from_source: bool = False,
                          generate: Optional[tuple] = None, line_packing: Optional[tuple] = None):
    """Step 1 of the module docstring: ``df`` with the batch time and source
    partition added, windows assigned and each key group's rows plus the
    progress summary packed (:func:`_project_and_pack`; ``generate``: the
    source's watermark rows are generated there too).  ``line_packing``:
    (columns, packed source, rows) when ``df`` is a reader's rows through
    projections its line task computes (``columns``, :mod:`.line_columns`);
    ``df`` is then read for its schema only.  The packed source takes a
    :class:`WindowLinePacker` and returns the same rows but those the line
    task packed, which leave it packed (or None: the reader packs nothing);
    ``rows()`` builds ``df``'s rows otherwise.  Returns (packed DataFrame:
    ``_kg``, ``rows``; the names of the packed rows' columns)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType
    if line_packing is not None:
        columns, packed_source, rows = line_packing
        line_packed = None
        if generate is not None and assigner is not None and spec.partition is None \
                and generate[2] is None:
            packer = WindowLinePacker(columns, generate[:2], spec.column, assigner, key, key_groups,
                                      _row_schema(df.schema, spec, assigner, generate))
            line_packed = packed_source(packer)
        df = line_packed if line_packed is not None else rows()
    row_schema = _row_schema(StructType([f for f in df.schema.fields
                                         if f.name not in (PACKED_GROUP_COL, PACKED_ROWS_COL)]),
                             spec, assigner, generate)
    if generate is not None and METRICS_COL not in df.columns:
        # the column the watermark rows travel in, as runtime.source_watermarks adds it
        df = df.withColumn(METRICS_COL, F.lit(None).cast("string"))
    # in a streaming query current_timestamp() is the batch's timestamp, kept
    # in the offset log: a replayed batch sees the same processing time
    src = df.withColumn(NOW_COL, F.current_timestamp())
    if spec.partition == FILE_PARTITIONS:
        src = src.withColumn(PART_COL, F.input_file_name())
    elif spec.partition is not None:
        src = src.withColumn(PART_COL, F.col(f"`{spec.partition}`").cast("string"))
    # (one source partition: no column, the Arrow pass knows)
    # the packed rows' columns (the processor drops the helpers)
    columns = [f.name for f in row_schema]
    packed = src.mapInArrow(_project_and_pack(spec, spec.column, assigner, key,
                                              key_groups, row_schema, from_source, generate),
                            spark_schema(packed_schema(KEY_GROUP_COL)))
    return packed, columns


def apply_event_time(df, operator: KeyedOperator, spec: EventTimeSpec, *,
                     assigner: Optional[WindowAssigner] = None,
                     key_groups: Optional[int] = None, growth: float = 1.0,
                     max_runs: int = 8, from_source: bool = False,
                     generate: Optional[tuple] = None, line_packing: Optional[tuple] = None):
    """The event-time operator's output (plus metric rows) as a DataFrame:
    the window projection (``assigner`` on ``spec.column``) and the operator,
    streaming with our own watermarks, or batch with the end of input.
    ``from_source``: the watermarks are the sources' watermark rows
    (``runtime.source_watermarks``), folded by ``spec`` (a
    ``SourceWatermarks`` generator); else ``spec`` generates them from the
    operator's input rows.  ``generate`` (with ``from_source``): ``df`` is
    the source's rows without their watermark rows, which the packing pass
    generates ((generator, source name, partition column), as
    ``source_watermarks.generate_watermarks`` takes them): one Arrow pass
    over the rows instead of two.  ``line_packing``: the reader's line task
    does that pass's work on the rows it finishes
    (:func:`pack_event_time_input`).

    ``key_groups`` (default :data:`EVENT_TIME_KEY_GROUPS`) is fixed for the
    life of a checkpoint.  Rows cross to the Python step packed per key
    group, so more key groups than cores only add calls (each a fixed cost)
    without making any call cheaper."""
    if key_groups is None:
        key_groups = EVENT_TIME_KEY_GROUPS
    packed, columns = pack_event_time_input(df, spec, operator.key, key_groups, assigner,
                                            from_source, generate, line_packing)
    out_schema = spark_schema(output_schema_with_metrics(operator))
    time_zone = df.sparkSession.conf.get("spark.sql.session.timeZone")
    grouped = packed.groupBy(KEY_GROUP_COL)
    if df.isStreaming:
        processor = EventTimeKeyGroupProcessor(operator, spec, columns, growth, max_runs,
                                               time_zone, spread_group_ids(key_groups)[0], key_groups)
        return grouped.transformWithStateInPandas(
            statefulProcessor=processor, outputStructType=out_schema, outputMode="Append",
            timeMode="None")

    def run_group(table: pa.Table) -> pa.Table:
        rows = unpack(table.column(PACKED_COL).to_pylist())
        pdf, passed = split_upstream_metrics(arrow_input(rows, columns, time_zone), operator)
        kinds = pdf[KIND_COL].to_numpy(dtype=np.int64) if len(pdf) else np.zeros(0)
        data = pdf[kinds != PROGRESS_KIND].drop(columns=list(_HELPERS)).reset_index(drop=True)
        if data.empty:   # only summary rows (every key group gets them) or side rows
            return (arrow_output(None, passed, operator, None) if passed is not None
                    else output_schema_with_metrics(operator).empty_table())
        # a bounded input: every row arrives before any watermark, then the end
        # of input fires every window (Flink's batch mode): nothing is late
        out, _, ctx = run_event_time_batch(operator, RunStack(operator.key), data,
                                           PartitionWatermarks.empty(), None, spec, 0, 0,
                                           end_of_input=True)
        return arrow_output(out, passed, operator, ctx,
                             {"state_rows": 0, "watermark_ms": ctx.watermark_ms})

    return grouped.applyInArrow(run_group, schema=out_schema)


__all__ = ["apply_event_time", "pack_event_time_input", "project_windows", "EventTimeKeyGroupProcessor",
           "WindowLinePacker", "PROGRESS_KIND"]
