"""Lowering: the one place that turns a plan into operators and DataFrames.

``lower(node)`` takes a planned tree (``rules.optimize``/``rules.plan_sink``
already applied) and returns a :class:`Lowered`: the Spark DataFrame of the
node's changelog and the keyed operators built for it.
The Python API and the SQL front end both end here; nothing else builds an
operator or a pipeline DataFrame (docs/plan.md).

Side rows (``_kind = -1``, a JSON payload in ``_metrics``: operator metrics,
a reader's dead letters and skipped records) pass through every step built
here unchanged, and each step reads its input once: projections and filters
keep them (their data columns are null), the join's input union carries both
inputs' side rows (``JoinInputLayout.spark_union``), and keyed operators
route them to key group -1 (``runtime.spark_keyed``).

Each node is lowered once per process (memoized by node identity, like its
traits; a memo entry never refers to its own node, so it goes with the
node): the API asks for column types while it builds a pipeline, and the
pipeline reuses the DataFrames.
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Optional

from sqlglot import exp

from ..model import KIND_COL, METRICS_COL, METRICS_KIND, SEQ_COL, ChangelogMode
from ..model.rowkind import RowKind
from ..operators.keys import GLOBAL_KEY
from ..runtime.keyed_rows import operator_schema_of
from ..runtime.spark_keyed import chained_step, current_key_group_id_layout, keyed_step
from . import expressions
from .chains import chain_reason, chaining
from .nodes import (WINDOW_END, WINDOW_START, WINDOW_TIME, Aggregate, ApplyAs, Deduplicate, Filter, History,
                    Join, Materialize, Node, Normalize, Project, Sink, Source, TopN, UnionAll,
                    WatermarkAssigner,
                    WindowAggregate, WindowTableFunction, join_input_specs)
from .rules import PlanError


@dataclasses.dataclass(frozen=True)
class Lowered:
    """A lowered node: its changelog DataFrame (data columns, ``_kind``,
    ``_seq``, and ``_metrics`` when side rows may travel in it: operator
    metrics, the readers' dead letters and skipped records) and the keyed
    operators built for it (inputs first)."""

    #: the DataFrame; for a source whose reader builds its rows when first
    #: used (``ReadResult``), that reader until something asks for ``df``
    frame: object
    operators: tuple = ()
    #: the operators that read source rows directly (their input rows are
    #: the changelog rows the sources produced: the report's "rows in")
    entry: tuple = ()
    #: the reader whose rows ``df`` is (a source node), else None: a keyed
    #: operator reading them directly lets its line task pack them
    reader: Optional[object] = None
    #: (the keyed operator's output DataFrame, its step packing for the next, ``spark_keyed.keyed_step``):
    #: a keyed operator reading that output directly has it packed by the
    #: operator before (docs/runtime.md, "Packing in the operator before")
    packs: Optional[tuple] = None
    #: when ``packs`` is a projection's of the last keyed operator's output
    #: (``_packs_through``): (column of ``packs[0]``, its name in that
    #: output) pairs; None when ``packs[0]`` is that output itself
    packed_names: Optional[tuple] = None

    def then(self, df, *ops, packs: Optional[tuple] = None) -> "Lowered":
        """This input followed by the keyed operators ``ops`` (one step, output ``df``)."""
        return Lowered(df, self.operators + ops, self.entry if self.operators else ops[:1], packs=packs)

    @property
    def df(self):
        """The node's changelog DataFrame (a reader's rows, or a projection
        of them (:func:`_project`), are built here when they were not yet:
        ``ReadResult.rows``)."""
        if isinstance(self.frame, _Deferred):
            return self.frame.built()
        return self.frame.rows if self.defers_rows else self.frame

    @property
    def defers_rows(self) -> bool:
        """The node is a reader's rows, built when first asked for."""
        return self.reader is not None and self.frame is self.reader

    @property
    def schema(self):
        """The Spark schema of :attr:`df`, without building a reader's rows."""
        return self.reader.schema if self.defers_rows else self.frame.schema

    @property
    def data_schema(self):
        """:attr:`schema` without the side rows' column: the schema of
        :attr:`data_df` (nullability aside, which operators ignore)."""
        return _without_side_column(self.schema)

    def packed_source(self, frame):
        """How a keyed operator reading ``frame`` (this node's :attr:`frame`
        or a DataFrame) gets it packed by the step that makes it (a reader's
        line task, a keyed operator), or None."""
        if getattr(self.reader, "packed_rows", None) is not None and (
                frame is self.reader or (getattr(self.reader, "built", True) and frame is self.reader.rows)):
            return self.reader.packed_rows
        if self.packs is not None and frame is self.packs[0]:
            return lambda pack: self.packs[1](pack, frame.schema)
        return None

    @property
    def data_df(self):
        """The DataFrame without side rows and their column."""
        return data_rows(self.df)

    @property
    def is_streaming(self) -> bool:
        return bool(self.reader.streaming) if self.defers_rows else bool(self.frame.isStreaming)


