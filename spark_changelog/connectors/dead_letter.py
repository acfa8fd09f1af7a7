"""Dead-letter files for invalid change records (docs/semantics.md, sections 1-2: bad input is
never dropped silently).

``write_dead_letter`` stores the rows of ``ReadResult.invalid`` (``raw``,
``file``, ``line``, ``reason``) as JSON lines in a local directory, one file per
micro-batch: ``batch-<batch_id>.jsonl``.  A replayed micro-batch (same id after a
restart) overwrites its file, so replays never duplicate entries.  Without a
batch id the file is named after a hash of its content
(``content-<sha256 prefix>.jsonl``), so writing the same records twice also
yields one file.  Files are written to a temporary name and renamed, so a
reader never sees half a file.

Typical streaming use::

    res = read_changes(spark, path, format="debezium-json", schema=..., streaming=True)
    res.invalid.writeStream.foreachBatch(
        lambda df, batch_id: write_dead_letter(df, "/data/dead-letter", batch_id)).start()

The invalid records of one micro-batch are collected to the driver: they are
expected to be few.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any, Optional

from spark_changelog.connectors.cdc_json import INVALID_COLUMNS

SUFFIX = ".jsonl"


def _records(invalid: Any) -> list[dict]:
    """The rows of a Spark or pandas DataFrame as dicts, ordered by (file, line)."""
    from pyspark.sql import DataFrame

    if isinstance(invalid, DataFrame):
        rows = invalid.select(*INVALID_COLUMNS).orderBy("file", "line").collect()
        return [{c: row[c] for c in INVALID_COLUMNS} for row in rows]
    missing = [c for c in INVALID_COLUMNS if c not in invalid.columns]
    if missing:
        raise ValueError(f"dead-letter input lacks column(s) {missing}; expected {list(INVALID_COLUMNS)}")
    frame = invalid.sort_values(["file", "line"], kind="stable")
    out = []
    for raw, file, line, reason in frame[list(INVALID_COLUMNS)].itertuples(index=False, name=None):
        out.append({"raw": raw, "file": file, "line": None if line is None else int(line), "reason": reason})
    return out


def _file_name(batch_id: Optional[int], payload: bytes, prefix: str = "") -> str:
    if batch_id is not None:
        if int(batch_id) < 0:
            raise ValueError(f"batch_id must be >= 0, got {batch_id}")
        return f"{prefix}batch-{int(batch_id):012d}{SUFFIX}"
    return f"{prefix}content-{hashlib.sha256(payload).hexdigest()[:20]}{SUFFIX}"


def write_dead_letter(invalid: Any, directory: str, batch_id: Optional[int] = None,
                      prefix: str = "") -> int:
    """Write the invalid records (Spark or pandas DataFrame) to ``directory``.

    ``prefix`` keeps the files of different writers apart (the input query's
    batch ids and the sink's are numbered independently): ``sink-batch-...``.
    Returns the number of records written.  An empty batch writes nothing (and
    removes a file left for the same batch id by an earlier attempt).
    """
    records = _records(invalid)
    os.makedirs(directory, exist_ok=True)
    payload = "".join(json.dumps(r, ensure_ascii=False, sort_keys=False) + "\n" for r in records).encode("utf-8")
    if not records:
        if batch_id is not None:
            stale = os.path.join(directory, _file_name(batch_id, b"", prefix))
            if os.path.exists(stale):
                os.remove(stale)
        return 0
    target = os.path.join(directory, _file_name(batch_id, payload, prefix))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=SUFFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return len(records)


def read_dead_letter(directory: str) -> list[dict]:
    """All records in ``directory``, file by file in name order."""
    out: list[dict] = []
    for name in _data_files(directory):
        with open(os.path.join(directory, name), encoding="utf-8") as fh:
            out.extend(json.loads(line) for line in fh if line.strip())
    return out


def count_dead_letter(directory: str) -> int:
    """Number of records in ``directory`` (0 if it does not exist)."""
    total = 0
    for name in _data_files(directory):
        with open(os.path.join(directory, name), "rb") as fh:
            total += sum(1 for line in fh if line.strip())
    return total


def _data_files(directory: str) -> list[str]:
    if not os.path.isdir(directory):
        return []
    return sorted(n for n in os.listdir(directory) if n.endswith(SUFFIX) and not n.startswith("."))
