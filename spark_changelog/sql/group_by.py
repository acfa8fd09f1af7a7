"""``GROUP BY``, ``HAVING`` and ``SELECT DISTINCT`` (docs/sql.md,
"Queries"): the group aggregation with retraction (docs/semantics.md,
section 7), then the select list's order and names.  The grouped select list
(:func:`grouped_select_items`, :func:`grouped_relation`) is shared with the
window aggregation (:mod:`.window_tvf`).
"""
from __future__ import annotations

from typing import Callable

from sqlglot import exp

from .context import Context
from .dialect import Flink
from .errors import SqlError, UnsupportedFeature
from .projection import project
from .relation import Field, Relation
from .script import Position, node_position


def aggregate(ctx: Context, rel: Relation, q: exp.Select, pos: Position) -> Relation:
    """``SELECT keys..., AGG(expr) [FILTER (WHERE cond)] ... [GROUP BY keys]``.
    Select items are group columns or one aggregate call each.  Without
    ``GROUP BY`` the whole stream is one group (Flink runs it with
    parallelism 1).  An aggregate's argument that is not a column, or a
    ``FILTER``, is computed as a hidden column before the aggregation
    (:func:`call_over_columns`)."""
    group = q.args.get("group")
    for g in group.expressions if group is not None else ():
        for cls, kind in ((exp.Rollup, "ROLLUP"), (exp.Cube, "CUBE"),
                          (exp.GroupingSets, "GROUPING SETS")):
            if isinstance(g, cls):
                raise ctx.error(f"GROUP BY {kind} is not supported yet (one grouping per query: "
                                "write each grouping as its own INSERT)",
                                ctx.keyword_position(g, kind.split()[0], pos), UnsupportedFeature)
    keys = []
    for g in group.expressions if group is not None else ():
        if not isinstance(g, exp.Column):
            raise ctx.unsupported("GROUP BY takes columns (compute an expression in a "
                                  "view first)", g, pos)
        keys.append(ctx.resolve(g, rel, pos).column)
    hidden: list = []
    calls, named = grouped_select_items(
        ctx, q, rel, pos, lambda f: f.column if f.column in keys else None,
        lambda call: call_over_columns(ctx, call, rel, pos, hidden),
        "in a GROUP BY query, a select item is a group column or one aggregate call "
        "(AGG(expression)); expressions over aggregates are not supported yet")
    stream = rel.stream
    if hidden:
        with ctx.analysis("aggregate arguments", q.expressions, pos):
            stream = stream.select(*stream.schema.columns, **dict(hidden))
    try:
        with ctx.analysis("aggregation", q.expressions, pos):
            stream = stream.group_by(*keys).agg(
                state_ttl_ms=ctx.settings.state_ttl_ms, **ctx.keyed(), **calls)
    except ValueError as e:
        if isinstance(e, SqlError):
            raise
        raise ctx.error(str(e), node_position(group or q, pos)) from None
    return grouped_relation(ctx, stream, named, pos, q.expressions)


def is_aggregate_item(body: exp.Expr) -> bool:
    """An aggregate call, with or without ``FILTER (WHERE ...)``."""
    return isinstance(body, exp.AggFunc) or (isinstance(body, exp.Filter)
                                             and isinstance(body.this, exp.AggFunc))


def call_over_columns(ctx: Context, node: exp.Expr, rel: Relation, pos: Position,
                      hidden: list) -> str:
    """The text of an aggregate call over columns only.  A call whose
    argument is an expression (``SUM(a * b)``, ``COUNT(DISTINCT CONCAT(a,
    b))``, ``MAX(CASE ...)``) or that has ``FILTER (WHERE cond)`` aggregates a
    hidden column (``$agg0``, ...; appended to ``hidden`` as (name, Spark
    SQL)): the argument, under a filter ``CASE WHEN cond THEN arg END`` (a row
    the filter rejects is a null, which every function but ``COUNT(*)``
    ignores; ``COUNT(*) FILTER`` counts ``CASE WHEN cond THEN 1 END``)."""
    cond = None
    if isinstance(node, exp.Filter):
        cond, node = node.expression.this, node.this
    call = node.copy()
    distinct = isinstance(call.this, exp.Distinct)
    arg = call.this.expressions[0] if distinct and call.this.expressions else call.this
    if distinct and len(call.this.expressions) != 1:
        raise ctx.unsupported("COUNT(DISTINCT ...) of several expressions is not supported yet "
                              "(count the DISTINCT of one expression, e.g. CONCAT_WS)", node, pos)
    if isinstance(arg, exp.Star) and cond is not None:
        arg = exp.Literal.number(1)
    if cond is None and (isinstance(arg, (exp.Column, exp.Star)) or arg is None):
        return ctx.spark_sql(call, rel, pos, allow_aggregates=True)
    value = arg if cond is None else exp.Case(ifs=[exp.If(this=cond.copy(), true=arg.copy())])
    ctx.check_expression(value, pos)
    name = f"$agg{len(hidden)}"
    hidden.append((name, ctx.spark_sql(value, rel, pos)))
    column = f"`{name}`"
    return f"{call.sql_name()}({'DISTINCT ' if distinct else ''}{column})"


