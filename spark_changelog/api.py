"""The Python API: changelog streams over Spark DataFrames.

```python
from spark_changelog import build_session, read_debezium
spark = build_session()
src = read_debezium(spark, "cdc/", schema="id BIGINT, name STRING", primary_key=["id"])
report = src.normalize().write_upsert("table/", checkpoint="ck/")   # or streaming=False
```

A :class:`ChangelogStream` is a Spark session and a plan node
(:mod:`spark_changelog.plan.nodes`).  Its methods build new nodes; the node's
traits say what the stream is (columns, changelog mode, keys, event time).
``write_*``/``collect``/``explain`` plan the tree (``plan.rules``) and lower
it (``plan.lower``, the one place that builds operators and DataFrames), so
the Python API and the SQL front end share one planner and one lowering.
The same pipeline runs on a bounded DataFrame (batch) and as a Structured
Streaming query with a checkpoint, with the same operator code and the same
final table.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence, Union

from .model import KIND_COL, SEQ_COL, ChangelogMode, StreamSchema, as_key
from .model.watermark import DAY_MS, Duration, duration_ms
from .plan import explain_plan
from .plan.expressions import ExpressionError, aggregate_call, parse, project_item, to_spark_sql
from .plan.execute import PlanWarning, run_sink
from .plan.lower import Lowered, column_sql, lower
from .plan.nodes import (Aggregate, ApplyAs, Deduplicate, Filter, History, Join, Node, Normalize,
                         Project,
                         ProjectItem, Sink, Source, TopN, UnionAll, WatermarkAssigner, WindowAggregate,
                         WindowTableFunction, source_leaves)
from .plan.rules import PlanError, fold_micro_batches, optimize, plan_sink

JoinOn = Union[str, Sequence[Union[str, tuple]], dict, None]

#: nodes that keep state: the event time must be declared below them
_STATEFUL = {Normalize: "ChangelogNormalize", History: "ScdType2History", Join: "Join",
             Deduplicate: "Deduplicate",
             Aggregate: "GroupAggregate", TopN: "Rank", WindowAggregate: "WindowAggregate"}

#: the key-group count of a window aggregation built here (its checkpoints
#: record it in their plan; SQL's windows use the runtime's own count,
#: ``spark_event_time.EVENT_TIME_KEY_GROUPS``).  Keyed operators default to
#: ``None``: the checkpoint's count, else ``model.partitioning.default_key_groups``
WINDOW_KEY_GROUPS = 32


@dataclasses.dataclass(frozen=True)
class ChangelogStream:
    """A changelog: a Spark session and the plan node that describes it."""

    spark: object                   # pyspark.sql.SparkSession
    node: Node
    mini_batch: bool = False        # fold each key's changes per micro-batch (with_mini_batch)

    # -- what the stream is (derived from the plan) ------------------------------
    def _planned(self) -> Node:
        planned = optimize(self.node)
        return fold_micro_batches(planned) if self.mini_batch else planned

    def _lowered(self) -> Lowered:
        return lower(self._planned())

    @property
    def traits(self):
        """The planner's facts about this stream (``plan.nodes.Traits``)."""
        return self._planned().traits

    @property
    def schema(self) -> StreamSchema:
        t = self.traits
        return StreamSchema(tuple(t.columns), tuple(t.primary_key), t.upsert_key, t.mode,
                            time_attribute=t.time_attribute, watermark=t.watermark)

    @property
    def df(self):
        """The lowered Spark DataFrame (data columns, ``_kind``, ``_seq``, and
        ``_metrics`` when side rows travel along)."""
        return self._lowered().df

    @property
    def spark_schema(self):
        """The Spark schema of :attr:`df` (data columns, ``_kind``, ``_seq``,
        ``_metrics`` when side rows travel along), without building a
        reader's rows that are not built yet (``ReadResult``)."""
        return self._lowered().schema

    @property
    def is_streaming(self) -> bool:
        return self._lowered().is_streaming

    @property
    def sources(self) -> tuple:
        """The readers of every source leaf (their dead letters and counts)."""
        return tuple(s.reader for s in source_leaves(self.node) if s.reader is not None)

    @property
    def source(self):
        """The reader this stream came from, when it has exactly one."""
        readers = self.sources
        return readers[0] if len(readers) == 1 else None

    def _derive(self, node: Node) -> "ChangelogStream":
        """A stream over ``node``, lowered at once so a bad column or key fails
        here, at the call that introduced it (lowering is memoized)."""
        out = ChangelogStream(self.spark, node, self.mini_batch)
        out._lowered()
        return out

    def with_mini_batch(self, enabled: bool = True) -> "ChangelogStream":
        """Micro-batch folding for the whole job (Flink's
        ``table.exec.mini-batch.enabled``; off by default, as in Flink): every
        keep-last operator (ChangelogNormalize, the ones the planner inserts,
        keep-last deduplication) emits only each key's net change per
        micro-batch (nothing, ``+I``, ``-U``/``+U`` or ``-D``) instead of every
        intermediate version.  The final table is the same; the emitted
        changelog is shorter.  Group aggregation and Top-N emit once per key
        and micro-batch either way.  ``explain`` marks the folded operators
        (``miniBatch=[true]``).  docs/operators.md, "Micro-batch folding"."""
        return dataclasses.replace(self, mini_batch=bool(enabled))

    def _types(self) -> dict:
        cols = set(self.traits.columns)
        return {f.name: f.dataType.simpleString() for f in self._lowered().data_schema.fields
                if f.name in cols}

    # -- sources ---------------------------------------------------------------
    @classmethod
    def from_dataframe(cls, df, primary_key: Union[str, Sequence[str], None] = None,
                       mode: ChangelogMode = ChangelogMode.RETRACT, *,
                       name: Optional[str] = None, ordered: bool = False) -> "ChangelogStream":
        """Wrap a DataFrame that already has ``_kind`` (tinyint) and ``_seq`` (bigint).
        ``name``: how ``explain`` calls the source.  ``ordered=True`` declares that a
        streaming input brings each key's changes in ``_seq`` order across
        micro-batches, so the planner does not put a ChangelogNormalize in front of
        order-sensitive operators (docs/semantics.md, section 10)."""
        for c in (KIND_COL, SEQ_COL):
            if c not in df.columns:
                raise ValueError(f"DataFrame lacks the {c} column; columns: {df.columns}")
        cols = tuple(c for c in df.columns if c not in (KIND_COL, SEQ_COL))
        pk = as_key(primary_key)
        StreamSchema(cols, pk, pk or None, mode)          # validates the key and names
        node = Source(name or "changelog", cols, pk, mode, pk, streaming=bool(df.isStreaming),
                      declared_ordered=bool(ordered), dataframe=df)
        return cls(df.sparkSession, node)

    # -- keyed operators ---------------------------------------------------------
    def normalize(self, key: Union[str, Sequence[str], None] = None, *,
                  state_ttl_ms: Optional[int] = None,
                  tombstone_retention_ms: Optional[int] = DAY_MS,
                  generate_update_before: bool = True,
                  key_groups: Optional[int] = None) -> "ChangelogStream":
        """ChangelogNormalize: keep the last change per key (docs/semantics.md, section 5)."""
        key = as_key(key) or self.traits.primary_key
        if not key:
            raise ValueError("normalize needs a key: the stream has no primary key; pass key=[...]")
        return self._derive(Normalize(self.node, tuple(key), generate_update_before,
                                      state_ttl_ms=state_ttl_ms,
                                      tombstone_retention_ms=tombstone_retention_ms,
                                      key_groups=key_groups))

    def history(self, key: Union[str, Sequence[str], None] = None, *,
                sequence_by: Union[str, Sequence[str], None] = None,
                columns: Optional[Sequence[str]] = None,
                track_history: Optional[Sequence[str]] = None,
                track_history_except: Optional[Sequence[str]] = None,
                ignore_null_updates: bool = False,
                key_groups: Optional[int] = None) -> "ChangelogStream":
        """SCD type 2 history of the changes of each ``key`` (default: the
        primary key): one row per version with ``__START_AT``/``__END_AT``,
        keyed by ``key`` + ``__START_AT``, exact whatever order the changes
        arrive in (docs/operators.md, "SCD type 2 history").  Any keyed
        changelog: a source, a join's or an aggregation's output.

        ``sequence_by``: the column(s) that order a key's changes (several:
        compared field by field; default: the source sequence ``_seq``);
        ``columns``: the history's data columns (default: all);
        ``track_history``/``track_history_except``: the columns whose change
        opens a version (default: every non-key column); ``ignore_null_updates``:
        a null in an upsert keeps the previous value (partial updates)."""
        key = as_key(key) or self.traits.primary_key
        if not key:
            raise ValueError("history needs a key: the stream has no primary key; pass key=[...]")
        have = self.traits.columns
        seq = as_key(sequence_by)
        cols = tuple(columns) if columns is not None else None
        missing = [c for c in tuple(key) + seq + (cols or ()) if c not in have]
        if missing:
            raise ValueError(f"history: column(s) {missing} not among {list(have)}")
        if cols is not None and not set(key) <= set(cols):
            raise ValueError(f"history: the columns {list(cols)} must include the key {list(key)}")
        if track_history is not None and track_history_except is not None:
            raise ValueError("history: pass track_history or track_history_except, not both")
        values = [c for c in (cols or have) if c not in key]
        if track_history_except is not None:
            track_history = [c for c in values if c not in set(track_history_except)]
        if track_history is not None:
            bad = [c for c in track_history if c not in values]
            if bad:
                raise ValueError(f"history: tracked column(s) {bad} are not non-key columns of "
                                 f"the history {values}")
            track_history = tuple(track_history)
        return self._derive(History(self.node, tuple(key), seq, cols, track_history,
                                    bool(ignore_null_updates), key_groups))

    def apply_as(self, deletes=None, truncates=None, *,
                 key: Union[str, Sequence[str], None] = None,
                 sequence_by: Union[str, Sequence[str], None] = None,
                 resequence: bool = False) -> "ChangelogStream":
        """Auto CDC's event options (docs/operators.md, "Auto CDC"):
        ``deletes``, a Spark SQL condition over a change (``"op = 'D'"``),
        makes matching changes deletes; ``truncates`` makes matching changes
        delete every ``key`` (default: the primary key) at their sequence,
        in batch and streaming.  ``sequence_by``: the column(s) placing a change;
        ``resequence``: its one integer or timestamp column becomes ``_seq``."""
        key = as_key(key) or self.traits.primary_key
        seq = as_key(sequence_by)
        if resequence and len(seq) != 1:
            raise ValueError("apply_as: resequence needs exactly one sequence_by column")
        if truncates is not None and not key:
            raise ValueError("apply_as: truncates need the keys (key=[...])")
        return self._derive(ApplyAs(self.node, deletes, truncates, tuple(key), seq,
                                    bool(resequence)))

    # -- deduplication, aggregation, Top-N (docs/operators.md) -------------------
    def deduplicate(self, key: Union[str, Sequence[str], None] = None,
                    order_by: Optional[str] = None, keep: str = "first", *,
                    generate_update_before: bool = True, generate_insert: bool = True,
                    fold_batch: bool = False, state_ttl_ms: Optional[int] = None,
                    key_groups: Optional[int] = None,
                    proctime_column: Optional[str] = None) -> "ChangelogStream":
        """``ROW_NUMBER() OVER (PARTITION BY key ORDER BY order_by ASC|DESC) = 1``:
        keep the first (``keep="first"``, ASC) or last (``"last"``, DESC) row per
        ``key`` (default: the primary key; ``key=()``: one row over the whole
        stream, a global deduplication without PARTITION BY).

        ``order_by``: ``None`` orders by arrival (processing time; arrival is
        the source sequence), or the event-time attribute declared with
        ``with_watermark`` (keep first on event time then waits for the
        watermark).  Keep first needs an insert-only input; keep last over a
        changelog input is ChangelogNormalize on ``key``.  ``fold_batch``:
        emit only each key's net change per micro-batch (keep last).
        ``proctime_column`` (processing time only): a column holding the
        processing time that nothing after this step reads (SQL's hidden
        ``ORDER BY pt``); it reaches the operator null, as Flink's
        unmaterialized ``PROCTIME()`` (plan/nodes.py, Deduplicate)."""
        t = self.traits
        if key is None:
            key = t.primary_key
            if not key:
                raise ValueError("deduplicate needs a key: the stream has no primary key; pass "
                                 "key=[...] (or key=() to keep one row over the whole stream)")
        key = as_key(key)
        missing = [c for c in key if c not in t.columns]
        if missing:
            raise ValueError(f"deduplicate: key column(s) {missing} not among {list(t.columns)}")
        keep = str(keep).lower()
        if keep not in ("first", "last"):
            raise ValueError(f"deduplicate: keep must be 'first' or 'last', got {keep!r}")
        if order_by is not None and order_by != t.time_attribute:
            raise PlanError(
                f"deduplicate: order_by={order_by!r} must be the event-time attribute declared "
                f"with with_watermark ({t.time_attribute!r}), or None for processing time "
                "(arrival order)")
        if t.mode is not ChangelogMode.INSERT_ONLY:
            if keep == "first":
                raise PlanError(f"deduplicate(keep='first') needs an insert-only input; this stream "
                                f"is {t.mode.value}: a kept first row could be retracted later")
            if order_by is not None:
                raise PlanError("deduplicate(keep='last') over a changelog input keeps each key's "
                                "latest change by sequence (ChangelogNormalize); order_by must be "
                                "None")
        if proctime_column is not None and (order_by is not None or proctime_column in key
                                            or proctime_column not in t.columns):
            raise ValueError(f"deduplicate: proctime_column={proctime_column!r} must be a non-key "
                             "column of the stream, with order_by=None (processing time)")
        return self._derive(Deduplicate(self.node, tuple(key), keep, order_by,
                                        generate_update_before, generate_insert, fold_batch,
                                        state_ttl_ms, key_groups, proctime_column))

    def group_by(self, *keys: Union[str, Sequence[str]]) -> "GroupedStream":
        """``GROUP BY keys``; finish with ``.agg(...)``.  No keys: one global
        group (SQL's aggregate without ``GROUP BY``), which runs as one key
        in one task, as Flink runs it with parallelism 1."""
        cols = tuple(c for k in keys for c in as_key(k))
        missing = [c for c in cols if c not in self.traits.columns]
        if missing:
            raise ValueError(f"group_by: column(s) {missing} not among {list(self.traits.columns)}")
        return GroupedStream(self, cols)

    def top_n(self, n: int, partition_by: Union[str, Sequence[str], None],
              order_by: Union[str, Sequence], with_rank: bool = False, *,
              rank_column: str = "rn", state_ttl_ms: Optional[int] = None,
              key_groups: Optional[int] = None) -> "ChangelogStream":
        """``ROW_NUMBER() OVER (PARTITION BY partition_by ORDER BY order_by) <= n``:
        the changes to each partition's top ``n`` rows.  ``partition_by=()``
        (or None): one top ``n`` over the whole stream (a global Top-N; its
        state is one key, so it runs in one task, as in Flink).  ``order_by``:
        ``"score DESC, id"`` or ``[("score", False), "id"]``; ``with_rank``
        adds the row number as ``rank_column`` (the output is then keyed on
        partition and rank)."""
        part = as_key(partition_by)
        t = self.traits
        order = _order_items(order_by)
        missing = [c for c in list(part) + [c for c, _ in order] if c not in t.columns]
        if missing:
            raise ValueError(f"top_n: column(s) {missing} not among {list(t.columns)}")
        if int(n) < 1:
            raise ValueError(f"top_n: n must be at least 1, got {n}")
        if with_rank and rank_column in t.columns:
            raise ValueError(f"top_n: rank column {rank_column!r} is already a column")
        return self._derive(TopN(self.node, part, int(n), order,
                                 rank_column if with_rank else None, state_ttl_ms, key_groups))

    # -- event time -----------------------------------------------------------
    def with_watermark(self, column: str, bound: Duration = 0, *,
                       partition: Optional[str] = None,
                       idle_timeout: Optional[Duration] = None) -> "ChangelogStream":
        """Declare ``column`` (a TIMESTAMP) the event-time attribute, with a
        bounded-out-of-orderness watermark: ``max event time seen - bound - 1 ms``
        (docs/semantics.md, section 6; Flink's ``WATERMARK FOR column AS column -
        INTERVAL 'bound'``).  ``bound``: milliseconds, ``"5 seconds"`` or a timedelta.

        Declare it on a source, before ``normalize``/``join``: the source
        generates it and it travels with the stream to every event-time
        operator (windows, event-time deduplication, ``ON CONFLICT DO
        ERROR/NOTHING``, which needs it), each keeping the minimum over its
        sources' partitions in its checkpointed state.
        An integer epoch column is turned into a timestamp first, e.g.
        ``s.with_column("rt", "timestamp_millis(t)").with_watermark("rt", 1000)``.

        ``partition``: a column whose values are the source's partitions (a
        Kafka table's partition): each generates its own watermark, and the
        windows wait for the minimum over the partitions that are not idle
        (docs/windows.md, "Watermarks from the source").  Default: the source
        is one partition.  ``idle_timeout``: a partition without rows for that
        long (processing time) is idle and leaves the minimum (Flink's
        ``'scan.watermark.idle-timeout'``); default: the operator's own
        ``idle_timeout``, else never.
        """
        t = self.traits
        if column not in t.columns:
            raise ValueError(f"with_watermark: column {column!r} not among {list(t.columns)}")
        if partition is not None and partition not in t.columns:
            raise ValueError(f"with_watermark: partition column {partition!r} not among "
                             f"{list(t.columns)}")
        if t.watermark is not None:
            raise PlanError(f"with_watermark: the stream already has a watermark on "
                            f"{t.watermark.column!r}")
        stateful = _stateful_below(self.node)
        if stateful:
            raise PlanError("with_watermark must be declared on a source, before stateful "
                            f"operators ({', '.join(stateful)}): Spark does not allow "
                            "redefining the event time after a stateful operator")
        dtype = dict((f.name, f.dataType.typeName()) for f in self._lowered().schema.fields)[column]
        if dtype not in ("timestamp", "timestamp_ntz"):
            raise TypeError(
                f"with_watermark: event-time column {column!r} has type {dtype}; it must be a "
                f"TIMESTAMP. For epoch milliseconds add one first: "
                f".with_column('{column}_ts', 'timestamp_millis({column})')")
        return self._derive(WatermarkAssigner(
            self.node, column, duration_ms(bound), partition,
            None if idle_timeout is None else duration_ms(idle_timeout)))

    def window(self, window, *, watermark=None, partition: Optional[str] = None,
               idle_timeout: Optional[Duration] = None, allowed_lateness: Duration = 0
               ) -> "WindowedStream":
        """Event-time windows (docs/windows.md): ``window`` is
        ``tumble("ts", "1 minute")``, ``hop("ts", slide, size)``,
        ``cumulate("ts", step, max_size)`` or ``session("ts", gap)`` (sessions
        merge per group key; without group keys one session sequence over the
        whole stream, run as one key) from ``spark_changelog.operators.window``;
        then ``.aggregate(by=[...], users="count(distinct u)", n="count(*)")``.

        ``watermark``: a generator (``BoundedOutOfOrderness``, ``Punctuated``,
        your own ``WatermarkGenerator``); default: the stream's
        ``with_watermark``.  ``partition``: a column whose values are source
        partitions with their own watermarks (combined by minimum), or
        ``"<file>"`` for one per input file.  ``idle_timeout``: a partition
        without rows that long leaves the minimum.  ``allowed_lateness``: a
        fired window stays open that long and re-fires as ``-U``/``+U``.
        """
        column, assigner = window
        t = self.traits
        if column not in t.columns:
            raise ValueError(f"window: column {column!r} not among {list(t.columns)}")
        if t.mode is not ChangelogMode.INSERT_ONLY:
            raise PlanError(f"window: needs an insert-only input; this stream is {t.mode.value} "
                            "(deduplicate or aggregate it first)")
        if watermark is None and t.watermark is None:
            raise PlanError("window: the stream has no watermark; call with_watermark(column, "
                            "bound) first or pass watermark=BoundedOutOfOrderness(column, bound)")
        if partition is not None and partition != "<file>" and partition not in t.columns:
            raise ValueError(f"window: partition column {partition!r} not among {list(t.columns)}")
        tvf = WindowTableFunction(self.node, column, assigner, watermark, partition,
                                  None if idle_timeout is None else duration_ms(idle_timeout))
        return WindowedStream(self, tvf, duration_ms(allowed_lateness))

    # -- projection -----------------------------------------------------------
    def select(self, *cols, **named) -> "ChangelogStream":
        """Project the data columns (``_kind``/``_seq`` are kept).

        ``cols``: column names (``"*"`` for all), Spark ``Column`` expressions
        (aliased with ``.alias``), or SQL expression strings; ``named``: output
        name -> column name (a rename) or expression.  The planner keeps unique
        and upsert keys through references, renames and widening casts; an
        expression over a key column drops the key; ``rand()``,
        ``current_timestamp()``, ``uuid()``, ... mark the column non-deterministic
        (see :meth:`with_column` to say so explicitly).  Expressions are read as
        sqlglot trees (docs/plan.md, "Expressions").
        """
        from pyspark.sql import Column
        columns = list(self.traits.columns)
        items = []
        for c in cols:
            if isinstance(c, str) and c.strip() == "*":
                items.extend(ProjectItem.ref(name) for name in columns)
            elif isinstance(c, str) and c in columns:
                items.append(ProjectItem.ref(c))
            elif isinstance(c, (str, Column)):
                items.append(self._item(c, None, None))
            else:
                raise TypeError(f"select: expected a column name, expression string or Column, got {c!r}")
        for name, c in named.items():
            deterministic = None
            if isinstance(c, tuple):          # (expr, deterministic) from with_column
                c, deterministic = c
            if isinstance(c, str) and c in columns:
                items.append(ProjectItem.ref(name, c))
            else:
                items.append(self._item(c, name, deterministic))
        names = [i.name for i in items]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"select: duplicate output column(s) {dup}")
        return self._derive(Project(self.node, tuple(items)))

    project = select

    def _item(self, c, name: Optional[str], deterministic: Optional[bool]) -> ProjectItem:
        """One projected expression: a sqlglot tree parsed from the string (or
        from the SQL Spark prints for the resolved Column), named as Spark
        names it unless ``name`` is given."""
        from pyspark.sql import Column, functions as F
        types = self._types()
        column = c if isinstance(c, Column) else None
        if column is None:
            try:
                tree = parse(c)
            except ExpressionError:
                column = F.expr(c)            # Spark may still know it: read its resolved SQL
        # the input's rows are built only to resolve what the tree does not
        # say (a reader's rows are otherwise built when first used)
        if column is not None:
            spark_name, sql = column_sql(self._lowered().data_df, column)
            try:
                tree = parse(sql)
            except ExpressionError:           # opaque to the planner: keeps no key
                from sqlglot import exp
                tree = exp.Anonymous(this="opaque_expression")
            # explain shows the tree's Spark SQL (a Column prints as ``+(a, 1)``)
            return project_item(tree, name or spark_name, types, deterministic, column=column)
        if name is None and tree.alias == "":
            name = self._lowered().data_df.select(F.expr(c)).columns[0]
        return project_item(tree, name, types, deterministic, text=c.strip())

    def with_column(self, name: str, expr, deterministic: Optional[bool] = None
                    ) -> "ChangelogStream":
        """Add (or replace) one column; ``deterministic=False`` tells the planner
        the value changes between evaluations of the same row (a timestamp, a
        random number), which it otherwise reads from the expression."""
        named = {c: ((expr, deterministic) if c == name else c) for c in self.traits.columns}
        named.setdefault(name, (expr, deterministic))
        return self.select(**named)

    def where(self, condition) -> "ChangelogStream":
        """Keep the changes whose row satisfies ``condition`` (a SQL expression
        string or a Spark Column); a retraction and its row are filtered alike
        (docs/plan.md)."""
        from pyspark.sql import Column
        if isinstance(condition, Column):
            _, sql = column_sql(self._lowered().data_df, condition)
            tree = parse(sql)
            return self._derive(Filter(self.node, tree, to_spark_sql(tree), condition))
        return self._derive(Filter(self.node, parse(condition), condition.strip()))

    filter = where

    # -- union ------------------------------------------------------------------
    def union_all(self, *others: "ChangelogStream") -> "ChangelogStream":
        """``UNION ALL``: every change of this stream and of ``others``, columns
        matched by position and named as this stream's (docs/plan.md,
        "Union"): each input keeps its per-key ``_seq`` order; between inputs
        there is no order (compare ``_seq`` across them only when they share a
        sequence space).  No key survives a union."""
        if not others:
            raise ValueError("union_all needs at least one other stream")
        width = len(self.traits.columns)
        for o in others:
            if len(o.traits.columns) != width:
                raise ValueError(f"union_all: {width} columns {list(self.traits.columns)} against "
                                 f"{len(o.traits.columns)} {list(o.traits.columns)}")
        return self._derive(UnionAll((self.node,) + tuple(o.node for o in others)))

    # -- join -------------------------------------------------------------------
    def join(self, other: "ChangelogStream", on: JoinOn = None, *, left_on=None, right_on=None,
             how: str = "inner", condition=None, state_ttl_ms=None,
             key_groups: Optional[int] = None) -> "ChangelogStream":
        """Regular (unbounded) stream-stream join (docs/semantics.md, section 4).

        ``on``: ``[("level", "id"), ...]`` pairs (left column, right column), a
        ``{"level": "id"}`` dict, or names present on both sides; or
        ``left_on=[...]``/``right_on=[...]``.  ``how``: inner/left/right/full.
        ``condition``: an extra non-equi predicate, vectorized over candidate
        pairs: ``condition(left_df, right_df) -> bool array`` (output column
        names, see :class:`~spark_changelog.operators.join.RegularJoin`).
        ``state_ttl_ms``: int or ``(left, right)``.

        The state view of each side comes from the planner's unique keys.  An
        upsert-mode input, and a streaming input that does not keep per-key
        order, first goes through ChangelogNormalize (``plan.rules.order_input``).
        Output columns: left columns, then right ones (a taken name gets ``0``,
        ``1``, ... appended: ``id`` -> ``id0``).  The output's ``_seq`` is the
        join's own emission counter per key group: comparable only within one
        join key, which is why the planner marks the upsert key of a side
        shuffled on other columns as lost.
        """
        lk, rk = _join_columns(on, left_on, right_on)
        joined = Join(self.node, other.node, lk, rk, how.lower(), condition, state_ttl_ms,
                      key_groups)
        # a job-wide setting: on if either side asked for it
        return dataclasses.replace(self, mini_batch=self.mini_batch or other.mini_batch)._derive(joined)

    # -- sinks -------------------------------------------------------------------
    def plan_sink(self, key: Union[str, Sequence[str], None] = None, *, materialize: str = "auto",
                  conflict: Optional[str] = None, require_on_conflict: bool = False,
                  table: str = "sink", materializer_ttl_ms: Optional[int] = None,
                  key_groups: Optional[int] = None) -> Sink:
        """The planned sink (``plan.rules.plan_sink``): per-key order restored
        where the input does not guarantee it, then the materializer decision
        for an upsert sink keyed by ``key`` (default: the stream's primary key;
        ``()``: a sink without primary key, e.g. a print sink)."""
        key = tuple(self.traits.primary_key if key is None else as_key(key))
        return plan_sink(self.node, key, table=str(table), strategy=materialize, conflict=conflict,
                         require_on_conflict=require_on_conflict,
                         materializer_ttl_ms=materializer_ttl_ms, key_groups=key_groups,
                         mini_batch=self.mini_batch)

    def write_upsert(self, table: Union[str, "object"], *, checkpoint: Optional[str] = None,
                     changelog_path: Optional[str] = None, changelog_format: str = "parquet",
                     dead_letter: Optional[str] = None, strict: bool = False,
                     key: Union[str, Sequence[str], None] = None, progress=None,
                     materialize: str = "auto", conflict: Optional[str] = None,
                     require_on_conflict: bool = False,
                     materializer_ttl_ms: Optional[int] = None,
                     key_groups: Optional[int] = None, late_output: Optional[str] = None,
                     trigger: Optional[str] = None, until=None):
        """Write the stream to an upsert table (a Delta path or an ``UpsertSink``);
        see :func:`spark_changelog.runtime.pipeline.run_to_sink`.

        ``materialize``: ``auto`` (default) puts a SinkUpsertMaterializer in
        front of the sink where the input's upsert key is not contained in the
        sink key and the input has updates; ``force`` always; ``none`` never
        (``explain`` says when that is unsafe).  ``conflict``: ``deduplicate``
        (the default behaviour), ``error``/``nothing`` (need watermarks);
        rejected with ``materialize='none'`` (FLINK-41007).
        ``require_on_conflict``: Flink 2.3's strict default (an explicit
        ``conflict`` is required where a materializer is needed).  The report's
        ``plan`` holds the explain text, its ``warnings`` the plan warnings.
        Bad input of every source leaf goes to ``dead_letter``.
        ``late_output``: a directory for the late rows of window operators
        (JSON lines per micro-batch, docs/windows.md).
        ``trigger``/``until``: keep a streaming query running with a
        processing-time trigger (e.g. ``"0 seconds"``) until ``until(report)``
        is true; by default it reads what the sources hold now and stops.
        """
        name = os.fspath(table) if isinstance(table, (str, os.PathLike)) else type(table).__name__
        sink = self.plan_sink(key, materialize=materialize, conflict=conflict,
                              require_on_conflict=require_on_conflict, table=name,
                              materializer_ttl_ms=materializer_ttl_ms, key_groups=key_groups)
        return run_sink(sink, table, checkpoint=checkpoint, changelog_path=changelog_path,
                        changelog_format=changelog_format, dead_letter=dead_letter, strict=strict,
                        progress=progress, late_output=late_output, warn_stacklevel=3,
                        trigger=trigger, until=until)

    def collect(self):
        """A bounded stream's emitted changelog as pandas (data rows, in ``_seq`` order)."""
        from .runtime.pipeline import collect_changes
        return collect_changes(self.df)

    def explain(self, key: Union[str, Sequence[str], None] = None, *, materialize: str = "auto",
                conflict: Optional[str] = None, require_on_conflict: bool = False,
                table: str = "sink", materializer_ttl_ms: Optional[int] = None) -> str:
        """The plan with, per node, its changelog mode, unique keys and upsert key,
        why keys were lost, and what was inserted automatically.  With ``key``
        (the sink's primary key) the plan ends in that sink, with the
        materializer decision ``write_upsert`` would take and its reason."""
        if key is None and conflict is None and materialize == "auto":
            return explain_plan(self._planned())
        return explain_plan(self.plan_sink(key, materialize=materialize, conflict=conflict,
                                           require_on_conflict=require_on_conflict, table=table,
                                           materializer_ttl_ms=materializer_ttl_ms))


