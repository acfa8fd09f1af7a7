"""Changelog sink: appends every emitted row with its kind and sequence.

For inspection and tests: where an upsert sink keeps only the current row of
each key, this sink keeps the changes themselves, batch by batch.

Layout of ``path``::

    _schema.arrow                   Arrow IPC schema of the data columns
    batch-00000000000000000007.parquet   (or .json), one file per batch id

One file per batch id, written to a hidden temporary file and renamed over the
final name, so a batch replayed after a crash replaces its own file instead of
duplicating its rows, and a reader never sees half a file.  An empty batch
removes its file if one exists (so a replay is still exact) and writes nothing.
One query per ``path``: the batch id alone names the file.

Row order inside a batch ("emission order"): rows are sorted by ``_seq``, then
by the key (when the sink knows one), then retractions before additions, then
arrival order.  Arrival order alone means nothing after a shuffle
(model.schema); ``_seq`` plus "retraction first at equal ``_seq``" is the order
in which the operators emitted them.  Grouping by key at equal ``_seq`` keeps
``-U``/``+U`` of one key adjacent.

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
import datetime as _dt
import decimal
import json
import os
import re
import uuid
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .base import check_kinds
from ..model import KIND_COL, METADATA_COLUMNS, SEQ_COL, RowKind, as_key
from ..model.rowkind import IS_ADD, SHORT_NAMES

__all__ = ["ChangelogSink", "read_changelog", "OP_COL", "BATCH_COL", "FORMATS"]

OP_COL = "op"
BATCH_COL = "_batch"
SCHEMA_FILE = "_schema.arrow"
FORMATS = {"parquet": "parquet", "debezium-json": "json", "debezium": "json", "json": "json"}
_EXT = {"parquet": "parquet", "json": "json"}
_FILE_RE = re.compile(r"^batch-(\d{20})\.(parquet|json)$")
_OP_TO_KIND = {"+I": 0, "-U": 1, "+U": 2, "-D": 3}


def _batch_file(batch_id: int, ext: str) -> str:
    return f"batch-{batch_id:020d}.{ext}"


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
    """Writes each micro-batch of a changelog to its own file under ``path``.

    ``schema`` (Arrow, data columns only) fixes the column types; without it the
    types of the first non-empty batch are inferred and stored in
    ``_schema.arrow``, and later batches are converted to them (so a bigint
    column that pandas turned into float64 because of nulls is written as int64).
    ``key`` (the upsert key of the stream) groups rows of one key at equal
    ``_seq`` and pairs ``-U``/``+U`` into one Debezium ``u`` event.
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
            clash = [c for c in self.schema.names if c in METADATA_COLUMNS or c in (OP_COL, BATCH_COL)]
            if clash:
                raise ValueError(f"column name(s) {clash} are reserved in a changelog sink")
            missing = [k for k in self.key if k not in self.schema.names]
            if missing:
                raise ValueError(f"key column(s) {missing} not among columns {self.schema.names}")
        self.path.mkdir(parents=True, exist_ok=True)
        other = [p.name for p in self.path.iterdir()
                 if _FILE_RE.match(p.name) and not p.name.endswith("." + _EXT[self.format])]
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

    def _store_schema(self) -> None:
        data = self.schema.serialize().to_pybytes()
        _atomic_write(self.path / SCHEMA_FILE, lambda p: p.write_bytes(data))

    def last_batch_id(self, query_id: Optional[str] = None) -> int:
        """The largest batch id with a file, or -1 (empty batches leave no file)."""
        ids = [int(m.group(1)) for m in map(_FILE_RE.match, os.listdir(self.path)) if m]
        return max(ids, default=-1)

    def write_batch(self, changes: pd.DataFrame, *, batch_id: int,
                    query_id: Optional[str] = None) -> dict:
        if isinstance(batch_id, bool) or not isinstance(batch_id, (int, np.integer)) or batch_id < 0:
            raise ValueError(f"batch_id must be an integer >= 0, got {batch_id!r}")
        batch_id = int(batch_id)
        target = self.path / _batch_file(batch_id, _EXT[self.format])
        existed = target.exists()
        result = {"batch_id": batch_id, "rows": int(len(changes)), "file": str(target),
                  "overwrote": existed}
        if len(changes) == 0:
            if existed:
                target.unlink()
            result["file"] = None
            return result

        missing = [c for c in (KIND_COL, SEQ_COL) if c not in changes.columns]
        if missing:
            raise ValueError(f"batch {batch_id} lacks changelog column(s) {missing}")
        if self.schema is None:
            data_cols = [c for c in changes.columns if c not in METADATA_COLUMNS]
            clash = [c for c in data_cols if c in (OP_COL, BATCH_COL)]
            if clash:
                raise ValueError(f"column name(s) {clash} are reserved in a changelog sink")
            missing = [k for k in self.key if k not in data_cols]
            if missing:
                raise ValueError(f"key column(s) {missing} not among columns {data_cols}")
            self.schema = pa.Schema.from_pandas(changes[data_cols], preserve_index=False) \
                .remove_metadata()
            self._store_schema()
        cols = list(self.schema.names)
        missing = [c for c in cols if c not in changes.columns]
        extra = [c for c in changes.columns if c not in cols and c not in METADATA_COLUMNS]
        if missing or extra:
            raise ValueError(f"batch {batch_id} columns do not match the changelog schema {cols}: "
                             f"missing {missing}, unexpected {extra}")
        check_kinds(changes, batch_id)

        ordered = _emission_order(changes, self.key)
        try:
            data = pa.Table.from_pandas(ordered[cols], schema=self.schema, preserve_index=False,
                                        safe=True).replace_schema_metadata(None)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            raise ValueError(f"batch {batch_id} does not convert to the changelog schema "
                             f"{self.schema}: {e}") from e
        kind_codes = ordered[KIND_COL].to_numpy(dtype=np.int64)
        seqs = ordered[SEQ_COL].to_numpy(dtype=np.int64)
        if self.format == "parquet":
            table = data.append_column(OP_COL, pa.array(SHORT_NAMES[kind_codes].tolist(), pa.string())) \
                .append_column(SEQ_COL, pa.array(seqs, pa.int64()))
            _atomic_write(target, lambda p: pq.write_table(table, p))
        else:
            lines = _debezium_lines(data, kind_codes, seqs, self.key)
            payload = "".join(line + "\n" for line in lines).encode("utf-8")
            _atomic_write(target, lambda p: p.write_bytes(payload))
            result["events"] = len(lines)
        return result


