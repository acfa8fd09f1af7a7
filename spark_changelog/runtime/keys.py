"""Exact, vectorized key matching shared by the runtimes' state handling."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd


def key_index(df: pd.DataFrame, key: Sequence[str]) -> pd.Index:
    """An index over the key columns of ``df`` (exact values, nulls included)."""
    if len(key) == 1:
        return pd.Index(df[key[0]])
    return pd.MultiIndex.from_frame(df[list(key)])


def rows_with_keys(df: pd.DataFrame, key: Sequence[str], keys: pd.DataFrame) -> np.ndarray:
    """Boolean mask of the rows of ``df`` whose key occurs in ``keys``."""
    if df.empty or keys.empty:
        return np.zeros(len(df), dtype=bool)
    return np.asarray(key_index(df, key).isin(key_index(keys, key)), dtype=bool)


def distinct_keys(df: pd.DataFrame, key: Sequence[str]) -> pd.DataFrame:
    return df[list(key)].drop_duplicates().reset_index(drop=True)
