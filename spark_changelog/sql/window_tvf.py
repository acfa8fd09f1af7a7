"""Window table functions: ``FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts),
INTERVAL '1' MINUTE))`` and ``HOP``, ``CUMULATE``, ``SESSION`` (docs/sql.md,
"Windows").

``relation`` reads the call into a :class:`WindowCall` (the window of
``model.windows``: ``tumble``/``hop``/``cumulate``/``session``) over the
input relation, with ``window_start``, ``window_end`` and ``window_time``
among its fields.  The enclosing ``SELECT`` then decides: ``GROUP BY
window_start, window_end[, keys]`` is :meth:`WindowedStream.aggregate`, a
plain ``SELECT`` the window table function alone
(:meth:`WindowedStream.select`).  The ``SET`` options in force give the
allowed lateness (``table.exec.emit.allow-lateness``) and the idle timeout
(``table.exec.source.idle-timeout``).  Windows, their firing and lateness are
the window operator's (docs/windows.md); nothing here re-states them.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from sqlglot import exp
from sqlglot.errors import ParseError

from ..model.windows import cumulate, hop, session, tumble
from ..plan.nodes import WINDOW_END, WINDOW_START, WINDOW_TIME
from ..plan.rules import PlanError
from .context import Context, column_types
from .dialect import Descriptor, Flink, TableArgument
from .errors import SqlError, UnsupportedFeature
from .group_by import grouped_relation, grouped_select_items
from .relation import Field, Relation
from .script import Position, interval_ms, node_position

WINDOW_COLUMNS = (WINDOW_START, WINDOW_END, WINDOW_TIME)
#: Flink 2.3's parameters per function (``OFFSET`` optional), positional order
PARAMETERS = {"TUMBLE": ("DATA", "TIMECOL", "SIZE", "OFFSET"),
              "HOP": ("DATA", "TIMECOL", "SLIDE", "SIZE", "OFFSET"),
              "CUMULATE": ("DATA", "TIMECOL", "STEP", "SIZE", "OFFSET"),
              "SESSION": ("DATA", "TIMECOL", "GAP")}
#: Flink's window_time of the window table function alone: the window's last millisecond
WINDOW_TIME_SQL = f"`{WINDOW_END}` - INTERVAL 1 MILLISECOND"
AGGREGATES = {exp.Count: "count", exp.Sum: "sum", exp.Min: "min", exp.Max: "max",
              exp.Avg: "avg"}


@dataclasses.dataclass(frozen=True)
class WindowCall:
    """A window table function over the relation's stream."""

    name: str                   # TUMBLE, HOP, CUMULATE, SESSION
    window: tuple               # (column, model.windows assigner)
    partition: tuple            # SESSION's PARTITION BY columns
    node: exp.Expr
    position: Position

    def unsettled_error(self, ctx: Context) -> SqlError:
        return ctx.unsupported(
            f"a window table function ({self.name}) is read by a SELECT of its own "
            "(FROM TABLE(...) with or without GROUP BY window_start, window_end); joining "
            "it (a window join) is not supported yet", self.node, Position(1, 1))


