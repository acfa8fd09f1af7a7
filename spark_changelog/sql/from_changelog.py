"""``FROM_CHANGELOG(input => TABLE t [, op => DESCRIPTOR(c)] [, op_mapping =>
MAP[...]])``: Flink 2.3's
built-in process table function that turns an append-only table with an
operation column into a changelog (docs/sql.md, "Connectors").

Flink 2.3.0 (checked by running it): row semantics (``PARTITION BY`` is
refused), the operation column defaults to ``op``, holds ``INSERT``,
``UPDATE_BEFORE``, ``UPDATE_AFTER`` or ``DELETE``, and leaves the output; the
output's changelog mode is ``[I,UB,UA,D]``.  Here the table must be a plain
``json``/``csv``/``parquet``/``avro`` file table, and the call is the
changelog reader over the same files with that column as the kind column
(one read, no extra step), so the reader's dead letters name the file and
line of a bad operation.  The reader also accepts ``+I``/``-U``/``+U``/``-D``
and ``0``-``3`` where Flink's default mapping fails the job.  ``op_mapping``
names the column's own codes (:func:`op_mapping`).
"""
from __future__ import annotations

from typing import Callable

from sqlglot import exp

from ..model.rowkind import RowKind
from .context import Context
from .dialect import Descriptor, TableArgument
from .errors import UnsupportedFeature
from .relation import Relation
from .script import Position, TableDef, node_position

#: Flink 2.3's parameters (``uid`` and ``on_time`` are every PTF's)
PARAMETERS = ("INPUT", "OP", "OP_MAPPING", "UID", "ON_TIME")
DEFAULT_OPERATION_COLUMN = "op"


def relation(ctx: Context, fn: exp.Anonymous, alias: str, pos: Position, tables: dict,
             read: Callable[..., Relation]) -> Relation:
    """The call ``fn``; ``read(table, pos, operation column, op_mapping)``:
    the table read as a changelog."""
    name = "FROM_CHANGELOG"
    fpos = node_position(fn, pos)
    args = ctx.call_arguments(fn, name, PARAMETERS, pos)
    data = args.get("INPUT")
    if not isinstance(data, TableArgument):
        raise ctx.error(f"{name}: the first argument is input => TABLE name", fpos)
    if data.args.get("partition_by"):
        raise ctx.error(f"{name} has row semantics: its table argument takes no PARTITION BY "
                        "(as in Flink 2.3)", node_position(data, pos))
    for key in ("UID", "ON_TIME"):
        if key in args:
            raise ctx.unsupported(f"{name}: {key.lower()} is not supported", args[key], pos)
    mapping = op_mapping(ctx, args["OP_MAPPING"], pos) if "OP_MAPPING" in args else None
    column = DEFAULT_OPERATION_COLUMN
    if "OP" in args:
        d = args["OP"]
        if not isinstance(d, Descriptor) or len(d.expressions) != 1:
            raise ctx.error(f"{name}: op is DESCRIPTOR(column)", node_position(d, pos))
        column = d.expressions[0].name
    tname = data.this.name
    table = tables.get(tname)
    tpos = node_position(data, pos)
    if table is None or table.connector.kind != "filesystem" or \
            table.connector.reader_format != "changelog":
        raise ctx.error(f"{name}: the input must be a filesystem table of plain rows ('format' = "
                        f"'json', 'csv', 'parquet' or 'avro'); {tname!r} is not", tpos,
                        UnsupportedFeature)
    if table.connector.option("changelog.kind-column") is not None:
        raise ctx.error(f"{name}: table {tname} is already a changelog ('changelog.kind-column'); "
                        "read it directly", tpos)
    op = [c for c in table.physical_columns if c.name == column]
    if not op:
        raise ctx.error(f"{name}: table {tname} has no column {column!r} (the operation column; "
                        "name another with op => DESCRIPTOR(column))", fpos)
    if op[0].spark_type.upper() != "STRING":
        raise ctx.error(f"{name}: the operation column {column!r} must be a string "
                        f"(it is {op[0].flink_type})", fpos)
    rel = read(table, tpos, column, mapping)
    return rel.requalified(alias or tname)


def op_mapping(ctx: Context, arg: exp.Expr, pos: Position) -> tuple[tuple[str, int], ...]:
    """``op_mapping => MAP['c, r', 'INSERT', 'ub', 'UPDATE_BEFORE', ...]`` as
    (code, RowKind) pairs, validated as Flink 2.3 does (checked by running
    it, docs/sql.md "Connectors"): a constant MAP of strings; each key a
    comma-separated list of codes (spaces around them ignored); each value
    one of INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE (exact case), at most
    once; UPDATE_BEFORE present (Flink 2.3 supports the retract mode only).
    A row whose code is not in the map is a dead letter (Flink fails the
    job)."""
    apos = node_position(arg, pos)
    items = arg.expressions if isinstance(arg, exp.Bracket) and \
        isinstance(arg.this, exp.Column) and arg.this.name.upper() == "MAP" else None
    if not items or len(items) % 2 or not all(isinstance(e, exp.Literal) and e.is_string
                                              for e in items):
        raise ctx.error("FROM_CHANGELOG: op_mapping must be a constant MAP literal of strings "
                        "(MAP['c, r', 'INSERT', 'ub', 'UPDATE_BEFORE', 'u', 'UPDATE_AFTER', "
                        "'d', 'DELETE'])", apos)
    kinds = {k.name: int(k) for k in RowKind}
    out: dict[str, int] = {}
    seen: set = set()
    for key, value in zip(items[0::2], items[1::2]):
        kind = value.this
        if kind not in kinds:
            raise ctx.error(f"FROM_CHANGELOG: op_mapping: unknown change operation {kind!r}; valid "
                            "values are INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE",
                            node_position(value, pos))
        if kind in seen:
            raise ctx.error(f"FROM_CHANGELOG: op_mapping: duplicate change operation {kind!r}; map "
                            f"several codes to it with one comma-separated key (MAP['c, r', "
                            f"'{kind}'])", node_position(value, pos))
        seen.add(kind)
        for code in (c.strip() for c in key.this.split(",")):
            if not code or code in out:
                raise ctx.error(f"FROM_CHANGELOG: op_mapping: code {code!r} is empty or given "
                                "twice", node_position(key, pos))
            out[code] = kinds[kind]
    if "UPDATE_BEFORE" not in seen:
        raise ctx.unsupported("FROM_CHANGELOG: op_mapping must map a code to UPDATE_BEFORE: "
                              "without it the input is an upsert changelog, which Flink 2.3 "
                              "does not support either", arg, pos)
    return tuple(sorted(out.items()))


__all__ = ["relation", "PARAMETERS"]
