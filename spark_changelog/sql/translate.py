"""Flink SQL statements -> changelog streams of the Python API (docs/sql.md).

Everything a script does is built with :class:`~spark_changelog.api.ChangelogStream`
methods (``read_changes``, ``with_column``, ``with_watermark``, ``select``,
``where``, ``join``, ``group_by().agg()``, ``deduplicate``, ``top_n``,
``window().aggregate()``, ``explain``, ``write_upsert``), so SQL and Python
end in the same plan, the same explain text and the same operators.

* ``CREATE TABLE`` with a ``filesystem`` connector is a source: the CDC or
  changelog-file reader with the table's schema and primary key, then its
  computed columns (``PROCTIME()`` is ``current_timestamp()``, marked
  non-deterministic), then its watermark (``bound = delay - 1 ms``,
  :mod:`.script`).  Other connectors are sinks.
* ``SELECT`` lists become one projection, ``WHERE`` a filter, ``JOIN ... ON``
  a regular join on the equalities between the two sides' columns; the rest
  of ``ON`` is the join's vectorized condition (:mod:`.predicate`).
* Expressions are sqlglot trees; column references are resolved against the
  ``FROM`` scope, a few Flink functions are rewritten to their Spark
  equivalents (:data:`FUNCTION_MAP`), and the tree is generated as Spark SQL.
* ``INSERT INTO t`` maps the query's columns to ``t``'s by position (or by the
  column list), casting where the types differ, and plans the upsert sink
  with the ``SET`` options in force at that statement.

* ``GROUP BY`` is the group aggregation, ``HAVING`` a filter over it,
  ``SELECT DISTINCT`` a ``GROUP BY`` of every item; ``ROW_NUMBER() OVER``
  filtered on the row number is deduplication or Top-N (:mod:`.over`);
  ``FROM TABLE(TUMBLE(...))`` a window table function (:mod:`.window_tvf`).
  Both leave a *pending* relation that the enclosing query completes.

Features without an operator or plan node (``UNION``, ``ORDER BY``/``LIMIT``,
``OVER`` aggregation, ...) raise :class:`UnsupportedFeature` with their line
and column.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
from typing import Callable, Optional, Sequence

from sqlglot import exp

from ..api import ChangelogStream, read_changes
from ..model.watermark import duration_ms
from ..plan.rules import PlanError
from ..model import join_output_names
from .dialect import Descriptor, Flink, TableArgument, WINDOW_TVFS
from . import window_tvf
from .errors import SqlError, UnsupportedFeature
from .over import RankCall, apply_rank, is_rank_item, rank_relation, unfiltered_error
from .predicate import JoinCondition, UnsupportedCondition
from .window_tvf import WindowCall
from .script import (ExplainDef, InsertDef, Position, QueryDef, Script, SetOption, StatementSet,
                     TableDef, ViewDef, node_position)


def _timestamp_ltz(args: list) -> exp.Expr:
    precision = args[1].this if len(args) > 1 and isinstance(args[1], exp.Literal) else "3"
    fn = {"0": "timestamp_seconds", "3": "timestamp_millis"}.get(str(precision))
    if fn is None:
        raise ValueError("TO_TIMESTAMP_LTZ(x, p) takes precision 0 (seconds) or 3 (milliseconds)")
    return exp.Anonymous(this=fn, expressions=[args[0]])


#: Flink functions whose Spark spelling or arguments differ (the rest keep
#: their name: UPPER, LOWER, TRIM, CONCAT, CONCAT_WS, COALESCE, IF, ABS, ...;
#: Flink's and Spark's CONCAT both return NULL when an argument is NULL)
FUNCTION_MAP = {
    "PROCTIME": lambda args: exp.CurrentTimestamp(),
    "NOW": lambda args: exp.CurrentTimestamp(),
    "LOCALTIMESTAMP": lambda args: exp.CurrentTimestamp(),
    "TO_TIMESTAMP_LTZ": _timestamp_ltz,
    "CHAR_LENGTH": lambda args: exp.Anonymous(this="char_length", expressions=args),
    "SPLIT_INDEX": lambda args: exp.Anonymous(this="try_element_at", expressions=[
        exp.Anonymous(this="split", expressions=[
            args[0], exp.Anonymous(this="regexp_replace", expressions=[
                args[1], exp.Literal.string(r"([\\^$.|?*+()\[\]{}])"),
                exp.Literal.string(r"\\$1")])]),
        exp.Add(this=args[2], expression=exp.Literal.number(1))]),
}

_TYPE_FIX = {exp.DataType.Type.VARCHAR: "STRING", exp.DataType.Type.CHAR: "STRING",
             exp.DataType.Type.TEXT: "STRING", exp.DataType.Type.TIMESTAMPTZ: "TIMESTAMP",
             exp.DataType.Type.TIMESTAMPLTZ: "TIMESTAMP"}


@dataclasses.dataclass(frozen=True)
class Field:
    qualifier: Optional[str]   # table name or alias it is visible under
    name: str                  # name in SQL
    column: str                # column of the stream
    proctime: bool = False     # a PROCTIME() column (a processing-time attribute)


@dataclasses.dataclass
class Relation:
    stream: ChangelogStream
    fields: tuple[Field, ...]
    #: a ROW_NUMBER() waiting for its filter (:class:`.over.RankCall`) or a
    #: window table function waiting for its GROUP BY (:class:`.window_tvf.WindowCall`)
    pending: Optional[object] = None

    def requalified(self, qualifier: str) -> "Relation":
        return Relation(self.stream, tuple(dataclasses.replace(f, qualifier=qualifier)
                                           for f in self.fields), self.pending)


#: our own SET key (Flink drops late rows; it has no such option): where the
#: window operators' late rows go
LATE_OUTPUT_KEY = "spark-changelog.late-output.path"


@dataclasses.dataclass
class Settings:
    """The ``SET`` options in force at a statement."""

    materialize: str = "auto"
    require_on_conflict: bool = False
    state_ttl_ms: Optional[int] = None
    runtime_mode: Optional[str] = None
    allow_lateness_ms: int = 0
    idle_timeout_ms: Optional[int] = None
    late_output: Optional[str] = None
    mini_batch: bool = False
    ignored: tuple = ()

    def apply(self, s: SetOption) -> "Settings":
        v = s.value.strip()
        if s.key == "table.exec.sink.upsert-materialize":
            return dataclasses.replace(self, materialize=v.lower())
        if s.key == "table.exec.sink.require-on-conflict":
            return dataclasses.replace(self, require_on_conflict=v.lower() == "true")
        if s.key == "table.exec.state.ttl":
            ms = duration_ms(int(v) if v.isdigit() else v)
            return dataclasses.replace(self, state_ttl_ms=ms or None)
        if s.key == "execution.runtime-mode":
            return dataclasses.replace(self, runtime_mode=v.lower())
        if s.key == "table.exec.emit.allow-lateness":
            return dataclasses.replace(self, allow_lateness_ms=duration_ms(
                int(v) if v.isdigit() else v))
        if s.key == "table.exec.source.idle-timeout":
            ms = duration_ms(int(v) if v.isdigit() else v)
            return dataclasses.replace(self, idle_timeout_ms=ms or None)
        if s.key == LATE_OUTPUT_KEY:
            return dataclasses.replace(self, late_output=v or None)
        if s.key == "table.exec.mini-batch.enabled":
            return dataclasses.replace(self, mini_batch=v.lower() == "true")
        return dataclasses.replace(self, ignored=self.ignored + (s.key,))


@dataclasses.dataclass
class PlannedInsert:
    """One ``INSERT INTO``: the stream to write and how to write it."""

    insert: InsertDef
    table: TableDef
    stream: ChangelogStream
    settings: Settings

    @property
    def sink_key(self) -> tuple:
        return tuple(self.table.primary_key)

    def sink_options(self) -> dict:
        return dict(key=self.sink_key, materialize=self.settings.materialize,
                    conflict=self.insert.conflict,
                    require_on_conflict=self.settings.require_on_conflict,
                    materializer_ttl_ms=self.settings.state_ttl_ms)

    def explain(self) -> str:
        return self.stream.explain(table=self.table.name, **self.sink_options())

    def plan(self):
        """The planned sink node (for graph formats)."""
        return self.stream.plan_sink(table=self.table.name, **self.sink_options())

    def run(self, *, checkpoint: Optional[str] = None, dead_letter: Optional[str] = None,
            strict: bool = False, progress=None, out=None, late_output: Optional[str] = None,
            changelog_path: Optional[str] = None):
        """Run the INSERT; ``late_output`` (default: the script's
        ``'spark-changelog.late-output.path'``): where window operators put late
        rows; ``changelog_path``: also write every emitted change there."""
        sink = self.make_sink(out)
        return self.stream.write_upsert(sink, checkpoint=checkpoint, dead_letter=dead_letter,
                                        strict=strict, progress=progress,
                                        changelog_path=changelog_path,
                                        late_output=late_output or self.settings.late_output,
                                        **self.sink_options())

    def make_sink(self, out=None):
        c = self.table.connector
        if c.kind == "delta":
            return c.path
        if c.kind == "print":
            from ..sinks.console import PrintSink
            return PrintSink(self.sink_key, c.option("print-identifier"), out)
        if c.kind == "blackhole":
            from ..sinks.console import BlackholeSink
            return BlackholeSink(self.sink_key)
        if c.kind == "postgres":
            import pyarrow as pa
            from pyspark.sql.pandas.types import to_arrow_schema
            from ..sinks.postgres import PostgresUpsertSink
            data = [f for f in self.stream.df.schema.fields
                    if f.name in self.stream.schema.columns]
            schema = to_arrow_schema(type(self.stream.df.schema)(data), timezone="UTC")
            return PostgresUpsertSink(postgres_conninfo(c), c.option("table-name", self.table.name),
                                      self.sink_key, pa.schema(schema))
        raise AssertionError(f"not a sink connector: {c.kind}")


def postgres_conninfo(c) -> str:
    """A libpq conninfo from Flink's JDBC options (``jdbc:postgresql://h:p/db``,
    ``username``, ``password``); a libpq string or URI is taken as is."""
    url = c.option("url")
    if url.startswith("jdbc:"):
        url = url[len("jdbc:"):]
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        from urllib.parse import quote, urlsplit, urlunsplit
        parts = urlsplit(url)
        user, password = c.option("username"), c.option("password")
        if user and "@" not in parts.netloc:
            cred = quote(user, safe="") + (":" + quote(password, safe="") if password else "")
            parts = parts._replace(netloc=f"{cred}@{parts.netloc}")
        return urlunsplit(parts)
    extra = " ".join(f"{k}={v}" for k, v in (("user", c.option("username")),
                                           ("password", c.option("password"))) if v)
    return f"{url} {extra}".strip()


class Translator:
    """Builds the streams of a script's statements (nothing runs here)."""

    def __init__(self, spark, script: Script, *, streaming: bool = False, strict: bool = False,
                 key_groups: Optional[int] = None, max_files_per_trigger: Optional[int] = None):
        self.spark, self.script, self.streaming, self.strict = spark, script, streaming, strict
        self.key_groups = key_groups
        self.max_files_per_trigger = max_files_per_trigger
        self.tables: dict[str, TableDef] = {}
        self.views: dict[str, ViewDef] = {}
        self.settings = Settings()
        self._sources: dict[str, Relation] = {}

    # -- the script ------------------------------------------------------------
    def statements(self):
        """``(statement, planned)`` for every statement in order; ``planned`` is a
        list of :class:`PlannedInsert` for INSERT/STATEMENT SET/EXPLAIN, else None."""
        for stmt in self.script.statements:
            if isinstance(stmt, TableDef):
                self._define(stmt.name, stmt)
                self.tables[stmt.name] = stmt
                yield stmt, None
            elif isinstance(stmt, ViewDef):
                self._define(stmt.name, stmt)
                self.views[stmt.name] = stmt
                yield stmt, None
            elif isinstance(stmt, SetOption):
                self.settings = self.settings.apply(stmt)
                yield stmt, None
            elif isinstance(stmt, InsertDef):
                yield stmt, [self.insert(stmt)]
            elif isinstance(stmt, StatementSet):
                yield stmt, [self.insert(i) for i in stmt.inserts]
            elif isinstance(stmt, ExplainDef):
                inner = stmt.statement
                if isinstance(inner, QueryDef):
                    yield stmt, self.settled(self.query(inner.query, inner.position)).stream
                else:
                    yield stmt, [self.insert(inner)]
            elif isinstance(stmt, QueryDef):
                raise self.script.error(
                    "a bare SELECT has no sink here: write it with INSERT INTO a table (a "
                    "'print' table shows the changes), or EXPLAIN it", stmt.position,
                    UnsupportedFeature)
            else:  # pragma: no cover - the model has no other statement
                raise AssertionError(stmt)

    def _define(self, name: str, stmt) -> None:
        if name in self.tables or name in self.views:
            raise self.script.error(f"{name} is already defined", stmt.position)

    # -- INSERT ------------------------------------------------------------------
    def insert(self, ins: InsertDef) -> PlannedInsert:
        table = self.tables.get(ins.table)
        if table is None:
            raise self.script.error(f"unknown table {ins.table!r} (defined: "
                                    f"{', '.join(self.tables) or 'none'})", ins.table_position)
        if table.connector.kind == "filesystem":
            raise self.script.error(
                f"table {table.name} (connector 'filesystem') is a source here; write to a "
                "'delta', 'jdbc'/'postgres', 'print' or 'blackhole' table",
                ins.table_position, UnsupportedFeature)
        if not table.primary_key and table.connector.kind in ("delta", "postgres"):
            raise self.script.error(
                f"table {table.name} (connector {table.connector.kind!r}) is an upsert table and "
                "needs PRIMARY KEY (...) NOT ENFORCED", ins.table_position)
        if ins.conflict and self.settings.materialize == "none":
            raise self.script.error(
                f"ON CONFLICT DO {ins.conflict.upper()} needs the sink upsert materializer, but "
                "SET 'table.exec.sink.upsert-materialize' = 'none' disables it (Flink 2.3 ignores "
                "the clause silently, FLINK-41007): use 'auto' or 'force', or drop ON CONFLICT",
                ins.position)
        rel = self.settled(self.query(ins.query, ins.position))
        targets = ins.columns or tuple(c.name for c in table.physical_columns)
        unknown = [c for c in targets if c not in table.column_names]
        if unknown:
            raise self.script.error(f"INSERT INTO {table.name}: unknown column(s) {unknown}",
                                    ins.table_position)
        if len(rel.fields) != len(targets):
            raise self.script.error(
                f"INSERT INTO {table.name}: the query has {len(rel.fields)} column(s) "
                f"({', '.join(f.name for f in rel.fields)}), the table takes {len(targets)} "
                f"({', '.join(targets)})", ins.position)
        if ins.columns and len(targets) != len(table.physical_columns):
            missing = [c.name for c in table.physical_columns if c.name not in targets]
            raise self.script.error(f"INSERT INTO {table.name}: column(s) {missing} get no value "
                                    "(partial inserts are not supported)", ins.table_position)
        types = self._types(rel.stream)
        named, identity = {}, True
        by_target = dict(zip(targets, rel.fields))
        for c in table.physical_columns:
            f = by_target[c.name]
            if types.get(f.column) != _normal_type(c.spark_type):
                named[c.name] = f"CAST(`{f.column}` AS {c.spark_type})"
                identity = False
            else:
                named[c.name] = f.column
                identity = identity and f.column == c.name
        stream = rel.stream
        if not (identity and tuple(stream.schema.columns) == tuple(named)):
            stream = self._select(stream, named, ins.position)
        if self.settings.mini_batch:
            stream = stream.with_mini_batch()
        planned = PlannedInsert(ins, table, stream, self.settings)
        try:
            planned.plan()          # the materializer decision: its errors belong to this line
        except PlanError as e:
            raise self.script.error(f"INSERT INTO {table.name}: {e}", ins.position) from None
        return planned

    # -- queries -----------------------------------------------------------------
    def query(self, q: exp.Expr, pos: Position) -> Relation:
        if isinstance(q, exp.Subquery):
            return self.query(q.this, pos)
        if isinstance(q, exp.SetOperation):
            raise self.script.error(f"{q.key.upper()} (combining queries) is not supported yet",
                                    self._keyword_position(q.expression, q.key.upper(), pos),
                                    UnsupportedFeature)
        if not isinstance(q, exp.Select):
            raise self._unsupported(f"{q.key.upper()} is not supported here", q, pos)
        if q.args.get("with_"):
            raise self._unsupported("WITH (common table expressions) is not supported yet: use "
                                    "CREATE TEMPORARY VIEW", q.args["with_"], pos)
        self._check_select(q, pos)
        from_ = q.args.get("from_")
        if from_ is None:
            raise self.script.error("a SELECT needs FROM (constant queries have no changelog)",
                                    pos, UnsupportedFeature)
        rel = self.relation(from_.this, pos)
        for j in q.args.get("joins") or ():
            rel = self.join(rel, j, pos)
        where = q.args.get("where")
        where = where.this if where is not None else None
        if isinstance(rel.pending, RankCall):
            rel, rest = apply_rank(self, rel, where, q, pos)
            where = exp.and_(*rest) if rest else None
        if isinstance(rel.pending, WindowCall):
            window_tvf.check_where(self, rel, where, pos)
        if where is not None:
            cond = self.spark_sql(where, rel, pos)
            with self._analysis("condition", [where], node_position(where, pos)):
                rel = dataclasses.replace(rel, stream=rel.stream.where(cond))
        if isinstance(rel.pending, WindowCall):
            if q.args.get("group"):
                return self.having(window_tvf.aggregate(self, rel, q, pos), q, pos)
            rel = window_tvf.table_function(self, rel, q, pos)
        if q.args.get("group"):
            return self.having(self.aggregate(rel, q, pos), q, pos)
        if q.args.get("distinct"):
            return self.distinct(rel, q, pos)
        if any(is_rank_item(e) for e in q.expressions):
            return rank_relation(self, rel, q, pos)
        return self.project(rel, q.expressions, pos)

    def settled(self, rel: Relation) -> Relation:
        """``rel``, which must not wait for an enclosing query any more."""
        if isinstance(rel.pending, RankCall):
            raise unfiltered_error(self, rel.pending)
        if isinstance(rel.pending, WindowCall):
            raise self._unsupported(
                f"a window table function ({rel.pending.name}) is read by a SELECT of its own "
                "(FROM TABLE(...) with or without GROUP BY window_start, window_end); joining "
                "it (a window join) is not supported yet", rel.pending.node, Position(1, 1))
        return rel

    def aggregate(self, rel: Relation, q: exp.Select, pos: Position) -> Relation:
        """``SELECT keys..., AGG(col) ... GROUP BY keys``: the group aggregation
        with retraction (docs/semantics.md, section 7), then the select list's
        order and names.  Select items are group columns or one aggregate call
        of a column each."""
        keys = []
        for g in q.args["group"].expressions:
            if not isinstance(g, exp.Column):
                raise self._unsupported("GROUP BY takes columns (compute an expression in a "
                                        "view first)", g, pos)
            keys.append(self._resolve(g, rel, pos).column)
        calls, named = self.grouped_select_items(
            q, rel, pos, lambda f: f.column if f.column in keys else None,
            lambda call: self.spark_sql(call, rel, pos, allow_aggregates=True),
            "in a GROUP BY query, a select item is a group column or one aggregate call "
            "(AGG(column)); expressions over them are not supported yet")
        kw = {"key_groups": self.key_groups} if self.key_groups else {}
        try:
            with self._analysis("aggregation", q.expressions, pos):
                stream = rel.stream.group_by(*keys).agg(
                    state_ttl_ms=self.settings.state_ttl_ms, **kw, **calls)
        except ValueError as e:
            if isinstance(e, SqlError):
                raise
            raise self.script.error(str(e), node_position(q.args["group"], pos)) from None
        return self.grouped_relation(stream, named, pos, q.expressions)

    def grouped_select_items(self, q: exp.Select, rel: Relation, pos: Position,
                             column_of: Callable, call_of: Callable, what: str) -> tuple[dict, dict]:
        """The select list of a grouped query (GROUP BY, window aggregation):
        (aggregate calls by output name, output name -> column of the
        aggregated stream).  ``column_of(field)`` is what a selected column
        becomes (None: neither grouped nor aggregated), ``call_of(node)`` an
        aggregate call's text; ``what`` says what a select item may be."""
        calls, named = {}, {}
        for idx, item in enumerate(q.expressions):
            alias = item.alias if isinstance(item, exp.Alias) else None
            body = item.this if isinstance(item, exp.Alias) else item
            if isinstance(body, exp.Column) and not isinstance(body.this, exp.Star):
                f = self._resolve(body, rel, pos)
                column = column_of(f)
                if column is None:
                    raise self.script.error(f"column {f.name!r} is neither grouped nor "
                                            "aggregated: add it to GROUP BY or aggregate it",
                                            node_position(body, pos))
                named[alias or f.name] = column
            elif isinstance(body, exp.AggFunc):
                name = alias or f"EXPR${idx}"
                calls[name] = call_of(body)
                named[name] = name
            else:
                raise self._unsupported(what, body, pos)
        return calls, named

    def grouped_relation(self, stream, named: dict, pos: Position, expressions) -> Relation:
        """The aggregated ``stream`` in the select list's order and names."""
        cols = tuple(stream.schema.columns)
        if cols == tuple(named) and list(named) == list(named.values()):
            return Relation(stream, tuple(Field(None, c, c) for c in cols))
        stream = self._select(stream, named, pos, expressions)
        return Relation(stream, tuple(Field(None, n, n) for n in named))

    def having(self, rel: Relation, q: exp.Select, pos: Position) -> Relation:
        """``HAVING cond``: a filter over the aggregated rows.  An aggregate call
        in ``cond`` is the select item with the same call (by its name), or
        is added and projected away after the filter."""
        having = q.args.get("having")
        if having is None:
            return rel
        items = {}
        for idx, item in enumerate(q.expressions):
            body = item.this if isinstance(item, exp.Alias) else item
            if isinstance(body, exp.AggFunc):
                items.setdefault(body.sql(dialect=Flink).lower(), rel.fields[idx])
        cond = having.this.copy()
        extra = []
        for node in list(cond.find_all(exp.AggFunc)):
            key = node.sql(dialect=Flink).lower()
            if key not in items:
                extra.append(node.copy())
                items[key] = None
        if extra:            # the aggregation again, with the extra calls as hidden columns
            hidden = [exp.alias_(e, f"$having{i}", quoted=True) for i, e in enumerate(extra)]
            q2 = q.copy()
            q2.set("expressions", list(q.expressions) + hidden)
            q2.set("having", None)
            rel2 = self.query(q2, pos)
            for i, e in enumerate(extra):
                items[e.sql(dialect=Flink).lower()] = rel2.fields[len(q.expressions) + i]
            visible = rel2.fields[:len(q.expressions)]
        else:
            rel2, visible = rel, rel.fields
        for orig, new in zip(list(having.this.find_all(exp.AggFunc)),
                             list(cond.find_all(exp.AggFunc))):
            f = items[orig.sql(dialect=Flink).lower()]
            new.replace(exp.column(exp.to_identifier(f.name, quoted=True)))
        text = self.spark_sql(cond, Relation(rel2.stream, rel2.fields), pos)
        hpos = self._keyword_position(having, "HAVING", pos)
        with self._analysis("HAVING condition", [having.this], hpos):
            stream = rel2.stream.where(text)
        if extra:
            stream = self._select(stream, {f.name: f.column for f in visible}, hpos)
        return Relation(stream, tuple(visible))

    def distinct(self, rel: Relation, q: exp.Select, pos: Position) -> Relation:
        """``SELECT DISTINCT items``: ``GROUP BY`` every item (as Flink plans it);
        the group aggregation needs an aggregate, so a row count is computed
        and projected away."""
        out = self.project(rel, q.expressions, pos)
        names = [f.column for f in out.fields]
        count = "$distinct_rows"
        kw = {"key_groups": self.key_groups} if self.key_groups else {}
        dpos = self._keyword_position(q.args["distinct"], "DISTINCT", pos)
        with self._analysis("SELECT DISTINCT", q.expressions, dpos):
            stream = out.stream.group_by(*names).agg(
                state_ttl_ms=self.settings.state_ttl_ms, **kw, **{count: "COUNT(*)"})
            stream = stream.select(*names)
        return Relation(stream, out.fields)

    def _check_select(self, q: exp.Select, pos: Position) -> None:
        checks = (("order", "ORDER BY is not supported yet (Top-N: ROW_NUMBER() OVER (PARTITION "
                            "BY ... ORDER BY ...) AS rn in a subquery, WHERE rn <= N)", "ORDER"),
                  ("limit", "LIMIT is not supported yet", "LIMIT"),
                  ("qualify", "QUALIFY is not supported yet", "QUALIFY"))
        for arg, message, keyword in checks:
            node = q.args.get(arg)
            if node:
                raise self.script.error(message, self._keyword_position(node, keyword, pos),
                                        UnsupportedFeature)
        grouped = bool(q.args.get("group"))
        if q.args.get("having") and not grouped:
            raise self.script.error("HAVING needs GROUP BY (aggregates without GROUP BY are not "
                                    "supported yet)", self._keyword_position(
                                        q.args["having"], "HAVING", pos), UnsupportedFeature)
        for e in q.expressions:
            if is_rank_item(e):
                if grouped or q.args.get("distinct"):
                    raise self._unsupported("ROW_NUMBER() in a GROUP BY or DISTINCT query is not "
                                            "supported: rank the aggregated rows in an "
                                            "enclosing query", e, pos)
                continue
            self._check_expression(e, pos, allow_aggregates=grouped)

    def _check_expression(self, node: exp.Expr, pos: Position,
                          allow_aggregates: bool = False) -> None:
        for n in node.walk():
            if isinstance(n, exp.Window):
                fn = n.this
                if isinstance(fn, exp.RowNumber):
                    raise self._unsupported(
                        "ROW_NUMBER() OVER (...) must be a select item of its own (ROW_NUMBER() "
                        "OVER (PARTITION BY k ORDER BY t) AS rn), in a subquery whose enclosing "
                        "query filters on rn", fn, pos)
                raise self._unsupported(
                    f"{fn.sql(dialect=Flink).split('(')[0]}() OVER (...) is not supported yet "
                    "(OVER aggregation; RANK and DENSE_RANK Top-N): ROW_NUMBER() is", fn, pos)
            if isinstance(n, exp.AggFunc) and not allow_aggregates:
                raise self._unsupported(f"aggregate function {n.sql_name()} (GROUP BY "
                                        "aggregation) is not supported yet", n, pos)
            if isinstance(n, (exp.Subquery, exp.Exists)) or (isinstance(n, exp.In) and
                                                             n.args.get("query")):
                raise self._unsupported("subqueries in expressions are not supported yet", n, pos)

    def relation(self, node: exp.Expr, pos: Position) -> Relation:
        alias = node.alias if isinstance(node, (exp.Table, exp.Subquery)) else ""
        if isinstance(node, exp.Subquery):
            rel = self.query(node.this, node_position(node, pos))
            return rel.requalified(alias) if alias else rel
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Anonymous):
            fn = node.this
            inner = fn.expressions[0] if fn.name.upper() == "TABLE" and fn.expressions else fn
            name = inner.name.upper() if isinstance(inner, exp.Anonymous) else fn.name.upper()
            if name in WINDOW_TVFS and inner is not fn:
                return window_tvf.relation(self, inner, alias, pos)
            if name in WINDOW_TVFS:
                raise self._unsupported(f"write a window table function as TABLE({name}(...))",
                                        node, pos)
            raise self._unsupported(f"table function {name} is not supported", node, pos)
        if not isinstance(node, exp.Table):
            raise self._unsupported(f"{node.key.upper()} in FROM is not supported", node, pos)
        name = node.name
        tpos = node_position(node, pos)
        if name in self.views:
            view = self.views[name]
            rel = self.query(view.query, view.position)
        elif name in self.tables:
            rel = self.source(self.tables[name], tpos)
        else:
            raise self.script.error(f"unknown table or view {name!r} (defined: "
                                    f"{', '.join([*self.tables, *self.views]) or 'none'})", tpos)
        return rel.requalified(alias or name)

    def source(self, t: TableDef, pos: Position) -> Relation:
        if t.name in self._sources:
            return self._sources[t.name]
        c = t.connector
        if c.kind != "filesystem":
            raise self.script.error(f"table {t.name} (connector {c.kind!r}) cannot be read: "
                                    "sources are 'filesystem' tables", pos, UnsupportedFeature)
        kw = {}
        if c.reader_format == "changelog":
            kw.update(changelog_file_format=c.changelog_file_format,
                      kind_column=c.option("changelog.kind-column", "op"),
                      seq_column=c.option("changelog.seq-column"))
            csv = {k.split(".", 1)[1]: v for k, v in c.options if k.startswith("csv.")}
            names = {"field-delimiter": "sep", "quote-character": "quote",
                     "escape-character": "escape"}
            if csv:
                kw["csv_options"] = {names[k]: v for k, v in csv.items()}
        kw["ordered"] = c.option("source.ordered", "false").lower() == "true"
        mode = c.option("changelog.mode", "all").lower()
        modes = {"all": None, "insert-only": "insert-only", "upsert": "upsert"}
        if mode not in modes:
            raise self.script.error(f"table {t.name}: 'changelog.mode' is 'all' (default), "
                                    f"'insert-only' or 'upsert', got {mode!r}", t.position)
        kw["mode"] = modes[mode]
        files = c.option("source.max-files-per-trigger")
        max_files = int(files) if files else self.max_files_per_trigger
        try:
            stream = read_changes(self.spark, c.path, format=c.reader_format,
                                  schema=t.schema_ddl(), primary_key=t.primary_key or None,
                                  streaming=self.streaming, strict=self.strict,
                                  max_files_per_trigger=max_files, name=t.name, **kw)
        except ValueError as e:
            raise self.script.error(f"table {t.name}: {e}", t.position) from None
        fields = [Field(t.name, col.name, col.name) for col in t.physical_columns]
        rel = Relation(stream, tuple(fields))
        for col in t.columns:
            if not col.computed:
                continue
            if col.proctime:
                stream = rel.stream.with_column(col.name, "current_timestamp()", deterministic=False)
            else:
                expr = self.spark_sql(col.expression, rel, pos)
                with self._analysis(f"computed column {col.name}", [col.expression],
                                    node_position(col.expression, pos)):
                    stream = rel.stream.with_column(col.name, expr)
            rel = Relation(stream, rel.fields + (Field(t.name, col.name, col.name,
                                                       proctime=col.proctime),))
        order = tuple(col.name for col in t.columns)
        if tuple(rel.stream.schema.columns) != order:
            rel = Relation(rel.stream.select(*order), tuple(Field(t.name, n, n) for n in order))
        if t.watermark is not None:
            rel = Relation(rel.stream.with_watermark(t.watermark.column, t.watermark.bound_ms),
                           rel.fields)
        self._sources[t.name] = rel
        return rel

    def join(self, left: Relation, j: exp.Join, pos: Position) -> Relation:
        jpos = node_position(j, pos)
        side = (j.args.get("side") or "").lower()
        kind = (j.args.get("kind") or "").lower()
        if kind in ("cross", "semi", "anti") or j.args.get("method"):
            raise self.script.error(f"{kind.upper() or 'this'} JOIN is not supported (regular "
                                    "joins: [INNER], LEFT, RIGHT, FULL [OUTER] with ON)", jpos,
                                    UnsupportedFeature)
        left = self.settled(left)
        right = self.settled(self.relation(j.this, pos))
        clash = {f.qualifier for f in left.fields} & {f.qualifier for f in right.fields}
        if clash:
            raise self.script.error(f"{', '.join(sorted(clash))} appears twice in FROM: give it "
                                    "an alias", jpos)
        how = side or "inner"
        on = j.args.get("on")
        using = j.args.get("using")
        left_on, right_on, residual = [], [], []
        if using:
            for ident in using:
                left_on.append(self._resolve(exp.column(ident.name), left, pos).column)
                right_on.append(self._resolve(exp.column(ident.name), right, pos).column)
        elif on is not None:
            for term in on.flatten() if isinstance(on, exp.And) else [on]:
                pair = self._equi_pair(term, left, right)
                if pair is None:
                    residual.append(term)
                else:
                    left_on.append(pair[0])
                    right_on.append(pair[1])
        else:
            raise self.script.error("a join needs ON (or USING): a cross join is not supported",
                                    jpos, UnsupportedFeature)
        if not left_on:
            raise self.script.error(
                "a join needs at least one equality between a column of each side (ON l.k = "
                "r.k): joins on other conditions only are not supported", node_position(on, jpos),
                UnsupportedFeature)
        # output columns: the left ones, then the right ones renamed by the join (id -> id0)
        renamed = join_output_names(left.stream.schema.columns, right.stream.schema.columns)
        right_fields = tuple(Field(f.qualifier, f.name, renamed[f.column]) for f in right.fields)
        condition = self._join_condition(residual, left, Relation(right.stream, right_fields),
                                         pos) if residual else None
        kw = {"key_groups": self.key_groups} if self.key_groups else {}
        stream = left.stream.join(right.stream, left_on=left_on, right_on=right_on, how=how,
                                  condition=condition, state_ttl_ms=self.settings.state_ttl_ms,
                                  **kw)
        if tuple(stream.schema.columns) != tuple(left.stream.schema.columns) + tuple(
                renamed[c] for c in right.stream.schema.columns):    # pragma: no cover - one rule
            raise AssertionError("join output names differ from join_output_names")
        if using:   # the USING columns appear once, as the left side's (SELECT * has one id)
            names = {i.name for i in using}
            right_fields = tuple(f for f in right_fields if f.name not in names)
        return Relation(stream, left.fields + right_fields)

    def _join_condition(self, terms: list, left: Relation, right: Relation,
                        pos: Position) -> JoinCondition:
        """The non-equi part of ON over the join's output column names."""
        tree = (terms[0] if len(terms) == 1 else exp.and_(*terms))
        both = Relation(left.stream, left.fields + right.fields)
        resolved = {id(c): self._resolve(c, both, pos) for c in tree.find_all(exp.Column)}
        copy = tree.copy()
        mapping = {}
        for orig, new in zip(tree.walk(), copy.walk()):
            if isinstance(orig, exp.Column):
                f = resolved[id(orig)]
                mapping[f.column] = ("left" if f in left.fields else "right", f.column)
                new.replace(exp.column(exp.to_identifier(f.column, quoted=True)))
        try:
            return JoinCondition(copy, mapping)
        except UnsupportedCondition as e:
            raise self._unsupported(f"{e}: the non-equi part of ON takes comparisons, AND/OR/NOT, "
                                    "IS [NOT] NULL, arithmetic, BETWEEN and IN (literals)",
                                    e.node, pos) from None

    def _equi_pair(self, term: exp.Expr, left: Relation, right: Relation):
        if not isinstance(term, exp.EQ):
            return None
        a, b = term.this, term.expression
        if not (isinstance(a, exp.Column) and isinstance(b, exp.Column)):
            return None
        fa_l, fa_r = self._find(a, left), self._find(a, right)
        fb_l, fb_r = self._find(b, left), self._find(b, right)
        if fa_l and fb_r and not fa_r and not fb_l:
            return fa_l.column, fb_r.column
        if fb_l and fa_r and not fb_r and not fa_l:
            return fb_l.column, fa_r.column
        return None

    def project(self, rel: Relation, items: list, pos: Position) -> Relation:
        named: dict[str, str] = {}
        fields: list[Field] = []
        taken: set[str] = set()
        proctime: set[str] = set()

        def add(name: str, spec: str):
            out, i = name, 0
            while out in taken:
                out, i = f"{name}{i}", i + 1
            taken.add(out)
            named[out] = spec
            fields.append(Field(None, out, out))

        for idx, item in enumerate(items):
            if isinstance(item, exp.Star):
                for f in rel.fields:
                    add(f.name, f.column)
                    if f.proctime:
                        proctime.add(fields[-1].name)
                continue
            if isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
                q = item.table
                chosen = [f for f in rel.fields if f.qualifier == q]
                if not chosen:
                    raise self.script.error(f"unknown table {q!r} in {q}.*",
                                            node_position(item, pos))
                for f in chosen:
                    add(f.name, f.column)
                continue
            alias = item.alias if isinstance(item, exp.Alias) else None
            body = item.this if isinstance(item, exp.Alias) else item
            if isinstance(body, exp.Column):
                f = self._resolve(body, rel, pos)
                add(alias or f.name, f.column)
                if f.proctime:
                    proctime.add(fields[-1].name)
            else:
                add(alias or f"EXPR${idx}", self.spark_sql(body, rel, pos))
        stream = rel.stream
        same = [f.column for f in rel.fields] == list(named.values()) == list(named) and \
            tuple(stream.schema.columns) == tuple(named)
        if not same:
            first = node_position(items[0], pos) if items else pos
            stream = self._select(stream, named, first, items)
        return Relation(stream, tuple(Field(None, f.name, f.column, f.name in proctime)
                                      for f in fields))

    def _select(self, stream: ChangelogStream, named: dict, pos: Position,
                nodes: Sequence[exp.Expr] = ()) -> ChangelogStream:
        with self._analysis("projection", nodes, pos):
            return stream.select(**named)

    @contextlib.contextmanager
    def _analysis(self, what: str, nodes: Sequence[exp.Expr], pos: Position):
        """Spark's analysis errors (unknown function, wrong argument types) as a
        SqlError at the function it names (else at ``pos``), without PySpark
        logging the exception on the terminal first."""
        from pyspark.errors import AnalysisException
        loggers = [logging.getLogger(n) for n in ("SQLQueryContextLogger",
                                                  "DataFrameQueryContextLogger")]
        before = [lg.disabled for lg in loggers]
        for lg in loggers:
            lg.disabled = True
        try:
            yield
        except AnalysisException as e:
            msg = str(e).split("\n")[0]
            msg = re.sub(r"\s*SQLSTATE: \w+;?( line \d+ pos \d+;?)?", "", msg).strip()
            raise self.script.error(f"Spark cannot evaluate this {what}: {msg}",
                                    _named_function_position(msg, nodes, pos)) from None
        finally:
            for lg, b in zip(loggers, before):
                lg.disabled = b

    # -- expressions -------------------------------------------------------------
    def spark_sql(self, node: exp.Expr, rel: Relation, pos: Position,
                  allow_aggregates: bool = False) -> str:
        """The expression as Spark SQL over the stream's columns."""
        self._check_expression(node, pos, allow_aggregates)
        resolved = {id(c): self._resolve(c, rel, pos).column for c in node.find_all(exp.Column)}
        for n in node.walk():
            if isinstance(n, (TableArgument, Descriptor)):
                raise self._unsupported("table arguments are only valid in window table "
                                        "functions", n, pos)
        types = self._types(rel.stream)
        copy = node.copy()
        for orig, new in zip(node.walk(), copy.walk()):
            if isinstance(orig, exp.Column):
                new.replace(exp.column(exp.to_identifier(resolved[id(orig)], quoted=True)))
        try:
            copy = copy.transform(lambda n: self._map_function(n, types))
        except ValueError as e:
            raise self.script.error(str(e), node_position(node, pos)) from None
        return copy.sql(dialect="spark")

    def _map_function(self, node: exp.Expr, types: dict) -> exp.Expr:
        # Flink divides integers as integers (5 / 2 = 2); Spark's / gives a double
        if isinstance(node, exp.Div) and _integral(node.this, types) and \
                _integral(node.expression, types):
            return exp.IntDiv(this=node.this, expression=node.expression)
        if isinstance(node, exp.Anonymous) and node.name.upper() in FUNCTION_MAP:
            return FUNCTION_MAP[node.name.upper()](list(node.expressions))
        if isinstance(node, exp.DataType) and node.this in _TYPE_FIX:
            return exp.DataType.build(_TYPE_FIX[node.this])
        return node

    def _find(self, col: exp.Column, rel: Relation) -> Optional[Field]:
        q, name = col.table, col.name
        hits = [f for f in rel.fields if f.name == name and (not q or f.qualifier == q)]
        return hits[0] if len(hits) == 1 else None

    def _resolve(self, col: exp.Column, rel: Relation, pos: Position) -> Field:
        q, name = col.table, col.name
        hits = [f for f in rel.fields if f.name == name and (not q or f.qualifier == q)]
        if len(hits) == 1:
            return hits[0]
        where = node_position(col, pos)
        if not hits:
            known = ", ".join(f"{f.qualifier}.{f.name}" if f.qualifier else f.name
                              for f in rel.fields)
            raise self.script.error(f"unknown column {col.sql(dialect=Flink)!r} (available: "
                                    f"{known})", where)
        raise self.script.error(f"column {name!r} is ambiguous: it is in "
                                f"{', '.join(str(f.qualifier) for f in hits)}; qualify it",
                                where)

    # -- helpers -------------------------------------------------------------------
    def _types(self, stream: ChangelogStream) -> dict:
        return {f.name: f.dataType.simpleString() for f in stream.df.schema.fields}

    def _unsupported(self, message: str, node: exp.Expr, pos: Position) -> SqlError:
        return self.script.error(message, node_position(node, pos), UnsupportedFeature)

    def _keyword_position(self, node: exp.Expr, keyword: str, default: Position) -> Position:
        """The position of ``keyword`` (GROUP, ORDER, ...) just before ``node``."""
        inner = node_position(node, default)
        lines = self.script.sql.splitlines(keepends=True)
        offset = sum(len(x) for x in lines[:inner.line - 1]) + inner.col - 1
        at = self.script.sql.upper().rfind(keyword, 0, offset + len(keyword))
        if at < 0:
            return inner
        line = self.script.sql.count("\n", 0, at) + 1
        col = at - (self.script.sql.rfind("\n", 0, at) + 1) + 1
        return Position(line, col, len(keyword))


