"""Expressions as sqlglot trees, and what the planner reads from them.

Every expression of a plan is held as a sqlglot tree (``sqlglot.exp``),
parsed with the Spark dialect from a Python string, or from the SQL text
Spark gives for a resolved ``Column`` (``lower.column_sql``); the SQL front
end builds the same trees from its Flink dialect.  From the tree the planner
reads (docs/plan.md, "Expressions"):

* references, renames and casts: a key survives a projection only through an
  injective expression of its own column (a reference, a rename, a widening
  cast); anything else (``concat``, arithmetic, a narrowing cast) drops it.
  That is conservative: a lost key may add a materializer that was not
  needed, never the opposite;
* non-determinism: a function whose value differs between evaluations of the
  same row (``rand()``, ``uuid()``, ``current_timestamp()``, ...), by the name
  Spark calls it;
* the columns an expression reads (non-determinism propagates through them).

Lowering generates Spark SQL from the tree (``to_spark_sql``).
"""
from __future__ import annotations

from typing import Mapping, Optional

import sqlglot
from sqlglot import exp

from .nodes import ProjectItem

#: functions whose value differs between evaluations of the same row (Spark names)
NONDETERMINISTIC_FUNCTIONS = frozenset((
    "current_timestamp", "current_date", "now", "localtimestamp", "current_time", "rand", "randn",
    "random", "uuid", "shuffle", "monotonically_increasing_id", "spark_partition_id",
    "input_file_name", "curdate", "try_reflect", "reflect", "current_timezone",
))
#: functions that read the clock when called without arguments only
_CLOCK_WITHOUT_ARGUMENTS = frozenset(("unix_timestamp",))

# integral widening is injective; so is any integer -> decimal/string
_RANK = {"tinyint": 1, "byte": 1, "smallint": 2, "short": 2, "int": 3, "integer": 3,
         "bigint": 4, "long": 4}


class ExpressionError(ValueError):
    """An expression the Spark dialect cannot parse."""


def parse(text: str) -> exp.Expression:
    """``text`` (Spark SQL) as a sqlglot tree."""
    try:
        tree = sqlglot.parse_one(text, read="spark")
    except sqlglot.errors.ParseError as e:
        raise ExpressionError(f"cannot parse the expression {text!r}: {e}") from None
    if tree is None:
        raise ExpressionError(f"empty expression {text!r}")
    return tree


def to_spark_sql(tree: exp.Expression) -> str:
    """The Spark SQL text of a tree (what lowering hands to ``F.expr``)."""
    return tree.sql(dialect="spark")


def function_name(node: exp.Expression) -> Optional[str]:
    """What Spark calls the function ``node`` is (lower case), or None."""
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    if isinstance(node, exp.Func):
        # the generator prints the Spark name (exp.StrToUnix -> UNIX_TIMESTAMP(...))
        return node.sql(dialect="spark").split("(", 1)[0].strip().lower() or None
    return None


def _has_arguments(node: exp.Expression) -> bool:
    return any(isinstance(v, exp.Expression) or (isinstance(v, list) and v)
               for v in node.args.values())


def is_nondeterministic(expr) -> bool:
    """Whether the expression (a tree or Spark SQL text) calls a
    non-deterministic function anywhere."""
    tree = parse(expr) if isinstance(expr, str) else expr
    for node in tree.walk():
        name = function_name(node)
        if name is None:
            continue
        if name in NONDETERMINISTIC_FUNCTIONS:
            return True
        if name in _CLOCK_WITHOUT_ARGUMENTS and not _has_arguments(node):
            return True
    return False


def columns_read(tree: exp.Expression) -> tuple[str, ...]:
    """The column names an expression reads, in order of first appearance."""
    out: list[str] = []
    for node in tree.find_all(exp.Column):
        if node.name and node.name not in out and not isinstance(node.this, exp.Star):
            out.append(node.name)
    return tuple(out)


def cast_is_injective(from_type: Optional[str], to_type: str) -> bool:
    """A cast that maps distinct values to distinct values (keys survive it)."""
    if from_type is None:
        return False
    f, t = from_type.lower().strip(), to_type.lower().strip().replace(" ", "")
    if f == t:
        return True
    if f in _RANK and t in _RANK:
        return _RANK[t] >= _RANK[f]
    if f in _RANK and (t in ("string", "varchar") or t.startswith("decimal")):
        if t.startswith("decimal("):
            p, s = (int(x) for x in t[8:-1].split(","))
            return p - s >= {1: 3, 2: 5, 3: 10, 4: 19}[_RANK[f]]
        return True
    if f == "float" and t == "double":
        return True
    return False


def _unwrap(tree: exp.Expression) -> exp.Expression:
    while isinstance(tree, exp.Paren):
        tree = tree.this
    return tree


def split_alias(tree: exp.Expression) -> tuple[exp.Expression, Optional[str]]:
    """(expression, alias or None)."""
    if isinstance(tree, exp.Alias):
        return tree.this, tree.alias
    return tree, None


def project_item(tree: exp.Expression, name: Optional[str], input_types: Mapping[str, str],
                 deterministic: Optional[bool] = None, text: Optional[str] = None,
                 column=None) -> ProjectItem:
    """The :class:`ProjectItem` of one expression tree.

    ``name``: the output name if given separately (else the tree's alias, else
    ``text``).  ``input_types``: input column -> Spark simple type string.
    ``deterministic``: overrides what the tree says when the caller knows.
    ``text``: the expression as the user wrote it (explain shows it).
    ``column``: the pyspark Column lowering uses instead of the tree.
    """
    body, alias = split_alias(tree)
    body_text = text if text is not None and alias is None else to_spark_sql(body)
    out = name or alias or body_text
    nd = is_nondeterministic(body) if deterministic is None else not deterministic
    inner = _unwrap(body)
    shown = body_text if out == body_text else f"{body_text} AS {out}"
    if isinstance(inner, exp.Column) and not isinstance(inner.this, exp.Star) \
            and not inner.table and inner.name in input_types:
        ref = inner.name
        return ProjectItem(out, ref, True, not nd, ref if ref == out else f"{ref} AS {out}",
                           (ref,), body, column)
    if isinstance(inner, (exp.Cast, exp.TryCast)):
        src = _unwrap(inner.this)
        if isinstance(src, exp.Column) and not src.table and src.name in input_types:
            to = inner.to.sql(dialect="spark")
            inj = cast_is_injective(input_types.get(src.name), to)
            return ProjectItem(out, src.name, inj, not nd, shown, (src.name,), body, column)
    reads = tuple(c for c in columns_read(body) if c in input_types)
    return ProjectItem(out, None, False, not nd, shown, reads, body, column)


def classify(text: str, name: Optional[str], input_types: Mapping[str, str],
             deterministic: Optional[bool] = None) -> ProjectItem:
    """The :class:`ProjectItem` of one Spark SQL expression ``text``
    (``a``, ``a AS b``, ``CAST(a AS BIGINT) AS z``, ``rand(42L)``, ...)."""
    text = text.strip()
    tree = parse(text)
    _, alias = split_alias(tree)
    return project_item(tree, name, input_types, deterministic,
                        text=None if alias is not None else text)


__all__ = ["parse", "to_spark_sql", "project_item", "classify", "is_nondeterministic",
           "cast_is_injective", "columns_read", "split_alias", "function_name",
           "ExpressionError", "NONDETERMINISTIC_FUNCTIONS"]