class _Deferred:
    """A DataFrame not built yet (a reader's rows, a union of them), as a
    keyed step sees it while it decides how to read it
    (``spark_keyed.pack_key_groups``): the schema, columns, session and
    streaming flag come without a read plan; anything else builds the
    DataFrame (``build()``) and is its.  So when the line task packs
    (``ReadResult.packed_rows``) its plan is the only one built."""

    def __init__(self, schema, streaming: bool, spark, build):
        self._schema, self._streaming, self._spark, self._build = schema, streaming, spark, build
        self._built = None

    @classmethod
    def reader_rows(cls, reader) -> "_Deferred":
        return cls(reader.schema, bool(reader.streaming), reader.spark, lambda: reader.rows)

    @property
    def schema(self):
        return self._schema

    @property
    def columns(self) -> list:
        return self._schema.fieldNames()

    @property
    def isStreaming(self) -> bool:
        return self._streaming

    @property
    def sparkSession(self):
        return self._spark

    def built(self):
        """The DataFrame, built on the first call."""
        if self._built is None:
            self._built = self._build()
        return self._built

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.built(), name)


def data_rows(df):
    from pyspark.sql import functions as F
    if METRICS_COL in df.columns:
        return df.where(F.col(KIND_COL) != F.lit(METRICS_KIND)).drop(METRICS_COL)
    return df


#: each node's lowering, per key-group id layout (its keyed operators' state
#: is stored under the layout's ids: ``spark_keyed.key_group_id_layout``) and
#: whether keyed operators chain (``chains.keyed_chains``)
_LOWERED: "weakref.WeakKeyDictionary[Node, dict[tuple, Lowered]]" = weakref.WeakKeyDictionary()


def lower(node: Node) -> Lowered:
    """The DataFrame and operators of a planned ``node`` (module docstring)."""
    done = _LOWERED.setdefault(node, {})
    layout = (current_key_group_id_layout(), chaining())
    if layout not in done:
        done[layout] = _lower(node)
    return done[layout]


def _lower(node: Node) -> Lowered:
    if isinstance(node, Source):
        return _source(node)
    if isinstance(node, Sink):
        return lower(node.input)
    if isinstance(node, WatermarkAssigner):
        # the watermark rows every event-time operator folds (docs/windows.md);
        # Spark's own query watermark (withWatermark) is not used
        inp = lower(node.input)
        return dataclasses.replace(inp, frame=_with_watermark_rows(node, inp.df))
    if isinstance(node, Project):
        return _project(node, lower(node.input))
    if isinstance(node, Filter):
        return _filter(node, lower(node.input))
    if isinstance(node, Normalize):
        inp = lower(node.input)
        return _keyed(inp, inp.frame, _normalize_operator(node, inp.data_schema), node.key_groups)
    if isinstance(node, Materialize):
        if chain_reason(node):
            return _chained_materialize(node)
        inp = lower(node.input)
        op = _materialize_operator(node, inp.data_schema)
        if node.waits_for_watermark:
            return _event_time(inp, op, node.spec, node.key_groups)
        return _keyed(inp, inp.frame, op, node.key_groups)
    if isinstance(node, Join):
        if chain_reason(node):
            return _chained_join(node)
        return _join(node, lower(node.left), lower(node.right))
    if isinstance(node, UnionAll):
        return _union(node, [lower(c) for c in node.inputs])
    if isinstance(node, ApplyAs):
        from .lower_auto_cdc import lower_apply_as
        return lower_apply_as(node, lower(node.input))
    if isinstance(node, History):
        from .lower_auto_cdc import lower_history
        return lower_history(node, lower(node.input), _keyed)
    if isinstance(node, WindowAggregate):
        return _window_aggregate(node)
    if isinstance(node, WindowTableFunction):
        from ..runtime.spark_event_time import project_windows
        inp = lower(node.input)
        return dataclasses.replace(inp, frame=project_windows(inp.df, node.column, node.window))
    if isinstance(node, Deduplicate):
        return _deduplicate(node, lower(node.input))
    if isinstance(node, Aggregate):
        from ..operators.aggregate.group_aggregate import GroupAggregate
        inp, key = _keyed_input(lower(node.input), node.key)
        op = GroupAggregate(operator_schema_of(inp.data_schema), key, node.aggs,
                            generate_update_before=node.generate_update_before,
                            emit_unchanged=node.emit_unchanged, state_ttl_ms=node.state_ttl_ms)
        return _without_global_key(_keyed(inp, inp.frame, op, node.key_groups))
    if isinstance(node, TopN):
        from ..operators.top_n import AppendOnlyTopN, RetractableTopN
        inp, partition = _keyed_input(lower(node.input), node.partition_by)
        cls = AppendOnlyTopN if node.input.traits.mode is ChangelogMode.INSERT_ONLY \
            else RetractableTopN
        op = cls(operator_schema_of(inp.data_schema), partition, node.n, node.order_by,
                 rank_column=node.rank_column, state_ttl_ms=node.state_ttl_ms)
        return _without_global_key(_keyed(inp, inp.frame, op, node.key_groups))
    raise PlanError(f"no lowering for plan node {type(node).__name__}")