class GroupedStream:
    """``stream.group_by(keys)``: call :meth:`agg` for the aggregated stream."""

    def __init__(self, stream: ChangelogStream, key: tuple):
        self.stream = stream
        self.key = key

    def agg(self, *calls: str, generate_update_before: bool = True,
            emit_unchanged: Optional[bool] = None, state_ttl_ms: Optional[int] = None,
            key_groups: Optional[int] = None, **named: str) -> ChangelogStream:
        """``SELECT key..., calls... GROUP BY key`` over the changelog, with
        retraction (docs/operators.md, "Group aggregation").

        ``calls``: ``"AVG(score) AS avg_score"``, ``"COUNT(*) AS n"``,
        ``"COUNT(DISTINCT v) AS d"``; ``named``: ``avg_score="AVG(score)"``.
        Functions: COUNT, COUNT DISTINCT, SUM, AVG (AVG over BIGINT is BIGINT,
        as in Flink), MIN, MAX, FIRST_VALUE, LAST_VALUE.  ``emit_unchanged``:
        emit ``-U``/``+U`` when a group's result did not change (default: only
        with a state TTL, as Flink)."""
        aggs = [aggregate_call(c) for c in calls] + [aggregate_call(text, name)
                                                    for name, text in named.items()]
        if not aggs:
            raise ValueError("agg needs at least one aggregate, e.g. 'COUNT(*) AS n'")
        cols = self.stream.traits.columns
        missing = sorted({c for _, c, _ in aggs if c is not None and c not in cols})
        if missing:
            raise ValueError(f"agg: column(s) {missing} not among {list(cols)}")
        return self.stream._derive(Aggregate(self.stream.node, self.key, tuple(aggs),
                                             generate_update_before, emit_unchanged,
                                             state_ttl_ms, key_groups))