def relation(ctx: Context, fn: exp.Anonymous, alias: str, pos: Position,
             read: Callable[[exp.Expr, Position], Relation]) -> Relation:
    """The call ``fn`` over its ``TABLE`` argument (``read(node, pos)``: that
    table's relation), pending until the enclosing ``SELECT``."""
    name = fn.name.upper()
    fpos = node_position(fn, pos)
    params = PARAMETERS[name]
    args = ctx.call_arguments(fn, name, params, pos)
    missing = [p for p in params if p != "OFFSET" and p not in args]
    if missing:
        raise ctx.error(f"{name}(...) lacks {', '.join(missing)} ({name}("
                              f"{', '.join(params)}))", fpos)
    data = args["DATA"]
    if not isinstance(data, TableArgument):
        raise ctx.error(f"{name}: the first argument is TABLE name", node_position(data, pos))
    rel = ctx.settled(read(data.this, pos))
    descriptor = args["TIMECOL"]
    if not isinstance(descriptor, Descriptor) or len(descriptor.expressions) != 1:
        raise ctx.error(f"{name}: the time column is DESCRIPTOR(column)",
                              node_position(descriptor, pos))
    col = exp.column(descriptor.expressions[0].copy())
    col.meta.update(descriptor.expressions[0].meta)
    field = ctx.resolve(col, rel, pos)
    t = rel.stream.traits
    if field.column != t.time_attribute:
        raise ctx.error(
            f"{name}: DESCRIPTOR({field.name}) must be the event-time attribute, a column with "
            f"WATERMARK FOR {field.name} AS ... (the stream's is "
            f"{t.time_attribute or 'not declared'}); processing-time windows are not supported "
            "yet", node_position(descriptor, pos))

    def duration(key: str) -> int:
        node = args[key]
        ms = interval_ms(node) if isinstance(node, exp.Interval) else None
        if ms is None or (ms <= 0 and key != "OFFSET"):
            raise ctx.error(f"{name}: {key} is a positive INTERVAL 'n' unit (MILLISECOND, "
                                  "SECOND, MINUTE, HOUR, DAY)", node_position(node, pos))
        return ms

    offset = duration("OFFSET") if "OFFSET" in args else 0
    partition = ()
    if data.args.get("partition_by"):
        if name != "SESSION":
            raise ctx.error("PARTITION BY in the table argument is SESSION's",
                                  node_position(data, pos))
        partition = tuple(ctx.resolve(c, rel, pos).column for c in data.args["partition_by"])
    try:
        if name == "TUMBLE":
            window = tumble(field.column, duration("SIZE"), offset)
        elif name == "HOP":
            window = hop(field.column, duration("SLIDE"), duration("SIZE"), offset)
        elif name == "CUMULATE":
            window = cumulate(field.column, duration("STEP"), duration("SIZE"), offset)
        else:
            window = session(field.column, duration("GAP"))
    except ValueError as e:
        if isinstance(e, SqlError):
            raise
        raise ctx.error(f"{name}: {e}", fpos) from None
    call = WindowCall(name, window, partition, fn, fpos)
    fields = rel.fields + tuple(Field(None, c, c) for c in WINDOW_COLUMNS)
    out = Relation(rel.stream, fields, pending=call)
    return out.requalified(alias) if alias else out


#: the deprecated group window functions (``GROUP BY TUMBLE(ts, size)``) and
#: their auxiliary functions: the window table function's columns
GROUP_WINDOWS = ("TUMBLE", "HOP", "SESSION")
AUXILIARY = {"START": WINDOW_START, "END": WINDOW_END, "ROWTIME": WINDOW_TIME}


def _group_window(node) -> bool:
    return (isinstance(node, exp.Anonymous) and node.name.upper() in GROUP_WINDOWS
            and bool(node.expressions) and isinstance(node.expressions[0], exp.Column))


def from_group_window(ctx: Context, q: exp.Select, pos: Position) -> exp.Select:
    """A group window aggregation (Flink's deprecated ``GROUP BY TUMBLE(ts,
    size), k`` with ``TUMBLE_START(ts, size)``, ``_END``, ``_ROWTIME``; HOP
    and SESSION alike) as the window table function aggregation it means
    (docs/sql.md, "Windows"): ``FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts),
    size)) GROUP BY window_start, window_end, k``; a SESSION's other group
    keys are its PARTITION BY.  ``q`` itself when it has no group window."""
    group = q.args.get("group")
    calls = [g for g in (group.expressions if group is not None else ()) if _group_window(g)]
    if not calls:
        return q
    if len(calls) > 1:
        raise ctx.unsupported("one group window per GROUP BY", calls[1], pos)
    call = calls[0]
    name = call.name.upper()
    source = q.args["from_"].this
    if not isinstance(source, exp.Table) or not isinstance(source.this, exp.Identifier) \
            or q.args.get("joins"):
        raise ctx.unsupported(f"GROUP BY {name}(...) over one table or view (write a window "
                              "table function over a view of the join or subquery)", call, pos)
    keys = [g for g in group.expressions if g is not call]
    args = [a.sql(dialect=Flink) for a in call.expressions[1:]]
    partition = (" PARTITION BY " + ", ".join(k.sql(dialect=Flink) for k in keys)
                 if name == "SESSION" and keys else "")
    table = exp.table_(source.this.copy()).sql(dialect=Flink)
    alias = f" AS {source.alias}" if source.alias else ""
    text = (
        f"SELECT * FROM TABLE({name}(TABLE {table}{partition}, DESCRIPTOR("
        f"{exp.to_identifier(call.expressions[0].name).sql(dialect=Flink)}), "
        f"{', '.join(args)})){alias}")
    try:
        tvf = exp.maybe_parse(text, dialect=Flink).args["from_"].this
    except ParseError:
        raise ctx.unsupported(f"this GROUP BY {name}(...) has no window table function form "
                              f"(write it as {text[len('SELECT * FROM '):]})", call, pos) from None
    out = q.copy()
    out.set("from_", exp.From(this=tvf))
    out.set("group", exp.Group(expressions=[exp.column(WINDOW_START), exp.column(WINDOW_END)]
                               + [k.copy() for k in keys]))

    def auxiliary(node):
        if isinstance(node, exp.Anonymous):
            fn, _, part = node.name.upper().rpartition("_")
            if fn == name and part in AUXILIARY:
                return exp.column(AUXILIARY[part])
        return node
    out.set("expressions", [e.transform(auxiliary) for e in out.expressions])
    if out.args.get("having"):
        out.set("having", out.args["having"].transform(auxiliary))
    return out