def _normalize_operator(node: Normalize, data_schema):
    from ..operators.normalize import ChangelogNormalize
    return ChangelogNormalize(operator_schema_of(data_schema), node.key, state_ttl_ms=node.state_ttl_ms,
                              tombstone_retention_ms=node.tombstone_retention_ms,
                              generate_update_before=node.generate_update_before,
                              fold_batch=node.fold_batch)


def _materialize_operator(node: Materialize, data_schema):
    from ..operators.sink_upsert_materializer import SinkUpsertMaterializer
    return SinkUpsertMaterializer(operator_schema_of(data_schema), node.sink_key,
                                  upsert_key=node.upsert_key, state_ttl_ms=node.state_ttl_ms,
                                  conflict=node.conflict)


def _step_output_schema(op):
    """The Spark schema of a keyed step's data rows (``op``'s output as the
    step emits it, without the side rows' column): what the operator after
    it is built with, chained or not."""
    from ..runtime.keyed_rows import spark_schema
    return _without_side_column(spark_schema(op.output_schema))


def _without_side_column(schema):
    """A Spark schema without the side rows' column (``_metrics``)."""
    from pyspark.sql.types import StructType
    return StructType([f for f in schema.fields if f.name != METRICS_COL])


def _chained_materialize(node: Materialize) -> Lowered:
    """The normalize the materializer reads and the materializer, in one
    keyed step on the normalize's key groups (``chains.chain_reason``)."""
    from ..runtime.keyed_chain import KeyedChain
    before = node.input
    inp = lower(before.input)
    normalize = _normalize_operator(before, inp.data_schema)
    chain = KeyedChain.linear((normalize, _materialize_operator(node, _step_output_schema(normalize))))
    # the normalize's key groups (the materializer's own count is not used)
    return _chained(inp, inp.frame, chain, before.key_groups)


def _chained(inp: Lowered, frame, chain, key_groups: Optional[int]) -> Lowered:
    """:func:`_keyed` for a chain of keyed operators (``runtime.keyed_chain``)."""
    source = inp.packed_source(frame)
    df = _Deferred.reader_rows(frame) if frame is inp.reader else frame
    out, repack = chained_step(df, chain, key_groups=key_groups, packed_source=source)
    return inp.then(out, *chain.operators, packs=(out, repack) if repack is not None else None)


def _union(node: UnionAll, inputs: list) -> Lowered:
    """``UNION ALL``: Spark's union of the inputs' DataFrames, columns
    renamed to the first input's by position; every row keeps its ``_seq``
    and its partition (no shuffle, nothing re-sorted: plan/nodes.py, UnionAll).
    Side rows travel as in any input (a ``_metrics`` column is added, null,
    to the inputs without one)."""
    from pyspark.sql import functions as F
    names = node.traits.columns
    metrics = any(METRICS_COL in i.df.columns for i in inputs)
    dfs = []
    for inp, child in zip(inputs, node.inputs):
        cols = [F.col(f"`{c}`").alias(n) for c, n in zip(child.traits.columns, names)]
        cols += [F.col(KIND_COL), F.col(SEQ_COL)]
        if metrics:
            cols.append(F.col(METRICS_COL) if METRICS_COL in inp.df.columns
                        else F.lit(None).cast("string").alias(METRICS_COL))
        dfs.append(inp.df.select(*cols))
    df = dfs[0]
    for other in dfs[1:]:
        df = df.unionByName(other)
    return Lowered(df, tuple(op for i in inputs for op in i.operators),
                   tuple(op for i in inputs for op in (i.entry or ())))