def _order_items(order_by) -> tuple:
    """``"a DESC, b"`` or ``[("a", False), "b"]`` as ``(("a", False), ("b", True))``."""
    items = [p.strip() for p in order_by.split(",")] if isinstance(order_by, str) else list(order_by)
    out = []
    for item in items:
        if isinstance(item, str):
            parts = item.split()
            direction = parts[1].upper() if len(parts) == 2 else "ASC"
            if not parts or len(parts) > 2 or direction not in ("ASC", "DESC"):
                raise ValueError(f"order_by item {item!r}: expected 'column [ASC|DESC]'")
            out.append((parts[0], direction == "ASC"))
        else:
            col, asc = item
            out.append((str(col), bool(asc)))
    if not out:
        raise ValueError("order_by needs at least one column")
    return tuple(out)


def _stateful_below(node: Node) -> list[str]:
    """Names of the stateful nodes in the plan below (and at) ``node``."""
    out: list[str] = []

    def walk(n: Node) -> None:
        for c in n.children:
            walk(c)
        name = _STATEFUL.get(type(n))
        if name:
            out.append(name)
    walk(node)
    return out


@dataclasses.dataclass(frozen=True)
class WindowedStream:
    """A stream with a window table function, waiting for its aggregation."""

    stream: ChangelogStream
    tvf: WindowTableFunction
    allowed_lateness_ms: int = 0

    def aggregate(self, by: Union[str, Sequence[str], None] = None, *,
                  key_groups: int = WINDOW_KEY_GROUPS, window_time: bool = False,
                  **aggregates) -> ChangelogStream:
        """GROUP BY ``by`` + window_start + window_end; ``aggregates``:
        ``name="count(*)"``, ``"count(col)"``, ``"count(distinct col)"``,
        ``"sum(col)"``, ``"avg(col)"``, ``"min(col)"``, ``"max(col)"``.  The
        output is insert-only (``-U``/``+U`` re-fires with allowed lateness),
        keyed by the group keys and the window bounds; late rows go to
        ``write_upsert(late_output=...)``.  ``window_time=True`` adds the
        ``window_time`` column (``window_end`` minus 1 ms): over the stream's
        ``with_watermark`` it is the output's event-time attribute, so
        ``.window(tumble("window_time", ...))`` cascades a second window
        (docs/windows.md, "Cascading windows")."""
        if not aggregates:
            raise ValueError("aggregate: name at least one aggregate, e.g. n='count(*)'")
        by = as_key(by)
        cols = self.stream.traits.columns
        missing = [c for c in by if c not in cols]
        if missing:
            raise ValueError(f"aggregate: group key(s) {missing} not among {list(cols)}")
        calls = tuple(_agg_call(name, text, cols) for name, text in aggregates.items())
        return self.stream._derive(WindowAggregate(self.tvf, by, calls, self.allowed_lateness_ms,
                                                   key_groups, window_time))

    def select(self) -> ChangelogStream:
        """The window table function alone: every row once per window, with
        ``window_start``/``window_end``."""
        return self.stream._derive(self.tvf)


