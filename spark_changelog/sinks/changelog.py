"""Changelog sink: appends every emitted row with its kind and sequence.

For inspection and tests: where an upsert sink keeps only the current row of
each key, this sink keeps the changes themselves, batch by batch
(docs/sinks.md, "The changelog output").

Layout of ``path``::

    _schema.arrow                          Arrow IPC schema of the data columns
    batch-00000000000000000007/            one directory per batch id
        _commit.json                       the commit: which part files make the batch
        <attempt>/part-00003.parquet       (or .json) the rows of state partition 3

Written by the executors, committed by the driver.  Run by the pipeline, each
partition of a micro-batch (every change of a key in one partition: the batch
is repartitioned by the sink key) puts its rows in emission order and writes
them as one part file, named by the batch, the attempt and the partition,
into the attempt's directory (a hidden temporary file renamed over the final
name, so a retried task replaces its own file).  The driver receives only
each part's name and row count and commits the batch by writing
``_commit.json`` (temporary file and rename), which lists the parts; a reader
reads a batch only through its commit, so it sees the whole batch or none of
it, and a crashed attempt's files are never read.  A replayed batch writes a
new attempt and its commit replaces the old one (then the old attempt's
files are deleted), so it is never duplicated.  An empty batch removes the
batch's commit if one exists (so a replay is still exact) and leaves nothing.
One query per ``path``: the batch id alone names the batch.

Row order inside a batch ("emission order"): rows are sorted by ``_seq``, then
by the key (when the sink knows one), then retractions before additions, then
arrival order.  Arrival order alone means nothing after a shuffle
(model.schema); ``_seq`` plus "retraction first at equal ``_seq``" is the order
in which the operators emitted them.  Grouping by key at equal ``_seq`` keeps
``-U``/``+U`` of one key adjacent.  Each part file is in emission order; the
rows that tie on (``_seq``, key, retraction first) are of one key, so in one
part, and :func:`read_changelog` merges the parts by that order, then by part
and position: the batch's emission order, the same as one file sorted whole.

Earlier versions wrote one file per batch, ``batch-<id>.parquet`` (or
``.json``) beside ``_schema.arrow``; such outputs are still read, and written
on: a batch id that has both a file and a committed directory is read from
the directory (the commit then deletes the file).

Formats
-------
``parquet``
    the data columns, ``op`` (string ``+I``/``-U``/``+U``/``-D``), ``_seq`` (int64).

``debezium-json``
    one JSON object per line, ``{"before": .., "after": .., "op": .., "source": {"lsn": ..}}``,
    ``_seq`` written as ``source.lsn`` (the log position of Debezium's PostgreSQL
    connector, which ``connectors.debezium`` orders events by):

    ====================================================  ==========================================
    rows (emission order)                                 event
    ====================================================  ==========================================
    ``+I r``                                              ``op "c"``, ``after = r``
    ``-D r``                                              ``op "d"``, ``before = r``
    ``-U a`` directly followed by ``+U b``, same ``_seq``  one ``op "u"``, ``before = a, after = b``
    and same key (needs ``key``)
    any other ``-U a``                                    ``op "u"``, ``before = a``, ``after = null``
    any other ``+U b``                                    ``op "u"``, ``before = null``, ``after = b``
    ====================================================  ==========================================

    Reading maps back exactly (``c`` -> ``+I``, ``d`` -> ``-D``, ``r`` -> ``+I``,
    ``u`` -> ``-U`` of ``before`` if present then ``+U`` of ``after`` if present),
    so both formats read back to the same rows.  A standard Debezium consumer
    (Flink's ``debezium-json`` included) expects ``before`` and ``after`` on every
    ``u`` event and rejects the half events; give the sink the upsert key to
    pair updates.  Values: timestamps, dates and times as ISO 8601 text,
    decimals as text, binary as base64; ``_schema.arrow`` restores the types.
"""
from __future__ import annotations

import base64
import contextlib
import datetime as _dt
import decimal
import json
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .base import check_kinds
from ..model import KIND_COL, METADATA_COLUMNS, SEQ_COL, RowKind, as_key
from ..model.rowkind import IS_ADD, SHORT_NAMES

__all__ = ["ChangelogSink", "StagedChangelog", "read_changelog", "read_changelog_arrow",
           "committed_batches", "is_changelog_output",
           "OP_COL", "BATCH_COL", "FORMATS"]

