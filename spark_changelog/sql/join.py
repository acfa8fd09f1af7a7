"""Regular joins: ``[INNER | LEFT | RIGHT | FULL [OUTER]] JOIN ... ON`` or
``USING`` (docs/sql.md, "Queries").  The equalities between a column of each
side are the join keys; the rest of ``ON`` is the join's vectorized condition
(:mod:`.predicate`).  The output is the left side's columns, then the right
side's renamed by the join (``id`` -> ``id0``, :func:`model.join_output_names`).
"""
from __future__ import annotations

from typing import Callable

from sqlglot import exp

from ..model import join_output_names
from .context import Context
from .errors import UnsupportedFeature
from .predicate import JoinCondition, UnsupportedCondition
from .relation import Field, Relation
from .script import Position, node_position


def join(ctx: Context, left: Relation, j: exp.Join, pos: Position,
         read: Callable[[exp.Expr, Position], Relation]) -> Relation:
    """``left JOIN j``; ``read(node, pos)`` gives the right side's relation."""
    jpos = node_position(j, pos)
    side = (j.args.get("side") or "").lower()
    kind = (j.args.get("kind") or "").lower()
    if kind in ("cross", "semi", "anti") or j.args.get("method"):
        raise ctx.error(f"{kind.upper() or 'this'} JOIN is not supported (regular "
                        "joins: [INNER], LEFT, RIGHT, FULL [OUTER] with ON)", jpos,
                        UnsupportedFeature)
    left = ctx.settled(left)
    right = ctx.settled(read(j.this, pos))
    ctx.check_bounded_mix("a JOIN", (left.stream, right.stream), jpos)
    clash = {f.qualifier for f in left.fields} & {f.qualifier for f in right.fields}
    if clash:
        raise ctx.error(f"{', '.join(sorted(clash))} appears twice in FROM: give it "
                        "an alias", jpos)
    how = side or "inner"
    on = j.args.get("on")
    using = j.args.get("using")
    left_on, right_on, residual = [], [], []
    if using:
        for ident in using:
            left_on.append(ctx.resolve(exp.column(ident.name), left, pos).column)
            right_on.append(ctx.resolve(exp.column(ident.name), right, pos).column)
    elif on is not None:
        for term in on.flatten() if isinstance(on, exp.And) else [on]:
            pair = _equi_pair(ctx, term, left, right)
            if pair is None:
                residual.append(term)
            else:
                left_on.append(pair[0])
                right_on.append(pair[1])
    else:
        raise ctx.error("a join needs ON (or USING): a cross join is not supported",
                        jpos, UnsupportedFeature)
    if not left_on:
        raise ctx.error(
            "a join needs at least one equality between a column of each side (ON l.k = "
            "r.k): joins on other conditions only are not supported", node_position(on, jpos),
            UnsupportedFeature)
    # output columns: the left ones, then the right ones renamed by the join (id -> id0)
    renamed = join_output_names(left.stream.schema.columns, right.stream.schema.columns)
    right_fields = tuple(Field(f.qualifier, f.name, renamed[f.column]) for f in right.fields)
    condition = _join_condition(ctx, residual, left, Relation(right.stream, right_fields),
                                pos) if residual else None
    stream = left.stream.join(right.stream, left_on=left_on, right_on=right_on, how=how,
                              condition=condition, state_ttl_ms=ctx.settings.state_ttl_ms,
                              **ctx.keyed())
    if tuple(stream.schema.columns) != tuple(left.stream.schema.columns) + tuple(
            renamed[c] for c in right.stream.schema.columns):    # pragma: no cover - one rule
        raise AssertionError("join output names differ from join_output_names")
    if using:   # the USING columns appear once, as the left side's (SELECT * has one id)
        names = {i.name for i in using}
        right_fields = tuple(f for f in right_fields if f.name not in names)
    return Relation(stream, left.fields + right_fields)


def _join_condition(ctx: Context, terms: list, left: Relation, right: Relation,
                    pos: Position) -> JoinCondition:
    """The non-equi part of ON over the join's output column names."""
    tree = (terms[0] if len(terms) == 1 else exp.and_(*terms))
    both = Relation(left.stream, left.fields + right.fields)
    resolved = {id(c): ctx.resolve(c, both, pos) for c in tree.find_all(exp.Column)}
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
        raise ctx.unsupported(f"{e}: the non-equi part of ON takes comparisons, AND/OR/NOT, "
                              "IS [NOT] NULL, arithmetic, BETWEEN and IN (literals)",
                              e.node, pos) from None


def _equi_pair(ctx: Context, term: exp.Expr, left: Relation, right: Relation):
    if not isinstance(term, exp.EQ):
        return None
    a, b = term.this, term.expression
    if not (isinstance(a, exp.Column) and isinstance(b, exp.Column)):
        return None
    fa_l, fa_r = ctx.find(a, left), ctx.find(a, right)
    fb_l, fb_r = ctx.find(b, left), ctx.find(b, right)
    if fa_l and fb_r and not fa_r and not fb_l:
        return fa_l.column, fb_r.column
    if fb_l and fa_r and not fb_r and not fa_l:
        return fb_l.column, fa_r.column
    return None


__all__ = ["join"]