def _named_function_position(message: str, nodes: Sequence[exp.Expr], default: Position
                             ) -> Position:
    """The position of the function a Spark analysis error names (```FOO```
    or ``"date_add(id, 1)"``) among ``nodes``, else ``default``."""
    m = re.search(r"routine `([^`]+)`", message) or re.search(r'resolve "(\w+)\(', message)
    if m:
        name = m.group(1).lower()
        for node in nodes:
            for n in node.walk():
                if isinstance(n, exp.Func) and (
                        n.sql(dialect="spark").lower().startswith(name + "(") or
                        (isinstance(n, exp.Anonymous) and n.name.lower() == name)):
                    return node_position(n, default)
    return default


_INTEGRAL = ("tinyint", "smallint", "int", "bigint")


def _integral(node: exp.Expr, types: dict) -> bool:
    """An integer column, literal or integer arithmetic of those (types of the
    stream's columns by name; columns are already resolved and quoted)."""
    if isinstance(node, exp.Paren):
        return _integral(node.this, types)
    if isinstance(node, exp.Column):
        return types.get(node.name) in _INTEGRAL
    if isinstance(node, exp.Literal):
        return not node.is_string and node.this.lstrip("-").isdigit()
    if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Mod, exp.IntDiv)):
        return _integral(node.this, types) and _integral(node.expression, types)
    if isinstance(node, exp.Neg):
        return _integral(node.this, types)
    if isinstance(node, exp.Cast):
        return node.to.sql(dialect="spark").lower() in _INTEGRAL
    return False


def _normal_type(spark_sql_type: Optional[str]) -> Optional[str]:
    """``DECIMAL(10, 2)`` -> ``decimal(10,2)`` (Spark's ``simpleString``)."""
    if spark_sql_type is None:
        return None
    return spark_sql_type.lower().replace(" ", "")


__all__ = ["Translator", "PlannedInsert", "Relation", "Field", "Settings", "FUNCTION_MAP",
           "postgres_conninfo"]