OP_COL = "op"
BATCH_COL = "_batch"
SCHEMA_FILE = "_schema.arrow"
COMMIT_FILE = "_commit.json"
FORMATS = {"parquet": "parquet", "debezium-json": "json", "debezium": "json", "json": "json"}
_EXT = {"parquet": "parquet", "json": "json"}
_DIR_RE = re.compile(r"^batch-(\d{20})$")
#: the layout of earlier versions: one file per batch beside ``_schema.arrow``
_LEGACY_RE = re.compile(r"^batch-(\d{20})\.(parquet|json)$")
_OP_TO_KIND = {"+I": 0, "-U": 1, "+U": 2, "-D": 3}
_OP_NAMES = pa.array(SHORT_NAMES.tolist(), pa.string())
#: how often a reader re-reads a batch's commit when a file it lists is gone
#: (a replay's commit replaced it meanwhile and deleted the older attempt)
_READ_TRIES = 5


def _batch_name(batch_id: int) -> str:
    return f"batch-{batch_id:020d}"


def _legacy_files(path: Path, batch_id: int) -> list[Path]:
    return [f for f in (path / f"{_batch_name(batch_id)}.{ext}" for ext in _EXT.values()) if f.exists()]


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".tmp-{path.name}-{uuid.uuid4().hex}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _nullable_types(t: pa.DataType):
    from .delta import _nullable_types as f

    return f(t)


def _checked_batch_id(batch_id) -> int:
    if isinstance(batch_id, bool) or not isinstance(batch_id, (int, np.integer)) or batch_id < 0:
        raise ValueError(f"batch_id must be an integer >= 0, got {batch_id!r}")
    return int(batch_id)


# ------------------------------------------------------------------ JSON values
def _json_default(value: Any):
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value // _dt.timedelta(microseconds=1)
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} value {value!r} as JSON")


def _array_from_json(values: list, t: pa.DataType) -> pa.Array:
    def each(f):
        return [None if v is None else f(v) for v in values]

    if pa.types.is_timestamp(t):
        return pa.array(each(_dt.datetime.fromisoformat), type=t)
    if pa.types.is_date(t):
        return pa.array(each(_dt.date.fromisoformat), type=t)
    if pa.types.is_time(t):
        return pa.array(each(_dt.time.fromisoformat), type=t)
    if pa.types.is_duration(t):
        return pa.array(each(lambda v: _dt.timedelta(microseconds=v)), type=t)
    if pa.types.is_decimal(t):
        return pa.array(each(decimal.Decimal), type=t)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return pa.array(each(base64.b64decode), type=t)
    return pa.array(values, type=t)


