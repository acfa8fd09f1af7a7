"""Running a keyed operator on Spark: streaming (state store) and batch.

Both group rows by *key group* ``pmod(hash(key), G)`` (like Flink's max
parallelism), so Spark's Python stateful API is called once per key group per
micro-batch instead of once per key (~1 ms each, architecture notes), and both
call the same :func:`~spark_changelog.runtime.keygroup.process_key_group`.

Both are fed *packed* rows (docs/runtime.md, "Packed key groups"): one
``mapInArrow`` pass before the shuffle (:func:`pack_key_groups`) pre-folds
each input partition when the operator folds, and packs each key group's rows
of the partition into ONE row (key group, LZ4 Arrow IPC blob,
:mod:`~spark_changelog.runtime.arrow_packing`), so Spark shuffles, sorts and
converts a few rows per key group instead of every input row; the Python step
unpacks them and sorts each key group's rows by key and ``_seq``.  Streaming
runs ``transformWithStateInPandas`` on the RocksDB state store; batch runs
``applyInArrow`` once per key group, without state.  The key group is still
Spark's ``pmod(hash(key), G)`` (computed as a column before the pass), which
picks the group's index; the group's id, the value Spark groups by and the
state is stored under, is the index's entry in
:func:`~spark_changelog.model.partitioning.spread_group_ids` (ids Spark's hash
partitioner spreads evenly over the state partitions), or the index itself
for a checkpoint written before the layout was recorded (:func:`key_group_id_layout`,
docs/runtime.md, "Key groups over the state partitions").  Operators that wait for the
watermark run in :mod:`.spark_event_time` (the sources' watermarks, never
Spark's ``EventTime`` mode).

Per key group two state variables hold a
:class:`~spark_changelog.runtime.state_runs.RunStack`:

* ``meta`` (value state): the ids of the group's runs, oldest first, and the
  group's emission counter (``OpContext.next_seq``);
* ``runs`` (map state): run id -> Arrow IPC blob (LZ4), written once when the
  run is created and removed when it is merged away.

A micro-batch writes one run with the touched keys only, so its state-store
writes follow the rows and keys it touches.  Decoded runs are cached per Python
worker (:data:`~spark_changelog.runtime.state_runs.WORKER_CACHE`) and as
memory-mapped files shared by the executor's workers
(:class:`~spark_changelog.runtime.state_runs.RunFiles`), so blobs are read only
when neither has the run.  Checkpoints and restarts are Spark's: the run list
in ``meta`` is versioned with the rest of the state store.  Run ids are
digests of what a run holds and where (:func:`~spark_changelog.runtime.state_runs.name_new_runs`),
so a micro-batch replayed after a crash writes the very state, ids included,
that the killed attempt wrote (docs/runtime.md, "Replay is deterministic").

Operator counters leave the operator as one extra output row per call
(``_kind = -1``, JSON in ``_metrics``); ``pipeline.split_metrics`` separates them.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import time
from typing import Callable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import BinaryType, ByteType, IntegerType, StructField, StructType

from ..model import (KIND_COL, METRICS_COL, METRICS_KIND, PACKED_GROUP_COL, PACKED_ROWS_COL,
                     SEQ_COL, RowKind)
from ..model.partitioning import PLAIN_IDS, SPREAD_IDS, default_key_groups, key_group_ids
from ..operators.base import KeyedOperator, OpContext
from ..operators.kernels import arrow_to_pandas
from .arrow_packing import PACKED_COL, conform, pack_groups, packed_batch, packed_schema, unpack
from ..model.spark_hash import key_groups as key_groups_of, supports as spark_hash_supports
from .keygroup import process_key_group
from .keyed_rows import (KEY_GROUP_COL, METRICS_GROUP, arrow_output, arrow_rows, arrow_schema_of,
                         operator_instance, output_schema_with_metrics, spark_schema,
                         split_upstream_metrics_arrow)
from .spark_seen_keys import apply_seen_keys
from .key_group_processor import KeyedChainProcessor, KeyGroupProcessor
from .keyed_chain import KeyedChain

#: the key-group id layout of the keyed operators built on a stream
#: (:func:`key_group_id_layout`)
_ID_LAYOUT: contextvars.ContextVar = contextvars.ContextVar("key_group_id_layout", default=SPREAD_IDS)


@contextlib.contextmanager
def key_group_id_layout(layout: str):
    """Keyed operators built on a stream in this block store their key
    groups under ``layout``'s ids (``model.partitioning.key_group_ids``):
    ``plan.execute`` lowers a query with the layout its checkpoint recorded
    (``plan.fingerprint.checkpoint_key_group_ids``); outside such a block,
    :data:`~spark_changelog.model.partitioning.SPREAD_IDS`."""
    key_group_ids(1, layout)       # an unknown layout fails here
    token = _ID_LAYOUT.set(layout)
    try:
        yield
    finally:
        _ID_LAYOUT.reset(token)


def current_key_group_id_layout() -> str:
    """The layout of :func:`key_group_id_layout`'s block (or the default)."""
    return _ID_LAYOUT.get()


