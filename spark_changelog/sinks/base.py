"""What every upsert sink shares (docs/semantics.md, section 1, "upsert" mode).

A sink receives one micro-batch of a changelog whose per-key order is intact
(the planner puts a ``SinkUpsertMaterializer`` in front when it is not) and
applies the *net* change of each primary key atomically, recording the batch
id so that a batch replayed after a crash is not applied twice.
"""
from __future__ import annotations

import abc
import json
from typing import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ..model import KIND_COL, SEQ_COL
from ..model.rowkind import IS_ADD
from ..operators.kernels import last_change_per_key


def net_changes_per_key(changes: pd.DataFrame, key: Sequence[str]) -> pd.DataFrame:
    """The last change of each key, by ``_seq`` (retractions before additions
    at equal ``_seq``, model.schema).  Rows with ``_kind`` -D/-U mean "delete the
    key", +I/+U mean "the key's row is now this".

    Vectorized: factorize the key, then :func:`~spark_changelog.operators.kernels.last_change_per_key`.
    """
    if changes.empty:
        return changes
    if len(key) == 1:
        codes = pd.factorize(changes[key[0]], use_na_sentinel=False)[0]
    else:
        codes = pd.MultiIndex.from_frame(changes[list(key)]).factorize()[0]
    kinds = changes[KIND_COL].to_numpy(dtype=np.int64)
    keep = last_change_per_key([codes], changes[SEQ_COL].to_numpy(dtype=np.int64), IS_ADD[kinds])
    return changes.iloc[keep].reset_index(drop=True)


def split_null_keys(changes: pd.DataFrame, key: Sequence[str], table: str
                    ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(rows with a complete key, rejects)``: a change whose primary key has a
    null column cannot be applied to an upsert table (docs/semantics.md, section 3, "bad
    input").  Rejects come as dead-letter records (``raw``: the row as JSON
    with its ``op``; ``file``: ``sink:<table>``; ``line``: its ``_seq``;
    ``reason`` naming the field)."""
    if changes.empty:
        return changes, pd.DataFrame(columns=["raw", "file", "line", "reason"])
    nulls = changes[list(key)].isna()
    bad = nulls.any(axis=1).to_numpy()
    if not bad.any():
        return changes, pd.DataFrame(columns=["raw", "file", "line", "reason"])
    from ..model import RowKind
    rows = changes[bad]
    data_cols = [c for c in changes.columns if c not in (KIND_COL, SEQ_COL)]
    raws, reasons = [], []
    for (_, row), null_row in zip(rows.iterrows(), nulls[bad].itertuples(index=False)):
        op = RowKind(int(row[KIND_COL])).short
        record = {"op": op, **{c: _json_value(row[c]) for c in data_cols}}
        raws.append(json.dumps(record, default=str))
        fields = [k for k, isnull in zip(key, null_row) if isnull]
        reasons.append(f"field {', '.join(repr(f) for f in fields)}: primary key of the sink "
                       f"table is null ({op} change, _seq {int(row[SEQ_COL])})")
    rejects = pd.DataFrame({"raw": raws, "file": f"sink:{table}",
                            "line": rows[SEQ_COL].astype("int64").to_numpy(), "reason": reasons})
    return changes[~bad].reset_index(drop=True), rejects


def split_null_keys_arrow(changes: pa.Table, key: Sequence[str], table: str
                          ) -> tuple[pa.Table, pd.DataFrame]:
    """:func:`split_null_keys` on an Arrow batch: the null test is vectorized
    in Arrow; only the rejected rows (few) go through pandas for their
    dead-letter records."""
    if changes.num_rows == 0 or not any(changes[k].null_count for k in key):
        return changes, pd.DataFrame(columns=["raw", "file", "line", "reason"])
    bad = pc.is_null(changes[key[0]])
    for k in key[1:]:
        bad = pc.or_(bad, pc.is_null(changes[k]))
    _, rejects = split_null_keys(changes.filter(bad).to_pandas(), key, table)
    return changes.filter(pc.invert(bad)), rejects


def _json_value(v):
    if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NaT or v is pd.NA:
        return None
    if isinstance(v, pd.Timestamp):
        return v.isoformat()
    return v.item() if isinstance(v, np.generic) else v


def check_kinds(changes: pd.DataFrame, batch_id) -> None:
    """Every row's ``_kind`` must be a RowKind code; name the first bad row."""
    kinds = changes[KIND_COL]
    bad = kinds.isna() | ~kinds.isin([0, 1, 2, 3])
    if bad.any():
        i = bad.to_numpy().nonzero()[0][0]
        raise ValueError(f"invalid {KIND_COL} value {kinds.iloc[i]!r} in row {changes.index[i]!r} "
                         f"of batch {batch_id} (expected 0=+I, 1=-U, 2=+U, 3=-D)")


class UpsertSink(abc.ABC):
    """Applies net changes per primary key, idempotently per (query id, batch id)."""

    key: tuple[str, ...]

    @abc.abstractmethod
    def write_batch(self, changes: pd.DataFrame, *, query_id: str, batch_id: int) -> dict:
        """Apply one micro-batch of changes (data columns + ``_kind``/``_seq``, any
        order).  Returns counts: ``{"upserted": n, "deleted": n, "skipped_replay": bool}``.
        Must be atomic: a reader sees all of the batch or none of it."""

    def write_arrow_batch(self, changes: pa.Table, *, query_id: str, batch_id: int) -> dict:
        """:meth:`write_batch` for a batch as Arrow (what the runtime hands
        over).  This default converts it to pandas; a sink that can apply
        Arrow directly (the Delta sink) overrides it."""
        return self.write_batch(changes.to_pandas(), query_id=query_id, batch_id=batch_id)

    @abc.abstractmethod
    def last_batch_id(self, query_id: str) -> int:
        """The last batch id committed for ``query_id``, or -1."""
