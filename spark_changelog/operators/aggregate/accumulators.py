"""Aggregate functions that can retract, vectorized per key group
(docs/operators.md, "Group aggregation").

An accumulator is the state of one aggregate function for many groups at once:
``scalars`` (one numpy array per state field, indexed by group) and, for the
functions that must remember values (``MIN``/``MAX`` and ``COUNT(DISTINCT)``
keep value counts, ``FIRST_VALUE``/``LAST_VALUE`` keep the added values with
their order), ``entries``: a frame of ``(group, value, ...)`` rows.

A batch reaches the accumulators as :class:`Contributions`: rows with a group
index and a sign (``+1`` for ``+I``/``+U``, ``-1`` for ``-U``/``-D``).
:meth:`Accumulator.update` folds them into the state of all groups with numpy
and pandas group operations, :meth:`Accumulator.result` computes every group's
value.  The group aggregate and the window aggregate build their state rows
from :attr:`Accumulator.scalar_fields` and :attr:`Accumulator.entry_fields`.

Result types follow Flink 2.3 (recorded in ``tests/fixtures/flink/aggregate.json``
and ``decimal.json``): ``COUNT`` is BIGINT, ``MIN``/``MAX``/``FIRST_VALUE``/
``LAST_VALUE`` keep the input type, ``SUM``/``AVG`` of an integer keep its
type (INT stays INT; ``AVG`` the quotient truncated toward zero, as Java's
long division) and of
``DECIMAL(p, s)`` are ``DECIMAL(38, s)`` / ``DECIMAL(38, max(6, s))``, summed
exactly (:mod:`~spark_changelog.model.decimals`).  A sum that does not fit its
result type raises :class:`AggregateOverflow` (Flink wraps an integer around
and turns a DECIMAL into null; we never change a value silently).
"""
from __future__ import annotations

import abc
import dataclasses
import decimal
from typing import Optional

import numpy as np
import pandas as pd
import pyarrow as pa

from ...model import decimals
from ..kernels import factorize_rows, fifo_survivors, group_sum, run_ends, run_starts

GROUP = "_group"   # entries: the group index a value belongs to


@dataclasses.dataclass
class Contributions:
    """The rows of a batch for the accumulators: ``group`` (int64, 0 ..
    ``n_groups - 1``), ``sign`` (+1 accumulate, -1 retract, 0 ignore),
    ``order`` (int64, the arrival order within a group, for first/last value)
    and the input ``frame`` (aligned with the arrays)."""

    group: np.ndarray
    sign: np.ndarray
    order: np.ndarray
    frame: pd.DataFrame
    n_groups: int

    def take(self, mask: np.ndarray) -> "Contributions":
        return Contributions(self.group[mask], self.sign[mask], self.order[mask],
                             self.frame[mask].reset_index(drop=True), self.n_groups)


@dataclasses.dataclass
class AccState:
    """One accumulator's state for ``n`` groups."""

    scalars: dict
    entries: Optional[pd.DataFrame] = None


class AggregateOverflow(ArithmeticError):
    """A result that does not fit its type; ``groups``: the positions of the
    groups concerned (the operator names their keys)."""

    def __init__(self, call: str, type_name: str, groups: np.ndarray, where: str = ""):
        super().__init__(f"{call} overflows {type_name}{where}: the result does not fit its "
                         "type (Flink would wrap an integer around or emit null for a DECIMAL; "
                         "we stop rather than change the value, docs/operators.md, \"DECIMAL\")")
        self.call, self.type_name, self.groups = call, type_name, groups

    def naming(self, groups: pd.DataFrame, columns) -> "AggregateOverflow":
        """The same error naming the first group concerned by its key
        (``groups``: the key columns of each group position)."""
        if not len(groups) or not len(self.groups):
            return self
        row = groups.iloc[int(self.groups[0])]
        where = ", ".join(f"{c}={row[c]}" for c in columns)
        return AggregateOverflow(self.call, self.type_name, self.groups, f" in group ({where})")


def _is_integer(t: pa.DataType) -> bool:
    return pa.types.is_integer(t)


#: a float sum of int64 values at least this large may have left the int64 range
_INT64_SUSPECT = float(2 ** 62)
#: Flink's names of the integer types
_INTEGER_NAMES = {8: "TINYINT", 16: "SMALLINT", 32: "INT", 64: "BIGINT"}