def _agg_call(name: str, text: str, columns) -> tuple:
    import re
    m = re.fullmatch(r"\s*(\w+)\s*\(\s*(distinct\s+)?([\w*]+)\s*\)\s*", str(text), re.I)
    if not m:
        raise ValueError(f"aggregate {name}={text!r}: write e.g. 'count(*)', 'sum(x)', "
                         "'count(distinct u)'")
    func, distinct, col = m.group(1).lower(), bool(m.group(2)), m.group(3)
    if distinct and func != "count":
        raise ValueError(f"aggregate {name}={text!r}: DISTINCT only with count")
    func = "count_distinct" if distinct else func
    if func not in ("count", "count_distinct", "sum", "avg", "min", "max"):
        raise ValueError(f"aggregate {name}={text!r}: {func} is not a window aggregate "
                         "(count, count distinct, sum, avg, min, max)")
    col = None if col == "*" else col
    if col is not None and col not in columns:
        raise ValueError(f"aggregate {name}={text!r}: no column {col!r} in {list(columns)}")
    return (name, func, col)


def _join_columns(on, left_on, right_on) -> tuple[tuple, tuple]:
    if on is not None and (left_on is not None or right_on is not None):
        raise ValueError("join: pass on= or left_on=/right_on=, not both")
    if on is None:
        lk, rk = as_key(left_on), as_key(right_on)
    elif isinstance(on, dict):
        lk, rk = tuple(on), tuple(on.values())
    elif isinstance(on, str):
        lk = rk = as_key(on)
    else:
        pairs = [(p, p) if isinstance(p, str) else tuple(p) for p in on]
        if any(len(p) != 2 for p in pairs):
            raise ValueError(f"join: on= takes (left, right) column pairs, got {on!r}")
        lk, rk = tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    if not lk or len(lk) != len(rk):
        raise ValueError(f"join: the join columns must pair up: left {list(lk)}, right {list(rk)}")
    return lk, rk


