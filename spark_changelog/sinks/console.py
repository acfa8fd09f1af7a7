"""Sinks that keep nothing: ``print`` and ``blackhole`` (Flink's connectors of
the same names, docs/sql.md).

They take every change of a micro-batch as it comes, in ``_seq`` order, not
the net change per key: :class:`PrintSink` writes one line per change in
Flink's format (``+I[1, 20, b1]``, prefixed by ``print-identifier>`` when
given); :class:`BlackholeSink` only counts.  Neither records batch ids, so a
micro-batch replayed after a crash is printed again (as in Flink, the print
sink is not exactly-once).  A primary key is optional (``requires_key``).

Where the rows go: the print sink writes every change of a batch to the
driver's standard output in ``_seq`` order, so the batch is collected on the
driver (a person reads what it prints: a bounded preview would drop rows
silently).  The blackhole sink's batches stay on the executors
(:meth:`BlackholeSink.stage_batch`): each partition checks and counts its
rows, only the counts reach the driver (docs/runtime.md, "Sink writers on
the executors").
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence, TextIO

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ..model import KIND_COL, SEQ_COL, RowKind
from .base import UpsertSink, check_kinds
from .text import flink_text


class PrintSink(UpsertSink):
    requires_key = False

    def __init__(self, key: Sequence[str] = (), identifier: Optional[str] = None,
                 out: Optional[TextIO] = None):
        self.key = tuple(key)
        self.identifier = identifier
        self.out = out

    def write_batch(self, changes: pd.DataFrame, *, query_id: str, batch_id: int) -> dict:
        check_kinds(changes, batch_id)
        return self.write_arrow_batch(pa.Table.from_pandas(changes, preserve_index=False),
                                      query_id=query_id, batch_id=batch_id)

    def write_arrow_batch(self, changes: pa.Table, *, query_id: str, batch_id: int) -> dict:
        """The lines are built from the Arrow values, so a BIGINT column with
        nulls prints ``3``, not pandas' ``3.0``, and a DECIMAL its digits."""
        out = self.out or sys.stdout
        rows = changes.take(pc.sort_indices(changes, [(SEQ_COL, "ascending")]))
        data = [c for c in rows.column_names if c not in (KIND_COL, SEQ_COL)]
        prefix = f"{self.identifier}> " if self.identifier else ""
        kinds = rows.column(KIND_COL).to_pylist()
        if any(k not in (0, 1, 2, 3) for k in kinds):
            check_kinds(rows.select([KIND_COL]).to_pandas(), batch_id)
        columns = [[flink_text(v, rows.column(c).type) for v in rows.column(c).to_pylist()]
                   for c in data]
        lines = [f"{prefix}{RowKind(k).short}[{', '.join(vals)}]"
                 for k, vals in zip(kinds, zip(*columns) if columns else [()] * len(kinds))]
        if lines:
            out.write("\n".join(lines) + "\n")
            out.flush()
        adds = sum(1 for k in kinds if k in (0, 2))
        return {"upserted": adds, "deleted": len(kinds) - adds, "skipped_replay": False}

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

    def stage_batch(self, query_id: str, batch_id: int) -> "DiscardedBatch":
        """The batch stays on the executors, which only count it."""
        return DiscardedBatch(self, batch_id)

    def last_batch_id(self, query_id: str) -> int:
        return -1


class DiscardedBatch:
    """A blackhole batch on the executors: each partition's ``_kind`` values
    are checked and its rows counted; nothing is written, so a key's changes
    need not meet in one partition (the sink writers do not shuffle them)."""

    needs_key_together = False

    def __init__(self, sink: BlackholeSink, batch_id: int):
        self.sink, self.batch_id = sink, batch_id

    def write_partition(self, changes: pa.Table, partition: int) -> dict:
        if changes.num_rows:
            kinds = changes.column(KIND_COL)
            ok = pc.is_in(kinds, value_set=pa.array([0, 1, 2, 3], kinds.type))
            if not pc.all(pc.fill_null(ok, False)).as_py():
                check_kinds(pd.DataFrame({KIND_COL: kinds.to_pylist()}, dtype=object), self.batch_id)
        return {"files": []}

    def drop(self, written: list[dict]) -> None:
        """Nothing was written."""

    def commit(self, written: list[dict]) -> dict:
        self.sink.rows += sum(w["rows"] for w in written)
        return {"upserted": 0, "deleted": 0, "skipped_replay": False}


__all__ = ["PrintSink", "BlackholeSink", "DiscardedBatch"]
