"""The Python API: changelog streams over Spark DataFrames.

```python
from spark_changelog import build_session, read_debezium
spark = build_session()
src = read_debezium(spark, "cdc/", schema="id BIGINT, name STRING", primary_key=["id"])
report = src.normalize().write_upsert("table/", checkpoint="ck/")   # or streaming=False
```

A :class:`ChangelogStream` is a Spark DataFrame (data columns + ``_kind`` +
``_seq``) plus its :class:`~spark_changelog.model.StreamSchema`.  Operators
build new streams; nothing runs until a ``write_*``/``collect`` call.  The same
pipeline runs on a bounded DataFrame (batch) and as a Structured Streaming
query with a checkpoint, with the same operator code and the same final table.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence, Union

import pyarrow as pa

from .model import KIND_COL, SEQ_COL, ChangelogMode, StreamSchema, as_key
from .model.watermark import BoundedOutOfOrderness, Duration, duration_ms
from .operators.base import KeyedOperator
from .operators.normalize import DAY_MS, ChangelogNormalize
from .plan import explain_plan, materialize as plan_materialize
from .plan.expressions import classify, expression_text, is_nondeterministic
from .plan.rules import PlanError, order_input, plan_warnings
from .plan.traits import (Filter, Join, Materialize, Node, Normalize, Project, ProjectItem, Sink,
                          Source, WatermarkAssigner, join_state_unique_key)
from .runtime.spark_keyed import DEFAULT_KEY_GROUPS, apply_keyed

JoinOn = Union[str, Sequence[Union[str, tuple]], dict, None]


def arrow_schema_of(df) -> pa.Schema:
    """The Arrow schema operators see.  TIMESTAMP columns are UTC instants
    (``timestamp[us, tz=UTC]``): the runtime hands operators tz-aware UTC
    values whatever the session time zone, so state and event times never
    depend on it (``spark_keyed._input_frame``)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    return to_arrow_schema(df.schema, timezone="UTC")


