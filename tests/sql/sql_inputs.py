"""Changelog inputs of SQL tests as Parquet files with a kind column ``op`` and
a sequence column ``seq`` (read by ``'format' = 'parquet'`` with
``'changelog.kind-column' = 'op'``, ``'changelog.seq-column' = 'seq'``)."""
from __future__ import annotations

import os
from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

ARROW = {"BIGINT": pa.int64(), "STRING": pa.string(), "INT": pa.int32(), "DOUBLE": pa.float64()}


def arrow_type(t: str) -> pa.DataType:
    """The Arrow type of a column type name (``DECIMAL(p, s)`` included)."""
    if t.upper().startswith("DECIMAL("):
        p, s = t[t.index("(") + 1:t.index(")")].split(",")
        return pa.decimal128(int(p), int(s))
    return ARROW[t]


def write_changelog(directory, columns: Sequence[str], types: Sequence[str], files) -> None:
    """``files``: per file, rows ``(kind, [values], seq)``."""
    os.makedirs(directory, exist_ok=True)
    schema = pa.schema([(c, arrow_type(t)) for c, t in zip(columns, types)]
                       + [("op", pa.string()), ("seq", pa.int64())])
    for i, rows in enumerate(files):
        data = {c: [r[1][j] for r in rows] for j, c in enumerate(columns)}
        data["op"] = [r[0] for r in rows]
        data["seq"] = [r[2] for r in rows]
        pq.write_table(pa.table(data, schema=schema),
                       os.path.join(directory, f"part-{i:04d}.parquet"))


def source_options(path) -> str:
    return (f"'connector' = 'filesystem', 'path' = '{path}', 'format' = 'parquet', "
            "'changelog.kind-column' = 'op', 'changelog.seq-column' = 'seq'")


def create_table(name: str, spec: dict, path) -> str:
    """``CREATE TABLE`` of a Flink fixture input (columns, types, primary key)."""
    cols = [f"{c} {t}" for c, t in zip(spec["columns"], spec["types"])]
    extra = spec.get("schema_extra") or {}
    cols += [f"{c} AS {e}" for c, e in extra.get("computed", ())]
    if extra.get("watermark"):
        cols.append("WATERMARK FOR {} AS {}".format(*extra["watermark"]))
    if spec.get("primary_key"):
        cols.append(f"PRIMARY KEY ({', '.join(spec['primary_key'])}) NOT ENFORCED")
    return f"CREATE TEMPORARY TABLE {name} ({', '.join(cols)}) WITH ({source_options(path)})"


#: seed 002's per-minute click counts into a Delta table (``{out}``), up to
#: the WHERE/GROUP BY the caller adds
PER_MINUTE = """
CREATE TABLE per_minute (
  window_start TIMESTAMP(3), window_end TIMESTAMP(3), users BIGINT, clicks BIGINT,
  PRIMARY KEY (window_start, window_end) NOT ENFORCED
) WITH ('connector' = 'delta', 'path' = '{out}');
INSERT INTO per_minute
SELECT window_start, window_end, COUNT(DISTINCT u) AS users, COUNT(*) AS clicks
FROM TABLE(TUMBLE(TABLE clicks, DESCRIPTOR(rt), INTERVAL '1' MINUTE))
"""


def hm(ts) -> str:
    """A timestamp of a result table as naive ISO text."""
    return ts.tz_convert(None).isoformat() if hasattr(ts, "tz_convert") else ts.isoformat()