def add_key_group(df, key, key_groups: int, layout: str = SPREAD_IDS):
    """``df`` with ``_kg``: the id (under ``layout``) of the key group
    ``pmod(hash(key), key_groups)``; side rows :data:`METRICS_GROUP`."""
    from pyspark.sql import functions as F
    group = F.pmod(F.hash(*[F.col(k) for k in key]), F.lit(key_groups))
    if layout != PLAIN_IDS:
        group = F.array(*[F.lit(i) for i in key_group_ids(key_groups, layout)])[group]
    if METRICS_COL in df.columns:
        group = F.when(F.col(KIND_COL) == F.lit(METRICS_KIND), F.lit(METRICS_GROUP)).otherwise(group)
    return df.withColumn(KEY_GROUP_COL, group)


def session_key_groups(spark) -> int:
    """The key-group count of a keyed operator that sets none, for the
    session's state partitions (``model.partitioning.default_key_groups``)."""
    return default_key_groups(int(spark.conf.get("spark.sql.shuffle.partitions")))


def apply_keyed(df, operator: KeyedOperator, *, key_groups: Optional[int] = None,
                growth: float = 1.0, max_runs: int = 8, processing_time_ms: Optional[int] = None,
                packed_source: Optional[Callable] = None):
    """The operator's output (plus metric rows) as a Spark DataFrame.

    A streaming ``df`` runs with state in the state store; a bounded one is
    processed in one go per key group, with the same operator code.
    ``packed_source``: see :func:`pack_key_groups`.  ``key_groups``: None
    for :func:`session_key_groups`.  An operator that waits
    for the watermark runs in :func:`~.spark_event_time.apply_event_time`.
    """
    return keyed_step(df, operator, key_groups=key_groups, growth=growth, max_runs=max_runs,
                      processing_time_ms=processing_time_ms, packed_source=packed_source)[0]


def keyed_step(df, operator: KeyedOperator, *, key_groups: Optional[int] = None,
               growth: float = 1.0, max_runs: int = 8, processing_time_ms: Optional[int] = None,
               packed_source: Optional[Callable] = None, null_columns: tuple = ()) -> tuple:
    """(:func:`apply_keyed`'s output, how the next keyed operator takes it
    packed or None).  The second is, for an operator running as a
    :class:`KeyGroupProcessor` on a stream, a callable ``(pack, schema) ->
    DataFrame`` (docs/runtime.md, "Packing in the operator before"): the
    same step on the same packed input, its processor packing its output
    (``pack``: the output rows, an Arrow table of
    :func:`output_schema_with_metrics`, -> (key group, packed rows) pairs),
    the step's output being those pairs, one row each, with the columns of
    ``schema`` null (the shape of a reader's ``packed_rows``).
    ``null_columns``: columns of ``df`` that are null in every row, which a
    ``packed_source`` leaves out (:func:`pack_key_groups`)."""
    if operator.uses_watermark:
        raise ValueError(f"{operator.name} waits for the watermark: run it with "
                         "runtime.spark_event_time.apply_event_time")
    if df.isStreaming and operator.state_is_seen_keys:
        return apply_seen_keys(df, operator), None

    def run_batch(rows, passed, now):
        ctx = OpContext(processing_time_ms=now)
        pdf = arrow_to_pandas(rows)
        return process_key_group(operator, None, pdf, ctx), passed, ctx

    return _grouped_step(df, operator, operator, KeyGroupProcessor, run_batch, key_groups=key_groups,
                         growth=growth, max_runs=max_runs, processing_time_ms=processing_time_ms,
                         packed_source=packed_source, null_columns=null_columns)


