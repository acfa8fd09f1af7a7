"""Exact, vectorized key handling shared by operators and runtimes."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from .kernels import factorize_rows

#: the constant key column of a keyed operator over a query without keys (a
#: global Top-N, deduplication or session window: one key, all rows in one key
#: group, Flink's parallelism 1): the lowering adds it before the operator and
#: drops it after, so it never reaches an output (docs/operators.md, "Top-N")
GLOBAL_KEY = "$global"


def key_index(df: pd.DataFrame, key: Sequence[str]) -> pd.Index:
    """An index over the key columns of ``df`` (exact values, nulls included)."""
    if len(key) == 1:
        return pd.Index(df[key[0]])
    return pd.MultiIndex.from_frame(df[list(key)])


def rows_with_keys(df: pd.DataFrame, key: Sequence[str], keys: pd.DataFrame) -> np.ndarray:
    """Boolean mask of the rows of ``df`` whose key occurs in ``keys`` (nulls
    equal nulls): one combined code per row of both, instead of an index of
    key tuples per side."""
    if df.empty or keys.empty:
        return np.zeros(len(df), dtype=bool)
    cols = list(key)
    codes = factorize_rows(pd.concat([df[cols], keys[cols]], ignore_index=True), cols)
    held = np.zeros(int(codes.max()) + 1, dtype=bool)
    held[codes[len(df):]] = True
    return held[codes[:len(df)]]


def distinct_keys(df: pd.DataFrame, key: Sequence[str]) -> pd.DataFrame:
    return df[list(key)].drop_duplicates().reset_index(drop=True)


def key_change(rows: pd.DataFrame, key: Sequence[str]) -> np.ndarray:
    """True where row i's key differs from row i-1's (rows sorted by key).

    Nulls compare equal to nulls, as in a GROUP BY.
    """
    n = len(rows)
    change = np.zeros(n, dtype=bool)
    if n == 0:
        return change
    change[0] = True
    for k in key:
        v = rows[k].to_numpy()
        a, b = v[1:], v[:-1]
        with np.errstate(invalid="ignore"):
            diff = ~np.asarray(a == b, dtype=bool)
        diff &= ~(pd.isna(a) & pd.isna(b))
        change[1:] |= diff
    return change


def first_of_key(rows: pd.DataFrame, key: Sequence[str]) -> np.ndarray:
    return key_change(rows, key)


def last_of_key(rows: pd.DataFrame, key: Sequence[str]) -> np.ndarray:
    ch = key_change(rows, key)
    return np.append(ch[1:], True) if len(ch) else ch


def lookup_unique(rows: pd.DataFrame, table: pd.DataFrame, key: Sequence[str]) -> np.ndarray:
    """Position of each row's key in ``table`` (whose keys are unique), or -1."""
    if not len(table) or not len(rows):
        return np.full(len(rows), -1, dtype=np.int64)
    return np.asarray(key_index(table, key).get_indexer(key_index(rows, key)), dtype=np.int64)
