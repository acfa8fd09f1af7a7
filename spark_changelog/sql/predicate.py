"""A join's non-equi condition (``ON l.id = r.id AND l.v > r.w``) as the
vectorized callable :class:`~spark_changelog.operators.join.RegularJoin`
takes: ``condition(left_df, right_df) -> bool array`` over candidate pairs.

The part of ``ON`` that is not an equality between the two sides' columns is
evaluated here with SQL's three-valued logic on pandas nullable columns
(``NULL`` compares as unknown, ``unknown AND false`` is false, the pair is
kept only when the result is true).  Supported: column references,
literals, ``= <> < <= > >=``, ``AND OR NOT``, ``IS [NOT] NULL``, ``+ - * /``,
``BETWEEN``, ``IN (literals)`` and parentheses; anything else is refused when
the query is planned (:class:`UnsupportedCondition`).
"""
from __future__ import annotations

import operator
from typing import Mapping

import numpy as np
import pandas as pd
from sqlglot import exp


class UnsupportedCondition(ValueError):
    def __init__(self, node: exp.Expr):
        self.node = node
        super().__init__(f"{node.sql(dialect='spark')!r} in a join condition")


_COMPARE = {exp.EQ: operator.eq, exp.NEQ: operator.ne, exp.LT: operator.lt, exp.LTE: operator.le,
            exp.GT: operator.gt, exp.GTE: operator.ge}
_ARITH = {exp.Add: operator.add, exp.Sub: operator.sub, exp.Mul: operator.mul,
          exp.Div: operator.truediv}


def _nullable(col: pd.Series) -> pd.Series:
    """A column as pandas' nullable dtypes (``convert_dtypes``); an integer
    column held as object (Python ints beyond 2**53 beside nulls:
    ``operators.kernels.nullable_ints``) goes to Int64 directly, as
    ``convert_dtypes`` would go through float64 and round it."""
    if col.dtype == object and pd.api.types.infer_dtype(col, skipna=True) == "integer":
        return pd.Series(pd.array(col.to_numpy(), dtype="Int64"), index=col.index)
    return col.convert_dtypes()


class JoinCondition:
    """Picklable (it travels to Spark's Python workers): holds the sqlglot tree
    and which side each referenced output column comes from.

    ``columns``: output column name -> ("left" | "right", column name in that
    side's frame)."""

    def __init__(self, tree: exp.Expr, columns: Mapping[str, tuple[str, str]]):
        self.tree = tree
        self.columns = dict(columns)
        _check(tree, self.columns)

    def __call__(self, left: pd.DataFrame, right: pd.DataFrame) -> np.ndarray:
        n = len(left)
        frames = {"left": left, "right": right}
        result = self._eval(self.tree, frames, n)
        result = pd.Series(result, dtype="boolean") if not isinstance(result, pd.Series) \
            else result.astype("boolean")
        return result.fillna(False).to_numpy(dtype=bool)

    def _eval(self, node: exp.Expr, frames, n):
        if isinstance(node, exp.Paren):
            return self._eval(node.this, frames, n)
        if isinstance(node, exp.Column):
            side, name = self.columns[node.name]
            return _nullable(frames[side][name]).reset_index(drop=True)
        if isinstance(node, exp.Literal):
            value = node.this if node.is_string else _number(node.this)
            return pd.Series([value] * n).convert_dtypes()
        if isinstance(node, exp.Boolean):
            return pd.Series([bool(node.this)] * n, dtype="boolean")
        if isinstance(node, exp.Null):
            return pd.Series([pd.NA] * n, dtype="boolean")
        if type(node) in _COMPARE:
            a, b = self._eval(node.this, frames, n), self._eval(node.expression, frames, n)
            return _COMPARE[type(node)](a, b).astype("boolean")
        if type(node) in _ARITH:
            a, b = self._eval(node.this, frames, n), self._eval(node.expression, frames, n)
            return _ARITH[type(node)](a, b)
        if isinstance(node, exp.Neg):
            return -self._eval(node.this, frames, n)
        if isinstance(node, exp.And):
            return self._eval(node.this, frames, n).astype("boolean") & \
                self._eval(node.expression, frames, n).astype("boolean")
        if isinstance(node, exp.Or):
            return self._eval(node.this, frames, n).astype("boolean") | \
                self._eval(node.expression, frames, n).astype("boolean")
        if isinstance(node, exp.Not):
            return ~self._eval(node.this, frames, n).astype("boolean")
        if isinstance(node, exp.Is):
            return self._eval(node.this, frames, n).isna().astype("boolean")
        if isinstance(node, exp.Between):
            v = self._eval(node.this, frames, n)
            lo, hi = self._eval(node.args["low"], frames, n), self._eval(node.args["high"], frames, n)
            return ((v >= lo) & (v <= hi)).astype("boolean")
        if isinstance(node, exp.In):
            v = self._eval(node.this, frames, n)
            values = [e.this if e.is_string else _number(e.this) for e in node.expressions]
            out = v.isin(values).astype("boolean")
            return out.mask(v.isna(), pd.NA)
        raise UnsupportedCondition(node)


def _number(text: str):
    try:
        return int(text)
    except ValueError:
        return float(text)


def _check(node: exp.Expr, columns: Mapping) -> None:
    allowed = (exp.Paren, exp.Column, exp.Literal, exp.Boolean, exp.Null, exp.Neg, exp.And,
               exp.Or, exp.Not, exp.Is, exp.Between, exp.In, exp.Identifier,
               *_COMPARE, *_ARITH)
    for n in node.walk():
        if not isinstance(n, allowed):
            raise UnsupportedCondition(n)
        if isinstance(n, exp.Is) and not isinstance(n.expression, exp.Null):
            raise UnsupportedCondition(n)
        if isinstance(n, exp.In) and (n.args.get("query") or
                                      not all(isinstance(e, exp.Literal) for e in n.expressions)):
            raise UnsupportedCondition(n)
        if isinstance(n, exp.Column) and n.name not in columns:
            raise UnsupportedCondition(n)


__all__ = ["JoinCondition", "UnsupportedCondition"]
