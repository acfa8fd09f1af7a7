"""The key-group sort is a total order (docs/runtime.md, "Replay is
deterministic"): whatever order a shuffle delivers a key group's rows in, the
operator sees them in the same order, ties on key and ``_seq`` included."""
from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_changelog.runtime.keygroup import sort_rows


def _frame(n: int, seed: int) -> pd.DataFrame:
    """Rows with many ties on (k, _seq) and columns of every kind pandas holds:
    nullable strings, floats with NaN and -0.0, zoned timestamps with NaT,
    ARRAY (numpy arrays) and ROW (dicts) values."""
    rng = np.random.default_rng(seed)
    floats = rng.choice(np.array([0.0, -0.0, 1.5, np.nan]), n)
    stamps = pd.Series(pd.to_datetime(rng.integers(0, 3, n), unit="s", utc=True))
    stamps[rng.random(n) < 0.2] = pd.NaT
    return pd.DataFrame({
        "k": rng.integers(0, 3, n),
        "name": pd.Series(rng.choice(np.array(["a", "b", None], dtype=object), n), dtype=object),
        "x": floats,
        "at": stamps,
        "tags": [np.array(rng.integers(0, 2, int(rng.integers(0, 3)))) for _ in range(n)],
        "row": [{"a": int(rng.integers(0, 2)), "b": [int(v) for v in rng.integers(0, 2, 2)]}
                for _ in range(n)],
        "_kind": rng.integers(0, 4, n).astype(np.int8),
        "_seq": rng.integers(0, 3, n),
    })


def _exact(v):
    """A value as something compared exactly (-0.0 != 0.0, NaN == NaN)."""
    if isinstance(v, (float, np.floating)):
        return np.float64(v).tobytes()
    if isinstance(v, np.ndarray):
        return v.tobytes()
    return repr(v)


def _bytes(df: pd.DataFrame) -> list:
    return [tuple(_exact(v) for v in rec) for rec in df.itertuples(index=False)]


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 40), st.integers(0, 2 ** 32 - 1), st.randoms(use_true_random=False))
def test_any_arrival_order_gives_the_same_rows_in_the_same_order(n, seed, random):
    rows = _frame(n, seed)
    shuffled = rows.take(random.sample(range(n), n)).reset_index(drop=True)
    assert _bytes(sort_rows(shuffled, ["k"])) == _bytes(sort_rows(rows, ["k"]))


def test_ties_on_key_and_seq_put_retractions_first_then_kind_then_values():
    rows = pd.DataFrame({"k": [1, 1, 1, 1, 1, 0],
                         "v": ["b", "a", "c", "a", "b", "z"],
                         "_kind": np.array([2, 0, 1, 3, 1, 2], dtype=np.int8),
                         "_seq": [5, 5, 5, 5, 5, 9]})
    got = sort_rows(rows, ["k"])
    assert got[["k", "v", "_kind", "_seq"]].values.tolist() == [
        [0, "z", 2, 9],
        [1, "b", 1, 5], [1, "c", 1, 5],       # -U, by value
        [1, "a", 3, 5],                       # -D
        [1, "a", 0, 5],                       # +I
        [1, "b", 2, 5]]                       # +U


def test_rows_without_ties_keep_their_order_and_nulls_in_the_key_sort_last():
    rows = pd.DataFrame({"k": [None, "b", "a", None, "a"], "v": [4, 3, 2, 1, 0],
                         "_kind": np.zeros(5, dtype=np.int8), "_seq": [1, 1, 2, 1, 1]})
    got = sort_rows(rows, ["k"])
    # the two null keys tie on (k, _seq): broken by v
    assert got[["k", "v", "_seq"]].values.tolist() == [
        ["a", 0, 1], ["a", 2, 2], ["b", 3, 1], [None, 1, 1], [None, 4, 1]]