# ------------------------------------------------------------------------ sink
class ChangelogSink:
    """Writes each micro-batch of a changelog to its own directory under ``path``.

    ``schema`` (Arrow, data columns only) fixes the column types; without it the
    types of the first non-empty batch are inferred and stored in
    ``_schema.arrow``, and later batches are converted to them (so a bigint
    column that pandas turned into float64 because of nulls is written as int64).
    ``key`` (the upsert key of the stream) groups rows of one key at equal
    ``_seq`` and pairs ``-U``/``+U`` into one Debezium ``u`` event.

    Run by the pipeline, a batch is written by the executors
    (:meth:`stage_batch`, :class:`StagedChangelog`); :meth:`write_batch` and
    :meth:`write_arrow_batch` write a batch held in this process the same way,
    as one part.
    """

    def __init__(self, path: "str | os.PathLike", format: str = "parquet", *,
                 key: "str | Sequence[str] | None" = None,
                 schema: Optional[pa.Schema] = None) -> None:
        if format not in FORMATS:
            raise ValueError(f"unknown changelog format {format!r}: expected one of {sorted(FORMATS)}")
        self.path = Path(path)
        self.format = FORMATS[format]
        self.key = as_key(key)
        self.schema = pa.schema(schema) if schema is not None else None
        if self.schema is not None:
            self._check_names(self.schema.names)
        self.path.mkdir(parents=True, exist_ok=True)
        other = [name for name, ext in _stored_formats(self.path) if ext != _EXT[self.format]]
        if other:
            raise ValueError(f"{self.path} already holds changelog files of another format "
                             f"({other[0]}, ...); use a separate directory per format")
        stored = _read_schema(self.path)
        if stored is not None and self.schema is not None and not stored.equals(self.schema):
            raise ValueError(f"{self.path} holds a changelog with schema {stored}, which differs "
                             f"from the sink schema {self.schema}")
        if stored is not None:
            self.schema = stored
        elif self.schema is not None:
            self._store_schema()

    def _check_names(self, names: Sequence[str]) -> None:
        clash = [c for c in names if c in METADATA_COLUMNS or c in (OP_COL, BATCH_COL)]
        if clash:
            raise ValueError(f"column name(s) {clash} are reserved in a changelog sink")
        missing = [k for k in self.key if k not in names]
        if missing:
            raise ValueError(f"key column(s) {missing} not among columns {list(names)}")

    def _store_schema(self) -> None:
        data = self.schema.serialize().to_pybytes()
        _atomic_write(self.path / SCHEMA_FILE, lambda p: p.write_bytes(data))

    def last_batch_id(self, query_id: Optional[str] = None) -> int:
        """The largest committed batch id, or -1 (empty batches leave nothing)."""
        return max((b for b, _ in _batch_sources(self.path)), default=-1)

    # ------------------------------------------------------- written by the executors
    def stage_batch(self, query_id: Optional[str], batch_id: int) -> "Optional[StagedChangelog]":
        """On the driver, before the sink writers run: the batch's stage, whose
        part files the executors write (:class:`StagedChangelog`); ``None``
        while the schema is unknown (the batch is then written from the
        driver, which infers it)."""
        batch_id = _checked_batch_id(batch_id)
        if self.schema is None:
            return None
        return StagedChangelog(self, query_id, batch_id)

    # --------------------------------------------------- written from this process
    def write_batch(self, changes: pd.DataFrame, *, batch_id: int,
                    query_id: Optional[str] = None) -> dict:
        """One batch given as pandas (data columns, ``_kind``, ``_seq``), written
        from this process as one part."""
        batch_id = _checked_batch_id(batch_id)
        if len(changes) == 0:
            return self._write_whole(None, batch_id, query_id)
        missing = [c for c in (KIND_COL, SEQ_COL) if c not in changes.columns]
        if missing:
            raise ValueError(f"batch {batch_id} lacks changelog column(s) {missing}")
        if self.schema is None:
            data_cols = [c for c in changes.columns if c not in METADATA_COLUMNS]
            self._check_names(data_cols)
            self.schema = pa.Schema.from_pandas(changes[data_cols], preserve_index=False) \
                .remove_metadata()
            self._store_schema()
        self._check_columns(changes.columns, batch_id)
        check_kinds(changes, batch_id)
        if changes[SEQ_COL].isna().any():
            i = changes[SEQ_COL].isna().to_numpy().nonzero()[0][0]
            raise ValueError(f"null {SEQ_COL} in row {changes.index[i]!r} of batch {batch_id}")
        try:
            data = pa.Table.from_pandas(changes[list(self.schema.names)], schema=self.schema,
                                        preserve_index=False, safe=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            raise ValueError(f"batch {batch_id} does not convert to the changelog schema "
                             f"{self.schema}: {e}") from e
        table = data.replace_schema_metadata(None) \
            .append_column(KIND_COL, pa.array(changes[KIND_COL].to_numpy(dtype=np.int8))) \
            .append_column(SEQ_COL, pa.array(changes[SEQ_COL].to_numpy(dtype=np.int64)))
        return self._write_whole(table, batch_id, query_id)

    def write_arrow_batch(self, changes: pa.Table, *, batch_id: int,
                          query_id: Optional[str] = None) -> dict:
        """One batch given as Arrow (data columns, ``_kind``, ``_seq``), written
        from this process as one part (a batch the pipeline collected anyway)."""
        batch_id = _checked_batch_id(batch_id)
        if self.schema is None and changes.num_rows:
            data_cols = [c for c in changes.column_names if c not in METADATA_COLUMNS]
            self._check_names(data_cols)
            self.schema = changes.select(data_cols).schema.remove_metadata()
            self._store_schema()
        return self._write_whole(changes if changes.num_rows else None, batch_id, query_id)

    def _write_whole(self, changes: Optional[pa.Table], batch_id: int, query_id) -> dict:
        stage = StagedChangelog(self, query_id, batch_id)
        written: list = []
        try:
            if changes is not None:
                written.append(stage.write_partition(changes, 0))
            return stage.commit(written)
        except BaseException:
            stage.drop(written)
            raise

    # ----------------------------------------------------------------- checks
    def _check_columns(self, names: Sequence[str], batch_id: int) -> None:
        cols = list(self.schema.names)
        missing = [c for c in cols + [KIND_COL, SEQ_COL] if c not in set(names)]
        extra = [c for c in names if c not in cols and c not in METADATA_COLUMNS]
        if missing or extra:
            raise ValueError(f"batch {batch_id} columns do not match the changelog schema {cols}: "
                             f"missing {missing}, unexpected {extra}")

    def _checked_arrow(self, changes: pa.Table, batch_id: int
                       ) -> "tuple[pa.Table, np.ndarray, np.ndarray]":
        """A batch (or a partition of one) -> (its data columns in the sink's
        schema, ``_kind`` codes, ``_seq``), every error naming the batch and the row."""
        self._check_columns(changes.column_names, batch_id)
        kinds = changes[KIND_COL]
        bad = pc.invert(pc.fill_null(pc.is_in(kinds, value_set=pa.array([0, 1, 2, 3], kinds.type)), False))
        if pc.any(bad).as_py():
            i = int(np.flatnonzero(bad.to_numpy(zero_copy_only=False))[0])
            raise ValueError(f"invalid {KIND_COL} value {kinds[i].as_py()!r} in row {i} of batch "
                             f"{batch_id} (expected 0=+I, 1=-U, 2=+U, 3=-D)")
        if changes[SEQ_COL].null_count:
            i = int(np.flatnonzero(pc.is_null(changes[SEQ_COL]).to_numpy(zero_copy_only=False))[0])
            raise ValueError(f"null {SEQ_COL} in row {i} of batch {batch_id}")
        data = changes.select(list(self.schema.names))
        if data.schema.remove_metadata() != self.schema.remove_metadata():
            try:
                data = data.cast(self.schema, safe=True)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
                raise ValueError(f"batch {batch_id} does not convert to the changelog schema "
                                 f"{self.schema}: {e}") from e
        return (data.replace_schema_metadata(None), kinds.to_numpy().astype(np.int64),
                changes[SEQ_COL].to_numpy().astype(np.int64))


class StagedChangelog:
    """One batch of a :class:`ChangelogSink`: part files written by the
    executors, one commit by the driver (module docstring, "Layout").
    Picklable: it travels to the executors with the sink (path, format, key,
    schema) and the attempt's name, chosen on the driver."""

    def __init__(self, sink: ChangelogSink, query_id: Optional[str], batch_id: int):
        self.sink, self.query_id, self.batch_id = sink, query_id, batch_id
        self.attempt = uuid.uuid4().hex[:16]

    @property
    def batch_dir(self) -> Path:
        return self.sink.path / _batch_name(self.batch_id)

    # ------------------------------------------------------------- executors
    def write_partition(self, changes: pa.Table, partition: int) -> dict:
        """The partition's changes (every change of its keys, in arrival order)
        -> its part file, in emission order; what the driver gets back: the
        file's name (``None`` for no rows) and its counts."""
        s = self.sink
        out = {"partition": int(partition), "file": None, "rows": 0}
        if changes.num_rows == 0:
            return out
        data, kinds, seqs = s._checked_arrow(changes, self.batch_id)
        order = _emission_order(data, kinds, seqs, s.key)
        data, kinds, seqs = data.take(order), kinds[order], seqs[order]
        name = f"{self.attempt}/part-{int(partition):05d}.{_EXT[s.format]}"
        target = self.batch_dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if s.format == "parquet":
            ops = pc.take(_OP_NAMES, pa.array(kinds))     # no Python string per row
            table = data.append_column(OP_COL, ops).append_column(SEQ_COL, pa.array(seqs, pa.int64()))
            _atomic_write(target, lambda p: pq.write_table(table, p))
        else:
            lines = _debezium_lines(data, kinds, seqs, s.key)
            payload = "".join(line + "\n" for line in lines).encode("utf-8")
            _atomic_write(target, lambda p: p.write_bytes(payload))
            out["events"] = len(lines)
        out.update(file=name, rows=data.num_rows)
        return out

    def drop(self, written: list[dict]) -> None:
        """The batch failed before its commit: delete this attempt's files
        (named by the attempt, so also those of tasks whose result never came)."""
        shutil.rmtree(self.batch_dir / self.attempt, ignore_errors=True)
        if self.batch_dir.is_dir() and not any(self.batch_dir.iterdir()):
            self.batch_dir.rmdir()

    # ---------------------------------------------------------------- driver
    def commit(self, written: list[dict]) -> dict:
        """Make the batch visible: ``_commit.json`` listing the parts replaces
        any earlier attempt's in one rename; then the files no commit lists any
        more (earlier attempts, the old layout's file of this batch id) are
        deleted.  An empty batch removes the batch instead."""
        path, batch_dir = self.sink.path, self.batch_dir
        legacy = _legacy_files(path, self.batch_id)
        existed = (batch_dir / COMMIT_FILE).exists() or bool(legacy)
        parts = sorted((w for w in written if w.get("file")), key=lambda w: w["partition"])
        rows = sum(w["rows"] for w in parts)
        result = {"batch_id": self.batch_id, "rows": rows, "file": None, "overwrote": existed,
                  "parts": len(parts)}
        if self.sink.format == "json":
            result["events"] = sum(w.get("events", 0) for w in parts)
        if rows == 0:
            if (batch_dir / COMMIT_FILE).exists():
                (batch_dir / COMMIT_FILE).unlink()       # first: the batch is gone at once
            shutil.rmtree(batch_dir, ignore_errors=True)
            for f in legacy:
                f.unlink()
            return result
        lost = [w["file"] for w in parts if not (batch_dir / w["file"]).is_file()]
        if lost:
            raise RuntimeError(f"changelog batch {self.batch_id}: part file(s) {lost} under "
                               f"{batch_dir} are missing at commit; the batch is not committed "
                               "(is the changelog directory on a path every executor and the "
                               "driver share?)")
        manifest = {"batch_id": self.batch_id, "query_id": self.query_id, "attempt": self.attempt,
                    "format": self.sink.format, "key": list(self.sink.key), "rows": rows,
                    "parts": [{k: w[k] for k in ("file", "partition", "rows")} for w in parts]}
        payload = json.dumps(manifest, indent=1).encode("utf-8")
        _atomic_write(batch_dir / COMMIT_FILE, lambda p: p.write_bytes(payload))
        # committed: what follows only tidies up (and must not fail the batch)
        with contextlib.suppress(OSError):
            for entry in batch_dir.iterdir():
                if entry.is_dir() and entry.name != self.attempt:
                    shutil.rmtree(entry, ignore_errors=True)
            listed = {Path(w["file"]).name for w in parts}
            for entry in (batch_dir / self.attempt).iterdir():
                if entry.name not in listed:    # a killed task's temporary file
                    entry.unlink()
            for f in legacy:
                f.unlink()
        result["file"] = str(batch_dir)
        return result


def _emission_order(data: pa.Table, kinds: np.ndarray, seqs: np.ndarray,
                    key: tuple[str, ...]) -> np.ndarray:
    """Row positions in emission order: ``_seq``, the key, retraction first,
    arrival."""
    cols = {"__seq": pa.array(seqs, pa.int64())}
    for i, k in enumerate(key):
        cols[f"__key{i}"] = data[k]
    cols["__add"] = pa.array(IS_ADD[kinds].astype(np.int8))
    cols["__pos"] = pa.array(np.arange(data.num_rows, dtype=np.int64))
    t = pa.table(cols)
    return pc.sort_indices(t, sort_keys=[(c, "ascending", "at_end") for c in t.column_names]).to_numpy()


def _debezium_lines(data: pa.Table, kinds: np.ndarray, seqs: np.ndarray,
                    key: tuple[str, ...]) -> list[str]:
    rows = data.to_pylist()
    keys = [tuple(r[k] for k in key) for r in rows] if key else None
    lines: list[str] = []

    def event(before, after, op, seq):
        return json.dumps({"before": before, "after": after, "op": op, "source": {"lsn": int(seq)}},
                          default=_json_default, ensure_ascii=False)

    i, n = 0, len(rows)
    while i < n:
        k = kinds[i]
        if k == RowKind.INSERT:
            lines.append(event(None, rows[i], "c", seqs[i]))
        elif k == RowKind.DELETE:
            lines.append(event(rows[i], None, "d", seqs[i]))
        elif k == RowKind.UPDATE_BEFORE:
            if (keys is not None and i + 1 < n and kinds[i + 1] == RowKind.UPDATE_AFTER
                    and seqs[i + 1] == seqs[i] and keys[i + 1] == keys[i]):
                lines.append(event(rows[i], rows[i + 1], "u", seqs[i]))
                i += 1
            else:
                lines.append(event(rows[i], None, "u", seqs[i]))
        else:
            lines.append(event(None, rows[i], "u", seqs[i]))
        i += 1
    return lines


# ---------------------------------------------------------------------- reading
def _read_schema(path: Path) -> Optional[pa.Schema]:
    f = path / SCHEMA_FILE
    if not f.exists():
        return None
    return pa.ipc.read_schema(pa.py_buffer(f.read_bytes()))


def _read_commit(batch_dir: Path) -> Optional[dict]:
    try:
        return json.loads((batch_dir / COMMIT_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


def _batch_sources(path: Path) -> list[tuple[int, Path]]:
    """(batch id, its committed directory or old-layout file), by batch id; a
    directory without a commit (an attempt that did not finish) is not a batch,
    and a committed directory wins over an old-layout file of the same id."""
    found: dict[int, Path] = {}
    legacy: dict[int, Path] = {}
    for name in os.listdir(path):
        m = _DIR_RE.match(name)
        if m and (path / name / COMMIT_FILE).exists():
            found[int(m.group(1))] = path / name
            continue
        m = _LEGACY_RE.match(name)
        if m:
            legacy[int(m.group(1))] = path / name
    for batch_id, f in legacy.items():
        found.setdefault(batch_id, f)
    return sorted(found.items())


def _stored_formats(path: Path) -> list[tuple[str, str]]:
    """(name, file extension) of what ``path`` holds: old-layout files, and
    the newest committed batch directory."""
    out, newest = [], None
    for name in os.listdir(path):
        m = _LEGACY_RE.match(name)
        if m:
            out.append((name, m.group(2)))
        elif _DIR_RE.match(name) and (newest is None or name > newest) \
                and (path / name / COMMIT_FILE).exists():
            newest = name
    if newest is not None:
        commit = _read_commit(path / newest)
        if commit is not None:
            out.append((newest, commit["format"]))
    return out


def committed_batches(path: "str | os.PathLike") -> list[tuple[int, list[Path]]]:
    """(batch id, its files in partition order) of every committed batch of
    the changelog output ``path``, by batch id: what a reader other than
    :func:`read_changelog` reads (each file in emission order; the batch's
    order is their merge, module docstring)."""
    path = Path(path)
    out = []
    for batch_id, source in _batch_sources(path):
        if source.is_file():
            out.append((batch_id, [source]))
            continue
        commit = _read_commit(source)
        if commit is not None:
            out.append((batch_id, [source / p["file"] for p in commit["parts"]]))
    return out


def _parse_debezium(file: Path, schema: pa.Schema) -> pa.Table:
    cols = schema.names
    values: dict[str, list] = {c: [] for c in cols}
    ops: list[str] = []
    seqs: list[int] = []

    def add(row, op, seq):
        for c in cols:
            values[c].append(row.get(c))
        ops.append(op)
        seqs.append(seq)

    with open(file, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            ev = json.loads(line)
            op, before, after = ev.get("op"), ev.get("before"), ev.get("after")
            seq = (ev.get("source") or {}).get("lsn")
            if op in ("c", "r"):
                add(after, "+I", seq)
            elif op == "d":
                add(before, "-D", seq)
            elif op == "u":
                if before is None and after is None:
                    raise ValueError(f"{file}:{lineno}: 'u' event without before and after")
                if before is not None:
                    add(before, "-U", seq)
                if after is not None:
                    add(after, "+U", seq)
            else:
                raise ValueError(f"{file}:{lineno}: unknown Debezium op {op!r}")
    arrays = [_array_from_json(values[c], schema.field(c).type) for c in cols]
    return pa.Table.from_arrays(arrays + [pa.array(ops, pa.string()), pa.array(seqs, pa.int64())],
                                names=cols + [OP_COL, SEQ_COL])


def _read_file(f: Path, schema: Optional[pa.Schema]) -> pa.Table:
    return pq.read_table(f) if f.suffix == ".parquet" else _parse_debezium(f, schema)


def _read_batch_dir(batch_dir: Path, schema: Optional[pa.Schema]) -> Optional[pa.Table]:
    """A committed batch's rows in emission order: its parts merged by
    (``_seq``, key, retraction first, part, position); ``None`` when the
    batch is gone (an empty replay removed it meanwhile)."""
    for _ in range(_READ_TRIES):
        commit = _read_commit(batch_dir)
        if commit is None:
            return None
        try:
            parts = [_read_file(batch_dir / p["file"], schema) for p in commit["parts"]]
        except FileNotFoundError:
            continue        # a replay's commit replaced this one meanwhile: read that
        if len(parts) == 1:
            return parts[0]
        table = pa.concat_tables(parts)
        t = {"__seq": table[SEQ_COL]}
        for i, k in enumerate(commit.get("key") or ()):
            t[f"__key{i}"] = table[k]
        t["__add"] = pc.cast(pc.is_in(table[OP_COL], value_set=pa.array(["+I", "+U"])), pa.int8())
        t["__part"] = pa.array(np.repeat(np.arange(len(parts)), [p.num_rows for p in parts]))
        t["__row"] = pa.array(np.concatenate([np.arange(p.num_rows) for p in parts]))
        keys = pa.table(t)
        return table.take(pc.sort_indices(keys, sort_keys=[(c, "ascending", "at_end")
                                                           for c in keys.column_names]))
    raise RuntimeError(f"changelog batch {batch_dir}: its files kept changing while being read "
                       f"({_READ_TRIES} tries); is a query replaying it right now?")


def is_changelog_output(path: "str | os.PathLike") -> bool:
    """``path`` is a directory this sink wrote (its ``_schema.arrow``)."""
    return (Path(path) / SCHEMA_FILE).is_file()


def read_changelog_arrow(path: "str | os.PathLike") -> pa.Table:
    """:func:`read_changelog` as Arrow, the values as written: the data
    columns, ``op``, ``_seq`` and ``_batch``."""
    path = Path(path)
    schema = _read_schema(path)
    tables = []
    for batch_id, source in _batch_sources(path):
        t = _read_file(source, schema) if source.is_file() else _read_batch_dir(source, schema)
        if t is not None:
            tables.append(t.append_column(BATCH_COL, pa.array(np.full(len(t), batch_id, np.int64))))
    if schema is None:  # nothing was ever written
        schema = pa.schema([])
    if not tables:
        empty = schema.empty_table()
        tables = [empty.append_column(OP_COL, pa.array([], pa.string()))
                  .append_column(SEQ_COL, pa.array([], pa.int64()))
                  .append_column(BATCH_COL, pa.array([], pa.int64()))]
    return pa.concat_tables(tables)


def read_changelog(path: "str | os.PathLike") -> pd.DataFrame:
    """All rows written under ``path``, ordered by batch id then emission order.

    Columns: the data columns (integers and booleans as pandas' nullable
    dtypes), ``op`` (``+I``/``-U``/``+U``/``-D``), ``_kind`` (int8 code),
    ``_seq`` (int64) and ``_batch`` (int64, the batch id).  Only committed
    batches are read (a batch being written or replayed is read whole, as
    it was or as it is after, never half), in the old layout as in the new.
    """
    if _read_schema(Path(path)) is None:  # nothing was ever written
        return pd.DataFrame({OP_COL: pd.Series([], dtype=str), KIND_COL: np.array([], np.int8),
                             SEQ_COL: np.array([], np.int64), BATCH_COL: np.array([], np.int64)})
    table = read_changelog_arrow(path)
    meta = {SEQ_COL: table.column(SEQ_COL).to_numpy(), BATCH_COL: table.column(BATCH_COL).to_numpy()}
    df = table.drop_columns([SEQ_COL, BATCH_COL]).to_pandas(types_mapper=_nullable_types)
    df[KIND_COL] = df[OP_COL].map(_OP_TO_KIND).to_numpy(dtype=np.int8)
    df[SEQ_COL] = np.asarray(meta[SEQ_COL], dtype=np.int64)
    df[BATCH_COL] = np.asarray(meta[BATCH_COL], dtype=np.int64)
    return df.reset_index(drop=True)