def read_changes(spark, path, format: str = "debezium-json", schema=None, primary_key=None,
                 streaming: bool = False, ordered: bool = False, *, name: Optional[str] = None,
                 mode: Union[ChangelogMode, str, None] = None, **kw) -> ChangelogStream:
    """Read CDC files (``debezium-json``, ``canal-json``, ``maxwell-json``, ``changelog``;
    ``format="changelog"`` with ``kind_column=None``: plain rows, every one an
    insert, an insert-only stream).

    ``ordered=True`` declares that a streaming read brings each key's changes in
    source-sequence order (files arrive in log order), so the planner puts no
    ChangelogNormalize in front of joins, materializers and sinks; explain says
    what that risks (docs/semantics.md, section 10).  ``name``: how ``explain``
    calls the source (default: the format).  ``mode``: what the files hold,
    overriding the reader's ``retract`` (every change with its old row):
    ``insert_only`` (inserts only, so keep-first deduplication, windows and the
    append Top-N apply; a change of another kind fails the job, naming its
    sequence number) or ``upsert`` (``+U`` without ``-U``, deletes may carry the
    key only: the planner puts a ChangelogNormalize on the primary key where
    an operator needs the old rows)."""
    from .connectors.cdc_json import read_changes as _read
    res = _read(spark, path, format=format, schema=schema, primary_key=primary_key,
                streaming=streaming, **kw)
    s = res.stream_schema
    mode = s.mode if mode is None else ChangelogMode(mode)
    if mode is ChangelogMode.UPSERT and not s.primary_key:
        raise ValueError("an upsert source needs a primary key")
    node = Source(name or format, tuple(s.columns), tuple(s.primary_key), mode,
                  tuple(s.upsert_key) if s.upsert_key else (), streaming=bool(streaming),
                  declared_ordered=bool(ordered), reader=res)
    return ChangelogStream(spark, node)


