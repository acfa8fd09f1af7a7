"""Accumulators (docs/operators.md, "Group aggregation") against the
row-at-a-time reference functions of tests/reference/aggregate.py."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from spark_changelog.operators.aggregate.accumulators import Contributions, make_accumulator
from tests.reference.aggregate import RefFunction

SCHEMA = pa.schema([("g", pa.int64()), ("i", pa.int64()), ("d", pa.float64()),
                    ("s", pa.string())])
FUNCS = ["count", "count_distinct", "sum", "avg", "min", "max", "first_value", "last_value"]
COLS = {"i": 1, "d": 2, "s": 3}


def contributions(rows, n_groups, order0=0):
    frame = pd.DataFrame([r[2] for r in rows], columns=["g", "i", "d", "s"])
    frame["i"] = frame["i"].astype("Int64")
    return Contributions(np.array([r[0] for r in rows], dtype=np.int64),
                         np.array([r[1] for r in rows], dtype=np.int64),
                         np.arange(order0, order0 + len(rows), dtype=np.int64), frame, n_groups)


row_st = st.tuples(st.integers(0, 2), st.sampled_from([1, 1, -1]),
                   st.tuples(st.just(0), st.one_of(st.none(), st.integers(-3, 3)),
                             st.one_of(st.none(), st.sampled_from([0.5, -1.25, 2.0])),
                             st.one_of(st.none(), st.sampled_from(["a", "b", "c"]))))


@settings(max_examples=60, deadline=None)
@given(st.lists(row_st, max_size=25), st.integers(0, 25),
       st.sampled_from([(f, c) for f in FUNCS for c in ("i", "d", "s")
                        if not (f in ("sum", "avg") and c == "s")] + [("count", None)]))
def test_accumulators_equal_reference(rows, split, fc):
    function, column = fc
    n = 3
    acc = make_accumulator(function, "out", column, SCHEMA)
    rows = sorted(rows, key=lambda r: r[0])          # grouped, as the operators hand them over
    first, second = rows[:split], rows[split:]
    state = acc.empty(n)
    state = acc.update(state, contributions(first, n))
    state = acc.update(state, contributions(second, n, order0=len(first)))
    got = list(pd.array(acc.result(state, n), dtype=object))
    refs = [RefFunction(function, COLS.get(column), column == "i") for _ in range(n)]
    for order, (g, sign, row) in enumerate(first + second):
        refs[g].apply(row, sign, order)
    want = [r.result() for r in refs]
    got = [None if v is pd.NA or v is None else v for v in got]
    assert got == pytest.approx(want) if function == "avg" and column == "d" else got == want


def test_avg_bigint_truncates_toward_zero_and_keeps_the_type():
    acc = make_accumulator("avg", "a", "i", SCHEMA)
    assert acc.result_type == pa.int64()
    rows = [(0, 1, (0, 1, None, None)), (0, 1, (0, 2, None, None)),
            (1, 1, (0, -1, None, None)), (1, 1, (0, -2, None, None)), (2, 1, (0, None, 1.0, "x"))]
    state = acc.update(acc.empty(3), contributions(rows, 3))
    assert list(pd.array(acc.result(state, 3), dtype=object)) == [1, -1, pd.NA]


def test_max_retracting_the_extreme_finds_the_next_value():
    acc = make_accumulator("max", "m", "i", SCHEMA)
    state = acc.update(acc.empty(1), contributions(
        [(0, 1, (0, 5, None, None)), (0, 1, (0, 9, None, None)), (0, 1, (0, 9, None, None))], 1))
    state = acc.update(state, contributions([(0, -1, (0, 9, None, None))], 1))
    assert list(acc.result(state, 1)) == [9]
    state = acc.update(state, contributions([(0, -1, (0, 9, None, None))], 1))
    assert list(acc.result(state, 1)) == [5]


def test_unknown_function_and_non_numeric_sum_are_clear_errors():
    with pytest.raises(ValueError, match="unknown aggregate function 'median'"):
        make_accumulator("median", "m", "i", SCHEMA)
    with pytest.raises(TypeError, match="SUM\\(s\\): s is string"):
        make_accumulator("SUM", "m", "s", SCHEMA)