def chained_step(df, chain: KeyedChain, *, key_groups: Optional[int] = None, growth: float = 1.0,
                 max_runs: int = 8, processing_time_ms: Optional[int] = None,
                 packed_source: Optional[Callable] = None) -> tuple:
    """:func:`keyed_step` for keyed operators chained in one key group
    (:class:`~spark_changelog.runtime.keyed_chain.KeyedChain`, docs/runtime.md,
    "Chained keyed operators"): ``df`` packed per key group of
    ``chain.packing``, one call per key group running every link; on a
    stream each link's state in the group's state
    (:class:`KeyedChainProcessor`), in a batch run none."""
    def run_batch(rows, passed, now):
        ctxs = {}

        def open_link(i):
            ctxs[i] = OpContext(processing_time_ms=now)
            return None, ctxs[i]
        out, ran = chain.process(rows, open_link)
        passed = chain.passed_rows(passed, [(i, ctxs[i], {"state_rows": 0}) for i in ran])
        return out, passed, ctxs.get(len(chain.operators) - 1)

    return _grouped_step(df, chain.packing, chain.last, KeyedChainProcessor, run_batch,
                         processor_operator=chain, key_groups=key_groups, growth=growth, max_runs=max_runs,
                         processing_time_ms=processing_time_ms, packed_source=packed_source)


def _grouped_step(df, packing: KeyedOperator, last: KeyedOperator, processor_class, run_batch, *,
                  processor_operator=None, key_groups: Optional[int] = None, growth: float = 1.0,
                  max_runs: int = 8, processing_time_ms: Optional[int] = None,
                  packed_source: Optional[Callable] = None, null_columns: tuple = ()) -> tuple:
    """The keyed step of :func:`keyed_step` and :func:`chained_step`:
    ``df`` packed per key group of ``packing``, then on a stream
    ``processor_class`` (built with ``processor_operator``, by default
    ``packing``) in ``transformWithStateInPandas``, in a batch run
    ``run_batch(data rows (Arrow), passed side rows, now) -> (output, side
    rows, context or None)`` per key group in ``applyInArrow``; ``last``: the
    operator whose output the step emits."""
    time_zone = df.sparkSession.conf.get("spark.sql.session.timeZone")
    out_schema = spark_schema(output_schema_with_metrics(last))
    if key_groups is None:
        key_groups = session_key_groups(df.sparkSession)
    if processor_operator is None:
        processor_operator = packing
    if df.isStreaming:
        layout = current_key_group_id_layout()
        packed, columns = pack_key_groups(df, packing, key_groups, packed_source=packed_source,
                                          null_columns=null_columns, layout=layout)

        def step(pack: Optional[Callable] = None, schema=None):
            processor = processor_class(processor_operator, columns, growth, max_runs, time_zone, key_groups,
                                        pack, layout)
            out = packed.groupBy(KEY_GROUP_COL).transformWithStateInPandas(
                statefulProcessor=processor, outputStructType=PACKED_OUTPUT if pack else out_schema,
                outputMode="Append", timeMode="None")
            return out if pack is None else _with_columns_of(out, schema)
        return step(), step

    # the same packed input as streaming: Spark shuffles and groups a few
    # blobs per key group instead of sorting every row (``keygroup.sort_rows``
    # sorts each key group's rows by key and ``_seq`` in the Python step);
    # no state, so always the spread ids
    packed, columns = pack_key_groups(df, packing, key_groups, packed_source=packed_source,
                                      null_columns=null_columns)
    now = int(time.time() * 1000) if processing_time_ms is None else processing_time_ms

    def run_group(table: pa.Table) -> pa.Table:
        rows = unpack(table.column(PACKED_COL).to_pylist())
        data, passed = split_upstream_metrics_arrow(arrow_rows(rows, columns, time_zone), last)
        if not data.num_rows:
            return arrow_output(None, passed, last, None)
        out, passed, ctx = run_batch(data, passed, now)
        return arrow_output(out if ctx is not None else None, passed, last, ctx,
                            {"state_rows": 0} if ctx is not None else None)

    return packed.groupBy(KEY_GROUP_COL).applyInArrow(run_group, schema=out_schema), None


#: the output of a keyed operator that packs it for the next one: only
#: packed rows (:func:`keyed_step`)
PACKED_OUTPUT = StructType([StructField(KIND_COL, ByteType()), StructField(PACKED_GROUP_COL, IntegerType()),
                            StructField(PACKED_ROWS_COL, BinaryType())])


def _with_columns_of(packed, schema):
    """``packed`` (:data:`PACKED_OUTPUT` rows) with the columns of ``schema``
    (a Spark ``StructType``), null, before the packed columns: the shape of a
    reader's ``packed_rows``."""
    from pyspark.sql import functions as F
    cols = [F.col(KIND_COL) if f.name == KIND_COL else F.lit(None).cast(f.dataType).alias(f.name)
            for f in schema.fields]
    return packed.select(*cols, F.col(PACKED_GROUP_COL), F.col(PACKED_ROWS_COL))


