"""Flink SQL statements -> changelog streams of the Python API (docs/sql.md).

Everything a script does is built with :class:`~spark_changelog.api.ChangelogStream`
methods (``read_changes``, ``with_column``, ``with_watermark``, ``select``,
``where``, ``join``, ``group_by().agg()``, ``deduplicate``, ``top_n``,
``window().aggregate()``, ``explain``, ``write_upsert``), so SQL and Python
end in the same plan, the same explain text and the same operators.

This module walks the statements and dispatches each query to the module of
its shape; they share the relation model (:mod:`.relation`) and the
translation's services (:mod:`.context`), and none imports this one:

* ``CREATE TABLE`` sources: :mod:`.source`; ``INSERT INTO`` sinks: :mod:`.insert`
  (``CREATE TABLE ... AS SELECT``: a sink table with the query's columns, then
  its insert); ``VALUES`` rows: :mod:`.values`;
* ``SELECT`` lists and ``WHERE``: :mod:`.projection`; ``JOIN``: :mod:`.join`;
* ``GROUP BY``, ``HAVING``, ``SELECT DISTINCT``: :mod:`.group_by`;
* ``ROW_NUMBER() OVER`` filtered on the row number (deduplication, Top-N):
  :mod:`.row_number`; ``FROM TABLE(TUMBLE(...))``: :mod:`.window_tvf`.  Both
  leave a *pending* relation that the enclosing query completes;
* ``FROM FROM_CHANGELOG(input => TABLE t)``: :mod:`.from_changelog`.

Features without an operator or plan node (``UNION``, ``ORDER BY``/``LIMIT``,
``OVER`` aggregation, ...) raise :class:`UnsupportedFeature` with their line
and column.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from sqlglot import exp

from . import from_changelog, group_by, projection, row_number, tableau, window_tvf
from .context import Context
from .dialect import FROM_CHANGELOG, WINDOW_TVFS
from .errors import SqlError, UnsupportedFeature
from .insert import PlannedInsert, plan_insert
from .join import join
from .relation import Field, Relation
from .row_number import RankCall
from .script import (ColumnDef, CreateTableAsDef, DescribeDef, ExplainDef, InsertDef, Position,
                     QueryDef, Script, SetOption,
                     ShowDef, StatementSet,
                     TableDef, ViewDef, node_position)
from .settings import Settings
from .source import read_source
from .values import values_relation
from .window_tvf import WindowCall


class Translator:
    """Builds the streams of a script's statements (nothing runs here)."""

    def __init__(self, spark, script: Script, *, streaming: bool = False, strict: bool = False,
                 key_groups: Optional[int] = None, max_files_per_trigger: Optional[int] = None):
        self.script = script
        self.ctx = Context(spark, script, streaming=streaming, strict=strict,
                           key_groups=key_groups, max_files_per_trigger=max_files_per_trigger)
        self.tables: dict[str, TableDef] = {}
        self.views: dict[str, ViewDef] = {}
        self._sources: dict[tuple, Relation] = {}

    @property
    def settings(self) -> Settings:
        """The ``SET`` options in force at the current statement."""
        return self.ctx.settings

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
                try:
                    self.ctx.settings = self.ctx.settings.apply(stmt)
                except ValueError as e:
                    if isinstance(e, SqlError):
                        raise
                    raise self.script.error(str(e), stmt.position) from None
                yield stmt, None
            elif isinstance(stmt, CreateTableAsDef):
                yield stmt, [self.create_table_as(stmt)]
            elif isinstance(stmt, InsertDef):
                yield stmt, [self.insert(stmt)]
            elif isinstance(stmt, StatementSet):
                yield stmt, [self.insert(i) for i in stmt.inserts]
            elif isinstance(stmt, ExplainDef):
                inner = stmt.statement
                if isinstance(inner, QueryDef):
                    yield stmt, self.ctx.settled(self.query(inner.query, inner.position)).stream
                else:
                    yield stmt, [self.insert(inner)]
            elif isinstance(stmt, QueryDef):
                # run by the runner and printed as Flink's SQL client tableau (sql/tableau.py)
                yield stmt, self.ctx.settled(self.query(stmt.query, stmt.position)).stream
            elif isinstance(stmt, ShowDef):
                yield stmt, tableau.show_text(stmt, self.tables, self.views)
            elif isinstance(stmt, DescribeDef):
                yield stmt, self.describe(stmt)
            else:  # pragma: no cover - the model has no other statement
                raise AssertionError(stmt)

    def describe(self, stmt: DescribeDef) -> str:
        if stmt.name in self.tables:
            return tableau.describe_text(stmt, self.tables[stmt.name])
        if stmt.name in self.views:
            view = self.views[stmt.name]
            stream = self.ctx.settled(self.query(view.query, view.position)).stream
            types = {f.name: f.dataType.simpleString().upper() for f in stream.spark_schema.fields}
            return tableau.describe_text(stmt, None, [(c, types.get(c, "?"))
                                                      for c in stream.schema.columns])
        raise self.script.error(f"DESCRIBE: unknown table or view {stmt.name!r} (defined: "
                                f"{', '.join([*self.tables, *self.views]) or 'none'})",
                                stmt.position)

    def _define(self, name: str, stmt) -> None:
        if name in self.tables or name in self.views:
            raise self.script.error(f"{name} is already defined", stmt.position)

    def insert(self, ins: InsertDef) -> PlannedInsert:
        return plan_insert(self.ctx, self.tables, ins,
                           lambda q, pos: self.ctx.settled(self.query(q, pos)))

    def create_table_as(self, stmt: CreateTableAsDef) -> PlannedInsert:
        """``CREATE TABLE t WITH (...) AS query`` (Flink's CTAS): ``t`` gets the
        query's column names and types (and the primary key declared in the
        statement, as Flink: none is derived from the query), then the query
        is inserted into it; the sink creates the table where it is missing."""
        ctx, ins = self.ctx, stmt.insert
        self._define(stmt.table.name, stmt)
        rel = ctx.settled(self.query(ins.query, ins.position))
        types = {f.name: f.dataType for f in rel.stream.spark_schema.fields}
        names = [f.name for f in rel.fields]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ctx.error(f"CREATE TABLE {stmt.table.name} AS SELECT: the query has duplicate "
                            f"column name(s) {dup}: name them with AS", ins.position)
        for k in stmt.table.primary_key:
            if k not in names:
                raise ctx.error(f"CREATE TABLE {stmt.table.name}: primary key column {k!r} is "
                                f"not a column of the query ({', '.join(names)})", stmt.position)
        columns = tuple(ColumnDef(f.name, types[f.column].simpleString().upper(),
                                  types[f.column].simpleString(),
                                  nullable=f.name not in stmt.table.primary_key)
                        for f in rel.fields)
        table = dataclasses.replace(stmt.table, columns=columns)
        self.tables[table.name] = table
        return plan_insert(ctx, self.tables, ins, lambda q, pos: rel)

    # -- queries -----------------------------------------------------------------
    def query(self, q: exp.Expr, pos: Position) -> Relation:
        """A query's relation, by its shape (it may be pending)."""
        ctx = self.ctx
        if isinstance(q, exp.Subquery):
            return self.query(q.this, pos)
        if isinstance(q, exp.Union) and not q.args.get("distinct"):
            return self.union_all(q, pos)
        if isinstance(q, exp.SetOperation):
            what = "UNION (without ALL: distinct rows)" if isinstance(q, exp.Union) \
                else q.key.upper()
            raise ctx.error(f"{what} is not supported yet (UNION ALL is)",
                            ctx.keyword_position(q.expression, q.key.upper(), pos),
                            UnsupportedFeature)
        if isinstance(q, exp.Values):
            return values_relation(ctx, q, pos)
        if not isinstance(q, exp.Select):
            raise ctx.unsupported(f"{q.key.upper()} is not supported here", q, pos)
        if q.args.get("with_"):
            return self.with_query(q, pos)
        self._check_select(q, pos)
        q = window_tvf.from_group_window(ctx, q, pos)
        from_ = q.args.get("from_")
        if from_ is None:
            raise ctx.error("a SELECT needs FROM (constant queries have no changelog)",
                            pos, UnsupportedFeature)
        rel = self.relation(from_.this, pos)
        for j in q.args.get("joins") or ():
            rel = join(ctx, rel, j, pos, self.relation)
        where = q.args.get("where")
        where = where.this if where is not None else None
        if isinstance(rel.pending, RankCall):
            rel, rest = row_number.apply_rank(ctx, rel, where, q, pos)
            where = exp.and_(*rest) if rest else None
        if isinstance(rel.pending, WindowCall):
            window_tvf.check_where(ctx, rel, where, pos)
        rel = projection.where(ctx, rel, where, pos)
        if isinstance(rel.pending, WindowCall):
            if q.args.get("group"):
                return group_by.having(ctx, window_tvf.aggregate(ctx, rel, q, pos), q, pos,
                                       self.query)
            rel = window_tvf.table_function(ctx, rel, q, pos)
        if q.args.get("group") or _has_aggregates(q):
            return group_by.having(ctx, group_by.aggregate(ctx, rel, q, pos), q, pos, self.query)
        if q.args.get("distinct"):
            return group_by.distinct(ctx, rel, q, pos)
        if any(row_number.is_rank_item(e) for e in q.expressions):
            return row_number.rank_relation(ctx, rel, q, pos)
        return projection.project(ctx, rel, q.expressions, pos)

    def union_all(self, q: exp.Union, pos: Position) -> Relation:
        """``a UNION ALL b``: the changes of both, columns by position and
        named as ``a``'s (:meth:`ChangelogStream.union_all`)."""
        ctx = self.ctx
        if q.args.get("with_"):
            return self.with_query(q, pos)
        left = ctx.settled(self.query(q.this, pos))
        right = ctx.settled(self.query(q.expression, pos))
        ctx.check_bounded_mix("UNION ALL", (left.stream, right.stream),
                              ctx.keyword_position(q.expression, "UNION", pos))
        if len(left.fields) != len(right.fields):
            raise ctx.error(f"UNION ALL: the left query has {len(left.fields)} columns, the "
                            f"right one {len(right.fields)}",
                            ctx.keyword_position(q.expression, "UNION", pos))
        with ctx.analysis("UNION ALL", [q.this, q.expression], pos):
            stream = left.stream.union_all(right.stream)
        return Relation(stream, tuple(Field(None, f.name, c)
                                      for f, c in zip(left.fields, stream.schema.columns)))

    def with_query(self, q: exp.Select, pos: Position) -> Relation:
        """``WITH a AS (SELECT ...), b AS (...) SELECT ...``: each common table
        expression is a view visible to the ones after it and to the query
        (expanded where it is used, as ``CREATE TEMPORARY VIEW``), for this
        query only."""
        with_ = q.args["with_"]
        if with_.args.get("recursive"):
            raise self.ctx.unsupported("WITH RECURSIVE is not supported yet", with_, pos)
        saved = dict(self.views)
        try:
            for cte in with_.expressions:
                name = cte.alias
                if name in self.tables:
                    raise self.ctx.error(f"WITH {name}: a table of that name is defined",
                                         node_position(cte, pos))
                self.views[name] = ViewDef(name, cte.this, True, node_position(cte.this, pos))
            body = q.copy()
            body.set("with_", None)
            return self.query(body, pos)
        finally:
            self.views = saved

    def _check_select(self, q: exp.Select, pos: Position) -> None:
        ctx = self.ctx
        checks = (("order", "ORDER BY is not supported yet (Top-N: ROW_NUMBER() OVER (PARTITION "
                            "BY ... ORDER BY ...) AS rn in a subquery, WHERE rn <= N)", "ORDER"),
                  ("limit", "LIMIT is not supported yet", "LIMIT"),
                  ("qualify", "QUALIFY is not supported yet", "QUALIFY"))
        for arg, message, keyword in checks:
            node = q.args.get(arg)
            if node:
                raise ctx.error(message, ctx.keyword_position(node, keyword, pos),
                                UnsupportedFeature)
        grouped = bool(q.args.get("group")) or _has_aggregates(q)
        if q.args.get("having") and not grouped:
            raise ctx.error("HAVING needs GROUP BY or an aggregate in the select list",
                            ctx.keyword_position(q.args["having"], "HAVING", pos))
        for e in q.expressions:
            if row_number.is_rank_item(e):
                if grouped or q.args.get("distinct"):
                    raise ctx.unsupported("ROW_NUMBER() in a GROUP BY or DISTINCT query is not "
                                          "supported: rank the aggregated rows in an "
                                          "enclosing query", e, pos)
                continue
            ctx.check_expression(e, pos, allow_aggregates=grouped)

    def relation(self, node: exp.Expr, pos: Position) -> Relation:
        """A ``FROM`` item: a subquery, a window table function, a view or a table."""
        ctx = self.ctx
        if isinstance(node, exp.Values):
            return values_relation(ctx, node, pos)
        alias = node.alias if isinstance(node, (exp.Table, exp.Subquery)) else ""
        if isinstance(node, exp.Subquery):
            rel = self.query(node.this, node_position(node, pos))
            return rel.requalified(alias) if alias else rel
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Anonymous):
            fn = node.this
            inner = fn.expressions[0] if fn.name.upper() == "TABLE" and fn.expressions else fn
            name = inner.name.upper() if isinstance(inner, exp.Anonymous) else fn.name.upper()
            if name in WINDOW_TVFS and inner is not fn:
                return window_tvf.relation(ctx, inner, alias, pos, self.relation)
            if name == FROM_CHANGELOG:
                return from_changelog.relation(ctx, inner, alias, pos, self.tables, self.source)
            if name in WINDOW_TVFS:
                raise ctx.unsupported(f"write a window table function as TABLE({name}(...))",
                                      node, pos)
            raise ctx.unsupported(f"table function {name} is not supported", node, pos)
        if not isinstance(node, exp.Table):
            raise ctx.unsupported(f"{node.key.upper()} in FROM is not supported", node, pos)
        name = node.name
        tpos = node_position(node, pos)
        if name in self.views:
            view = self.views[name]
            rel = self.query(view.query, view.position)
        elif name in self.tables:
            rel = self.source(self.tables[name], tpos)
        else:
            raise ctx.error(f"unknown table or view {name!r} (defined: "
                            f"{', '.join([*self.tables, *self.views]) or 'none'})", tpos)
        return rel.requalified(alias or name)

    def source(self, t: TableDef, pos: Position, operation: Optional[str] = None,
               op_mapping: Optional[tuple] = None) -> Relation:
        """A source table's relation, read once per script (and once more
        as a changelog per ``FROM_CHANGELOG`` operation column and mapping)."""
        key = (t.name, operation, op_mapping)
        if key not in self._sources:
            self._sources[key] = read_source(self.ctx, t, pos, operation, op_mapping)
        return self._sources[key]


def _has_aggregates(q: exp.Select) -> bool:
    """Whether a select item calls an aggregate function (outside OVER):
    without GROUP BY, the query is a global aggregation."""
    return any(isinstance(n, exp.AggFunc) and not isinstance(n.parent, exp.Window)
               for e in q.expressions for n in e.walk())


__all__ = ["Translator"]
