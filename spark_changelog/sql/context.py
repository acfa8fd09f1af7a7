"""What every query shape needs from the translation (docs/sql.md, opening
section): the script (errors at a line and column), the ``SET`` options in force, the
run's options, and the services over a :class:`~.relation.Relation`: name
resolution, expressions as Spark SQL, projections with Spark's analysis
errors at the function they name.

The shape modules (:mod:`.projection`, :mod:`.join`, :mod:`.group_by`,
:mod:`.row_number`, :mod:`.window_tvf`, :mod:`.source`, :mod:`.insert`) take
a :class:`Context`; :mod:`.translate` owns one and dispatches to them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
from typing import Optional, Sequence

from sqlglot import exp

from ..api import ChangelogStream
from .dialect import Descriptor, Flink, TableArgument
from .errors import SqlError, UnsupportedFeature
from .expressions import map_function, named_function_position
from .relation import Field, Relation
from .script import Position, Script, node_position
from .settings import Settings


@dataclasses.dataclass
class Context:
    spark: object
    script: Script
    streaming: bool = False
    strict: bool = False
    key_groups: Optional[int] = None
    max_files_per_trigger: Optional[int] = None
    settings: Settings = dataclasses.field(default_factory=Settings)

    # -- errors ----------------------------------------------------------------
    def error(self, message: str, position: Optional[Position],
              cls: type = SqlError) -> SqlError:
        return self.script.error(message, position, cls)

    def unsupported(self, message: str, node: exp.Expr, pos: Position) -> SqlError:
        return self.script.error(message, node_position(node, pos), UnsupportedFeature)

    def check_bounded_mix(self, what: str, streams, at: Position) -> None:
        """A streaming run cannot combine a bounded input (``VALUES`` rows, a
        Spark batch frame) with a streaming one: Spark refuses to union them,
        so say it here, at the statement, instead of failing at run time."""
        if self.streaming and len({s.is_streaming for s in streams}) > 1:
            raise self.error(f"{what} of VALUES rows with a streaming table is not "
                             "supported yet in a streaming run (run it with --batch)", at,
                             UnsupportedFeature)

    def keyword_position(self, node: exp.Expr, keyword: str, default: Position) -> Position:
        """The position of ``keyword`` (GROUP, ORDER, ...) just before ``node``."""
        inner = node_position(node, default)
        sql = self.script.sql
        lines = sql.splitlines(keepends=True)
        offset = sum(len(x) for x in lines[:inner.line - 1]) + inner.col - 1
        at = sql.upper().rfind(keyword, 0, offset + len(keyword))
        if at < 0:
            return inner
        line = sql.count("\n", 0, at) + 1
        col = at - (sql.rfind("\n", 0, at) + 1) + 1
        return Position(line, col, len(keyword))

    @contextlib.contextmanager
    def analysis(self, what: str, nodes: Sequence[exp.Expr], pos: Position):
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
                                    named_function_position(msg, nodes, pos)) from None
        finally:
            for lg, b in zip(loggers, before):
                lg.disabled = b

    def call_arguments(self, fn: exp.Anonymous, name: str, params: Sequence[str],
                       pos: Position) -> dict:
        """A table function's arguments by parameter name (upper case),
        positional or named (``size => INTERVAL ...``)."""
        args: dict = {}
        for i, a in enumerate(fn.expressions):
            if isinstance(a, exp.Kwarg):
                key = a.this.name.upper()
                if key not in params:
                    raise self.error(f"{name} has no parameter {key} (parameters: "
                                     f"{', '.join(params)})", node_position(a, pos))
                args[key] = a.expression
            elif i < len(params):
                args[params[i]] = a
            else:
                raise self.error(f"{name} takes at most {len(params)} arguments "
                                 f"({', '.join(params)})", node_position(a, pos))
        return args

    # -- relations -------------------------------------------------------------
    def settled(self, rel: Relation) -> Relation:
        """``rel``, which must not wait for an enclosing query any more."""
        if rel.pending is not None:
            raise rel.pending.unsettled_error(self)
        return rel

    def keyed(self) -> dict:
        """The keyed operators' ``key_groups`` argument, when the run sets one."""
        return {"key_groups": self.key_groups} if self.key_groups else {}

    def find(self, col: exp.Column, rel: Relation) -> Optional[Field]:
        q, name = col.table, col.name
        hits = [f for f in rel.fields if f.name == name and (not q or f.qualifier == q)]
        return hits[0] if len(hits) == 1 else None

    def resolve(self, col: exp.Column, rel: Relation, pos: Position) -> Field:
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

    def select(self, stream: ChangelogStream, named: dict, pos: Position,
               nodes: Sequence[exp.Expr] = ()) -> ChangelogStream:
        with self.analysis("projection", nodes, pos):
            return stream.select(**named)

    # -- expressions -----------------------------------------------------------
    def spark_sql(self, node: exp.Expr, rel: Relation, pos: Position,
                  allow_aggregates: bool = False) -> str:
        """The expression as Spark SQL over the stream's columns."""
        self.check_expression(node, pos, allow_aggregates)
        resolved = {id(c): self.resolve(c, rel, pos).column for c in node.find_all(exp.Column)}
        for n in node.walk():
            if isinstance(n, (TableArgument, Descriptor)):
                raise self.unsupported("table arguments are only valid in window table "
                                       "functions", n, pos)
        types = column_types(rel.stream)
        copy = node.copy()
        for orig, new in zip(node.walk(), copy.walk()):
            if isinstance(orig, exp.Column):
                new.replace(exp.column(exp.to_identifier(resolved[id(orig)], quoted=True)))
        try:
            copy = copy.transform(lambda n: map_function(n, types))
        except ValueError as e:
            raise self.script.error(str(e), node_position(node, pos)) from None
        return copy.sql(dialect="spark")

    def check_expression(self, node: exp.Expr, pos: Position,
                         allow_aggregates: bool = False) -> None:
        for n in node.walk():
            if isinstance(n, exp.Window):
                fn = n.this
                if isinstance(fn, exp.RowNumber):
                    raise self.unsupported(
                        "ROW_NUMBER() OVER (...) must be a select item of its own (ROW_NUMBER() "
                        "OVER (PARTITION BY k ORDER BY t) AS rn), in a subquery whose enclosing "
                        "query filters on rn", fn, pos)
                raise self.unsupported(
                    f"{fn.sql(dialect=Flink).split('(')[0]}() OVER (...) is not supported yet "
                    "(OVER aggregation; RANK and DENSE_RANK Top-N): ROW_NUMBER() is", fn, pos)
            if isinstance(n, exp.AggFunc) and not allow_aggregates:
                raise self.unsupported(f"aggregate function {n.sql_name()} (GROUP BY "
                                       "aggregation) is not supported yet", n, pos)
            if isinstance(n, (exp.Subquery, exp.Exists)) or (isinstance(n, exp.In) and
                                                             n.args.get("query")):
                raise self.unsupported("subqueries in expressions are not supported yet", n, pos)


def column_types(stream: ChangelogStream) -> dict:
    """The stream's column types by name (Spark's ``simpleString``)."""
    return {f.name: f.dataType.simpleString() for f in stream.spark_schema.fields}


__all__ = ["Context", "column_types"]
