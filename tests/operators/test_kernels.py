"""Shared vectorized helpers (spark_changelog/operators/kernels.py)."""
from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings, strategies as st

from spark_changelog.operators.kernels import rows_equal, stable_order


def test_rows_equal_nulls_equal_nulls_for_every_column_type():
    a = pd.DataFrame({"i": pd.array([1, 2, None, 4], dtype="Int64"), "s": ["a", None, None, "d"],
                      "f": [1.0, np.nan, np.nan, 4.0],
                      "tz": pd.to_datetime([1, 2, None, 4], unit="s", utc=True),
                      "naive": pd.to_datetime([1, None, 3, 4], unit="s")})
    b = pd.DataFrame({"i": pd.array([1, 3, None, None], dtype="Int64"), "s": ["a", None, "c", "d"],
                      "f": [1.0, np.nan, 3.0, 4.0],
                      "tz": pd.to_datetime([1, 3, None, None], unit="s", utc=True),
                      "naive": pd.to_datetime([1, None, 3, 5], unit="s")})
    assert rows_equal(a, b, ["i"]).tolist() == [True, False, True, False]
    assert rows_equal(a, b, ["s"]).tolist() == [True, True, False, True]
    assert rows_equal(a, b, ["f"]).tolist() == [True, True, False, True]
    assert rows_equal(a, b, ["tz"]).tolist() == [True, False, True, False]
    assert rows_equal(a, b, ["naive"]).tolist() == [True, True, True, False]
    assert rows_equal(a, b, ["i", "s", "f", "tz", "naive"]).tolist() == [True, False, False, False]


def test_rows_equal_on_zoned_timestamps_does_not_box_each_value():
    """A million zoned timestamps compare as int64 (boxing each as a
    Timestamp took ~3/4 of keep-last deduplication's time on processing time)."""
    n = 1_000_000
    a = pd.DataFrame({"t": pd.to_datetime(np.arange(n), unit="ms", utc=True)})
    b = a.copy()
    b.loc[n - 1, "t"] = pd.NaT
    import time
    start = time.perf_counter()
    eq = rows_equal(a, b, ["t"])
    assert time.perf_counter() - start < 0.5
    assert eq[:-1].all() and not eq[-1]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_stable_order_is_pandas_stable_sort(data):
    """``stable_order`` is the permutation of pandas' stable ``sort_values``
    for every column kind an operator key can have: integers, floats with
    NaN and -0.0, strings with None, zoned timestamps with NaT, nullable
    integers."""
    n = data.draw(st.integers(0, 30))
    ints = data.draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n))
    floats = data.draw(st.lists(st.sampled_from([0.0, -0.0, 1.5, float("nan"), -2.0]), min_size=n, max_size=n))
    strs = data.draw(st.lists(st.sampled_from(["a", "b", "", None, "ab"]), min_size=n, max_size=n))
    ms = data.draw(st.lists(st.sampled_from([0.0, 5.0, None]), min_size=n, max_size=n))
    df = pd.DataFrame({"i": np.array(ints, dtype=np.int64), "f": np.array(floats, dtype=float),
                       "s": pd.Series(strs, dtype=object),
                       "t": pd.to_datetime(pd.Series(ms, dtype=float), unit="ms", utc=True),
                       "n": pd.array([x if x else None for x in ints], dtype="Int64")})
    for cols in (["i"], ["f", "i"], ["s", "i"], ["t", "s"], ["n", "f"], ["s", "t", "i"]):
        expected = df.sort_values(cols, kind="stable").index.to_numpy()
        assert stable_order(df, cols).tolist() == expected.tolist(), cols



def test_stable_order_orders_mixed_values_as_pandas_does():
    df = pd.DataFrame({"k": pd.Series([2, "a", 1, None, "a"], dtype=object), "_seq": [3, 2, 1, 0, 1]})
    expected = df.sort_values(["k", "_seq"], kind="stable").index.tolist()
    assert stable_order(df, ["k", "_seq"]).tolist() == expected == [2, 0, 4, 1, 3]


def test_int64_with_nulls_beyond_2_53_reaches_pandas_exactly():
    """``arrow_to_pandas``: an int64 column with nulls is float64 while its
    values fit float64 exactly, object (Python ints, None) once one is beyond
    2**53; ``nullable_ints``/``concat_ints`` keep the same rule."""
    import pyarrow as pa

    from spark_changelog.operators.kernels import arrow_to_pandas, concat_ints, nullable_ints
    big, small = [2**53 + 1, None, -(2**62) - 3], [5, None, -7]
    df = arrow_to_pandas(pa.table({"big": pa.array(big, pa.int64()), "small": pa.array(small, pa.int64()),
                                   "full": pa.array([2**53 + 1, 1, 2], pa.int64())}))
    assert df["big"].dtype == object and df["big"].tolist() == big
    assert df["small"].dtype == np.float64 and df["small"].isna().tolist() == [False, True, False]
    assert df["full"].dtype == np.int64 and df["full"].tolist() == [2**53 + 1, 1, 2]
    out = nullable_ints(np.array([2**53 + 1, 0, 3]), np.array([False, True, False]))
    assert out.dtype == object and out.tolist() == [2**53 + 1, None, 3]
    assert nullable_ints(np.array([1, 0]), np.array([False, True])).dtype == np.float64
    got = concat_ints([np.array([2**53 + 1, -(2**62) - 3]), np.array([np.nan, 4.0]),
                       np.array([None, 2**53 + 3], dtype=object)])
    assert got.tolist() == [2**53 + 1, -(2**62) - 3, None, 4, None, 2**53 + 3]
    assert concat_ints([np.array([1, 2]), np.array([np.nan])]).dtype == np.float64