def check_where(ctx: Context, rel: Relation, where: Optional[exp.Expr],
                pos: Position) -> None:
    """A ``WHERE`` over a window table function filters its input rows; the
    window columns are not there yet."""
    if where is None:
        return
    for c in where.find_all(exp.Column):
        f = ctx.find(c, rel)
        if f is not None and f.column in WINDOW_COLUMNS:
            raise ctx.unsupported(f"a WHERE on {f.name} is not supported yet (filter the "
                                  "window aggregate's result in an enclosing query)", c, pos)


def _windowed(ctx: Context, rel: Relation):
    call: WindowCall = rel.pending
    s = ctx.settings
    try:
        return rel.stream.window(call.window, idle_timeout=s.idle_timeout_ms,
                                 allowed_lateness=s.allow_lateness_ms)
    except (PlanError, ValueError) as e:
        if isinstance(e, SqlError):
            raise
        raise ctx.error(f"{call.name}: {e}", call.position) from None


def table_function(ctx: Context, rel: Relation, q: exp.Select, pos: Position) -> Relation:
    """The window table function alone: every row once per window."""
    call: WindowCall = rel.pending
    if call.window[1].merging:
        raise ctx.unsupported("SESSION windows are only supported under GROUP BY window_start, "
                              "window_end, <PARTITION BY columns>", call.node, pos)
    stream = _windowed(ctx, rel).select()
    uses_time = any(ctx.find(c, rel) is not None and ctx.find(c, rel).column == WINDOW_TIME
                    for item in q.expressions for c in item.find_all(exp.Column))
    if uses_time:
        stream = stream.with_column(WINDOW_TIME, WINDOW_TIME_SQL)
    fields = tuple(f for f in rel.fields if uses_time or f.column != WINDOW_TIME)
    return Relation(stream, fields)


def aggregate(ctx: Context, rel: Relation, q: exp.Select, pos: Position) -> Relation:
    """``GROUP BY window_start, window_end[, window_time][, keys][, GROUPING
    SETS/ROLLUP/CUBE (...)]`` with COUNT,
    COUNT(DISTINCT), SUM, MIN, MAX, AVG of a column: the window aggregate,
    then the select list's order and names.  ``window_time`` (grouped or
    selected) is the aggregate's event-time attribute column, so a window
    over this query's result cascades (docs/windows.md, "Cascading
    windows")."""
    call: WindowCall = rel.pending
    group = q.args["group"]
    keys, bounds, sets = [], set(), None
    for g in group.expressions:
        if isinstance(g, (exp.GroupingSets, exp.Rollup, exp.Cube)):
            if sets is not None:
                raise ctx.unsupported("one GROUPING SETS, ROLLUP or CUBE per window aggregation",
                                      g, pos)
            sets = _grouping_sets(ctx, rel, g, pos)
            continue
        if not isinstance(g, exp.Column):
            raise ctx.unsupported("GROUP BY takes columns (compute an expression in a view "
                                  "first)", g, pos)
        f = ctx.resolve(g, rel, pos)
        if f.column in WINDOW_COLUMNS:
            bounds.add(f.column)
        else:
            keys.append(f.column)
    gpos = ctx.keyword_position(group, "GROUP", pos)
    if bounds - {WINDOW_TIME} != {WINDOW_START, WINDOW_END}:
        raise ctx.error("a window aggregation groups by window_start and window_end (and "
                              "optionally more columns)", gpos, UnsupportedFeature)
    if sets is not None and call.window[1].merging:
        raise ctx.error("GROUPING SETS, ROLLUP and CUBE are not supported over SESSION windows",
                        gpos, UnsupportedFeature)
    grouped = list(keys) + [c for c in dict.fromkeys(c for st in sets or () for c in st)
                            if c not in keys]
    if call.window[1].merging:
        # without PARTITION BY (and without group keys) one session sequence
        # over the whole stream
        if set(call.partition) != set(keys):
            raise ctx.error("SESSION(TABLE t PARTITION BY ...): the GROUP BY columns "
                                  "besides window_start and window_end must be the PARTITION BY "
                                  "columns", gpos, UnsupportedFeature)
    def column_of(f):
        return f.column if f.column in grouped or f.column in WINDOW_COLUMNS else None

    calls, named = grouped_select_items(
        ctx, q, rel, pos, column_of, lambda call: _call_text(ctx, call, rel, pos),
        "in a window aggregation, a select item is window_start, window_end, window_time, a "
        "group column or one aggregate call (COUNT, COUNT(DISTINCT c), SUM, MIN, MAX, AVG of a "
        "column)")
    if not calls:
        raise ctx.error("a window aggregation needs at least one aggregate (e.g. "
                              "COUNT(*))", gpos, UnsupportedFeature)
    window_time = WINDOW_TIME in bounds or WINDOW_TIME in named.values()

    def window_aggregate(by: list):
        try:
            return _windowed(ctx, rel).aggregate(by=by, window_time=window_time, **ctx.keyed(),
                                                 **calls)
        except (PlanError, ValueError) as e:
            if isinstance(e, SqlError):
                raise
            raise ctx.error(f"window aggregation: {e}", gpos) from None
    if sets is None:
        return grouped_relation(ctx, window_aggregate(keys), named, pos, q.expressions)
    # one window aggregate per grouping set, the columns outside it NULL, then
    # UNION ALL (as Flink expands them: an Expand before one aggregate)
    types = column_types(rel.stream)
    branches = []
    for grouping in sets:
        by = list(keys) + [c for c in grouping if c not in keys]
        out = {name: c if c not in grouped or c in by else f"CAST(NULL AS {types[c]})"
               for name, c in named.items()}
        branches.append(ctx.select(window_aggregate(by), out, pos, q.expressions))
    stream = branches[0].union_all(*branches[1:]) if len(branches) > 1 else branches[0]
    return Relation(stream, tuple(Field(None, n, n) for n in named))