def read_snapshots(spark, snapshots, primary_key, *, format: str = "parquet", schema=None,
                   sequence: Optional[Sequence[int]] = None,
                   versions: Optional[Sequence[int]] = None,
                   name: Optional[str] = None) -> ChangelogStream:
    """CDC from snapshots (docs/operators.md, "CDC from snapshots"): the
    changelog of successive full snapshots of a table, compared key by key in
    one Spark job (``connectors.snapshots``).  ``snapshots``: a list of
    DataFrames or paths (one full snapshot each, read with ``format`` and
    ``schema``), oldest first, with ``sequence`` values (default 0, 1, ...);
    or, with ``format="delta"``, the path of a Delta table whose ``versions``
    (default: all) are the snapshots and whose version numbers are the
    sequence.  A bounded stream: ``.history()`` gives the table's SCD type 2
    history, ``.normalize()`` its last snapshot."""
    from .connectors.snapshots import delta_snapshots, snapshot_changelog
    key = as_key(primary_key)
    if not key:
        raise ValueError("read_snapshots needs a primary_key to compare snapshots by")
    if format == "delta":
        frames, sequence = delta_snapshots(spark, os.fspath(snapshots), versions)
    else:
        frames = [s if hasattr(s, "columns") else
                  (spark.read.format(format).schema(schema) if schema else
                   spark.read.format(format)).load(os.fspath(s)) for s in snapshots]
    df = snapshot_changelog(frames, key, sequence)
    return ChangelogStream.from_dataframe(df, key, ChangelogMode.RETRACT, name=name or "snapshots")


