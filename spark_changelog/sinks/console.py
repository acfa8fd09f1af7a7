"""Sinks that keep nothing: ``print`` and ``blackhole`` (Flink's connectors of
the same names, docs/sql.md).

They take every change of a micro-batch as it comes, in ``_seq`` order, not
the net change per key: :class:`PrintSink` writes one line per change in
Flink's format (``+I[1, 20, b1]``, prefixed by ``print-identifier>`` when
given); :class:`BlackholeSink` only counts.  Neither records batch ids, so a
micro-batch replayed after a crash is printed again (as in Flink, the print
sink is not exactly-once).  A primary key is optional (``requires_key``).
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence, TextIO

import numpy as np
import pandas as pd

from ..model import KIND_COL, SEQ_COL, RowKind
from .base import UpsertSink, check_kinds


def _text(v) -> str:
    if v is None or v is pd.NaT or v is pd.NA or (isinstance(v, float) and np.isnan(v)):
        return "null"
    if isinstance(v, np.generic):
        v = v.item()
    return str(v)


class PrintSink(UpsertSink):
    requires_key = False

    def __init__(self, key: Sequence[str] = (), identifier: Optional[str] = None,
                 out: Optional[TextIO] = None):
        self.key = tuple(key)
        self.identifier = identifier
        self.out = out

    def write_batch(self, changes: pd.DataFrame, *, query_id: str, batch_id: int) -> dict:
        check_kinds(changes, batch_id)
        out = self.out or sys.stdout
        rows = changes.sort_values(SEQ_COL, kind="stable")
        data = [c for c in rows.columns if c not in (KIND_COL, SEQ_COL)]
        prefix = f"{self.identifier}> " if self.identifier else ""
        lines = [f"{prefix}{RowKind(int(k)).short}[{', '.join(_text(v) for v in vals)}]"
                 for k, vals in zip(rows[KIND_COL], rows[data].itertuples(index=False))]
        if lines:
            out.write("\n".join(lines) + "\n")
            out.flush()
        adds = int(rows[KIND_COL].isin([0, 2]).sum())
        return {"upserted": adds, "deleted": len(rows) - adds, "skipped_replay": False}

    def last_batch_id(self, query_id: str) -> int:
        return -1


class BlackholeSink(UpsertSink):
    requires_key = False

    def __init__(self, key: Sequence[str] = ()):
        self.key = tuple(key)
        self.rows = 0

    def write_batch(self, changes: pd.DataFrame, *, query_id: str, batch_id: int) -> dict:
        check_kinds(changes, batch_id)
        self.rows += len(changes)
        return {"upserted": 0, "deleted": 0, "skipped_replay": False}

    def last_batch_id(self, query_id: str) -> int:
        return -1


__all__ = ["PrintSink", "BlackholeSink"]
