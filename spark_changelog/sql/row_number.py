"""``ROW_NUMBER() OVER (...)`` filtered on the row number: deduplication and
Top-N (docs/sql.md, "Deduplication and Top-N").

Flink writes both as a subquery::

    SELECT ... FROM (
      SELECT *, ROW_NUMBER() OVER (PARTITION BY k ORDER BY t DESC) AS rn FROM s)
    WHERE rn = 1                  -- or rn <= N, rn < N, rn BETWEEN 1 AND N

The inner ``SELECT`` becomes a relation whose ``rn`` is *pending*
(:class:`RankCall`): it exists once the enclosing query's ``WHERE`` says
which rows to keep.  Then Flink's rule decides (``RankUtil.
canConvertToDeduplicate``): the rank range is 1..1, ``rn`` is not an output
column, and the ``ORDER BY`` is one time attribute (a ``PROCTIME()`` column or
the event-time attribute) -> :meth:`ChangelogStream.deduplicate` (``ASC``
keeps the first row, ``DESC`` the last); anything else -> :meth:`ChangelogStream.top_n`
(with the rank column when ``rn`` is selected).  Both build the same plan
nodes as the Python API; nothing here re-states their semantics.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from sqlglot import exp

from ..plan.rules import PlanError
from .context import Context
from .errors import SqlError, UnsupportedFeature
from .projection import project
from .relation import Field, Relation
from .script import Position, node_position

#: ``Field.column`` of the row number until the rank operator exists
RANK_MARKER = "\x00row_number"


@dataclasses.dataclass(frozen=True)
class RankCall:
    """``ROW_NUMBER() OVER (PARTITION BY partition ORDER BY order) AS name``
    over the relation's stream (columns of that stream); ``partition`` empty
    without PARTITION BY (one ranking over the whole stream)."""

    name: str
    partition: tuple
    order: tuple                 # ((column, ascending), ...)
    proctime: bool               # the only ORDER BY column is a PROCTIME() column
    node: exp.Expr
    position: Position

    def unsettled_error(self, ctx: Context) -> SqlError:
        return unfiltered_error(ctx, self)


def is_rank_item(item: exp.Expr) -> bool:
    """A select item ``ROW_NUMBER() OVER (...) [AS name]``."""
    body = item.this if isinstance(item, exp.Alias) else item
    return isinstance(body, exp.Window) and isinstance(body.this, exp.RowNumber)


def rank_relation(ctx: Context, rel: Relation, q: exp.Select, pos: Position) -> Relation:
    """The inner ``SELECT ..., ROW_NUMBER() OVER (...) AS rn``: its other
    items projected (plus the partition and order columns it does not
    select, kept under hidden names), ``rn`` pending."""
    ranks = [(i, e) for i, e in enumerate(q.expressions) if is_rank_item(e)]
    if len(ranks) > 1:
        raise ctx.unsupported("one ROW_NUMBER() per SELECT is supported", ranks[1][1], pos)
    idx, item = ranks[0]
    window = item.this if isinstance(item, exp.Alias) else item
    wpos = node_position(window, pos)
    name = item.alias if isinstance(item, exp.Alias) else f"EXPR${idx}"
    if window.args.get("spec") is not None:
        raise ctx.unsupported("ROW_NUMBER() OVER takes PARTITION BY and ORDER BY, no frame "
                              "(ROWS/RANGE BETWEEN)", window, pos)
    order = window.args.get("order")
    if order is None or not order.expressions:
        raise ctx.error("ROW_NUMBER() OVER (...) needs ORDER BY: deduplication orders by a "
                              "time attribute, Top-N by the ranking columns", wpos)
    partition = []
    for p in window.args.get("partition_by") or ():
        if not isinstance(p, exp.Column):
            raise ctx.unsupported("PARTITION BY takes columns (compute an expression in a view "
                                  "first)", p, pos)
        partition.append(ctx.resolve(p, rel, pos))
    ordered = []
    for o in order.expressions:
        col = o.this
        if not isinstance(col, exp.Column):
            raise ctx.unsupported("ORDER BY in OVER takes columns (compute an expression in a "
                                  "view first)", col, pos)
        ordered.append((ctx.resolve(col, rel, pos), not o.args.get("desc")))

    others = [e for i, e in enumerate(q.expressions) if i != idx]
    shown = _selected(ctx, rel, others, pos)
    needed = [f for f in partition + [f for f, _ in ordered] if f not in shown]
    hidden = {}
    for f in dict.fromkeys(needed):
        hidden[f] = f"$rank_{f.name}"
        others.append(exp.alias_(exp.column(exp.to_identifier(f.name, quoted=True),
                                            table=f.qualifier), hidden[f], quoted=True))
    out = project(ctx, rel, others, pos)
    names = {**shown, **hidden}
    fields = out.fields[:len(out.fields) - len(hidden)]
    # project() keeps the names asked for unless taken twice: find them in its output
    columns = {f.name: f.column for f in out.fields}
    call = RankCall(name, tuple(columns[names[f]] for f in partition),
                    tuple((columns[names[f]], asc) for f, asc in ordered),
                    len(ordered) == 1 and ordered[0][0].proctime, window, wpos)
    return Relation(out.stream, fields + (Field(None, name, RANK_MARKER),), pending=call)


def _selected(ctx: Context, rel: Relation, items: list, pos: Position) -> dict:
    """Input field -> output name, for the fields the items select as they are."""
    shown = {}
    for item in items:
        if isinstance(item, exp.Star):
            shown.update({f: f.name for f in rel.fields if f not in shown})
        elif isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
            shown.update({f: f.name for f in rel.fields if f.qualifier == item.table
                          and f not in shown})
        else:
            body = item.this if isinstance(item, exp.Alias) else item
            if isinstance(body, exp.Column):
                f = ctx.resolve(body, rel, pos)
                shown.setdefault(f, item.alias if isinstance(item, exp.Alias) else f.name)
    return shown


def unfiltered_error(ctx: Context, call: RankCall) -> SqlError:
    return ctx.error(
        f"ROW_NUMBER() OVER (...) AS {call.name} needs a filter on {call.name} in the enclosing "
        f"query: WHERE {call.name} = 1 (deduplication) or WHERE {call.name} <= N (Top-N); a row "
        "number of every row is not supported", call.position, UnsupportedFeature)


def apply_rank(ctx: Context, rel: Relation, where: Optional[exp.Expr], q: exp.Select,
               pos: Position) -> tuple[Relation, list]:
    """Deduplication or Top-N from the enclosing query's filter on the row
    number: the settled relation and the rest of ``WHERE`` (applied after)."""
    call: RankCall = rel.pending
    terms = [] if where is None else (list(where.flatten()) if isinstance(where, exp.And)
                                      else [where])

    def is_rn(node) -> bool:
        if not isinstance(node, exp.Column) or isinstance(node.this, exp.Star):
            return False
        f = ctx.find(node, rel)
        return f is not None and f.column == RANK_MARKER

    rn_terms = [t for t in terms if any(is_rn(c) for c in t.find_all(exp.Column))]
    rest = [t for t in terms if t not in rn_terms]
    if not rn_terms:
        raise unfiltered_error(ctx, call)
    start, end = 1, None
    for t in rn_terms:
        lo, hi = _bounds(ctx, t, is_rn, pos)
        start = max(start, lo)
        end = hi if end is None else (end if hi is None else min(end, hi))
    where_pos = node_position(rn_terms[0], pos)
    if end is None:
        raise ctx.error(
            f"the filter on {call.name} has no upper bound: Top-N needs {call.name} <= N "
            f"(rn > N alone would rank every row)", where_pos, UnsupportedFeature)
    if start > 1:
        raise ctx.error(
            f"a rank range starting at {start} is not supported yet (Top-N keeps ranks 1 to N): "
            f"filter on {call.name} <= N", where_pos, UnsupportedFeature)
    if end < start:
        raise ctx.error(f"the filter on {call.name} keeps no row (rank range {start} to "
                              f"{end})", where_pos)
    outputs_rank = _uses_rank(q.expressions, rest, is_rn, rel)
    stream = rel.stream
    t = stream.traits
    kw = ctx.keyed()
    ttl = ctx.settings.state_ttl_ms
    try:
        if (end == 1 and not outputs_rank and len(call.order) == 1
                and (call.proctime or call.order[0][0] == t.time_attribute)):
            column, asc = call.order[0]
            fields = tuple(f for f in rel.fields if f.column != RANK_MARKER)
            # a PROCTIME() column that only orders (not selected, so hidden)
            # is never read again: not materialized, as in Flink
            unread = call.proctime and column not in {f.column for f in fields} \
                and column not in call.partition
            stream = stream.deduplicate(list(call.partition),
                                        order_by=None if call.proctime else column,
                                        keep="first" if asc else "last", state_ttl_ms=ttl,
                                        proctime_column=column if unread else None, **kw)
        else:
            rank_column = call.name
            while rank_column in t.columns:
                rank_column += "0"
            stream = stream.top_n(end, list(call.partition), list(call.order),
                                  with_rank=outputs_rank, rank_column=rank_column,
                                  state_ttl_ms=ttl, **kw)
            fields = tuple(
                (Field(f.qualifier, f.name, rank_column) if f.column == RANK_MARKER else f)
                for f in rel.fields if outputs_rank or f.column != RANK_MARKER)
    except (PlanError, ValueError) as e:
        if isinstance(e, SqlError):
            raise
        raise ctx.error(f"ROW_NUMBER() OVER (...): {e}", call.position) from None
    return Relation(stream, fields), rest


def _bounds(ctx: Context, term: exp.Expr, is_rn, pos: Position) -> tuple:
    """``(first rank, last rank or None)`` one condition on the row number allows."""
    def number(node) -> Optional[int]:
        if isinstance(node, exp.Literal) and not node.is_string and str(node.this).isdigit():
            return int(node.this)
        return None

    if isinstance(term, exp.Between) and is_rn(term.this):
        lo, hi = number(term.args.get("low")), number(term.args.get("high"))
        if lo is not None and hi is not None:
            return lo, hi
    flip = {exp.LT: exp.GT, exp.LTE: exp.GTE, exp.GT: exp.LT, exp.GTE: exp.LTE, exp.EQ: exp.EQ}
    if type(term) in flip:
        a, b, op = term.this, term.expression, type(term)
        if is_rn(b) and not is_rn(a):
            a, b, op = b, a, flip[op]
        n = number(b)
        if is_rn(a) and n is not None:
            return {exp.EQ: (n, n), exp.LTE: (1, n), exp.LT: (1, n - 1), exp.GTE: (n, None),
                    exp.GT: (n + 1, None)}[op]
    raise ctx.unsupported("a filter on the row number takes rn = 1, rn <= N, rn < N or rn "
                          "BETWEEN 1 AND N (integer literals), joined with AND", term, pos)


def _uses_rank(items, rest, is_rn, rel) -> bool:
    """Whether the enclosing query selects the row number (``*`` does)."""
    for item in items:
        if isinstance(item, exp.Star):
            return True
        if isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
            if any(f.column == RANK_MARKER and f.qualifier == item.table for f in rel.fields):
                return True
        if any(is_rn(c) for c in item.find_all(exp.Column)):
            return True
    return any(is_rn(c) for t in rest for c in t.find_all(exp.Column))


__all__ = ["RankCall", "RANK_MARKER", "is_rank_item", "rank_relation", "apply_rank",
           "unfiltered_error"]