@dataclasses.dataclass
class ChangelogStream:
    """A changelog: a DataFrame with ``_kind``/``_seq`` and its schema facts."""

    df: object                      # pyspark.sql.DataFrame
    schema: StreamSchema
    source: Optional[object] = None  # the ReadResult it came from (dead letters)
    steps: tuple = ()               # operator names
    plan: Optional[Node] = None     # planner node (traits, explain); built from schema if None

    @property
    def spark(self):
        return self.df.sparkSession

    @property
    def is_streaming(self) -> bool:
        return bool(self.df.isStreaming)

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
        schema = StreamSchema(cols, pk, pk or None, mode)
        plan = Source(name or "changelog", cols, pk, mode, pk, streaming=bool(df.isStreaming),
                      declared_ordered=bool(ordered))
        return cls(df, schema, plan=plan)

    @property
    def node(self) -> Node:
        """The planner's node for this stream (a Source built from the schema facts
        when the stream was not built by the API's operators)."""
        if self.plan is None:
            s = self.schema
            name = getattr(self.source, "format", None) or "changelog"
            self.plan = Source(str(name), tuple(s.columns), tuple(s.primary_key), s.mode,
                               tuple(s.upsert_key) if s.upsert_key else (),
                               has_watermark=s.watermark is not None,
                               streaming=self.is_streaming)
        return self.plan

    def apply(self, operator: KeyedOperator, schema: StreamSchema, *,
              key_groups: int = DEFAULT_KEY_GROUPS, plan: Optional[Node] = None
              ) -> "ChangelogStream":
        # metric rows of upstream operators travel along (runtime.spark_keyed)
        out = apply_keyed(self.df, operator, key_groups=key_groups)
        return ChangelogStream(out, schema, self.source, self.steps + (operator.name,), plan)

    def normalize(self, key: Union[str, Sequence[str], None] = None, *,
                  state_ttl_ms: Optional[int] = None,
                  tombstone_retention_ms: Optional[int] = DAY_MS,
                  generate_update_before: bool = True,
                  key_groups: int = DEFAULT_KEY_GROUPS) -> "ChangelogStream":
        """ChangelogNormalize: keep the last change per key (spec section 5)."""
        key = as_key(key) or self.schema.primary_key
        if not key:
            raise ValueError("normalize needs a key: the stream has no primary key; pass key=[...]")
        op = ChangelogNormalize(arrow_schema_of(self._data_df()), key, state_ttl_ms=state_ttl_ms,
                                tombstone_retention_ms=tombstone_retention_ms,
                                generate_update_before=generate_update_before)
        out_schema = self.schema.with_(primary_key=key, upsert_key=key,
                                       mode=ChangelogMode.RETRACT if generate_update_before
                                       else ChangelogMode.UPSERT)
        return self.apply(op, out_schema, key_groups=key_groups,
                          plan=Normalize(self.node, tuple(key), generate_update_before))

    # -- event time -----------------------------------------------------------
    def with_watermark(self, column: str, bound: Duration = 0) -> "ChangelogStream":
        """Declare ``column`` (a TIMESTAMP) the event-time attribute, with a
        bounded-out-of-orderness watermark: ``max event time seen - bound - 1 ms``
        (spec section 6; Flink's ``WATERMARK FOR column AS column - INTERVAL
        'bound'``).  ``bound``: milliseconds, ``"5 seconds"`` or a timedelta.

        Declare it on a source, before ``normalize``/``join``: Spark computes one
        watermark per query (the minimum over the sources that declare one) and
        keeps it in the checkpoint.  ``ON CONFLICT DO ERROR/NOTHING`` need it.
        An integer epoch column is turned into a timestamp first, e.g.
        ``s.with_column("rt", "timestamp_millis(t)").with_watermark("rt", 1000)``.
        """
        if column not in self.schema.columns:
            raise ValueError(f"with_watermark: column {column!r} not among {list(self.schema.columns)}")
        if self.schema.watermark is not None:
            raise PlanError(f"with_watermark: the stream already has a watermark on "
                            f"{self.schema.watermark.column!r}")
        if any(step not in ("Project", "Filter") for step in self.steps):
            raise PlanError("with_watermark must be declared on a source, before stateful "
                            f"operators ({', '.join(self.steps)}): Spark does not allow "
                            "redefining the event time after a stateful operator")
        dtype = dict((f.name, f.dataType.typeName()) for f in self.df.schema.fields)[column]
        if dtype not in ("timestamp", "timestamp_ntz"):
            raise TypeError(
                f"with_watermark: event-time column {column!r} has type {dtype}; it must be a "
                f"TIMESTAMP. For epoch milliseconds add one first: "
                f".with_column('{column}_ts', 'timestamp_millis({column})')")
        strategy = BoundedOutOfOrderness(column, duration_ms(bound))
        df = self.df.withWatermark(column, strategy.spark_delay)
        schema = self.schema.with_(time_attribute=column, watermark=strategy)
        node = WatermarkAssigner(self.node, column, strategy.bound_ms)
        return ChangelogStream(df, schema, self.source, self.steps, node)

    # -- projection -----------------------------------------------------------
    def select(self, *cols, **named) -> "ChangelogStream":
        """Project the data columns (``_kind``/``_seq`` are kept).

        ``cols``: column names (``"*"`` for all), Spark ``Column`` expressions
        (aliased with ``.alias``), or SQL expression strings; ``named``: output
        name -> column name (a rename) or expression.  The planner keeps unique
        and upsert keys through references, renames and widening casts; an
        expression over a key column drops the key; ``rand()``,
        ``current_timestamp()``, ``uuid()``, ... mark the column non-deterministic
        (see :meth:`with_column` to say so explicitly).
        """
        from pyspark.sql import Column, functions as F
        columns = list(self.schema.columns)
        types = self._types()
        exprs, items = [], []

        def add(expr, item):
            exprs.append(expr)
            items.append(item)

        for c in cols:
            if isinstance(c, str) and c.strip() == "*":
                for name in columns:
                    add(F.col(f"`{name}`"), ProjectItem.ref(name))
            elif isinstance(c, str) and c in columns:
                add(F.col(f"`{c}`"), ProjectItem.ref(c))
            elif isinstance(c, str):
                e = F.expr(c)
                item = classify(expression_text(e), None, types)
                add(e.alias(item.name), item)
            elif isinstance(c, Column):
                item = classify(expression_text(c), None, types)
                add(c.alias(item.name), item)
            else:
                raise TypeError(f"select: expected a column name, expression string or Column, got {c!r}")
        for name, c in named.items():
            deterministic = None
            if isinstance(c, tuple):          # (expr, deterministic) from with_column
                c, deterministic = c
            if isinstance(c, str) and c in columns:
                add(F.col(f"`{c}`"), ProjectItem.ref(name, c))
                continue
            e = F.expr(c) if isinstance(c, str) else c
            item = classify(expression_text(e), name, types, deterministic)
            add(e, item)
        names = [i.name for i in items]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"select: duplicate output column(s) {dup}")
        node = Project(self.node, tuple(items))
        t = node.traits
        df = self.df
        from .runtime.spark_keyed import METRICS_COL
        keep_metrics = METRICS_COL in df.columns
        is_data = F.col(KIND_COL) != F.lit(-1)
        out_cols = [(F.when(is_data, e) if keep_metrics else e).alias(i.name)
                    for e, i in zip(exprs, items)]
        out_cols += [F.col(KIND_COL), F.col(SEQ_COL)] + ([F.col(METRICS_COL)] if keep_metrics else [])
        out = df.select(*out_cols)
        carried = {}
        for i in items:
            if i.source is not None and i.injective:
                carried.setdefault(i.source, i.name)
        pk = tuple(carried[c] for c in self.schema.primary_key) \
            if all(c in carried for c in self.schema.primary_key) else ()
        time_attr = carried.get(self.schema.time_attribute) if self.schema.time_attribute else None
        watermark = self.schema.watermark
        if watermark is not None and time_attr is not None:
            watermark = watermark.renamed(time_attr)
        schema = StreamSchema(tuple(names), pk, t.upsert_key, t.mode,
                              time_attribute=time_attr, watermark=watermark)
        return ChangelogStream(out, schema, self.source, self.steps + ("Project",), node)

    project = select

    def where(self, condition) -> "ChangelogStream":
        """Keep the rows for which ``condition`` (a SQL expression string or a
        Spark ``Column``) is true; null counts as false.  Both halves of an
        update are tested, so an update that leaves the filter comes out as a
        retraction.  An upsert stream (no ``-U``) first goes through
        ChangelogNormalize: the filter must retract the old row of a key whose
        new row no longer passes."""
        from pyspark.sql import Column, functions as F
        from .runtime.spark_keyed import METRICS_KIND
        if not isinstance(condition, (str, Column)):
            raise TypeError(f"where: expected a SQL expression string or a Column, got {condition!r}")
        stream = self
        t = self.node.traits
        if t.mode is ChangelogMode.UPSERT:
            key = t.upsert_key or (t.unique_keys[0] if t.unique_keys else None)
            if not key:
                raise PlanError("where: an upsert stream without a key cannot be filtered: give "
                                "it a primary key")
            stream = self._order_ready(Normalize(
                self.node, tuple(key), True, inserted_because=(
                    "a filter over an upsert stream needs update-before: it must retract the "
                    "old row of a key whose new row no longer passes")))
        cond = F.expr(condition) if isinstance(condition, str) else condition
        text = expression_text(cond)
        # operator metric / dead-letter side rows pass every filter (contracts: side rows)
        df = stream.df.where((F.col(KIND_COL) == F.lit(METRICS_KIND)) |
                             F.coalesce(cond, F.lit(False)))
        node = Filter(stream.node, text, not is_nondeterministic(text))
        return ChangelogStream(df, stream.schema, stream.source, stream.steps + ("Filter",), node)

    filter = where

    def with_column(self, name: str, expr, deterministic: Optional[bool] = None
                    ) -> "ChangelogStream":
        """Add (or replace) one column; ``deterministic=False`` tells the planner
        the value changes between evaluations of the same row (a timestamp, a
        random number), which it otherwise guesses from the expression text."""
        named = {c: ((expr, deterministic) if c == name else c) for c in self.schema.columns}
        named.setdefault(name, (expr, deterministic))
        return self.select(**named)

    # -- join -------------------------------------------------------------------
    def join(self, other: "ChangelogStream", on: JoinOn = None, *, left_on=None, right_on=None,
             how: str = "inner", condition=None, state_ttl_ms=None,
             key_groups: int = DEFAULT_KEY_GROUPS) -> "ChangelogStream":
        """Regular (unbounded) stream-stream join (spec section 4).

        ``on``: ``[("level", "id"), ...]`` pairs (left column, right column), a
        ``{"level": "id"}`` dict, or names present on both sides; or
        ``left_on=[...]``/``right_on=[...]``.  ``how``: inner/left/right/full.
        ``condition``: an extra non-equi predicate, vectorized over candidate
        pairs: ``condition(left_df, right_df) -> bool array`` (output column
        names, see :class:`~spark_changelog.operators.join.RegularJoin`).
        ``state_ttl_ms``: int or ``(left, right)``.

        The state view of each side comes from the planner's unique keys.  An
        upsert-mode input first goes through ChangelogNormalize (with
        update-before), as the join must retract rows it emitted.  Output
        columns: left columns, then right ones (a taken name gets ``0``, ``1``,
        ... appended: ``id`` -> ``id0``).  The output's ``_seq`` is the join's
        own emission counter per key group: comparable only within one join
        key, which is why the planner marks the upsert key of a side shuffled
        on other columns as lost.
        """
        from .operators.join import JoinInputLayout, RegularJoin
        lk, rk = _join_columns(on, left_on, right_on)
        left, right = self._join_ready(), other._join_ready()
        node = Join(left.node, right.node, lk, rk, how.lower(), condition is not None)
        left_df, right_df = left._data_df(), right._data_df()
        layout = JoinInputLayout(arrow_schema_of(left_df), arrow_schema_of(right_df), lk, rk)
        if layout.right_rename != node.right_rename:      # pragma: no cover - one rule
            raise AssertionError(f"join output names disagree: {layout.right_rename} vs "
                                 f"{node.right_rename}")
        op = RegularJoin(layout, how, join_state_unique_key(left.node.traits, lk),
                         join_state_unique_key(right.node.traits, rk), condition, state_ttl_ms)
        out = apply_keyed(layout.spark_union(left_df, right_df), op, key_groups=key_groups)
        t = node.traits
        # the event-time column of the output: the left one, else the right one
        # (renamed as in the output); the watermark is the query's, min over sources
        time_attr = left.schema.time_attribute
        if time_attr is None and right.schema.time_attribute is not None:
            time_attr = node.right_rename[right.schema.time_attribute]
        watermark = left.schema.watermark or right.schema.watermark
        if watermark is not None and time_attr is not None:
            watermark = watermark.renamed(time_attr)
        schema = StreamSchema(tuple(t.columns), (), t.upsert_key, t.mode,
                              time_attribute=time_attr if t.has_watermark else None,
                              watermark=watermark if t.has_watermark else None)
        return ChangelogStream(out, schema, None, left.steps + right.steps + (op.name,), node)

    def _join_ready(self) -> "ChangelogStream":
        """The join side with per-key order restored where needed (``rules.order_input``)."""
        return self._order_ready(order_input(self.node, "join"))

    def _order_ready(self, node: Node) -> "ChangelogStream":
        """This stream, or its ChangelogNormalize when the planner put one on top of
        it (``node`` is then that Normalize over ``self.node``)."""
        if node is self.node:
            return self
        assert isinstance(node, Normalize) and node.input is self.node
        s = self.normalize(node.key, generate_update_before=node.generate_update_before)
        s.plan = node
        return s

    def _types(self) -> dict:
        return {f.name: f.dataType.simpleString() for f in self._data_df().schema.fields
                if f.name in self.schema.columns}

    def _data_df(self):
        """The DataFrame without operator metric columns (input of the next operator)."""
        from .runtime.spark_keyed import METRICS_COL, METRICS_KIND
        from pyspark.sql import functions as F
        if METRICS_COL in self.df.columns:
            return self.df.where(F.col(KIND_COL) != F.lit(METRICS_KIND)).drop(METRICS_COL)
        return self.df

    def plan_sink(self, key: Union[str, Sequence[str], None] = None, *, materialize: str = "auto",
                  conflict: Optional[str] = None, require_on_conflict: bool = False,
                  table: str = "sink") -> Sink:
        """The planned sink: per-key order restored where the input does not
        guarantee it (docs/semantics.md, section 10), then the materializer
        decision (section 3) for an upsert sink keyed by ``key`` (default: the
        stream's primary key; ``()``: a sink without primary key, e.g. a print
        sink)."""
        key = tuple(self.schema.primary_key if key is None else as_key(key))
        node = order_input(self.node, "upsert sink", update_before=False)
        sink = plan_materialize(Sink(node, str(table), key, materialize, conflict),
                                require_on_conflict=require_on_conflict)
        if isinstance(node, Normalize) and sink.decision.inserted:
            # the materializer retracts rows by their old content: it needs -U rows
            node = order_input(self.node, "sink upsert materializer", update_before=True)
            sink = plan_materialize(Sink(node, str(table), key, materialize, conflict),
                                    require_on_conflict=require_on_conflict)
        return sink

    def write_upsert(self, table: Union[str, "object"], *, checkpoint: Optional[str] = None,
                     changelog_path: Optional[str] = None, changelog_format: str = "parquet",
                     dead_letter: Optional[str] = None, strict: bool = False,
                     key: Union[str, Sequence[str], None] = None, progress=None,
                     materialize: str = "auto", conflict: Optional[str] = None,
                     require_on_conflict: bool = False,
                     materializer_ttl_ms: Optional[int] = None,
                     key_groups: int = DEFAULT_KEY_GROUPS):
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
        """
        import warnings as _warnings
        from .operators.sink_upsert_materializer import SinkUpsertMaterializer
        from .runtime.pipeline import run_to_sink
        name = os.fspath(table) if isinstance(table, (str, os.PathLike)) else type(table).__name__
        sink = self.plan_sink(key, materialize=materialize, conflict=conflict,
                              require_on_conflict=require_on_conflict, table=name)
        m = sink.input
        stream = self._order_ready(m.input if isinstance(m, Materialize) else m)
        if sink.decision.inserted:
            assert isinstance(m, Materialize)
            op = SinkUpsertMaterializer(arrow_schema_of(stream._data_df()), sink.key,
                                        upsert_key=m.upsert_key, state_ttl_ms=materializer_ttl_ms,
                                        conflict=m.conflict)
            t = m.traits
            schema = StreamSchema(tuple(t.columns), tuple(sink.key), tuple(sink.key), t.mode,
                                  watermark=self.schema.watermark)
            stream = stream.apply(op, schema, key_groups=key_groups, plan=m)
        warns = plan_warnings(sink)
        for w in warns:
            _warnings.warn(w, PlanWarning, stacklevel=2)
        report = run_to_sink(stream, table, checkpoint=checkpoint, changelog_path=changelog_path,
                             changelog_format=changelog_format, dead_letter=dead_letter,
                             strict=strict, key=sink.key, progress=progress)
        report.plan = explain_plan(sink)
        report.warnings[:0] = warns
        return report

    def collect(self):
        """A bounded stream's emitted changelog as pandas (data rows, in ``_seq`` order)."""
        from .runtime.pipeline import collect_changes
        return collect_changes(self)

    def explain(self, key: Union[str, Sequence[str], None] = None, *, materialize: str = "auto",
                conflict: Optional[str] = None, require_on_conflict: bool = False,
                table: str = "sink") -> str:
        """The plan with, per node, its changelog mode, unique keys and upsert key,
        why keys were lost, and what was inserted automatically.  With ``key``
        (the sink's primary key) the plan ends in that sink, with the
        materializer decision ``write_upsert`` would take and its reason."""
        if key is None and conflict is None and materialize == "auto":
            return explain_plan(self.node)
        return explain_plan(self.plan_sink(key, materialize=materialize, conflict=conflict,
                                           require_on_conflict=require_on_conflict, table=table))


