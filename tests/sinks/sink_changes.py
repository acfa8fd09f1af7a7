"""Change batches of the Delta sink tests: ``(kind, seq, id, name)`` rows as
the Arrow table a sink writer receives."""
from __future__ import annotations

import pyarrow as pa

from spark_changelog.model import KIND_COL, SEQ_COL

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def changes(rows):
    """rows: (kind, seq, id, name) in arrival order"""
    return pa.table({"id": pa.array([r[2] for r in rows], pa.int64()),
                     "name": pa.array([r[3] for r in rows], pa.string()),
                     KIND_COL: pa.array([r[0] for r in rows], pa.int8()),
                     SEQ_COL: pa.array([r[1] for r in rows], pa.int64())})
