"""DECIMAL values: exact arithmetic, Flink's result types, exact printing
(docs/operators.md, "DECIMAL").

Operators see a ``DECIMAL(p, s)`` column as Python :class:`decimal.Decimal`
objects (Arrow ``decimal128(p, s)`` converted by pandas), never as floats.
Arithmetic on them runs in :func:`exact`, a context wide enough that no sum
is ever rounded (and that traps if one would be), so a SUM stays exact
however many rows it folds; only the final result is brought to its type's
scale (:func:`to_scale`, half up, as Java's ``BigDecimal`` in Flink's
``DecimalData``) and checked against its precision (:func:`fits`).

Result types are Flink's (``LogicalTypeMerging.findSumAggType`` and
``findAvgAggType``, recorded in ``tests/fixtures/flink/decimal.json``):
``SUM`` of ``DECIMAL(p, s)`` is ``DECIMAL(38, s)``, ``AVG`` is
``DECIMAL(38, max(6, s))``.
"""
from __future__ import annotations

import contextlib
import decimal
from typing import Iterator

import numpy as np
import pyarrow as pa

#: the widest DECIMAL of Flink and Spark
MAX_PRECISION = 38
#: AVG's smallest result scale (Flink's ``findDivisionDecimalType`` via ``findAvgAggType``)
AVG_MIN_SCALE = 6
#: digits of the working context: two DECIMAL(38)s multiplied, with room to spare
_WORK_PRECISION = 4 * MAX_PRECISION


@contextlib.contextmanager
def exact() -> Iterator[decimal.Context]:
    """A decimal context in which sums of DECIMAL(38) values are exact; an
    operation that would round raises :class:`decimal.Inexact` instead."""
    with decimal.localcontext() as ctx:
        ctx.prec = _WORK_PRECISION
        ctx.Emax, ctx.Emin = decimal.MAX_EMAX, decimal.MIN_EMIN
        ctx.rounding = decimal.ROUND_HALF_UP
        ctx.traps[decimal.Inexact] = True
        ctx.traps[decimal.Rounded] = True
        yield ctx


def is_decimal(t: pa.DataType) -> bool:
    return pa.types.is_decimal(t)


def sum_type(t: pa.DataType) -> pa.DataType:
    """``SUM`` of ``DECIMAL(p, s)``: ``DECIMAL(38, s)``."""
    return pa.decimal128(MAX_PRECISION, t.scale)


def avg_type(t: pa.DataType) -> pa.DataType:
    """``AVG`` of ``DECIMAL(p, s)``: ``DECIMAL(38, max(6, s))`` (Flink divides
    the ``DECIMAL(38, s)`` sum by a ``DECIMAL(20, 0)`` count)."""
    return pa.decimal128(MAX_PRECISION, max(AVG_MIN_SCALE, t.scale))


def state_sum_type(t: pa.DataType) -> pa.DataType:
    """The state field of a running DECIMAL sum: wider than the result, so an
    intermediate sum past 38 digits is kept exactly (a later retraction may
    bring it back) and only a result that does not fit is an overflow."""
    return pa.decimal256(2 * MAX_PRECISION, t.scale)


def to_scale(values: np.ndarray, valid: np.ndarray, scale: int) -> np.ndarray:
    """``values`` (Decimals, object array) rounded half up to ``scale``
    digits; invalid positions become ``None``."""
    q = decimal.Decimal(1).scaleb(-scale)
    out = np.full(len(values), None, dtype=object)
    with decimal.localcontext() as ctx:
        ctx.prec = _WORK_PRECISION
        ctx.rounding = decimal.ROUND_HALF_UP
        for i in np.flatnonzero(valid):
            out[i] = decimal.Decimal(values[i]).quantize(q)
    return out


def fits(values: np.ndarray, valid: np.ndarray, precision: int) -> np.ndarray:
    """Positions whose (already scaled) Decimal has at most ``precision``
    digits; invalid positions fit."""
    ok = np.ones(len(values), dtype=bool)
    for i in np.flatnonzero(valid):
        ok[i] = len(values[i].as_tuple().digits) <= precision or values[i].is_zero()
    return ok


def plain(value: decimal.Decimal) -> str:
    """A Decimal as plain digits with its type's scale (``1.10``,
    ``0.0000000000``), never an exponent or a float (``cat``)."""
    return format(value, "f")


__all__ = ["MAX_PRECISION", "exact", "is_decimal", "sum_type", "avg_type", "state_sum_type",
           "to_scale", "fits", "plain"]
