"""Upsert sink into a PostgreSQL table (psycopg 3).

One micro-batch is one transaction:

1. reduce the batch to the net change per primary key (:func:`net_changes_per_key`);
2. ``BEGIN``; lock the progress row of ``(query_id, sink table)`` with
   ``SELECT ... FOR UPDATE`` (created first if missing, so that two writers of
   the same query serialize on it); if ``batch_id`` is not newer than the recorded
   one the batch is a replay: nothing is written and ``skipped_replay`` is true;
3. upserts: ``COPY`` (CSV written by Arrow, vectorized) into a temporary table,
   then one ``INSERT ... SELECT ... ON CONFLICT (pk) DO UPDATE``; deletes: ``COPY``
   of the keys into a second temporary table, then one ``DELETE ... USING``;
4. record ``batch_id`` in the progress row; ``COMMIT``.

A reader sees the whole batch or nothing.  When the connection breaks (or the
server reports a transient failure: ``OperationalError``, which includes
serialization failures and deadlocks) anywhere before the commit returned, the
sink reconnects and runs the whole transaction again, with exponential backoff,
up to ``max_retries`` times.  If the break hit the ``COMMIT`` itself and it did
commit, the retry finds the batch id recorded and reports the batch as applied
(not as a replay): with the progress row in the same transaction as the data,
every ``(query_id, batch_id)`` is applied exactly once.

The progress table (default ``spark_changelog_progress``) holds one row per
``(query_id, sink_table)``; ``sink_table`` is the target's schema-qualified name,
so one query may feed several tables.

``write_batch`` returns ``batch_id``, ``upserted`` (= ``inserted`` + ``updated``, rows
written), ``unchanged`` (net upserts equal to the stored row: the ``DO UPDATE`` has a
``WHERE ... IS DISTINCT FROM`` and does not rewrite them), ``deleted`` (rows removed),
``missing_deletes`` (net retractions of absent keys), ``skipped_replay``, ``committed``
and ``retries`` (the key names of the Delta sink, plus ``unchanged``/``retries``).

Decisions
---------
* Two writers of the same ``(query_id, sink_table)`` (a zombie and a restarted
  query) are serialized by the progress row lock: the second finds the batch
  recorded and skips it.  Other writers of the target table are not excluded.
* Empty batches still run the transaction and record their batch id.
* pandas input: ``NaN`` in a float column is a missing value and becomes ``NULL``
  (Spark's ``toPandas`` turns ``NULL`` into ``NaN``); nanosecond timestamps are
  truncated to microseconds (PostgreSQL's and Spark's resolution).
* Each value is converted with the sink's Arrow schema; the temporary tables take
  the *target's* column types, so an existing table with other (compatible) types
  works.  Retries reuse the encoded CSV, only the SQL is run again.
"""
from __future__ import annotations

import io
import logging
import time
from typing import Callable, Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from ..model import KIND_COL, METADATA_COLUMNS, SEQ_COL
from ..model.rowkind import IS_ADD
from .base import UpsertSink, net_changes_per_key

log = logging.getLogger(__name__)

try:  # psycopg is a dependency, but keep the import error readable
    import psycopg
    from psycopg import sql
except ImportError as _e:  # pragma: no cover
    raise ImportError("spark_changelog.sinks.postgres needs psycopg 3 (pip install 'psycopg[binary]')") from _e

#: rows per COPY chunk (one Arrow CSV encode + one ``copy.write`` each)
COPY_CHUNK_ROWS = 100_000
#: ANALYZE the temporary tables from this many rows on (a good join plan for DELETE ... USING)
ANALYZE_FROM_ROWS = 10_000


# --------------------------------------------------------------------------------------
# Arrow <-> PostgreSQL types
# --------------------------------------------------------------------------------------

def pg_type_for(arrow_type: pa.DataType) -> str:
    """PostgreSQL column type for an Arrow type (used when the sink creates the table)."""
    t = arrow_type
    if pa.types.is_dictionary(t):
        return pg_type_for(t.value_type)
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_uint8(t):
        return "smallint"
    if pa.types.is_int32(t) or pa.types.is_uint16(t):
        return "integer"
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return "bigint"
    if pa.types.is_uint64(t):
        return "numeric(20,0)"
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return "real"
    if pa.types.is_float64(t):
        return "double precision"
    if pa.types.is_decimal(t):
        if t.precision <= 1000:
            return f"numeric({t.precision},{t.scale})"
        return "numeric"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "text"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) \
            or pa.types.is_binary_view(t):
        return "bytea"
    if pa.types.is_timestamp(t):
        return "timestamp with time zone" if t.tz is not None else "timestamp without time zone"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_time(t):
        return "time without time zone"
    if pa.types.is_duration(t):
        return "interval"
    if pa.types.is_null(t):
        return "text"
    raise TypeError(f"no PostgreSQL column type for Arrow type {t} (supported: integers, floats, decimal, "
                    "boolean, string, binary, date, time, timestamp[tz], duration)")