def _numeric_dtype(t: pa.DataType):
    if pa.types.is_integer(t):
        return np.int64
    if pa.types.is_floating(t):
        return np.float64
    raise TypeError(f"a numeric column is needed, got {t}")


def input_values(series: pd.Series, t: pa.DataType) -> tuple[np.ndarray, np.ndarray]:
    """``(values, valid)`` of an input column; null positions hold a filler.
    Numbers come back as int64/float64 whatever pandas made of them (an
    integer column with nulls arrives as float64 from Arrow)."""
    valid = ~np.asarray(pd.isna(series), dtype=bool)
    if decimals.is_decimal(t):
        vals = series.to_numpy(dtype=object).copy()
        vals[~valid] = _ZERO
        return vals, valid
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        dtype = _numeric_dtype(t)
        raw = series.to_numpy(dtype=np.float64 if dtype is np.float64 else object, na_value=0) \
            if not isinstance(series.dtype, np.dtype) else series.to_numpy()
        vals = np.where(valid, raw, 0).astype(dtype)
        return vals, valid
    return series.to_numpy(dtype=object), valid


_ZERO = decimal.Decimal(0)


def nullable_result(values: np.ndarray, valid: np.ndarray, t: pa.DataType):
    """A pandas array of type ``t`` with nulls where ``~valid``."""
    valid = np.asarray(valid, dtype=bool)
    if pa.types.is_integer(t):
        return pd.arrays.IntegerArray(np.where(valid, values, 0).astype(t.to_pandas_dtype()),
                                      ~valid)
    if pa.types.is_floating(t):
        return pd.arrays.FloatingArray(np.where(valid, values, 0).astype(np.float64), ~valid)
    out = np.asarray(values, dtype=object).copy()
    out[~valid] = None
    return out


class Accumulator(abc.ABC):
    """One aggregate function over ``column`` (``None``: ``COUNT(*)``),
    producing output column ``output``."""

    #: the SQL name, for explain and error messages
    function: str = ""

    def __init__(self, output: str, column: Optional[str] = None,
                 input_type: Optional[pa.DataType] = None):
        self.output = output
        self.column = column
        self.input_type = input_type

    def __repr__(self) -> str:
        return f"{self.function}({self.column or '*'}) AS {self.output}"

    def field(self, name: str) -> str:
        """The state column of this accumulator's field ``name``."""
        return f"{self.output}__{name}"

    @property
    @abc.abstractmethod
    def result_type(self) -> pa.DataType:
        """The output column's type (Flink's)."""

    @property
    def scalar_fields(self) -> list[pa.Field]:
        """Per-group state columns."""
        return []

    @property
    def entry_fields(self) -> list[pa.Field]:
        """Columns of the value entries (empty: no entries kept)."""
        return []

    def empty(self, n: int) -> AccState:
        """Fresh state for ``n`` groups."""
        scalars = {f.name: np.zeros(n, dtype=f.type.to_pandas_dtype()) for f in self.scalar_fields}
        entries = self._empty_entries() if self.entry_fields else None
        return AccState(scalars, entries)

    def _empty_entries(self) -> pd.DataFrame:
        cols = {GROUP: np.zeros(0, dtype=np.int64)}
        for f in self.entry_fields:
            cols[f.name] = pd.Series([], dtype=object if not (pa.types.is_integer(f.type)
                                                              or pa.types.is_floating(f.type))
                                     else f.type.to_pandas_dtype())
        return pd.DataFrame(cols)

    @abc.abstractmethod
    def update(self, acc: AccState, rows: Contributions) -> AccState:
        """Accumulate (``sign`` +1) and retract (``sign`` -1) ``rows``."""

    def accumulate(self, acc: AccState, rows: Contributions) -> AccState:
        return self.update(acc, dataclasses.replace(rows, sign=np.abs(rows.sign)))

    def retract(self, acc: AccState, rows: Contributions) -> AccState:
        return self.update(acc, dataclasses.replace(rows, sign=-np.abs(rows.sign)))

    @abc.abstractmethod
    def result(self, acc: AccState, n: int):
        """Every group's value (a pandas array or numpy array, length ``n``)."""

    def _values(self, rows: Contributions) -> tuple[np.ndarray, np.ndarray]:
        return input_values(rows.frame[self.column], self.input_type)


