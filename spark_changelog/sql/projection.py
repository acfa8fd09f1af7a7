"""Projection and filter: a ``SELECT`` list is one projection, ``WHERE`` one
filter (docs/sql.md, "Queries").  ``*`` and ``t.*`` expand to the visible
fields; a name taken twice gets a suffix (``id``, ``id0``); a projection that
changes nothing adds no plan node; a ``PROCTIME()`` column selected as it is
stays a processing-time attribute.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from sqlglot import exp

from .context import Context
from .relation import Field, Relation
from .script import Position, node_position


def project(ctx: Context, rel: Relation, items: list, pos: Position) -> Relation:
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
                raise ctx.error(f"unknown table {q!r} in {q}.*", node_position(item, pos))
            for f in chosen:
                add(f.name, f.column)
            continue
        alias = item.alias if isinstance(item, exp.Alias) else None
        body = item.this if isinstance(item, exp.Alias) else item
        if isinstance(body, exp.Column):
            f = ctx.resolve(body, rel, pos)
            add(alias or f.name, f.column)
            if f.proctime:
                proctime.add(fields[-1].name)
        else:
            add(alias or f"EXPR${idx}", ctx.spark_sql(body, rel, pos))
    stream = rel.stream
    same = [f.column for f in rel.fields] == list(named.values()) == list(named) and \
        tuple(stream.schema.columns) == tuple(named)
    if not same:
        first = node_position(items[0], pos) if items else pos
        stream = ctx.select(stream, named, first, items)
    return Relation(stream, tuple(Field(None, f.name, f.column, f.name in proctime)
                                  for f in fields))


def where(ctx: Context, rel: Relation, cond: Optional[exp.Expr], pos: Position) -> Relation:
    """``WHERE cond`` (None: no filter) over ``rel``; a pending call stays pending."""
    if cond is None:
        return rel
    text = ctx.spark_sql(cond, rel, pos)
    with ctx.analysis("condition", [cond], node_position(cond, pos)):
        return dataclasses.replace(rel, stream=rel.stream.where(text))


__all__ = ["project", "where"]