def _with_metrics_column(df):
    from pyspark.sql import functions as F
    if METRICS_COL in df.columns:
        return df
    return df.withColumn(METRICS_COL, F.lit(None).cast("string"))


def _fold_partition(table: pa.Table, operator: KeyedOperator, extra=None) -> pa.Table:
    """``table`` (one input partition's rows) without the rows
    ``operator.prefold_keep`` drops, plus one side row with the counters
    (``rows_in``, ``folded``: the rows dropped here); every column nullable.
    ``extra``: values of the side row's other columns (by name)."""
    import pyarrow.compute as pc
    columns = list(operator.key) + [KIND_COL, SEQ_COL]
    is_side = pc.equal(table.column(KIND_COL), METRICS_KIND).to_numpy(zero_copy_only=False)
    data_pos = np.flatnonzero(~is_side)
    small = table.select(columns).take(data_pos)
    # a nullable BIGINT key as float64 would make 2**53 and 2**53 + 1 one
    # key, and drop the older one's last change (arrow_to_pandas)
    keep = data_pos[operator.prefold_keep(arrow_to_pandas(small))]
    kept = table.take(np.sort(np.concatenate([np.flatnonzero(is_side), keep])))
    dropped = int(len(data_pos) - len(keep))
    n_ub = int(pc.sum(pc.equal(small.column(KIND_COL), int(RowKind.UPDATE_BEFORE))).as_py() or 0)
    payload = json.dumps({"operator": operator.name, "instance": operator_instance(operator),
                          "counters": {"rows_in": dropped, "folded": dropped - n_ub}})
    schema = pa.schema([f.with_nullable(True) for f in table.schema])
    values = {KIND_COL: METRICS_KIND, SEQ_COL: 0, METRICS_COL: payload, **(extra or {})}
    row = pa.table([pa.array([values.get(f.name)], f.type) for f in schema], schema=schema)
    return pa.concat_tables([kept.cast(schema), row])


#: rows of an input partition packed at a time: bounds the packing pass's
#: memory (a large batch input partition is packed in parts; folding per part
#: is exact, each part's dropped rows are older than a kept row of their key)
PACK_CHUNK_ROWS = 1 << 20


class LinePacker:
    """What a reader's line task calls on the change rows it finished
    (``ReadResult.packed_rows``, docs/runtime.md, "Packing in the line
    task"), and a keyed operator before this one on its output
    (:func:`keyed_step`): the rows in the packing pass's schema, each
    given its key group's id under ``layout`` (the index Spark's
    ``pmod(hash(key), G)`` gives, :func:`spark_hash.key_groups`, mapped as
    :func:`add_key_group` maps it; side rows :data:`METRICS_GROUP`),
    pre-folded when the operator pre-folds (the counters' side row into
    :data:`METRICS_GROUP`), packed per key group.  Returns (key group, packed
    rows) pairs."""

    def __init__(self, operator: KeyedOperator, key_groups: int, schema: pa.Schema,
                 layout: str = SPREAD_IDS):
        self.operator, self.key_groups, self.schema = operator, key_groups, schema
        self.ids = np.asarray(key_group_ids(key_groups, layout), dtype=np.int32)

    def __call__(self, rows: pa.Table) -> list[tuple[int, bytes]]:
        table = conform(rows, self.schema)
        groups = self.ids[key_groups_of(table, self.operator.key, self.key_groups)]
        # an upstream operator's side rows (its counters) travel in METRICS_GROUP
        is_side = pc.equal(table.column(KIND_COL), METRICS_KIND).to_numpy(zero_copy_only=False)
        if is_side.any():
            groups = np.where(is_side, METRICS_GROUP, groups)
        return _pack_table(table.append_column(KEY_GROUP_COL, pa.array(groups, pa.int32())), self.operator)


def _pack_table(table: pa.Table, operator: KeyedOperator) -> list[tuple[int, bytes]]:
    """(key group, packed rows) pairs of ``table`` (its ``_kg`` column gives
    the groups), pre-folded first when the operator pre-folds."""
    if operator.prefolds:
        table = _fold_partition(table, operator, {KEY_GROUP_COL: METRICS_GROUP})
    groups = table.column(KEY_GROUP_COL).to_numpy(zero_copy_only=False)
    return list(pack_groups(table.drop_columns([KEY_GROUP_COL]), groups))