def _emission_order(changes: pd.DataFrame, key: tuple[str, ...]) -> pd.DataFrame:
    df = changes.copy()
    df["__add"] = IS_ADD[df[KIND_COL].to_numpy(dtype=np.int64)].astype(np.int8)
    df["__pos"] = np.arange(len(df))
    df = df.sort_values([SEQ_COL, *key, "__add", "__pos"], kind="stable", na_position="last")
    return df.drop(columns=["__add", "__pos"]).reset_index(drop=True)


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


def read_changelog(path: "str | os.PathLike") -> pd.DataFrame:
    """All rows written under ``path``, ordered by batch id then emission order.

    Columns: the data columns (integers and booleans as pandas' nullable
    dtypes), ``op`` (``+I``/``-U``/``+U``/``-D``), ``_kind`` (int8 code),
    ``_seq`` (int64) and ``_batch`` (int64, the batch id).
    """
    path = Path(path)
    schema = _read_schema(path)
    files = sorted((int(m.group(1)), path / m.group(0))
                   for m in map(_FILE_RE.match, os.listdir(path)) if m)
    tables = []
    for batch_id, f in files:
        t = pq.read_table(f) if f.suffix == ".parquet" else _parse_debezium(f, schema)
        tables.append(t.append_column(BATCH_COL, pa.array(np.full(len(t), batch_id, np.int64))))
    if schema is None:  # nothing was ever written
        return pd.DataFrame({OP_COL: pd.Series([], dtype=str), KIND_COL: np.array([], np.int8),
                             SEQ_COL: np.array([], np.int64), BATCH_COL: np.array([], np.int64)})
    if not tables:
        empty = schema.empty_table()
        tables = [empty.append_column(OP_COL, pa.array([], pa.string()))
                  .append_column(SEQ_COL, pa.array([], pa.int64()))
                  .append_column(BATCH_COL, pa.array([], pa.int64()))]
    table = pa.concat_tables(tables)
    meta = {SEQ_COL: table.column(SEQ_COL).to_numpy(), BATCH_COL: table.column(BATCH_COL).to_numpy()}
    df = table.drop_columns([SEQ_COL, BATCH_COL]).to_pandas(types_mapper=_nullable_types)
    df[KIND_COL] = df[OP_COL].map(_OP_TO_KIND).to_numpy(dtype=np.int8)
    df[SEQ_COL] = np.asarray(meta[SEQ_COL], dtype=np.int64)
    df[BATCH_COL] = np.asarray(meta[BATCH_COL], dtype=np.int64)
    return df.reset_index(drop=True)
