"""Changelogs written out as data: ``[["+I", [1, "a"]], ...]`` <-> DataFrames."""
from __future__ import annotations

import json
import os
import pathlib
import time
from typing import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
from hypothesis import strategies as st

from spark_changelog.model import KIND_COL, SEQ_COL, RowKind

FIXTURES = pathlib.Path(__file__).parent / "fixtures"


def set_arrival(path, position: int) -> None:
    """Give the file ``path`` the modification time of arrival ``position``
    (one second apart): Spark's file stream source takes the oldest files
    first, and files written within the same millisecond could otherwise come
    in either order (a rare flaky failure of order-dependent tests)."""
    t = time.time() - 100 + position
    os.utime(path, (t, t))


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


def key_groups_separating(spark, a: int, b: int) -> int:
    """The smallest key-group count (2..8) that puts BIGINT keys ``a`` and
    ``b`` into different key groups (Spark's ``pmod(hash(key), G)``)."""
    from pyspark.sql import functions as F
    row = spark.range(1).select(*[
        (F.pmod(F.hash(F.lit(a).cast("bigint")), F.lit(g))
         != F.pmod(F.hash(F.lit(b).cast("bigint")), F.lit(g))).alias(str(g))
        for g in range(2, 9)]).first()
    return next(int(g) for g in row.asDict() if row[g])


# -- hypothesis strategies ------------------------------------------------------------

@st.composite
def side_changelog(draw, unique: str, spurious: bool):
    """A valid changelog of one side (ADD before RETRACT per row); ``unique``:
    "id" (unique key not in the join key), "k" (unique key = join key), "none"."""
    n_ops = draw(st.integers(0, 24))
    current: dict = {}          # unique key -> row, or row -> count
    out = []
    ks = st.one_of(st.integers(0, 2), st.just(None)) if draw(st.booleans()) else st.integers(0, 2)

    def fresh():
        i, k, v = draw(st.integers(0, 3)), draw(ks), draw(st.sampled_from(["a", "b", "c"]))
        if unique == "k":           # a unique key is never null; id follows k
            k = draw(st.integers(0, 2))
            i = k
        return (i, k, v)

    ukey = {"id": lambda r: r[0], "k": lambda r: r[1], "none": lambda r: r}[unique]
    for _ in range(n_ops):
        op = draw(st.sampled_from(["ins", "ins", "upd", "del", "ghost"] if spurious
                                  else ["ins", "ins", "upd", "del"]))
        new = fresh()
        if op == "ghost":           # a retraction of a row that may not be stored
            out.append((draw(st.sampled_from(["-D", "-U"])), new))
            continue
        if op == "ins":
            if unique != "none" and ukey(new) in current:
                continue
            out.append(("+I", new))
            if unique == "none":
                current[new] = current.get(new, 0) + 1
            else:
                current[ukey(new)] = new
            continue
        if not current:
            continue
        key = draw(st.sampled_from(sorted(current, key=repr)))
        old = key if unique == "none" else current[key]
        if op == "del":
            out.append(("-D", old))
        else:
            if unique == "id":
                new = (old[0], new[1], new[2])
            elif unique == "k":
                new = (old[0], old[1], new[2])
            out.extend([("-U", old), ("+U", new)])
        if unique == "none":
            current[old] -= 1
            if not current[old]:
                del current[old]
            if op == "upd":
                current[new] = current.get(new, 0) + 1
        else:
            del current[key]
            if op == "upd":
                current[ukey(new)] = new
    return out