def read_debezium(spark, path, schema=None, primary_key=None, **kw) -> ChangelogStream:
    return read_changes(spark, path, "debezium-json", schema, primary_key, **kw)


def read_canal(spark, path, schema=None, primary_key=None, **kw) -> ChangelogStream:
    return read_changes(spark, path, "canal-json", schema, primary_key, **kw)


def read_maxwell(spark, path, schema=None, primary_key=None, **kw) -> ChangelogStream:
    return read_changes(spark, path, "maxwell-json", schema, primary_key, **kw)


def read_postgres_cdc(spark, table_name: str, *, hostname: str = "localhost", port: int = 5432,
                      username: str, password: Optional[str] = None, database_name: str,
                      schema_name: str = "public", slot_name: str,
                      scan_startup_mode: str = "initial", name: Optional[str] = None,
                      **options) -> ChangelogStream:
    """Stream one PostgreSQL table's changes from a logical replication slot
    (docs/sources.md, "PostgreSQL CDC"): a consistent snapshot first
    (``scan_startup_mode="initial"``), then the log, exactly once.  Keyword
    names are Flink CDC's option names with ``_`` for ``-`` and ``.``;
    ``options``: more of them in Flink's spelling, e.g.
    ``**{"scan.incremental.snapshot.chunk.size": 10000}``.  With ``REPLICA
    IDENTITY FULL`` the stream is a retract changelog; with the default
    identity an upsert one (the planner restores old rows with
    ChangelogNormalize).  Always streaming: write it with a checkpoint."""
    from .connectors.postgres_cdc import read_postgres_cdc as _read
    res = _read(spark, {"hostname": hostname, "port": port, "username": username,
                        "password": password, "database-name": database_name,
                        "schema-name": schema_name, "table-name": table_name,
                        "slot.name": slot_name, "scan.startup.mode": scan_startup_mode, **options})
    s = res.stream_schema
    node = Source(name or f"postgres-cdc:{schema_name}.{table_name}", tuple(s.columns),
                  tuple(s.primary_key), s.mode, tuple(s.upsert_key), streaming=True,
                  declared_ordered=True, reader=res)
    return ChangelogStream(spark, node)


__all__ = ["ChangelogStream", "PlanWarning", "PlanError", "read_changes", "read_debezium",
           "read_snapshots",
           "read_canal", "read_maxwell", "read_postgres_cdc"]