def _window_aggregate(node: WindowAggregate) -> Lowered:
    """The window projection and the aggregate run as one step
    (``runtime.spark_event_time``): the projection happens in the same Arrow
    pass that summarises the watermarks (docs/windows.md)."""
    import pyarrow as pa
    from ..operators.window.aggregate import AggCall, SessionWindowAggregate
    from ..operators.window.aggregate import WindowAggregate as WindowAggregateOp
    from ..runtime.spark_event_time import apply_event_time
    tvf = node.input
    group_keys = node.group_keys
    # windows with a generator of their own (tvf.spec) compute their
    # watermarks from their rows: the source's watermark rows are not needed;
    # windows reading the source's watermark directly generate its rows in
    # their own packing pass (one Arrow pass over the rows instead of two)
    generate = line = None
    if isinstance(tvf.input, WatermarkAssigner):
        if tvf.from_source:
            wm = tvf.input
            generate = (wm.strategy, wm.source_name, wm.partition)
            # sessions (merged per key in the operator) keep Spark's path
            if wm.partition is None and not tvf.window.merging:
                line = _line_window_source(wm.input)
        inp = lower(tvf.input.input) if line is None else line
    else:
        inp = lower(tvf.input)
    if tvf.window.merging:   # sessions merge per key: the operator's key is the group keys
        inp, group_keys = _keyed_input(inp, group_keys)
    data = operator_schema_of(inp.data_schema)
    ts = pa.timestamp("us", tz="UTC")
    fields = [f for f in data if f.name not in (KIND_COL, SEQ_COL)]
    projected = pa.schema(fields + [pa.field(WINDOW_START, ts), pa.field(WINDOW_END, ts),
                                    data.field(KIND_COL), data.field(SEQ_COL)])
    cls = SessionWindowAggregate if tvf.window.merging else WindowAggregateOp
    op = cls(projected, group_keys, [AggCall(*a) for a in node.aggregates],
             allowed_lateness_ms=node.allowed_lateness_ms, time_column=tvf.column)
    if line is not None:
        out = apply_event_time(line, op, tvf.spec, assigner=tvf.window, key_groups=node.key_groups,
                               from_source=True, generate=generate,
                               line_packing=(line.line_columns, line.packed, lambda: lower(line.top).df))
        lowered = Lowered(out, (op,), (op,))
    else:
        out = apply_event_time(inp.df, op, tvf.spec, assigner=tvf.window, key_groups=node.key_groups,
                               from_source=tvf.from_source, generate=generate)
        lowered = inp.then(out, op)
    if node.window_time:
        lowered = dataclasses.replace(lowered, frame=_with_window_time(lowered.frame, node.traits.columns))
    return _without_global_key(lowered)


class _LineWindowSource:
    """A reader's rows through projections its line task computes
    (``runtime.line_columns``), as a window reading the source's watermark
    sees them before it decides how to read them
    (``spark_event_time.pack_event_time_input``): the schema, session and
    streaming flag come without a read plan, :meth:`packed` builds the read
    whose line task packs for the window; otherwise :func:`lower` builds
    ``top``'s rows (docs/runtime.md, "Packing in the line task")."""

    def __init__(self, top: Node, reader, chain: list, line_columns: tuple, schema):
        #: the node whose rows these are
        self.top = top
        self._reader, self._chain = reader, chain
        self.line_columns, self.schema = line_columns, schema

    @property
    def data_schema(self):
        return _without_side_column(self.schema)

    @property
    def columns(self) -> list:
        return self.schema.fieldNames()

    @property
    def isStreaming(self) -> bool:
        return bool(self._reader.streaming)

    @property
    def sparkSession(self):
        return self._reader.spark

    def packed(self, packer):
        """The reader's rows whose line task packs with ``packer``
        (``ReadResult.packed_rows``) through the projections (computed by
        Spark on the rows the line task did not pack), or None when the
        read packs nothing or its columns are not the expected ones."""
        from ..model import PACKED_GROUP_COL, PACKED_ROWS_COL
        df = self._reader.packed_rows(packer)
        if df is None:
            return None
        extra = (PACKED_GROUP_COL, PACKED_ROWS_COL)
        for node in self._chain:
            df = _projection(node, df, extra)
        got = [(f.name, f.dataType) for f in df.schema.fields if f.name not in extra]
        return df if got == [(f.name, f.dataType) for f in self.schema.fields] else None