def _line_packable(df, operator: KeyedOperator, null_columns: tuple = ()) -> bool:
    """Whether a line task can pack ``df``'s rows for ``operator``: Spark's
    key group of its key columns is computed in Python (:mod:`spark_hash`),
    and every column is of a type whose Arrow form is the same in the line
    task and in Spark's (no time zone, no decimal scale to agree on), or
    null in every row (``null_columns``: no value to agree on)."""
    schema = arrow_schema_of(df)
    simple = all(pa.types.is_boolean(f.type) or pa.types.is_integer(f.type) or pa.types.is_float64(f.type)
                 or pa.types.is_string(f.type) or f.name in null_columns for f in schema)
    return simple and spark_hash_supports([schema.field(k).type for k in operator.key])


def pack_key_groups(df, operator: KeyedOperator, key_groups: int, chunk_rows: int = PACK_CHUNK_ROWS,
                    packed_source: Optional[Callable] = None, null_columns: tuple = (),
                    layout: str = SPREAD_IDS):
    """The input of the keyed step, streaming and batch: ``df`` packed per
    key group (:mod:`~spark_changelog.runtime.arrow_packing`) in one
    ``mapInArrow`` pass, which first pre-folds when the operator pre-folds
    (micro-batch folding: only each key's last change of the part is kept,
    the operator's ``prefold_keep``; a side row carries the counters
    ``rows_in`` and ``folded``).  An input partition is packed in parts of
    about ``chunk_rows`` rows (whole Arrow batches).  The key group is Spark's
    ``pmod(hash(key), G)``, as its id under ``layout`` (:func:`add_key_group`),
    computed as a column before the pass; side rows go to
    :data:`METRICS_GROUP`.

    ``packed_source``: when ``df`` is a reader's rows read by this operator
    alone, the reader's ``packed_rows``: its line task then packs the rows it
    finishes itself (:class:`LinePacker`), and this pass only passes those
    packed rows on and packs the others (lines left to Spark, side rows).
    Every packed table then has the same all-nullable schema; the reader's
    rows need not have ``null_columns`` (columns null in every row of ``df``:
    the packing adds them, null).

    Returns (packed DataFrame: ``_kg``, ``rows``; the names of the packed
    rows' columns)."""
    if operator.prefolds:
        df = _with_metrics_column(df)
    columns = list(df.columns)
    schema = None
    if packed_source is not None and _line_packable(df, operator, null_columns):
        schema = pa.schema([f.with_nullable(True) for f in arrow_schema_of(df)])
        line_packed = packed_source(LinePacker(operator, key_groups, schema, layout))
        if line_packed is not None:
            df = line_packed
        else:
            schema = None
    keyed = add_key_group(df, operator.key, key_groups, layout)
    if schema is not None:
        from pyspark.sql import functions as F
        keyed = keyed.withColumn(KEY_GROUP_COL, F.when(F.col(PACKED_ROWS_COL).isNotNull(), F.col(PACKED_GROUP_COL))
                                 .otherwise(F.col(KEY_GROUP_COL)))

    def pack_part(batches):
        table = pa.Table.from_batches(batches)
        if schema is None:
            return packed_batch(_pack_table(table, operator), KEY_GROUP_COL)
        # the line task's packed rows pass as Arrow columns (no Python object
        # per blob); the others are packed here, in the same schema
        line_packed = table.column(PACKED_ROWS_COL).is_valid()
        done = table.filter(line_packed).select([PACKED_GROUP_COL, PACKED_ROWS_COL]).combine_chunks()
        rest = table.filter(pc.invert(line_packed))
        rest = conform(rest, schema).append_column(KEY_GROUP_COL, rest.column(KEY_GROUP_COL))
        more = packed_batch(_pack_table(rest, operator), KEY_GROUP_COL)
        groups = [c.cast(pa.int32()) for c in done.column(0).chunks] + [more.column(0)]
        blobs = [c.cast(pa.binary()) for c in done.column(1).chunks] + [more.column(1)]
        return pa.record_batch([pa.concat_arrays(groups), pa.concat_arrays(blobs)],
                               schema=packed_schema(KEY_GROUP_COL))

    def fn(batches):
        part, n = [], 0
        for b in batches:
            if b.num_rows:
                part.append(b)
                n += b.num_rows
            if n >= chunk_rows:
                yield pack_part(part)
                part, n = [], 0
        if part:
            yield pack_part(part)

    return keyed.mapInArrow(fn, spark_schema(packed_schema(KEY_GROUP_COL))), columns
