"""Results on the terminal as Flink's SQL client prints them in its tableau
mode (docs/sql.md, "Statements"): ``SHOW TABLES``, ``DESCRIBE t`` and a bare
``SELECT`` (its changelog with an ``op`` column, bounded by a row limit)."""
from __future__ import annotations

from typing import Sequence

from ..sinks.text import flink_text
from .script import DescribeDef, ShowDef, TableDef, ViewDef

#: rows of a bare SELECT printed at most (SET 'sql-client.display.max-rows')
DEFAULT_MAX_ROWS = 100


def table_text(headers: Sequence[str], rows: Sequence[Sequence], footer: str = "") -> str:
    """A boxed table, values right-aligned, nulls as ``<NULL>`` (Flink's
    tableau mode); ``rows`` hold Python values."""
    cells = [[("<NULL>" if v is None else v if isinstance(v, str) else flink_text(v)) for v in r]
             for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    fmt = lambda vals: "| " + " | ".join(v.rjust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    out = [line, fmt(headers), line] + [fmt(r) for r in cells] + [line]
    if footer:
        out.append(footer)
    return "\n".join(out)


def show_text(stmt: ShowDef, tables: dict, views: dict) -> str:
    names = sorted(tables if stmt.what == "TABLES" else views)
    header = "table name" if stmt.what == "TABLES" else "view name"
    return table_text([header], [[n] for n in names],
                      f"{len(names)} row{'s' if len(names) != 1 else ''} in set")


def describe_text(stmt: DescribeDef, table, view_columns=None) -> str:
    """``DESCRIBE``: a table's declared columns (type, nullability, primary
    key, computed expression, watermark), or a view's columns and types."""
    rows = []
    if isinstance(table, TableDef):
        key = f"PRI({', '.join(table.primary_key)})" if table.primary_key else ""
        for c in table.columns:
            extras = "AS PROCTIME()" if c.proctime else (
                f"AS {c.expression.sql()}" if c.expression is not None else "")
            wm = table.watermark.text if table.watermark and table.watermark.column == c.name else ""
            rows.append([c.name, c.flink_type or "TIMESTAMP_LTZ(3) *PROCTIME*", str(c.nullable and
                         c.name not in table.primary_key).upper(),
                         key if c.name in table.primary_key else "", extras, wm])
    else:
        rows = [[name, typ, "TRUE", "", "", ""] for name, typ in view_columns]
    return table_text(["name", "type", "null", "key", "extras", "watermark"], rows,
                      f"{len(rows)} row{'s' if len(rows) != 1 else ''} in set")


def changelog_text(frame, columns: Sequence[str], max_rows: int, schema=None) -> str:
    """A bare SELECT's changelog (pandas with ``_kind``, in ``_seq`` order) as
    Flink's tableau result: an ``op`` column, at most ``max_rows`` rows.
    ``schema``: the columns' Arrow types (an integer column with nulls is a
    float column in pandas; it prints as integers)."""
    import pyarrow as pa
    from ..model import KIND_COL, RowKind
    if schema is not None:
        fields = [schema.field(c) for c in columns] + [pa.field(KIND_COL, pa.int8())]
        table = pa.Table.from_pandas(frame[list(columns) + [KIND_COL]], preserve_index=False,
                                     schema=pa.schema(fields))
    else:
        table = pa.Table.from_pandas(frame, preserve_index=False)
    kinds = table.column(KIND_COL).to_pylist()
    data = [table.column(c).to_pylist() for c in columns]
    rows = [[RowKind(k).short, *vals] for k, vals in zip(kinds, zip(*data) if data else [()] * len(kinds))]
    shown = rows[:max_rows]
    footer = f"Received a total of {len(rows)} row{'s' if len(rows) != 1 else ''}"
    if len(rows) > len(shown):
        footer += (f" (the first {len(shown)} shown; SET 'sql-client.display.max-rows' shows "
                   "more)")
    return table_text(["op", *columns], shown, footer)


__all__ = ["table_text", "show_text", "describe_text", "changelog_text", "DEFAULT_MAX_ROWS"]