def _line_window_source(node: Node) -> Optional[_LineWindowSource]:
    """``node`` (a watermark's input) as a :class:`_LineWindowSource` when it
    is a reader's rows as they are, through projections whose every column
    is a reader's column or a function of one that the line task computes
    as Spark does (``runtime.line_columns``), of types whose Arrow form is
    the same in the line task and in Spark; else None (Spark's path)."""
    from pyspark.sql import types as T
    from ..runtime.line_columns import TIMESTAMP_FUNCTIONS, LineColumn
    top, chain = node, []
    while isinstance(node, Project):
        chain.append(node)
        node = node.input
    if not isinstance(node, Source) or node.reader is None or \
            not callable(getattr(node.reader, "packed_rows", None)):
        return None
    reader = node.reader
    frame = lower(node).frame
    if frame is not reader and not (getattr(reader, "built", True) and frame is reader.rows):
        return None
    reader_schema = reader.schema
    types = {f.name: f.dataType for f in reader_schema.fields}
    columns = {c: LineColumn(c, c) for c in node.traits.columns}
    for proj in reversed(chain):
        below, columns = columns, {}
        for it in proj.items:
            source = _reference(it)
            e = expressions.split_alias(it.expr)[0] if it.column is None and it.expr is not None else None
            if source is not None and source in below:
                columns[it.name] = dataclasses.replace(below[source], name=it.name)
            elif isinstance(e, exp.Anonymous) and e.name.lower() in TIMESTAMP_FUNCTIONS and \
                    len(e.expressions) == 1 and isinstance(e.expressions[0], exp.Column) and \
                    not e.expressions[0].table and below.get(e.expressions[0].name) is not None and \
                    below[e.expressions[0].name].function is None:
                columns[it.name] = LineColumn(it.name, below[e.expressions[0].name].source, e.name.lower())
            else:
                return None
    simple = (T.BooleanType, T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.DoubleType, T.StringType)
    fields = []
    for c in columns.values():
        source_type = types.get(c.source)
        if not isinstance(source_type, simple):
            return None
        if c.function is None:
            fields.append(T.StructField(c.name, source_type))
        elif isinstance(source_type, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
            fields.append(T.StructField(c.name, T.TimestampType()))
        else:
            return None
    rest = [reader_schema[c] for c in (KIND_COL, SEQ_COL, METRICS_COL) if c in types]
    return _LineWindowSource(top, reader, chain[::-1], tuple(columns.values()), T.StructType(fields + rest))


def _with_window_time(df, columns: tuple):
    """``window_time`` (``window_end`` minus 1 ms, null on side rows) in its
    place among the window aggregate's ``columns``, the other columns after."""
    from pyspark.sql import functions as F
    df = df.withColumn(WINDOW_TIME, F.col(WINDOW_END) - F.expr("INTERVAL 1 MILLISECOND"))
    rest = [c for c in df.columns if c not in columns]
    return df.select(*(F.col(f"`{c}`") for c in tuple(columns) + tuple(rest)))


def _with_watermark_rows(node: WatermarkAssigner, df):
    """The source's rows and its watermark rows (``runtime.source_watermarks``)."""
    from ..runtime.source_watermarks import generate_watermarks
    return generate_watermarks(df, node.strategy, node.source_name, node.partition)


def _deduplicate(node: Deduplicate, inp: Lowered) -> Lowered:
    """The deduplicate variant for the node: keep last over a changelog input
    is ChangelogNormalize; the insert-only variants by keep and time."""
    from ..operators import deduplicate as d
    from ..operators.normalize import ChangelogNormalize
    inp, key = _keyed_input(inp, node.key)
    packed_source, null_columns = None, ()
    if node.proctime_column is not None and node.order_by is None:
        inp, packed_source = _proctime_unread(node, inp)
        null_columns = (node.proctime_column,)
    schema = operator_schema_of(inp.data_schema)
    if node.input.traits.mode is not ChangelogMode.INSERT_ONLY:
        op = ChangelogNormalize(schema, key, state_ttl_ms=node.state_ttl_ms,
                                generate_update_before=node.generate_update_before,
                                fold_batch=node.fold_batch)
    elif node.keep == "first" and node.order_by is not None:
        op = d.RowTimeKeepFirst(schema, key, node.order_by, state_ttl_ms=node.state_ttl_ms)
        return _without_global_key(_event_time(inp, op, node.spec, node.key_groups))
    elif node.keep == "first":
        op = d.ProcTimeKeepFirst(schema, key, state_ttl_ms=node.state_ttl_ms)
    else:
        flags = dict(state_ttl_ms=node.state_ttl_ms, fold_batch=node.fold_batch,
                     generate_update_before=node.generate_update_before,
                     generate_insert=node.generate_insert)
        op = (d.ProcTimeKeepLast(schema, key, **flags) if node.order_by is None
              else d.RowTimeKeepLast(schema, key, node.order_by, **flags))
    return _without_global_key(_keyed(inp, inp.frame, op, node.key_groups, packed_source, null_columns))


def _proctime_unread(node: Deduplicate, inp: Lowered) -> tuple[Lowered, Optional[object]]:
    """The input of a deduplication on processing time with its unread
    processing-time column null (plan/nodes.py, Deduplicate), and the
    reader's ``packed_rows`` when every other column is a reader's column as
    it is (projections of plain references only, down to a source whose rows
    are the reader's): its line task then packs the rows, the null column
    added by the packing (docs/runtime.md, "Packing in the line task")."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
    col = node.proctime_column
    schema = inp.schema
    null = T.StructType([T.StructField(f.name, f.dataType, True) if f.name == col else f for f in schema.fields])
    spark = inp.reader.spark if inp.defers_rows else inp.frame.sparkSession
    # not built when the packed read is what the operator reads (_Deferred)
    df = _Deferred(null, inp.is_streaming, spark,
                   lambda: inp.df.withColumn(col, F.lit(None).cast(schema[col].dataType)))
    others = [c for c in schema.fieldNames() if c not in (col, KIND_COL, SEQ_COL, METRICS_COL)]
    reader = _reader_with_columns(node.input, others)
    packed = getattr(reader, "packed_rows", None) if reader is not None else None
    return dataclasses.replace(inp, frame=df), packed


def _reader_with_columns(node: Node, columns: list):
    """The reader whose rows hold ``columns`` of ``node``'s output as they
    are (same names, through projections that only reference them), or None."""
    names = {c: c for c in columns}
    while isinstance(node, Project):
        items = {it.name: it for it in node.items}
        for out, c in list(names.items()):
            source = _reference(items[c]) if c in items else None
            if source is None:
                return None
            names[out] = source
        node = node.input
    if not isinstance(node, Source) or node.reader is None:
        return None
    frame = lower(node).frame
    if frame is not node.reader and frame is not node.reader.rows:
        return None
    if any(out != c or c not in node.traits.columns for out, c in names.items()):
        return None
    return node.reader


def _keyed_input(inp: Lowered, key: tuple) -> tuple[Lowered, tuple]:
    """The input and key of a keyed operator.  A query without keys (a global
    Top-N, deduplication, aggregation or session window) runs as one key: a constant
    hidden column (:data:`~spark_changelog.operators.keys.GLOBAL_KEY`), so
    every row lands in one key group, as Flink runs it with parallelism 1.
    The plan node keeps the empty key (explain shows ``partitionBy=[]``)."""
    if key:
        return inp, tuple(key)
    from pyspark.sql import functions as F
    # null on side rows, like every data column of theirs (so the column is nullable)
    constant = F.when(F.col(KIND_COL) != F.lit(METRICS_KIND), F.lit(0))
    return dataclasses.replace(inp, frame=inp.df.withColumn(GLOBAL_KEY, constant)), (GLOBAL_KEY,)


def _without_global_key(out: Lowered) -> Lowered:
    """``out`` without the hidden key column of :func:`_keyed_input`."""
    if GLOBAL_KEY not in out.df.columns:
        return out
    return dataclasses.replace(out, frame=out.df.drop(GLOBAL_KEY))


def _event_time(inp: Lowered, op, spec, key_groups: Optional[int]) -> Lowered:
    """An operator that waits for the watermark: the watermarks its sources
    generate, folded per source partition with idleness, the same runtime
    step as the windows' (``runtime.spark_event_time``, docs/windows.md)."""
    from ..runtime.spark_event_time import apply_event_time
    return inp.then(apply_event_time(inp.df, op, spec, key_groups=key_groups, from_source=True),
                    op)


def _keyed(inp: Lowered, frame, op, key_groups: Optional[int], packed_source=None,
           null_columns: tuple = ()) -> Lowered:
    """The keyed operator ``op`` over ``frame`` (``inp``'s own frame, or a
    DataFrame made from it).  ``packed_source`` and ``null_columns``: a
    reader's packing for rows that are its rows but for columns null in
    every row (:func:`_proctime_unread`); by default the packing of the step
    that makes ``frame`` as it is."""
    # an operator reading a reader's or a keyed operator's rows as they are
    # has them packed where they are made (docs/runtime.md, "Packing in the
    # line task", "Packing in the operator before")
    source = inp.packed_source(frame) if packed_source is None else packed_source
    df = _Deferred.reader_rows(frame) if frame is inp.reader else frame
    out, repack = keyed_step(df, op, key_groups=key_groups, packed_source=source, null_columns=null_columns)
    return inp.then(out, op, packs=(out, repack) if repack is not None else None)


def _source(node: Source) -> Lowered:
    reader = node.reader
    if reader is not None and node.mode is ChangelogMode.INSERT_ONLY and \
            reader.stream_schema.mode is not ChangelogMode.INSERT_ONLY:
        return Lowered(_insert_only(reader.rows, node.name), reader=reader)
    if reader is not None and not getattr(reader, "built", True):
        # built when first asked for, or never when the keyed operator
        # reading it takes the packed variant (ReadResult)
        return Lowered(reader, reader=reader)
    df = reader.rows if reader is not None else node.dataframe
    if df is None:
        raise PlanError(f"source {node.name!r} has neither a reader nor a DataFrame")
    return Lowered(df, reader=reader)


def _insert_only(df, name: str):
    """A reader's rows declared insert-only: a change of another kind fails
    the job (it would break the insert-only operators' assumptions silently)."""
    from pyspark.sql import functions as F
    kind = F.col(KIND_COL)
    bad = (kind != F.lit(int(RowKind.INSERT))) & (kind != F.lit(METRICS_KIND))
    error = F.raise_error(F.concat(
        F.lit(f"source {name} is declared insert-only but holds a change of kind "),
        kind.cast("string"), F.lit(" (0 +I, 1 -U, 2 +U, 3 -D) at sequence number "),
        F.col(SEQ_COL).cast("string")))
    return df.withColumn(KIND_COL, F.when(bad, error).otherwise(kind).cast(df.schema[KIND_COL].dataType))


def spark_column(item):
    """The pyspark Column of a projection item (or filter): the user's own
    Column, else Spark SQL generated from the tree."""
    from pyspark.sql import functions as F
    if item.column is not None:
        return item.column
    tree = getattr(item, "expr", None)
    if tree is None:
        tree = getattr(item, "condition", None)
    if tree is None:
        raise PlanError(f"projection item {item!r} has no expression to lower")
    return F.expr(expressions.to_spark_sql(expressions.split_alias(tree)[0]))


def _project(node: Project, inp: Lowered) -> Lowered:
    deferred = _deferred_projection(node, inp)
    if deferred is not None:
        return dataclasses.replace(inp, frame=deferred)
    frame = _projection(node, inp.df)
    packs, names = _packs_through(node, inp, frame)
    return dataclasses.replace(inp, frame=frame, packs=packs, packed_names=names)


def _deferred_projection(node: Project, inp: Lowered) -> Optional[_Deferred]:
    """``node``'s projection not built yet when its input is not
    (a reader's rows, or such a projection of them) and each item is an input
    column or ``current_timestamp()`` (a ``PROCTIME()`` column), whose types
    are known without Spark: a deduplication on processing time reading it
    then builds only the reader's packed plan (:func:`_proctime_unread`,
    docs/runtime.md, "Before the query starts"); anything else that reads
    it builds it, as :func:`_projection` builds it; else None."""
    from pyspark.sql import types as T
    if not (inp.defers_rows or isinstance(inp.frame, _Deferred)):
        return None
    schema = inp.schema
    side_rows = METRICS_COL in schema.fieldNames()
    fields = []
    for item in node.items:
        source = _reference(item)
        if source is not None and source in schema.fieldNames():
            f = schema[source]
            fields.append(T.StructField(item.name, f.dataType, f.nullable or side_rows))
        elif item.column is None and item.expr is not None and \
                isinstance(expressions.split_alias(item.expr)[0], exp.CurrentTimestamp):
            fields.append(T.StructField(item.name, T.TimestampType(), side_rows))
        else:
            return None
    fields += [schema[c] for c in (KIND_COL, SEQ_COL) + ((METRICS_COL,) if side_rows else ())]
    spark = inp.reader.spark if inp.defers_rows else inp.frame.sparkSession
    return _Deferred(T.StructType(fields), inp.is_streaming, spark, lambda: _projection(node, inp.df))


def _packs_through(node: Project, inp: Lowered, frame) -> tuple:
    """(``packs``, ``packed_names``) of a projection ``frame`` that only
    picks and renames columns of a keyed operator's output read as it is:
    that operator's processor picks them before it packs
    (``arrow_packing.Picked``), so the operator or the sink reading the
    projection still gets the output packed (docs/runtime.md, "Where the
    time goes"); else (None, None)."""
    if inp.packs is None or inp.df is not inp.packs[0]:
        return None, None
    sources = [_reference(item) for item in node.items]
    if None in sources:
        return None, None
    from ..runtime.arrow_packing import Picked
    picked = tuple(zip(sources, (item.name for item in node.items)))
    repack = inp.packs[1]
    before = dict(inp.packed_names) if inp.packed_names is not None else None
    names = tuple((name, source if before is None else before[source]) for source, name in picked)
    return (frame, lambda pack, schema: repack(Picked(pack, picked), schema)), names


def _reference(item) -> Optional[str]:
    """The input column a projection item is, renamed or not; None for
    anything computed (or a user's own Column)."""
    if item.column is not None or item.source is None or item.expr is None:
        return None
    tree = expressions.split_alias(item.expr)[0]
    return item.source if isinstance(tree, exp.Column) and tree.name == item.source else None


def _projection(node: Project, df, extra: tuple = ()):
    """``df`` projected by ``node`` (side rows keep null data columns);
    ``extra``: columns of ``df`` passed on after the others as they are."""
    from pyspark.sql import functions as F
    keep_side_rows = METRICS_COL in df.columns
    is_data = F.col(KIND_COL) != F.lit(METRICS_KIND)
    cols = []
    for item in node.items:
        e = spark_column(item)
        cols.append((F.when(is_data, e) if keep_side_rows else e).alias(item.name))
    cols += [F.col(KIND_COL), F.col(SEQ_COL)] + ([F.col(METRICS_COL)] if keep_side_rows else [])
    return df.select(*cols, *(F.col(c) for c in extra))


def _filter(node: Filter, inp: Lowered) -> Lowered:
    from pyspark.sql import functions as F
    cond = spark_column(node)
    if METRICS_COL in inp.df.columns:
        cond = (F.col(KIND_COL) == F.lit(METRICS_KIND)) | cond
    return dataclasses.replace(inp, frame=inp.df.where(cond))


def _join_operator(node: Join, left_schema, right_schema) -> tuple:
    """(the join's input layout, the join) over inputs of those Spark schemas."""
    from ..operators.join import JoinInputLayout, RegularJoin
    layout = JoinInputLayout(operator_schema_of(left_schema), operator_schema_of(right_schema),
                             node.left_keys, node.right_keys)
    left_spec, right_spec = join_input_specs(node)
    return layout, RegularJoin(layout, node.how, left_spec.unique_key, right_spec.unique_key, node.condition,
                               node.state_ttl_ms)


def _chained_join(node: Join) -> Lowered:
    """The two normalizes the join reads and the join, in one keyed step on
    the join's key groups (``chains.chain_reason``): its input is the
    union of the normalizes' inputs in the join's layout."""
    from ..model import PACKED_GROUP_COL, PACKED_ROWS_COL
    from ..operators.join.regular_join import LEFT, RIGHT
    from ..runtime.keyed_chain import KeyedChain
    inputs = (lower(node.left.input), lower(node.right.input))
    normalizes = tuple(_normalize_operator(n, i.data_schema) for n, i in zip((node.left, node.right), inputs))
    layout, op = _join_operator(node, *(_step_output_schema(n) for n in normalizes))
    chain = KeyedChain.join(*normalizes, op, layout)
    union = _Deferred(_spark_schema_of(layout.union_schema, any(METRICS_COL in i.schema.fieldNames()
                                                                     for i in inputs)),
                      inputs[0].is_streaming,
                      inputs[0].reader.spark if inputs[0].defers_rows else inputs[0].frame.sparkSession,
                      lambda: layout.spark_union(inputs[0].df, inputs[1].df))
    sources = [i.packed_source(i.frame) for i in inputs]

    def packed_source(pack):
        # each input's line task packs its rows in the union layout
        # (``JoinInputLayout.arrow_side``), and the packed rows pass the union
        packed = [src(lambda t, side=side: pack(layout.arrow_side(t, side)))
                  for side, src in ((LEFT, sources[0]), (RIGHT, sources[1]))]
        if any(p is None for p in packed):
            return None
        return layout.spark_union(*packed, keep=(PACKED_GROUP_COL, PACKED_ROWS_COL))

    out, repack = chained_step(union, chain, key_groups=node.key_groups,
                               packed_source=packed_source if None not in sources else None)
    entry = tuple(dict.fromkeys((inputs[0].entry if inputs[0].operators else normalizes[:1])
                                + (inputs[1].entry if inputs[1].operators else normalizes[1:])))
    return Lowered(out, inputs[0].operators + inputs[1].operators + chain.operators, entry,
                   packs=(out, repack) if repack is not None else None)


def _spark_schema_of(schema, side_rows: bool):
    """The Spark schema of rows in the Arrow ``schema`` (plus the side
    rows' column)."""
    from pyspark.sql.types import StringType, StructField
    from ..runtime.keyed_rows import spark_schema
    out = spark_schema(schema)
    return out.add(StructField(METRICS_COL, StringType())) if side_rows else out


def _join(node: Join, left: Lowered, right: Lowered) -> Lowered:
    layout, op = _join_operator(node, left.data_schema, right.data_schema)
    # one pass over each input: side rows go into the union with null data columns
    union = layout.spark_union(left.df, right.df)
    entry = tuple(dict.fromkeys((left.entry if left.operators else (op,))
                                + (right.entry if right.operators else (op,))))
    out, repack = keyed_step(union, op, key_groups=node.key_groups,
                             packed_source=_join_packed_source(layout, left, right, union))
    return Lowered(out, left.operators + right.operators + (op,), entry,
                   packs=(out, repack) if repack is not None else None)


def _join_packed_source(layout, left: Lowered, right: Lowered, union):
    """When both join inputs are keyed operators' outputs, read as they are:
    each packs its rows for the join, in the join's union layout
    (``JoinInputLayout.arrow_side``), and the join reads the union of the
    two packed outputs (docs/runtime.md, "Packing in the operator before")."""
    from ..operators.join.regular_join import LEFT, RIGHT
    if left.packs is None or right.packs is None or left.df is not left.packs[0] \
            or right.df is not right.packs[0]:
        return None

    def source(pack):
        sides = [inp.packs[1](lambda t, side=side: pack(layout.arrow_side(t, side)), union.schema)
                 for side, inp in ((LEFT, left), (RIGHT, right))]
        return sides[0].unionByName(sides[1])
    return source


def column_sql(df, column) -> tuple[str, str]:
    """(Spark's output name, SQL text) of a pyspark Column resolved against
    ``df``: the text Spark's analyzer prints for the resolved expression, which
    parses with the Spark dialect (a Column's own string form does not:
    ``+(a, 1)``).  Raises Spark's analysis error for a bad column."""
    probe = df.select(column)
    name = probe.columns[0]
    try:
        e = probe._jdf.queryExecution().analyzed().projectList().apply(0)
    except Exception:   # not a classic session (Spark Connect): the Column's text
        text = str(column)
        return name, text[8:-2] if text.startswith("Column<'") else text
    if e.getClass().getSimpleName() == "Alias":
        return name, e.child().sql()
    return name, e.sql()


__all__ = ["Lowered", "lower", "data_rows", "column_sql", "spark_column"]
