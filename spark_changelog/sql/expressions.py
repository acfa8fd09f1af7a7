"""Flink SQL expressions as Spark SQL (docs/sql.md, "Expressions and
functions").

Column references are already resolved to stream columns by
:meth:`.context.Context.spark_sql`; here a few Flink functions are rewritten
to their Spark equivalents (:data:`FUNCTION_MAP`), integer division stays
integral, and Flink's type names become Spark's.
"""
from __future__ import annotations

import re
from typing import Optional, Sequence

from sqlglot import exp

from .script import Position, node_position


def _timestamp_ltz(args: list) -> exp.Expr:
    precision = args[1].this if len(args) > 1 and isinstance(args[1], exp.Literal) else "3"
    fn = {"0": "timestamp_seconds", "3": "timestamp_millis"}.get(str(precision))
    if fn is None:
        raise ValueError("TO_TIMESTAMP_LTZ(x, p) takes precision 0 (seconds) or 3 (milliseconds)")
    return exp.Anonymous(this=fn, expressions=[args[0]])


#: Flink functions whose Spark spelling or arguments differ (the rest keep
#: their name: UPPER, LOWER, TRIM, CONCAT, CONCAT_WS, COALESCE, IF, ABS, ...;
#: Flink's and Spark's CONCAT both return NULL when an argument is NULL)
FUNCTION_MAP = {
    "PROCTIME": lambda args: exp.CurrentTimestamp(),
    "NOW": lambda args: exp.CurrentTimestamp(),
    "LOCALTIMESTAMP": lambda args: exp.CurrentTimestamp(),
    "TO_TIMESTAMP_LTZ": _timestamp_ltz,
    "CHAR_LENGTH": lambda args: exp.Anonymous(this="char_length", expressions=args),
    "SPLIT_INDEX": lambda args: exp.Anonymous(this="try_element_at", expressions=[
        exp.Anonymous(this="split", expressions=[
            args[0], exp.Anonymous(this="regexp_replace", expressions=[
                args[1], exp.Literal.string(r"([\\^$.|?*+()\[\]{}])"),
                exp.Literal.string(r"\\$1")])]),
        exp.Add(this=args[2], expression=exp.Literal.number(1))]),
}

_TYPE_FIX = {exp.DataType.Type.VARCHAR: "STRING", exp.DataType.Type.CHAR: "STRING",
             exp.DataType.Type.TEXT: "STRING", exp.DataType.Type.TIMESTAMPTZ: "TIMESTAMP",
             exp.DataType.Type.TIMESTAMPLTZ: "TIMESTAMP"}


def map_function(node: exp.Expr, types: dict) -> exp.Expr:
    """One node of a resolved expression in Spark's terms (``types``: the
    stream's column types by name)."""
    # Flink divides integers as integers (5 / 2 = 2); Spark's / gives a double
    if isinstance(node, exp.Div) and integral(node.this, types) and \
            integral(node.expression, types):
        return exp.IntDiv(this=node.this, expression=node.expression)
    if isinstance(node, exp.Anonymous) and node.name.upper() in FUNCTION_MAP:
        return FUNCTION_MAP[node.name.upper()](list(node.expressions))
    if isinstance(node, exp.DataType) and node.this in _TYPE_FIX:
        return exp.DataType.build(_TYPE_FIX[node.this])
    return node


def named_function_position(message: str, nodes: Sequence[exp.Expr], default: Position
                            ) -> Position:
    """The position of the function a Spark analysis error names (```FOO```
    or ``"date_add(id, 1)"``) among ``nodes``, else ``default``."""
    m = re.search(r"routine `([^`]+)`", message) or re.search(r'resolve "(\w+)\(', message)
    if m:
        name = m.group(1).lower()
        for node in nodes:
            for n in node.walk():
                if isinstance(n, exp.Func) and (
                        n.sql(dialect="spark").lower().startswith(name + "(") or
                        (isinstance(n, exp.Anonymous) and n.name.lower() == name)):
                    return node_position(n, default)
    return default


_INTEGRAL = ("tinyint", "smallint", "int", "bigint")


def integral(node: exp.Expr, types: dict) -> bool:
    """An integer column, literal or integer arithmetic of those (types of the
    stream's columns by name; columns are already resolved and quoted)."""
    if isinstance(node, exp.Paren):
        return integral(node.this, types)
    if isinstance(node, exp.Column):
        return types.get(node.name) in _INTEGRAL
    if isinstance(node, exp.Literal):
        return not node.is_string and node.this.lstrip("-").isdigit()
    if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Mod, exp.IntDiv)):
        return integral(node.this, types) and integral(node.expression, types)
    if isinstance(node, exp.Neg):
        return integral(node.this, types)
    if isinstance(node, exp.Cast):
        return node.to.sql(dialect="spark").lower() in _INTEGRAL
    return False


def normal_type(spark_sql_type: Optional[str]) -> Optional[str]:
    """``DECIMAL(10, 2)`` -> ``decimal(10,2)`` (Spark's ``simpleString``)."""
    if spark_sql_type is None:
        return None
    return spark_sql_type.lower().replace(" ", "")


__all__ = ["FUNCTION_MAP", "map_function", "named_function_position", "integral", "normal_type"]