_DURATION_TO_US = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": None}


def _csv_ready(arr: pa.ChunkedArray | pa.Array) -> pa.Array | pa.ChunkedArray:
    """Make a column writable by Arrow's CSV writer in a form PostgreSQL's COPY parses."""
    t = arr.type
    if pa.types.is_dictionary(t):
        return _csv_ready(arr.cast(t.value_type))
    if pa.types.is_string_view(t):
        return arr.cast(pa.string())
    if pa.types.is_float16(t):
        return arr.cast(pa.float32())
    if pa.types.is_null(t):
        return arr.cast(pa.string())
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) \
            or pa.types.is_binary_view(t):
        # bytea text input: \x + hex digits
        values = arr.to_pylist()
        return pa.array([None if v is None else "\\x" + bytes(v).hex() for v in values], pa.string())
    if pa.types.is_duration(t):
        ints = arr.cast(pa.int64())
        factor = _DURATION_TO_US[t.unit]
        us = pc.divide(ints, 1000) if factor is None else pc.multiply(ints, factor)
        return pc.binary_join_element_wise(us.cast(pa.string()), pa.scalar(" microseconds"), "")
    return arr


def _to_arrow(df: pd.DataFrame, fields: Sequence[pa.Field]) -> pa.Table:
    """The columns of ``df`` as Arrow arrays of the schema's types."""
    arrays = []
    for f in fields:
        col = df[f.name]
        try:
            arr = pa.array(col, type=f.type, from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
            inferred = pa.array(col, from_pandas=True)
            try:
                arr = inferred.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                if pa.types.is_timestamp(f.type) or pa.types.is_time(f.type):
                    arr = inferred.cast(f.type, safe=False)  # PostgreSQL keeps microseconds anyway
                else:
                    raise ValueError(f"column {f.name!r}: cannot convert {col.dtype} values to {f.type} "
                                     "(the sink's Arrow schema)") from None
        arrays.append(arr)
    return pa.Table.from_arrays(arrays, names=[f.name for f in fields])


def _nullable_dtype(t: pa.DataType):
    """Integers and booleans as pandas' nullable dtypes (a null never turns a bigint into a
    float), the same choice as the Delta sink's ``read_table``."""
    if pa.types.is_integer(t):
        return pd.api.types.pandas_dtype(
            {8: "Int8", 16: "Int16", 32: "Int32", 64: "Int64"}[t.bit_width] if pa.types.is_signed_integer(t)
            else {8: "UInt8", 16: "UInt16", 32: "UInt32", 64: "UInt64"}[t.bit_width])
    if pa.types.is_boolean(t):
        return pd.BooleanDtype()
    return None


def _csv_chunks(table: pa.Table, chunk_rows: int = COPY_CHUNK_ROWS) -> list[bytes]:
    """CSV for ``COPY ... (FORMAT csv)``: every non-null value quoted (so an empty string is
    not NULL and a lone ``\\.`` is not the end-of-data marker), nulls as empty fields."""
    if table.num_rows == 0:
        return []
    table = pa.Table.from_arrays([_csv_ready(table.column(i)) for i in range(table.num_columns)],
                                 names=table.column_names)
    opts = pacsv.WriteOptions(include_header=False, quoting_style="all_valid")
    out = []
    for start in range(0, table.num_rows, chunk_rows):
        buf = io.BytesIO()
        pacsv.write_csv(table.slice(start, chunk_rows), buf, opts)
        out.append(buf.getvalue())
    return out


def _parse_table_name(name: "str | Sequence[str]") -> tuple[str, ...]:
    if isinstance(name, str):
        parts = tuple(name.split("."))
    else:
        parts = tuple(name)
    if not 1 <= len(parts) <= 2 or not all(parts):
        raise ValueError(f"table name {name!r}: expected 'table' or 'schema.table' "
                         "(pass a tuple (schema, table) for names containing dots)")
    return parts


# --------------------------------------------------------------------------------------
# the sink
# --------------------------------------------------------------------------------------

class PostgresUpsertSink(UpsertSink):
    """Applies net changes per primary key to a PostgreSQL table, exactly once per
    ``(query_id, batch_id)``.

    Parameters
    ----------
    conninfo:
        libpq connection string (``"host=... port=... dbname=... user=..."`` or a URI).
    table:
        ``"table"``, ``"schema.table"`` or a tuple ``(schema, table)``.
    key:
        primary key columns (a list, or ``"a,b"``).
    schema:
        Arrow schema of the data columns (no ``_kind``/``_seq``).
    create:
        create the table (with ``PRIMARY KEY``) if it does not exist; otherwise a missing
        table is an error.  An existing table must have exactly ``key`` as primary key and
        all schema columns.
    progress_table:
        where ``(query_id, sink_table) -> batch_id`` is kept (created if missing).
    max_retries, backoff_s:
        retries of a failed batch transaction after a connection loss / transient error;
        the n-th retry waits ``backoff_s * 2**(n-1)`` seconds (capped at 30 s).
    on_stage:
        testing hook ``f(stage, connection)`` called inside the batch transaction at the
        stages ``"locked"``, ``"upserted"``, ``"deleted"``, ``"before_commit"`` (:attr:`STAGES`),
        and at ``"after_commit"`` once the ``COMMIT`` returned.  An ``OperationalError`` raised
        by it is handled like a connection loss at that point.

    The constructor connects, creates or validates the tables, and keeps the connection;
    one sink is not meant to be used from several threads at once.
    """

    STAGES = ("locked", "upserted", "deleted", "before_commit")

    def __init__(self, conninfo: str, table: "str | Sequence[str]", key: "str | Sequence[str]",
                 schema: pa.Schema, create: bool = True, progress_table: "str | Sequence[str]" = "spark_changelog_progress",
                 max_retries: int = 5, backoff_s: float = 0.2, *,
                 connect_timeout_s: float = 10.0,
                 on_stage: Optional[Callable[[str, "psycopg.Connection"], None]] = None):
        from ..model import as_key

        self.conninfo = conninfo
        self.table_parts = _parse_table_name(table)
        self.progress_parts = _parse_table_name(progress_table)
        self.key = as_key(key)
        if not isinstance(schema, pa.Schema):
            raise TypeError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
        self.schema = schema
        self.columns = tuple(schema.names)
        if len(set(self.columns)) != len(self.columns):
            raise ValueError(f"duplicate column names in schema: {list(self.columns)}")
        clash = [c for c in self.columns if c in METADATA_COLUMNS]
        if clash:
            raise ValueError(f"column name(s) {clash} are reserved for changelog metadata")
        if not self.key:
            raise ValueError("an upsert sink needs a primary key")
        missing = [k for k in self.key if k not in self.columns]
        if missing:
            raise ValueError(f"key column(s) {missing} not in schema columns {list(self.columns)}")
        if len(set(self.key)) != len(self.key):
            raise ValueError(f"duplicate key columns: {list(self.key)}")
        self.value_columns = tuple(c for c in self.columns if c not in self.key)
        self.pg_types = {f.name: pg_type_for(f.type) for f in schema}  # fails early on unsupported types
        self.create = create
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.connect_timeout_s = connect_timeout_s
        self.on_stage = on_stage
        self._conn: Optional[psycopg.Connection] = None
        self.sink_table: Optional[str] = None  # schema-qualified name, resolved by _ensure_tables
        self._run_with_retries(self._ensure_tables, "prepare tables")

    # -- identifiers ---------------------------------------------------------
    @property
    def _target(self) -> sql.Identifier:
        return sql.Identifier(*self.table_parts)

    @property
    def _progress(self) -> sql.Identifier:
        return sql.Identifier(*self.progress_parts)

    @staticmethod
    def _idents(names: Sequence[str], prefix: Optional[str] = None) -> sql.Composed:
        if prefix is None:
            return sql.SQL(", ").join(sql.Identifier(n) for n in names)
        return sql.SQL(", ").join(sql.Identifier(prefix, n) for n in names)

    # -- connection / retries --------------------------------------------------
    def _connection(self) -> "psycopg.Connection":
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._drop_connection()
            conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=int(self.connect_timeout_s),
                                   application_name="spark_changelog.PostgresUpsertSink")
            conn.execute("SET TimeZone TO 'UTC'")
            conn.execute("SET client_encoding TO 'UTF8'")
            self._conn = conn
        return self._conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # already broken
                pass

    def _run_with_retries(self, fn: Callable[["psycopg.Connection", int], object], what: str):
        attempt = 0
        while True:
            try:
                return fn(self._connection(), attempt)
            except psycopg.OperationalError as e:
                self._drop_connection()
                if attempt >= self.max_retries:
                    e.add_note(f"spark_changelog: {what} failed after {attempt + 1} attempt(s) "
                               f"({self.max_retries} retries)")
                    raise
                attempt += 1
                delay = min(self.backoff_s * 2 ** (attempt - 1), 30.0)
                log.warning("PostgreSQL %s failed (%s: %s); retry %d/%d in %.2fs", what, type(e).__name__,
                            str(e).strip().splitlines()[0] if str(e).strip() else "", attempt,
                            self.max_retries, delay)
                time.sleep(delay)
            except BaseException:
                # a non-transient error: the transaction was rolled back by its context manager;
                # do not keep a connection in an unknown state
                if self._conn is not None and (self._conn.broken or self._conn.info.transaction_status
                                               != psycopg.pq.TransactionStatus.IDLE):
                    self._drop_connection()
                raise

    def close(self) -> None:
        self._drop_connection()

    def __getstate__(self) -> dict:
        # picklable (e.g. captured by a Spark closure): the connection is reopened lazily
        state = dict(self.__dict__)
        state["_conn"] = None
        return state

    def __enter__(self) -> "PostgresUpsertSink":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- DDL -----------------------------------------------------------------
    def _ensure_tables(self, conn: "psycopg.Connection", attempt: int) -> None:
        with conn.transaction():
            # serialize concurrent creators (CREATE TABLE IF NOT EXISTS can race on pg_type)
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('spark_changelog.sinks.postgres.ddl'))")
            self._ensure_progress_table(conn)
            self._ensure_target_table(conn)

    def _regclass(self, conn, parts: Sequence[str]) -> Optional[int]:
        name = sql.Identifier(*parts).as_string(conn)
        return conn.execute("SELECT to_regclass(%s)::oid", (name,)).fetchone()[0]

    def _columns_of(self, conn, oid: int) -> dict[str, str]:
        rows = conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (oid,)).fetchall()
        return dict(rows)

    def _primary_key_of(self, conn, oid: int) -> Optional[tuple[str, ...]]:
        rows = conn.execute(
            "SELECT a.attname FROM pg_index i "
            "CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
            "WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.ord", (oid,)).fetchall()
        return tuple(r[0] for r in rows) or None

    def _qualified_name(self, conn, oid: int) -> str:
        return conn.execute("SELECT format('%%I.%%I', n.nspname, c.relname) FROM pg_class c "
                            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s",
                            (oid,)).fetchone()[0]

    def _ensure_progress_table(self, conn) -> None:
        oid = self._regclass(conn, self.progress_parts)
        if oid is None:
            conn.execute(sql.SQL(
                "CREATE TABLE {} (query_id text NOT NULL, sink_table text NOT NULL, batch_id bigint NOT NULL, "
                "updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (query_id, sink_table))"
            ).format(self._progress))
            return
        cols = self._columns_of(conn, oid)
        pk = self._primary_key_of(conn, oid)
        if not {"query_id", "sink_table", "batch_id"} <= set(cols) or set(pk or ()) != {"query_id", "sink_table"}:
            raise ValueError(f"progress table {'.'.join(self.progress_parts)} exists but is not a "
                             "spark_changelog progress table (need columns query_id, sink_table, batch_id "
                             f"and PRIMARY KEY (query_id, sink_table); found columns {list(cols)}, primary key {pk})")

    def _ensure_target_table(self, conn) -> None:
        name = ".".join(self.table_parts)
        oid = self._regclass(conn, self.table_parts)
        if oid is None:
            if not self.create:
                raise ValueError(f"table {name} does not exist (and create=False)")
            coldefs = [sql.SQL("{} {}{}").format(sql.Identifier(c), sql.SQL(self.pg_types[c]),
                                                 sql.SQL(" NOT NULL") if c in self.key else sql.SQL(""))
                       for c in self.columns]
            conn.execute(sql.SQL("CREATE TABLE {} ({}, PRIMARY KEY ({}))").format(
                self._target, sql.SQL(", ").join(coldefs), self._idents(self.key)))
            oid = self._regclass(conn, self.table_parts)
        else:
            pk = self._primary_key_of(conn, oid)
            if pk is None:
                raise ValueError(f"table {name} exists but has no PRIMARY KEY; the sink key is {list(self.key)}")
            if set(pk) != set(self.key):
                raise ValueError(f"table {name} has PRIMARY KEY {list(pk)} but the sink key is {list(self.key)}")
            cols = self._columns_of(conn, oid)
            missing = [c for c in self.columns if c not in cols]
            if missing:
                raise ValueError(f"table {name} lacks column(s) {missing} of the sink schema "
                                 f"(table columns: {list(cols)})")
        self.sink_table = self._qualified_name(conn, oid)

    # -- batches -------------------------------------------------------------
    def _check_batch(self, changes: pd.DataFrame, query_id: str, batch_id: int) -> None:
        if not isinstance(query_id, str) or not query_id:
            raise ValueError(f"query_id must be a non-empty string, got {query_id!r}")
        if isinstance(batch_id, bool) or not isinstance(batch_id, (int, np.integer)) or batch_id < 0:
            raise ValueError(f"batch_id must be an integer >= 0, got {batch_id!r}")
        expected = set(self.columns) | set(METADATA_COLUMNS)
        missing = [c for c in (*self.columns, *METADATA_COLUMNS) if c not in changes.columns]
        extra = [c for c in changes.columns if c not in expected]
        if missing or extra:
            raise ValueError(f"batch columns {list(changes.columns)} do not match the sink: "
                             f"missing {missing}, unexpected {extra}")
        if changes[SEQ_COL].isna().any():
            pos = int(np.flatnonzero(changes[SEQ_COL].isna().to_numpy())[0])
            raise ValueError(f"null {SEQ_COL} at row {pos} (index {changes.index[pos]!r}) of batch {batch_id}")
        for col in self.key:
            nulls = changes[col].isna().to_numpy()
            if nulls.any():
                pos = int(np.flatnonzero(nulls)[0])
                row = changes.iloc[pos].to_dict()
                raise ValueError(f"null value in primary key column {col!r} at row {pos} (index "
                                 f"{changes.index[pos]!r}) of batch {batch_id} of query {query_id!r}, "
                                 f"{int(nulls.sum())} such row(s) in all; first one: {row}. Route rows "
                                 "with a null key to the dead-letter output before the sink.")
        if len(changes):
            kinds = changes[KIND_COL].to_numpy()
            bad = (pd.isna(changes[KIND_COL]).to_numpy()) | ~np.isin(kinds, [0, 1, 2, 3])
            if bad.any():
                pos = int(np.flatnonzero(bad)[0])
                raise ValueError(f"invalid {KIND_COL} value {kinds[pos]!r} at row {pos} (expected 0..3)")

    def write_batch(self, changes: pd.DataFrame, *, query_id: str, batch_id: int) -> dict:
        self._check_batch(changes, query_id, batch_id)
        batch_id = int(batch_id)
        net = net_changes_per_key(changes, self.key)
        if len(net):
            is_add = IS_ADD[net[KIND_COL].to_numpy(dtype=np.int64)]
        else:
            is_add = np.zeros(0, dtype=bool)
        adds, dels = net[is_add], net[~is_add]
        fields = [self.schema.field(c) for c in self.columns]
        upsert_csv = _csv_chunks(_to_arrow(adds, fields)) if len(adds) else []
        delete_csv = _csv_chunks(_to_arrow(dels, [f for f in fields if f.name in self.key])) if len(dels) else []
        state: dict = {"commit_sent": None}

        def attempt_batch(conn: "psycopg.Connection", attempt: int) -> dict:
            sent = state["commit_sent"]  # counts of the last attempt that sent COMMIT, if any
            result = {"batch_id": batch_id, "upserted": 0, "inserted": 0, "updated": 0, "unchanged": 0,
                      "deleted": 0, "missing_deletes": 0, "skipped_replay": False, "committed": False,
                      "retries": attempt}
            with conn.transaction():
                recorded = self._lock_progress(conn, query_id)
                if batch_id <= recorded:
                    if sent is not None and recorded == batch_id:
                        # the COMMIT of an earlier attempt went through before the connection broke
                        log.info("batch %d of %s was committed by attempt %d", batch_id, query_id, attempt - 1)
                        return dict(sent, retries=attempt)
                    return dict(result, skipped_replay=True, last_batch_id=recorded)
                self._stage("locked", conn)
                if upsert_csv:
                    inserted, updated = self._apply_upserts(conn, upsert_csv, len(adds))
                    result.update(inserted=inserted, updated=updated, upserted=inserted + updated,
                                  unchanged=len(adds) - inserted - updated)
                self._stage("upserted", conn)
                if delete_csv:
                    deleted = self._apply_deletes(conn, delete_csv, len(dels))
                    result.update(deleted=deleted, missing_deletes=len(dels) - deleted)
                self._stage("deleted", conn)
                conn.execute(sql.SQL("UPDATE {} SET batch_id = %s, updated_at = now() "
                                     "WHERE query_id = %s AND sink_table = %s").format(self._progress),
                             (batch_id, query_id, self.sink_table))
                self._stage("before_commit", conn)
                result["committed"] = True
                state["commit_sent"] = result
            self._stage("after_commit", conn)
            return result

        return self._run_with_retries(attempt_batch, f"batch {batch_id} of query {query_id!r}")

    def _stage(self, stage: str, conn) -> None:
        if self.on_stage is not None:
            self.on_stage(stage, conn)

    def _lock_progress(self, conn, query_id: str) -> int:
        # the INSERT makes the row exist so that FOR UPDATE always has a row to lock; a concurrent
        # writer of the same key waits on the unique index until we commit
        conn.execute(sql.SQL("INSERT INTO {} (query_id, sink_table, batch_id) VALUES (%s, %s, -1) "
                             "ON CONFLICT (query_id, sink_table) DO NOTHING").format(self._progress),
                     (query_id, self.sink_table))
        row = conn.execute(sql.SQL("SELECT batch_id FROM {} WHERE query_id = %s AND sink_table = %s "
                                   "FOR UPDATE").format(self._progress), (query_id, self.sink_table)).fetchone()
        return int(row[0])

    def _copy_into_temp(self, conn, temp: str, cols: Sequence[str], chunks: list[bytes], nrows: int) -> sql.Identifier:
        tmp = sql.Identifier(temp)
        # the temp table takes the target's own column types, so COPY parses into exactly those
        conn.execute(sql.SQL("CREATE TEMPORARY TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA").format(
            tmp, self._idents(cols), self._target))
        with conn.cursor() as cur:
            with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(tmp, self._idents(cols))) as cp:
                for chunk in chunks:
                    cp.write(chunk)
        if nrows >= ANALYZE_FROM_ROWS:
            conn.execute(sql.SQL("ANALYZE {}").format(tmp))
        return tmp

    def _apply_upserts(self, conn, chunks: list[bytes], nrows: int) -> tuple[int, int]:
        """-> (rows inserted, rows updated); unchanged rows are not updated."""
        tmp = self._copy_into_temp(conn, "_spark_changelog_upserts", self.columns, chunks, nrows)
        return self._upsert_from(conn, tmp, sql.SQL(""))

    def _upsert_from(self, conn, source: sql.Identifier, where: sql.Composable) -> tuple[int, int]:
        """``INSERT ... SELECT`` the rows of ``source`` (``where``) into the
        target, ``ON CONFLICT`` on the key -> (rows inserted, rows updated)."""
        if self.value_columns:
            set_clause = sql.SQL(", ").join(
                sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in self.value_columns)
            # skip no-op updates (a replayed upstream change): no dead tuple, no WAL
            changed = sql.SQL("ROW({}) IS DISTINCT FROM ROW({})").format(
                self._idents(self.value_columns, "t"),
                sql.SQL(", ").join(sql.SQL("EXCLUDED.{}").format(sql.Identifier(c)) for c in self.value_columns))
            action = sql.SQL("DO UPDATE SET {} WHERE {}").format(set_clause, changed)
        else:
            action = sql.SQL("DO NOTHING")
        # xmax = 0 tells a freshly inserted row from an updated one
        row = conn.execute(sql.SQL(
            "WITH w AS (INSERT INTO {} AS t ({}) SELECT {} FROM {} {} ON CONFLICT ({}) {} "
            "RETURNING (t.xmax = 0) AS ins) "
            "SELECT count(*) FILTER (WHERE ins), count(*) FILTER (WHERE NOT ins) FROM w").format(
            self._target, self._idents(self.columns), self._idents(self.columns), source, where,
            self._idents(self.key), action)).fetchone()
        return int(row[0]), int(row[1])

    def _apply_deletes(self, conn, chunks: list[bytes], nrows: int) -> int:
        tmp = self._copy_into_temp(conn, "_spark_changelog_deletes", self.key, chunks, nrows)
        return self._delete_from(conn, tmp, sql.SQL(""))

    def _delete_from(self, conn, source: sql.Identifier, where: sql.Composable) -> int:
        """Delete the target's rows whose key is in ``source`` (``where``, on ``d``)."""
        cond = sql.SQL(" AND ").join(
            sql.SQL("t.{} = d.{}").format(sql.Identifier(k), sql.Identifier(k)) for k in self.key)
        cur = conn.execute(sql.SQL("DELETE FROM {} AS t USING {} AS d WHERE {} {}").format(
            self._target, source, cond, where))
        return cur.rowcount

    # -- distributed: staged by the executors, applied by the driver ----------
    def stage_batch(self, query_id: str, batch_id: int) -> "StagedBatch":
        """On the driver, before the sink writers run: the batch's staging
        table, created empty (a leftover of a crashed attempt is dropped first),
        or none when the batch is a replay (docs/sinks.md, "PostgreSQL: staged
        by the executors")."""
        if not isinstance(query_id, str) or not query_id:
            raise ValueError(f"query_id must be a non-empty string, got {query_id!r}")
        batch_id = int(batch_id)
        staged = StagedBatch(self, query_id, batch_id, replay=self.last_batch_id(query_id) >= batch_id)
        if not staged.replay:
            self._run_with_retries(staged.create, f"staging table of batch {batch_id}")
        return staged

    # -- reading -------------------------------------------------------------
    def last_batch_id(self, query_id: str) -> int:
        def read(conn, attempt):
            row = conn.execute(sql.SQL("SELECT batch_id FROM {} WHERE query_id = %s AND sink_table = %s").format(
                self._progress), (query_id, self.sink_table)).fetchone()
            return -1 if row is None else int(row[0])

        return self._run_with_retries(read, "last_batch_id")

    def read_rows(self) -> list[tuple]:
        """The table's rows (schema columns) as Python tuples, sorted by the key."""
        def read(conn, attempt):
            return conn.execute(sql.SQL("SELECT {} FROM {} ORDER BY {}").format(
                self._idents(self.columns), self._target, self._idents(self.key))).fetchall()

        return self._run_with_retries(read, "read")

    def read_table(self) -> pd.DataFrame:
        """The table (schema columns) as a DataFrame sorted by the key; columns are converted
        through the Arrow schema when the values fit it."""
        rows = self.read_rows()
        cols = list(zip(*rows)) if rows else [[] for _ in self.columns]
        arrays = []
        for f, values in zip(self.schema, cols):
            try:
                arrays.append(pa.array(list(values), type=f.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                arrays.append(pa.array(list(values)))
        return pa.Table.from_arrays(arrays, names=list(self.columns)).to_pandas(types_mapper=_nullable_dtype)


#: columns the staging table adds to the target's: the row is a net addition
#: (else a net retraction: only its key is set), and the Spark partition that wrote it
STAGE_ADD_COL, STAGE_PART_COL = "_spark_changelog_add", "_spark_changelog_part"


class StagedBatch:
    """One micro-batch written by the executors into its staging table and
    applied by the driver in one transaction (docs/sinks.md, "PostgreSQL:
    staged by the executors").  Picklable (the sink travels without its
    connection): :meth:`write_partition` runs on the executors.

    The staging table ``_spark_changelog_stage_<hash of query and table>_<batch>``
    is an ``UNLOGGED`` table in the target's schema with the target's column
    types.  A partition replaces its own rows in one transaction (under an
    advisory lock on (table, partition)), so a retried or speculative task
    attempt leaves exactly one copy of its partition.  :meth:`commit` locks
    the progress row; a replay drops the staging table and writes nothing;
    otherwise it upserts the net additions, deletes the net retractions,
    records the batch id and drops the staging table, all in one transaction,
    with the sink's retries."""

    def __init__(self, sink: "PostgresUpsertSink", query_id: str, batch_id: int, replay: bool):
        import hashlib
        self.sink, self.query_id, self.batch_id, self.replay = sink, query_id, batch_id, replay
        digest = hashlib.sha1(f"{query_id}\0{sink.sink_table}".encode()).hexdigest()[:16]
        self.table_name = f"_spark_changelog_stage_{digest}_{batch_id}"

    @property
    def _ident(self) -> sql.Identifier:
        parts = self.sink.table_parts
        return sql.Identifier(*(parts[:-1] + (self.table_name,)))

    def create(self, conn, attempt: int) -> None:
        s = self.sink
        with conn.transaction():
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._ident))
            conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} AS SELECT {} FROM {} WITH NO DATA").format(
                self._ident, s._idents(s.columns), s._target))
            conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} boolean NOT NULL, ADD COLUMN {} integer NOT NULL")
                         .format(self._ident, sql.Identifier(STAGE_ADD_COL), sql.Identifier(STAGE_PART_COL)))

    def drop(self, written: list[dict]) -> None:
        """Drop the staging table (a batch that failed before its commit)."""
        self.sink._run_with_retries(
            lambda conn, attempt: conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._ident)),
            f"drop staging table of batch {self.batch_id}")

    # -- on an executor ---------------------------------------------------------
    def write_partition(self, changes: pa.Table, partition: int) -> dict:
        """The net change per key of one partition's changes (every change of
        its keys is in it) -> ``COPY`` into the staging table, replacing what an
        earlier attempt of the same partition wrote.  Nothing for a replay."""
        s = self.sink
        if self.replay or changes.num_rows == 0:
            return {"adds": 0, "retracts": 0}
        from ..operators.kernels import arrow_key_arrays, last_change_per_key
        is_add = IS_ADD[changes[KIND_COL].to_numpy().astype(np.int64)]
        keep = last_change_per_key(arrow_key_arrays(changes, s.key),
                                   changes[SEQ_COL].to_numpy().astype(np.int64), is_add)
        net = changes.select(list(s.columns)).take(pa.array(keep))
        net_add = is_add[keep]
        # a retraction keeps only its key: its other columns are not written
        values = {c: net[c] if c in s.key else pc.if_else(pa.array(net_add), net[c], pa.nulls(len(net), net[c].type))
                  for c in s.columns}
        table = pa.table({**values, STAGE_ADD_COL: pa.array(net_add),
                          STAGE_PART_COL: pa.array(np.full(len(net), partition, dtype=np.int32))})
        fields = [s.schema.field(c) for c in s.columns]
        table = table.cast(pa.schema(fields + [pa.field(STAGE_ADD_COL, pa.bool_()),
                                               pa.field(STAGE_PART_COL, pa.int32())]))
        chunks = _csv_chunks(table)
        cols = (*s.columns, STAGE_ADD_COL, STAGE_PART_COL)

        def load(conn, attempt):
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s), %s)", (self.table_name, partition))
                conn.execute(sql.SQL("DELETE FROM {} WHERE {} = %s").format(
                    self._ident, sql.Identifier(STAGE_PART_COL)), (partition,))
                with conn.cursor() as cur:
                    with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
                            self._ident, s._idents(cols))) as cp:
                        for chunk in chunks:
                            cp.write(chunk)

        try:
            s._run_with_retries(load, f"staging partition {partition} of batch {self.batch_id}")
        finally:
            s.close()
        n_add = int(net_add.sum())
        return {"adds": n_add, "retracts": len(net) - n_add}

    # -- on the driver ----------------------------------------------------------
    def commit(self, written: list[dict]) -> dict:
        """Apply the staging table to the target in one transaction (or skip a
        replay) -> the sink's result counts (:meth:`PostgresUpsertSink.write_batch`)."""
        s = self.sink
        n_adds = sum(w.get("adds", 0) for w in written)
        n_dels = sum(w.get("retracts", 0) for w in written)
        state: dict = {"commit_sent": None}
        is_add = sql.SQL("WHERE {}").format(sql.Identifier(STAGE_ADD_COL))

        def attempt_batch(conn, attempt: int) -> dict:
            sent = state["commit_sent"]
            result = {"batch_id": self.batch_id, "upserted": 0, "inserted": 0, "updated": 0, "unchanged": 0,
                      "deleted": 0, "missing_deletes": 0, "skipped_replay": False, "committed": False,
                      "retries": attempt, "write": "staged"}
            with conn.transaction():
                recorded = s._lock_progress(conn, self.query_id)
                if self.batch_id <= recorded:
                    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._ident))
                    if sent is not None and recorded == self.batch_id:
                        return dict(sent, retries=attempt)
                    return dict(result, skipped_replay=True, last_batch_id=recorded, write=None)
                s._stage("locked", conn)
                if n_adds + n_dels >= ANALYZE_FROM_ROWS:
                    conn.execute(sql.SQL("ANALYZE {}").format(self._ident))
                if n_adds:
                    inserted, updated = s._upsert_from(conn, self._ident, is_add)
                    result.update(inserted=inserted, updated=updated, upserted=inserted + updated,
                                  unchanged=n_adds - inserted - updated)
                s._stage("upserted", conn)
                if n_dels:
                    deleted = s._delete_from(conn, self._ident, sql.SQL("AND NOT d.{}").format(
                        sql.Identifier(STAGE_ADD_COL)))
                    result.update(deleted=deleted, missing_deletes=n_dels - deleted)
                s._stage("deleted", conn)
                conn.execute(sql.SQL("UPDATE {} SET batch_id = %s, updated_at = now() "
                                     "WHERE query_id = %s AND sink_table = %s").format(s._progress),
                             (self.batch_id, self.query_id, s.sink_table))
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._ident))
                s._stage("before_commit", conn)
                result["committed"] = True
                state["commit_sent"] = result
            s._stage("after_commit", conn)
            return result

        return s._run_with_retries(attempt_batch, f"batch {self.batch_id} of query {self.query_id!r}")