def _grouping_sets(ctx: Context, rel: Relation, node: exp.Expr, pos: Position) -> list:
    """The grouping sets (tuples of columns) of ``GROUPING SETS (...)``,
    ``ROLLUP (a, b)`` (``(a, b), (a), ()``) or ``CUBE (a, b)`` (every
    subset), as Flink reads them."""
    def columns(items) -> tuple:
        out = []
        for c in items:
            if not isinstance(c, exp.Column):
                raise ctx.unsupported("a grouping set lists columns", c, pos)
            f = ctx.resolve(c, rel, pos)
            if f.column in WINDOW_COLUMNS:
                raise ctx.unsupported(f"{f.name} in a grouping set is not supported (group "
                                      "by it beside the set)", c, pos)
            out.append(f.column)
        return tuple(out)
    if isinstance(node, exp.Rollup):
        cols = columns(node.expressions)
        return [cols[:i] for i in range(len(cols), -1, -1)]
    if isinstance(node, exp.Cube):
        cols = columns(node.expressions)
        return [tuple(c for i, c in enumerate(cols) if mask >> i & 1)
                for mask in range(2 ** len(cols) - 1, -1, -1)]
    sets = []
    for item in node.expressions:
        if isinstance(item, exp.Paren):
            item = item.this
        sets.append(columns(item.expressions if isinstance(item, exp.Tuple) else [item]))
    return sets


def _call_text(ctx: Context, node: exp.AggFunc, rel: Relation, pos: Position) -> str:
    """``count(distinct u)``-style text of the window operator's aggregates."""
    func = AGGREGATES.get(type(node))
    arg = node.this
    distinct = isinstance(arg, exp.Distinct)
    if distinct:
        arg = arg.expressions[0] if len(arg.expressions) == 1 else None
    if func is None or (distinct and func != "count") or node.expressions:
        raise ctx.unsupported(f"{node.sql_name()} is not a window aggregate here (COUNT, "
                              "COUNT(DISTINCT c), SUM, MIN, MAX, AVG of a column)", node, pos)
    if isinstance(arg, exp.Star) and func == "count" and not distinct:
        return "count(*)"
    if not isinstance(arg, exp.Column) or isinstance(arg.this, exp.Star):
        raise ctx.unsupported("a window aggregate takes a column (compute an expression in a "
                              "view first)", node, pos)
    f = ctx.resolve(arg, rel, pos)
    if f.column in WINDOW_COLUMNS:
        raise ctx.unsupported(f"aggregating {f.name} is not supported", arg, pos)
    return f"{func}({'distinct ' if distinct else ''}{f.column})"


__all__ = ["WindowCall", "relation", "from_group_window", "check_where", "table_function", "aggregate",
           "WINDOW_COLUMNS", "WINDOW_TIME"]
