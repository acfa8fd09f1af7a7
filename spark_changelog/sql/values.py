"""``VALUES`` rows (docs/sql.md, "VALUES"): the literal rows of ``INSERT INTO
t VALUES (...), (...)`` or of ``FROM (VALUES ...) AS v(a, b)`` as a bounded,
insert-only source (every row ``+I``, ``_seq`` its position), as Flink's
``Values`` node is.  The rows are a Spark inline table built on the driver:
in a streaming run the statement writes them in one micro-batch and ends.

Typed by the sink (``INSERT INTO t VALUES``): each literal is cast to its
column's declared type, as Flink does; a literal that cannot be cast is an
error at that literal (checked with ``try_cast`` before anything runs, so
Spark's non-ANSI casts never turn it into a silent NULL).  Without a sink
(``FROM (VALUES ...)``), Spark gives each column the common type of its
literals.
"""
from __future__ import annotations

from typing import Optional, Sequence

from sqlglot import exp

from ..api import ChangelogStream
from ..model.schema import KIND_COL, SEQ_COL, ChangelogMode
from ..model.rowkind import RowKind
from .context import Context
from .errors import UnsupportedFeature
from .expressions import map_function
from .relation import Field, Relation
from .script import Position, node_position


def values_relation(ctx: Context, node: exp.Values, pos: Position,
                    names: Optional[Sequence[str]] = None,
                    types: Optional[Sequence[str]] = None) -> Relation:
    """The rows of ``node``; ``names``/``types``: the sink's columns (INSERT),
    else the alias's columns (``AS v(a, b)``) or Flink's ``EXPR$0``, ...; the
    types are then Spark's common type of each column."""
    rows = [r.expressions if isinstance(r, exp.Tuple) else [r] for r in node.expressions]
    width = len(rows[0])
    for r, row in zip(node.expressions, rows):
        if len(row) != width:
            raise ctx.error(f"VALUES: every row needs the same number of values: this one has "
                            f"{len(row)}, the first {width}", node_position(r, pos))
    alias = node.args.get("alias")
    if names is None:
        named = [c.name for c in alias.columns] if alias is not None and alias.columns else []
        if named and len(named) != width:
            raise ctx.error(f"VALUES AS {alias.name}({', '.join(named)}): {len(named)} column "
                            f"name(s) for {width} value(s) per row", node_position(alias, pos))
        names = named or [f"EXPR${i}" for i in range(width)]
    elif len(names) != width:
        raise ctx.error(f"VALUES: the rows have {width} value(s), the table takes {len(names)} "
                        f"({', '.join(names)})", node_position(node.expressions[0], pos))
    cells = [[_spark_literal(ctx, e, pos) for e in row] for row in rows]
    if types is not None:
        _check_casts(ctx, rows, cells, names, types, pos)
        cells = [[f"CAST({c} AS {t})" for c, t in zip(row, types)] for row in cells]
    kind = f"CAST({RowKind.INSERT.value} AS TINYINT)"
    body = ", ".join(f"({', '.join([*row, kind, f'CAST({i} AS BIGINT)'])})"
                     for i, row in enumerate(cells))
    columns = ", ".join(f"`{n}`" for n in [*names, KIND_COL, SEQ_COL])
    with ctx.analysis("VALUES", [node], node_position(node, pos)):
        df = ctx.spark.sql(f"SELECT * FROM VALUES {body} AS v({columns})")
    stream = ChangelogStream.from_dataframe(df, mode=ChangelogMode.INSERT_ONLY, name="Values")
    qualifier = alias.name if alias is not None else None
    return Relation(stream, tuple(Field(qualifier, n, n) for n in names))


def _spark_literal(ctx: Context, e: exp.Expr, pos: Position) -> str:
    """One value of a row as Spark SQL: a constant expression (no columns)."""
    ctx.check_expression(e, pos)
    column = next(e.find_all(exp.Column), None)
    if column is not None:
        raise ctx.error(f"VALUES takes constant expressions, not columns ({column.sql()})",
                        node_position(column, pos), UnsupportedFeature)
    try:
        return e.copy().transform(lambda n: map_function(n, {})).sql(dialect="spark")
    except ValueError as err:
        raise ctx.script.error(str(err), node_position(e, pos)) from None


def _check_casts(ctx: Context, rows, cells, names, types, pos: Position) -> None:
    """Every non-NULL literal must cast to its column's type: one driver-side
    query of ``try_cast`` flags, the first failure is an error at its literal."""
    flags = [f"(({c}) IS NOT NULL AND try_cast(({c}) AS {t}) IS NULL)"
             for row in cells for c, t in zip(row, types)]
    with ctx.analysis("VALUES", [rows[0][0]], pos):
        bad = ctx.spark.sql(f"SELECT array({', '.join(flags)})").first()[0]
    width = len(types)
    for i, failed in enumerate(bad):
        if failed:
            e = rows[i // width][i % width]
            raise ctx.error(f"VALUES: {e.sql()} cannot be cast to {types[i % width].upper()} "
                            f"(column {names[i % width]})", node_position(e, pos))


__all__ = ["values_relation"]
