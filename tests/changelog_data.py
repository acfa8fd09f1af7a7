"""Changelogs written out as data: ``[["+I", [1, "a"]], ...]`` <-> DataFrames."""
from __future__ import annotations

import json
import pathlib
from typing import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from spark_changelog.model import KIND_COL, SEQ_COL, RowKind

FIXTURES = pathlib.Path(__file__).parent / "fixtures"


def load_fixture(relpath: str):
    return json.loads((FIXTURES / relpath).read_text())


def to_frame(rows: Sequence, columns: Sequence[str], seqs: Sequence[int] | None = None) -> pd.DataFrame:
    """``rows``: ``[kind, [values...]]`` or ``[kind, [values...], seq]``."""
    data = {c: [r[1][i] for r in rows] for i, c in enumerate(columns)}
    df = pd.DataFrame(data)
    df[KIND_COL] = np.array([int(RowKind.parse(r[0])) for r in rows], dtype=np.int8)
    if seqs is None:
        seqs = [r[2] if len(r) > 2 else i for i, r in enumerate(rows)]
    df[SEQ_COL] = np.array(seqs, dtype=np.int64)
    return df


def to_rows(df: pd.DataFrame, columns: Sequence[str]) -> list:
    """A DataFrame back to ``[kind, [values...]]`` in its row order (NaN -> None)."""
    out = []
    for rec in df[list(columns) + [KIND_COL]].itertuples(index=False):
        vals = [None if (isinstance(v, float) and np.isnan(v)) or v is None or v is pd.NA else
                (v.item() if hasattr(v, "item") else v) for v in rec[:-1]]
        out.append([RowKind(int(rec[-1])).short, vals])
    return out


def schema_of(columns: Sequence[str], types: Sequence[pa.DataType]) -> pa.Schema:
    return pa.schema([pa.field(c, t) for c, t in zip(columns, types)]
                     + [pa.field(KIND_COL, pa.int8()), pa.field(SEQ_COL, pa.int64())])


def batches_of(rows: Sequence, cuts: Sequence[int]) -> list:
    """``rows`` split at the positions ``cuts`` (mod ``len(rows) + 1``) into
    non-empty micro-batches of ``(index, row)``: random batch splits for
    property tests."""
    bounds = sorted(set(c % (len(rows) + 1) for c in cuts)) + [len(rows)]
    start, out = 0, []
    for b in bounds:
        if b > start:
            out.append([(i, rows[i]) for i in range(start, b)])
            start = b
    return out