class CountStar(Accumulator):
    """``COUNT(*)``: rows added minus rows retracted."""

    function = "COUNT"

    @property
    def result_type(self):
        return pa.int64()

    @property
    def scalar_fields(self):
        return [pa.field(self.field("n"), pa.int64())]

    def update(self, acc, rows):
        n = acc.scalars[self.field("n")] + group_sum(rows.sign.astype(np.int64), rows.group,
                                                      rows.n_groups)
        return AccState({self.field("n"): n})

    def result(self, acc, n):
        return acc.scalars[self.field("n")].astype(np.int64)


class Count(CountStar):
    """``COUNT(col)``: like ``COUNT(*)`` but rows whose value is null do not count."""

    def update(self, acc, rows):
        _, valid = self._values(rows)
        d = rows.sign.astype(np.int64) * valid
        return AccState({self.field("n"): acc.scalars[self.field("n")]
                         + group_sum(d, rows.group, rows.n_groups)})


class Sum(Accumulator):
    """``SUM(col)``: the sum and the number of non-null values (null when none).
    Integers are summed in int64 (the state's type) and the result keeps the
    input's type, as in Flink (``SUM`` of INT is INT); a result past that
    type's range raises :class:`AggregateOverflow`; decimals are summed exactly (the state keeps
    up to 76 digits) and a result past 38 digits raises it."""

    function = "SUM"

    @property
    def result_type(self):
        t = self.input_type
        if decimals.is_decimal(t):
            return decimals.sum_type(t)
        return t if _is_integer(t) else pa.float64()

    @property
    def scalar_fields(self):
        t = self.input_type
        sum_state = (decimals.state_sum_type(t) if decimals.is_decimal(t)
                     else pa.int64() if _is_integer(t) else self.result_type)
        return [pa.field(self.field("sum"), sum_state), pa.field(self.field("n"), pa.int64())]

    def update(self, acc, rows):
        vals, valid = self._values(rows)
        sign = rows.sign * valid
        old = acc.scalars[self.field("sum")]
        if decimals.is_decimal(self.input_type):
            with decimals.exact():
                s = old + group_sum(vals * sign, rows.group, rows.n_groups)
        else:
            s = old + group_sum(vals * sign, rows.group, rows.n_groups)
            if s.dtype == np.int64:
                self._check_int64(old, vals * sign, rows.group, rows.n_groups)
        n = acc.scalars[self.field("n")] + group_sum(sign.astype(np.int64), rows.group,
                                                      rows.n_groups)
        return AccState({self.field("sum"): s, self.field("n"): n})

    def _check_int64(self, old: np.ndarray, terms: np.ndarray, group: np.ndarray, n: int):
        """Raise :class:`AggregateOverflow` for the groups whose exact sum
        leaves int64 (numpy wraps around silently).  A float sum finds the
        few groups that come near the limit; only those are summed exactly."""
        approx = old.astype(np.float64) + np.bincount(group, weights=terms.astype(np.float64),
                                                      minlength=n)
        near = np.flatnonzero(np.abs(approx) >= _INT64_SUSPECT)
        if not len(near):
            return
        bad = [g for g in near
               if not -2 ** 63 <= int(old[g]) + sum(int(x) for x in terms[group == g]) < 2 ** 63]
        if bad:
            raise AggregateOverflow(repr(self).split(" AS ")[0], "BIGINT", np.asarray(bad))

    def _checked(self, values: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """Decimal results brought to the result type's scale; a group whose
        result has more than 38 digits raises :class:`AggregateOverflow`."""
        t = self.result_type
        out = decimals.to_scale(values, valid, t.scale)
        ok = decimals.fits(out, valid, t.precision)
        if not ok.all():
            raise AggregateOverflow(repr(self).split(" AS ")[0],
                                    f"DECIMAL({t.precision}, {t.scale})", np.flatnonzero(~ok))
        return out

    def result(self, acc, n):
        valid = acc.scalars[self.field("n")] > 0
        s = acc.scalars[self.field("sum")]
        if decimals.is_decimal(self.input_type):
            return self._checked(s, valid)
        if _is_integer(self.input_type) and self.input_type.bit_width < 64:
            self._check_range(s, valid)
        return nullable_result(s, valid, self.result_type)

    def _check_range(self, values: np.ndarray, valid: np.ndarray) -> None:
        """A group whose int64 sum is outside the result type (INT,
        SMALLINT, TINYINT) raises :class:`AggregateOverflow`."""
        info = np.iinfo(self.result_type.to_pandas_dtype())
        bad = np.flatnonzero(valid & ((values < info.min) | (values > info.max)))
        if len(bad):
            raise AggregateOverflow(repr(self).split(" AS ")[0],
                                    _INTEGER_NAMES[self.result_type.bit_width], bad)


class Avg(Sum):
    """``AVG(col)``: sum / count of non-null values, in the input type (Flink:
    an integer average is the truncated quotient)."""

    function = "AVG"

    @property
    def result_type(self):
        t = self.input_type
        return decimals.avg_type(t) if decimals.is_decimal(t) else super().result_type

    def result(self, acc, n):
        s = acc.scalars[self.field("sum")]
        c = acc.scalars[self.field("n")]
        valid = c > 0
        safe = np.where(valid, c, 1)
        if decimals.is_decimal(self.input_type):
            # the quotient truncated far past the result scale, then rounded
            # half up to it: the same value as one half-up division
            with decimal.localcontext() as ctx:
                ctx.prec = decimals.MAX_PRECISION * 4
                ctx.rounding = decimal.ROUND_DOWN
                q = np.array([decimal.Decimal(x) / int(d) if ok else _ZERO
                              for x, d, ok in zip(s, safe, valid)], dtype=object)
            return self._checked(q, valid)
        if _is_integer(self.input_type):
            q = np.abs(s) // safe * np.sign(s)       # truncation toward zero, like Java
        else:
            q = s / safe
        return nullable_result(q, valid, self.result_type)


class _ValueCounts(Accumulator):
    """Functions over the multiset of values: ``entries`` holds each distinct
    value of a group with its count (adds minus retractions, kept when
    negative: a retraction that came before its add is not lost); values
    with a count of zero are dropped."""

    @property
    def entry_fields(self):
        return [pa.field(self.field("value"), self.input_type),
                pa.field(self.field("count"), pa.int64())]

    def update(self, acc, rows):
        vals, valid = self._values(rows)
        use = valid & (rows.sign != 0)
        v, c = self.field("value"), self.field("count")
        new = pd.DataFrame({GROUP: rows.group[use], v: vals[use],
                            c: rows.sign[use].astype(np.int64)})
        both = pd.concat([acc.entries, new], ignore_index=True) if len(acc.entries) else new
        if not len(both):
            return AccState({}, self._empty_entries())
        merged = both.groupby([GROUP, v], sort=True)[c].sum().reset_index()
        merged = merged[merged[c] != 0].reset_index(drop=True)
        return AccState({}, merged)

    def _present(self, acc) -> pd.DataFrame:
        e = acc.entries
        return e[e[self.field("count")].to_numpy() > 0]


class _Extreme(_ValueCounts):
    pick = "min"

    @property
    def result_type(self):
        return self.input_type

    def result(self, acc, n):
        e = self._present(acc)
        valid = np.zeros(n, dtype=bool)
        out = np.empty(n, dtype=object)
        if len(e):
            best = getattr(e.groupby(GROUP, sort=False)[self.field("value")], self.pick)()
            idx = best.index.to_numpy(dtype=np.int64)
            valid[idx] = True
            out[idx] = best.to_numpy(dtype=object)
        return nullable_result(out, valid, self.result_type)


class Min(_Extreme):
    """``MIN(col)`` over the value counts: retracting the minimum finds the next one."""

    function = "MIN"
    pick = "min"


class Max(_Extreme):
    """``MAX(col)`` over the value counts."""

    function = "MAX"
    pick = "max"


class CountDistinct(_ValueCounts):
    """``COUNT(DISTINCT col)``: the number of distinct non-null values with a
    positive count."""

    function = "COUNT DISTINCT"

    def __repr__(self) -> str:
        return f"COUNT(DISTINCT {self.column}) AS {self.output}"

    @property
    def result_type(self):
        return pa.int64()

    def result(self, acc, n):
        e = self._present(acc)
        return np.bincount(e[GROUP].to_numpy(dtype=np.int64), minlength=n).astype(np.int64)


class _OrderedValues(Accumulator):
    """``FIRST_VALUE``/``LAST_VALUE`` with retraction: ``entries`` holds every
    added non-null value still present with its ``order``.  A retraction
    removes the oldest present entry with an equal value (Flink's
    ``FirstValueWithRetractAggFunction``) and is ignored if there is none.

    Vectorized: per (group, value) the entries form a FIFO queue
    (:func:`~..kernels.fifo_survivors`)."""

    pick_last = False

    @property
    def result_type(self):
        return self.input_type

    @property
    def entry_fields(self):
        return [pa.field(self.field("value"), self.input_type),
                pa.field(self.field("order"), pa.int64())]

    def update(self, acc, rows):
        vals, valid = self._values(rows)
        use = valid & (rows.sign != 0)
        v, o = self.field("value"), self.field("order")
        old = acc.entries
        n_old = len(old)
        frame = pd.DataFrame({
            GROUP: np.concatenate([old[GROUP].to_numpy(dtype=np.int64), rows.group[use]]),
            v: pd.concat([old[v].reset_index(drop=True), pd.Series(vals[use])],
                         ignore_index=True) if n_old else vals[use],
            o: np.concatenate([old[o].to_numpy(dtype=np.int64), rows.order[use]]),
            "_d": np.concatenate([np.ones(n_old, dtype=np.int64),
                                  rows.sign[use].astype(np.int64)]),
            # stored entries precede the batch; the batch keeps its row order
            "_pos": np.arange(n_old + int(use.sum()), dtype=np.int64)})
        if not len(frame):
            return AccState({}, self._empty_entries())
        slot = factorize_rows(frame, [GROUP, v])
        perm = np.lexsort((frame["_pos"].to_numpy(), slot))
        frame = frame.take(perm).reset_index(drop=True)
        slot = slot[perm]
        alive, _ = fifo_survivors(slot, frame["_d"].to_numpy())
        out = frame.loc[alive, [GROUP, v, o]].reset_index(drop=True)
        return AccState({}, out)

    def result(self, acc, n):
        e = acc.entries
        valid = np.zeros(n, dtype=bool)
        out = np.empty(n, dtype=object)
        if len(e):
            o = e[self.field("order")].to_numpy(dtype=np.int64)
            g = e[GROUP].to_numpy(dtype=np.int64)
            order = np.lexsort((o, g))
            gs = g[order]
            pick = order[run_ends(gs) if self.pick_last else run_starts(gs)]
            valid[g[pick]] = True
            out[g[pick]] = e[self.field("value")].to_numpy(dtype=object)[pick]
        return nullable_result(out, valid, self.result_type)


class FirstValue(_OrderedValues):
    """``FIRST_VALUE(col)``: the oldest present non-null value."""

    function = "FIRST_VALUE"
    pick_last = False


class LastValue(_OrderedValues):
    """``LAST_VALUE(col)``: the newest present non-null value."""

    function = "LAST_VALUE"
    pick_last = True


#: SQL function name -> accumulator class (``count`` with ``column=None`` is ``COUNT(*)``)
FUNCTIONS = {
    "count": Count, "count_distinct": CountDistinct, "sum": Sum, "avg": Avg, "min": Min,
    "max": Max, "first_value": FirstValue, "last_value": LastValue,
}


def make_accumulator(function: str, output: str, column: Optional[str],
                     input_schema: pa.Schema) -> Accumulator:
    """The accumulator of ``function(column) AS output`` over ``input_schema``;
    ``count`` of no column is ``COUNT(*)``.  Raises a clear error for an
    unknown function, a missing column or a non-numeric SUM/AVG."""
    name = function.lower()
    if name == "count" and column is None:
        return CountStar(output)
    if name not in FUNCTIONS:
        raise ValueError(f"unknown aggregate function {function!r}; known: "
                         f"{', '.join(sorted(FUNCTIONS))}")
    if column is None:
        raise ValueError(f"{function} needs a column")
    if column not in input_schema.names:
        raise ValueError(f"{function}({column}): no column {column!r} in {input_schema.names}")
    t = input_schema.field(column).type
    if name in ("sum", "avg") and not (pa.types.is_integer(t) or pa.types.is_floating(t)
                                       or decimals.is_decimal(t)):
        raise TypeError(f"{function}({column}): {column} is {t}, a number is needed")
    return FUNCTIONS[name](output, column, t)


__all__ = ["Accumulator", "AccState", "AggregateOverflow", "Contributions", "CountStar", "Count", "CountDistinct",
           "Sum", "Avg", "Min", "Max", "FirstValue", "LastValue", "make_accumulator", "GROUP"]