def grouped_select_items(ctx: Context, q: exp.Select, rel: Relation, pos: Position,
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
            f = ctx.resolve(body, rel, pos)
            column = column_of(f)
            if column is None:
                raise ctx.error(f"column {f.name!r} is neither grouped nor "
                                "aggregated: add it to GROUP BY or aggregate it",
                                node_position(body, pos))
            named[alias or f.name] = column
        elif is_aggregate_item(body):
            name = alias or f"EXPR${idx}"
            calls[name] = call_of(body)
            named[name] = name
        else:
            raise ctx.unsupported(what, body, pos)
    return calls, named


def grouped_relation(ctx: Context, stream, named: dict, pos: Position,
                     expressions) -> Relation:
    """The aggregated ``stream`` in the select list's order and names."""
    cols = tuple(stream.schema.columns)
    if cols == tuple(named) and list(named) == list(named.values()):
        return Relation(stream, tuple(Field(None, c, c) for c in cols))
    stream = ctx.select(stream, named, pos, expressions)
    return Relation(stream, tuple(Field(None, n, n) for n in named))


def having(ctx: Context, rel: Relation, q: exp.Select, pos: Position,
           requery: Callable[[exp.Select, Position], Relation]) -> Relation:
    """``HAVING cond``: a filter over the aggregated rows.  An aggregate call
    in ``cond`` is the select item with the same call (by its name), or
    is added and projected away after the filter (``requery`` plans the
    query again with the extra select items)."""
    cond_node = q.args.get("having")
    if cond_node is None:
        return rel
    items = {}
    for idx, item in enumerate(q.expressions):
        body = item.this if isinstance(item, exp.Alias) else item
        if is_aggregate_item(body):
            items.setdefault(body.sql(dialect=Flink).lower(), rel.fields[idx])
    cond = cond_node.this.copy()
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
        rel2 = requery(q2, pos)
        for i, e in enumerate(extra):
            items[e.sql(dialect=Flink).lower()] = rel2.fields[len(q.expressions) + i]
        visible = rel2.fields[:len(q.expressions)]
    else:
        rel2, visible = rel, rel.fields
    for orig, new in zip(list(cond_node.this.find_all(exp.AggFunc)),
                         list(cond.find_all(exp.AggFunc))):
        f = items[orig.sql(dialect=Flink).lower()]
        new.replace(exp.column(exp.to_identifier(f.name, quoted=True)))
    text = ctx.spark_sql(cond, Relation(rel2.stream, rel2.fields), pos)
    hpos = ctx.keyword_position(cond_node, "HAVING", pos)
    with ctx.analysis("HAVING condition", [cond_node.this], hpos):
        stream = rel2.stream.where(text)
    if extra:
        stream = ctx.select(stream, {f.name: f.column for f in visible}, hpos)
    return Relation(stream, tuple(visible))


def distinct(ctx: Context, rel: Relation, q: exp.Select, pos: Position) -> Relation:
    """``SELECT DISTINCT items``: ``GROUP BY`` every item (as Flink plans it);
    the group aggregation needs an aggregate, so a row count is computed
    and projected away."""
    out = project(ctx, rel, q.expressions, pos)
    names = [f.column for f in out.fields]
    count = "$distinct_rows"
    dpos = ctx.keyword_position(q.args["distinct"], "DISTINCT", pos)
    with ctx.analysis("SELECT DISTINCT", q.expressions, dpos):
        stream = out.stream.group_by(*names).agg(
            state_ttl_ms=ctx.settings.state_ttl_ms, **ctx.keyed(), **{count: "COUNT(*)"})
        stream = stream.select(*names)
    return Relation(stream, out.fields)


__all__ = ["aggregate", "call_over_columns", "is_aggregate_item", "grouped_select_items", "grouped_relation", "having", "distinct"]
