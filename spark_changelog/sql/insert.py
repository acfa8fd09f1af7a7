"""``INSERT INTO`` a sink table (docs/sql.md, "Statements"): the query mapped
onto the table's columns, the upsert sink with the ``SET`` options in force
at that statement, and the sink object of the table's connector.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from sqlglot import exp

from ..api import ChangelogStream
from ..plan.rules import PlanError
from .context import Context, column_types
from .errors import UnsupportedFeature
from .expressions import normal_type
from .history_sink import history_sink
from .preflight import sink_type_problem
from .relation import Relation
from .script import InsertDef, Position, TableDef
from .settings import Settings
from .values import values_relation


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
            changelog_path: Optional[str] = None, trigger: Optional[str] = None):
        """Run the INSERT; ``late_output`` (default: the script's
        ``'spark-changelog.late-output.path'``): where window operators put late
        rows; ``changelog_path``: also write every emitted change there;
        ``trigger``: a processing-time interval that keeps the streaming query
        running until Ctrl-C (default: the files present, then stop)."""
        sink = self.make_sink(out)
        return self.stream.write_upsert(sink, checkpoint=checkpoint, dead_letter=dead_letter,
                                        strict=strict, progress=progress,
                                        changelog_path=changelog_path, trigger=trigger,
                                        late_output=late_output or self.settings.late_output,
                                        **self.sink_options())

    def make_sink(self, out=None):
        c = self.table.connector
        if c.kind == "delta":
            from ..sinks.delta import DeltaPath, sink_options
            options = sink_options(dict(c.options))
            return DeltaPath(c.path, **options) if options else c.path
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
            data = [f for f in self.stream.spark_schema.fields
                    if f.name in self.stream.schema.columns]
            schema = to_arrow_schema(type(self.stream.spark_schema)(data), timezone="UTC")
            return PostgresUpsertSink(postgres_conninfo(c), c.option("table-name", self.table.name),
                                      self.sink_key, pa.schema(schema), **postgres_sink_retries(c))
        raise AssertionError(f"not a sink connector: {c.kind}")


def postgres_sink_retries(c) -> dict:
    """``'sink.max-retries'`` (Flink's JDBC option name) as the sink's
    ``max_retries``: how often a connection or transaction failure is retried,
    with backoff, before the run fails; the sink's own default when absent
    (docs/sql.md, "Connectors (`WITH` options)")."""
    retries = c.option("sink.max-retries")
    return {} if retries is None else {"max_retries": int(retries)}


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



def plan_insert(ctx: Context, tables: dict, ins: InsertDef,
                query: Callable[[exp.Expr, Position], Relation]) -> PlannedInsert:
    """``INSERT INTO t query``: the query's columns mapped to ``t``'s by
    position (or by the column list), cast where the types differ (``VALUES``
    rows: cast to ``t``'s types when they are read, :mod:`.values`), and the
    upsert sink planned with the ``SET`` options in force (``query(q, pos)``:
    the query's settled relation)."""
    table = tables.get(ins.table)
    if table is None:
        raise ctx.error(f"unknown table {ins.table!r} (defined: "
                        f"{', '.join(tables) or 'none'})", ins.table_position)
    if table.connector.kind == "filesystem":
        raise ctx.error(
            f"table {table.name} (connector 'filesystem') is a source here; write to a "
            "'delta', 'jdbc'/'postgres', 'print' or 'blackhole' table",
            ins.table_position, UnsupportedFeature)
    if not table.primary_key and table.connector.kind in ("delta", "postgres"):
        raise ctx.error(
            f"table {table.name} (connector {table.connector.kind!r}) is an upsert table and "
            "needs PRIMARY KEY (...) NOT ENFORCED", ins.table_position)
    if ins.conflict and ctx.settings.materialize == "none":
        raise ctx.error(
            f"ON CONFLICT DO {ins.conflict.upper()} needs the sink upsert materializer, but "
            "SET 'table.exec.sink.upsert-materialize' = 'none' disables it (Flink 2.3 ignores "
            "the clause silently, FLINK-41007): use 'auto' or 'force', or drop ON CONFLICT",
            ins.position)
    history = history_sink(ctx, table)    # None unless the table holds a history
    physical = tuple(c for c in table.physical_columns
                     if history is None or c.name not in history.columns)
    targets = ins.columns or tuple(c.name for c in physical)
    unknown = [c for c in targets if c not in table.column_names]
    if unknown:
        raise ctx.error(f"INSERT INTO {table.name}: unknown column(s) {unknown}",
                        ins.table_position)
    if isinstance(ins.query, exp.Values):     # literals typed by the sink's columns, as Flink
        declared = {c.name: c.spark_type for c in physical}
        rel = values_relation(ctx, ins.query, ins.position, targets,
                              [declared[t] for t in targets])
    else:
        rel = query(ins.query, ins.position)
    if len(rel.fields) != len(targets):
        raise ctx.error(
            f"INSERT INTO {table.name}: the query has {len(rel.fields)} column(s) "
            f"({', '.join(f.name for f in rel.fields)}), the table takes {len(targets)} "
            f"({', '.join(targets)})", ins.position)
    # a column left out of the column list gets NULL, as in Flink, unless it
    # cannot hold one (NOT NULL or a primary key column)
    refused = [c.name for c in physical if c.name not in targets
               and (not c.nullable or c.name in table.primary_key)]
    if refused:
        raise ctx.error(f"INSERT INTO {table.name}: column(s) {refused} get no value and do not "
                        "take NULL (NOT NULL or primary key): list them", ins.table_position)
    types = column_types(rel.stream)
    named, identity = {}, True
    by_target = dict(zip(targets, rel.fields))
    for c in physical:
        if c.name not in by_target:
            named[c.name] = f"CAST(NULL AS {c.spark_type})"
            identity = False
            continue
        f = by_target[c.name]
        problem = sink_type_problem(c.name, types.get(f.column, "void"), c.spark_type, table.name)
        if problem:
            raise ctx.error(problem, ins.position)
        if types.get(f.column) != normal_type(c.spark_type):
            named[c.name] = f"CAST(`{f.column}` AS {c.spark_type})"
            identity = False
        else:
            named[c.name] = f.column
            identity = identity and f.column == c.name
    stream = rel.stream
    if not (identity and tuple(stream.schema.columns) == tuple(named)):
        stream = ctx.select(stream, named, ins.position)
    if history is not None:
        stream = history.apply(stream)
    if ctx.settings.mini_batch:
        stream = stream.with_mini_batch()
    planned = PlannedInsert(ins, table, stream, ctx.settings)
    try:
        planned.plan()          # the materializer decision: its errors belong to this line
    except PlanError as e:
        raise ctx.error(f"INSERT INTO {table.name}: {e}", ins.position) from None
    return planned


__all__ = ["PlannedInsert", "plan_insert", "postgres_conninfo"]