class PlanWarning(UserWarning):
    """A plan-time warning (e.g. non-deterministic columns without an upsert key)."""


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
                 **kw) -> ChangelogStream:
    """Read CDC files (``debezium-json``, ``canal-json``, ``maxwell-json``, ``changelog``).

    ``ordered=True`` declares that a streaming read brings each key's changes in
    source-sequence order (files arrive in log order), so the planner puts no
    ChangelogNormalize in front of joins, materializers and sinks; explain says
    what that risks (docs/semantics.md, section 10).  ``name``: how ``explain``
    calls the source (default: the format)."""
    from .connectors.cdc_json import read_changes as _read
    res = _read(spark, path, format=format, schema=schema, primary_key=primary_key,
                streaming=streaming, **kw)
    s = res.stream_schema
    plan = Source(name or format, tuple(s.columns), tuple(s.primary_key), s.mode,
                  tuple(s.upsert_key) if s.upsert_key else (), streaming=bool(streaming),
                  declared_ordered=bool(ordered))
    return ChangelogStream(res.changes, s, res, plan=plan)


def read_debezium(spark, path, schema=None, primary_key=None, **kw) -> ChangelogStream:
    return read_changes(spark, path, "debezium-json", schema, primary_key, **kw)


def read_canal(spark, path, schema=None, primary_key=None, **kw) -> ChangelogStream:
    return read_changes(spark, path, "canal-json", schema, primary_key, **kw)


def read_maxwell(spark, path, schema=None, primary_key=None, **kw) -> ChangelogStream:
    return read_changes(spark, path, "maxwell-json", schema, primary_key, **kw)
