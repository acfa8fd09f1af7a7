"""PostgreSQL logical replication as a streaming changelog source
(docs/sources.md, "PostgreSQL CDC").

One source reads one table through one logical replication slot (``pgoutput``)
and one publication.  It is a Spark Python data source
(``pyspark.sql.datasource``): the stream reader runs in Spark's long-lived
planner process (offsets, slot, snapshot), its ``read`` in the tasks.

Offsets are ``{"lsn": <int>, "phase": "snapshot" | "stream"}``:

- ``initialOffset`` (a new query, ``scan.startup.mode = initial``) creates the
  slot over a replication connection with ``SNAPSHOT 'export'`` and keeps that
  connection open: the exported snapshot shows the tables exactly at the slot's
  consistent point.  Micro-batch 0 (``snapshot@X`` to ``stream@X``) reads the
  table in primary-key chunks, one task per chunk, each in that snapshot
  (``SET TRANSACTION SNAPSHOT``); each task also stages its chunk as an Arrow
  file, so a replay after a crash re-reads exactly the same rows once the
  exporting connection is gone.  A crash before every chunk was staged cannot
  have reached the sink: the slot is then dropped and the snapshot taken again.
- A streaming micro-batch ``(start, end]`` holds the transactions whose commit
  ends after ``start`` and at or before ``end``: ``latestOffset`` peeks the slot
  (``pg_logical_slot_peek_binary_changes``, decoded by the server, only the
  last commit LSN comes back) and ``read`` peeks it again up to ``end`` and
  decodes the changes (``connectors/pgoutput.py``).  Peeking consumes nothing;
  ``commit(end)`` -- called once Spark has committed the batch -- advances the
  slot (``pg_replication_slot_advance``), so a replayed batch re-reads the same
  transactions and nothing is lost or applied twice.  A transaction is never
  split: ``end`` is always a commit's end LSN.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
import time
from typing import Iterator, Optional

import pyarrow as pa

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, SupportsTriggerAvailableNow

from .pgoutput import ChangeDecoder, PgoutputError, lsn_text, parse_lsn, snapshot_seq

SOURCE_NAME = "postgres-cdc"

#: PostgreSQL type name -> (Arrow type, Spark SQL type); numeric is handled apart
_TYPES = {
    "int2": (pa.int16(), "SMALLINT"), "int4": (pa.int32(), "INT"), "int8": (pa.int64(), "BIGINT"),
    "float4": (pa.float32(), "FLOAT"), "float8": (pa.float64(), "DOUBLE"),
    "text": (pa.string(), "STRING"), "varchar": (pa.string(), "STRING"),
    "bpchar": (pa.string(), "STRING"), "name": (pa.string(), "STRING"),
    "json": (pa.string(), "STRING"), "jsonb": (pa.string(), "STRING"), "uuid": (pa.string(), "STRING"),
    "bool": (pa.bool_(), "BOOLEAN"), "date": (pa.date32(), "DATE"),
    "timestamp": (pa.timestamp("us"), "TIMESTAMP_NTZ"),
    "timestamptz": (pa.timestamp("us", tz="UTC"), "TIMESTAMP"),
    "bytea": (pa.binary(), "BINARY"),
}
#: the session the source reads in: text output the Arrow casts parse
_SESSION = ("SET TimeZone = 'UTC'", "SET DateStyle = 'ISO, YMD'", "SET extra_float_digits = 3",
            "SET bytea_output = 'hex'")
#: transient server errors retried with backoff (a restarting server, a slot
#: still held by the backend of a killed reader)
_RETRYABLE_SQLSTATES = {"55006", "57P01", "57P02", "57P03", "08000", "08003", "08006", "08001"}


class PostgresCdcError(RuntimeError):
    """A configuration or server problem of the PostgreSQL CDC source, said plainly."""


class NoReplicationPrivilege(PostgresCdcError):
    """The user may not open a replication connection (to create a slot)."""


@dataclasses.dataclass(frozen=True)
class Column:
    name: str
    pg_type: str        # format_type(), e.g. numeric(10,2)
    arrow: pa.DataType
    spark: str


@dataclasses.dataclass(frozen=True)
class SourceConfig:
    """The source's options (Flink CDC's names in ``options()``) and what the
    driver read from the catalog."""

    hostname: str
    port: int
    username: str
    database: str
    schema_name: str
    table_name: str
    slot_name: str
    publication: str
    startup_mode: str = "initial"
    columns: tuple = ()              # (name, format_type) pairs
    key: tuple = ()
    full_identity: bool = False
    chunk_size: int = 8096
    max_changes_per_batch: int = 200_000
    max_retries: int = 3
    retry_backoff_ms: int = 1000
    staging_dir: str = ""

    @property
    def table(self) -> str:
        return f"{quote_ident(self.schema_name)}.{quote_ident(self.table_name)}"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "SourceConfig":
        d = json.loads(text)
        d["columns"] = tuple(tuple(c) for c in d["columns"])
        d["key"] = tuple(d["key"])
        return cls(**d)

    def arrow_schema(self) -> pa.Schema:
        cols = [pa.field(n, map_type(self.table, n, t).arrow) for n, t in self.columns]
        return pa.schema(cols + [pa.field("_kind", pa.int8()), pa.field("_seq", pa.int64())])

    def spark_schema(self) -> str:
        cols = [f"`{n}` {map_type(self.table, n, t).spark}" for n, t in self.columns]
        return ", ".join(cols + ["_kind TINYINT", "_seq BIGINT"])


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def map_type(table: str, column: str, pg_type: str) -> Column:
    """The Spark/Arrow type of a PostgreSQL column; an unsupported type is an
    error naming the column (docs/sources.md, "Types")."""
    base = pg_type.split("(")[0].strip()
    aliases = {"smallint": "int2", "integer": "int4", "bigint": "int8", "real": "float4",
               "double precision": "float8", "character varying": "varchar", "character": "bpchar",
               "boolean": "bool", "timestamp without time zone": "timestamp",
               "timestamp with time zone": "timestamptz"}
    if base.startswith("timestamp") and "with time zone" in pg_type and "without" not in pg_type:
        base = "timestamptz"
    elif base.startswith("timestamp"):
        base = "timestamp"
    base = aliases.get(base, base)
    if base == "numeric":
        inner = pg_type[pg_type.find("(") + 1:pg_type.find(")")] if "(" in pg_type else ""
        if not inner:
            raise PostgresCdcError(f"table {table}, column {column!r}: numeric without precision "
                                   "and scale has no exact Spark type; declare it numeric(p,s) with "
                                   "p <= 38")
        p, _, s = inner.partition(",")
        p, s = int(p), int(s or 0)
        if p > 38:
            raise PostgresCdcError(f"table {table}, column {column!r}: numeric({p},{s}) exceeds "
                                   "Spark's DECIMAL precision 38")
        return Column(column, pg_type, pa.decimal128(p, s), f"DECIMAL({p},{s})")
    if base not in _TYPES or pg_type.endswith("[]"):
        raise PostgresCdcError(
            f"table {table}, column {column!r}: type {pg_type} is not supported by the CDC source "
            f"(supported: smallint, integer, bigint, numeric(p,s), real, double precision, text, "
            "varchar, char, boolean, date, timestamp, timestamptz, json, jsonb, bytea, uuid); "
            "cast it in a view-free way by changing the column or leave the table out")
    arrow, spark = _TYPES[base]
    return Column(column, pg_type, arrow, spark)


# --------------------------------------------------------------------------- connections


def connect(cfg: SourceConfig, password: Optional[str], *, replication: bool = False,
            autocommit: bool = True):
    """A psycopg connection with the source's session settings; credentials and
    unreachable servers are clear errors."""
    import psycopg
    kw = dict(host=cfg.hostname, port=cfg.port, user=cfg.username, dbname=cfg.database,
              connect_timeout=10, application_name=f"spark-changelog {cfg.slot_name}")
    if password:
        kw["password"] = password
    if replication:
        kw["replication"] = "database"
    try:
        conn = psycopg.connect(autocommit=autocommit, **kw)
    except psycopg.OperationalError as err:
        text = str(err).strip()
        if "password authentication failed" in text or "no password supplied" in text or \
                "role" in text and "does not exist" in text:
            raise PostgresCdcError(f"PostgreSQL at {cfg.hostname}:{cfg.port} refused user "
                                   f"{cfg.username!r}: {text}; check 'username'/'password'") from err
        if replication and "replication role" in text:
            raise NoReplicationPrivilege(text) from err
        if "database" in text and "does not exist" in text:
            raise PostgresCdcError(f"PostgreSQL at {cfg.hostname}:{cfg.port}: {text}; check "
                                   "'database-name'") from err
        raise
    if not replication:
        for stmt in _SESSION:
            conn.execute(stmt)
    return conn


def retrying(cfg: SourceConfig, what: str, fn):
    """Run ``fn()`` (which opens its own connection), retrying transient server
    errors with exponential backoff; then a clear error naming the server and
    what was being done (nothing of the micro-batch was committed)."""
    import psycopg
    delay = cfg.retry_backoff_ms / 1000.0
    started = time.monotonic()
    for attempt in range(cfg.max_retries + 1):
        try:
            return fn()
        except psycopg.OperationalError as err:
            if isinstance(err, psycopg.errors.ObjectNotInPrerequisiteState) and \
                    "is active for PID" not in str(err):
                raise
            if err.sqlstate not in _RETRYABLE_SQLSTATES and err.sqlstate is not None:
                raise
            last = err
        if attempt < cfg.max_retries:
            time.sleep(delay)
            delay *= 2
    raise PostgresCdcError(
        f"PostgreSQL at {cfg.hostname}:{cfg.port} (database {cfg.database!r}) is unreachable: "
        f"{what} failed {cfg.max_retries + 1} times over {time.monotonic() - started:.1f} s "
        f"(last error: {' '.join(str(last).split())}); the micro-batch was not committed: restart the query "
        "from its checkpoint once the server is back, it resumes where it stopped") from last


# --------------------------------------------------------------------------- driver side


def describe_table(cfg: SourceConfig, password: Optional[str]) -> SourceConfig:
    """Validate the server and the table and fill in columns, key and replica
    identity from the catalog (docs/sources.md, "Requirements")."""
    with connect(cfg, password) as conn:
        wal_level = conn.execute("SHOW wal_level").fetchone()[0]
        if wal_level != "logical":
            raise PostgresCdcError(
                f"PostgreSQL at {cfg.hostname}:{cfg.port} has wal_level = {wal_level}; logical "
                "decoding needs wal_level = logical: run ALTER SYSTEM SET wal_level = logical "
                "(and make max_replication_slots and max_wal_senders at least 1) and restart "
                "the server")
        row = conn.execute(
            "SELECT c.oid, c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = "
            "c.relnamespace WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
            (cfg.schema_name, cfg.table_name)).fetchone()
        if row is None:
            raise PostgresCdcError(f"table {cfg.schema_name}.{cfg.table_name} does not exist in "
                                   f"database {cfg.database!r}")
        oid, identity = row
        cols = conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid "
            "= %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (oid,)).fetchall()
        key = [r[0] for r in conn.execute(
            "SELECT a.attname FROM pg_index i, unnest(i.indkey) WITH ORDINALITY k(attnum, n) "
            "JOIN pg_attribute a ON a.attnum = k.attnum WHERE i.indrelid = %s AND i.indisprimary "
            "AND a.attrelid = %s ORDER BY k.n", (oid, oid)).fetchall()]
    table = f"{cfg.schema_name}.{cfg.table_name}"
    for name, pg_type in cols:
        map_type(table, name, pg_type)
    if not key:
        raise PostgresCdcError(
            f"table {table} has no primary key: the CDC source keys every change and splits the "
            f"snapshot by it; add one (ALTER TABLE {table} ADD PRIMARY KEY (...))")
    if identity == "n":
        raise PostgresCdcError(
            f"table {table} has REPLICA IDENTITY NOTHING: its updates and deletes carry no key; run "
            f"ALTER TABLE {table} REPLICA IDENTITY DEFAULT (or FULL for -U/+U rows)")
    if identity == "i":
        raise PostgresCdcError(
            f"table {table} has REPLICA IDENTITY USING INDEX: the CDC source keys changes by the "
            f"primary key; run ALTER TABLE {table} REPLICA IDENTITY DEFAULT (or FULL)")
    return dataclasses.replace(cfg, columns=tuple((n, t) for n, t in cols), key=tuple(key),
                               full_identity=identity == "f")


def ensure_publication(cfg: SourceConfig, password: Optional[str]) -> None:
    """The source's publication (``publication.name``, default ``<slot>_pub``)
    publishes exactly its table; created when missing."""
    with connect(cfg, password) as conn:
        rows = conn.execute(
            "SELECT p.puballtables, (SELECT count(*) FROM pg_publication_tables t WHERE "
            "t.pubname = p.pubname AND t.schemaname = %s AND t.tablename = %s) FROM "
            "pg_publication p WHERE p.pubname = %s",
            (cfg.schema_name, cfg.table_name, cfg.publication)).fetchone()
        if rows is None:
            conn.execute(f"CREATE PUBLICATION {quote_ident(cfg.publication)} FOR TABLE {cfg.table}")
        elif not rows[1]:
            raise PostgresCdcError(
                f"publication {cfg.publication!r} exists but does not publish {cfg.table}: run "
                f"ALTER PUBLICATION {quote_ident(cfg.publication)} ADD TABLE {cfg.table}, or "
                "name another one with 'publication.name'")


def slot_lag(cfg: SourceConfig, password: Optional[str]) -> dict:
    """The slot's position and how much WAL it holds on the server (bytes
    between the server's current WAL position and the slot's confirmed one)."""
    with connect(cfg, password) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text, pg_wal_lsn_diff(pg_current_wal_lsn(), "
            "confirmed_flush_lsn)::bigint, wal_status FROM pg_replication_slots WHERE slot_name = %s",
            (cfg.slot_name,)).fetchone()
    if row is None:
        return {"slot": cfg.slot_name, "exists": False}
    return {"slot": cfg.slot_name, "confirmed_lsn": row[0], "lag_bytes": int(row[1]),
            "wal_status": row[2]}


# --------------------------------------------------------------------------- the data source


class SnapshotChunk(InputPartition):
    def __init__(self, index: int, lower: Optional[list], upper: Optional[list], snapshot: str,
                 lsn: int, path: str):
        self.index, self.lower, self.upper = index, lower, upper
        self.snapshot, self.lsn, self.path = snapshot, lsn, path


class LogRange(InputPartition):
    def __init__(self, start: int, end: int):
        self.start, self.end = start, end


class PostgresCdcDataSource(DataSource):
    """``spark.readStream.format("postgres-cdc")``; options: ``config`` (the
    :class:`SourceConfig` as JSON) and ``password``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SourceConfig.from_json(self.options["config"]).spark_schema()

    def streamReader(self, schema) -> "PostgresCdcStreamReader":
        return PostgresCdcStreamReader(SourceConfig.from_json(self.options["config"]),
                                       self.options.get("password"))


class PostgresCdcStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The source's offsets, slot and snapshot (module docstring)."""

    def __init__(self, cfg: SourceConfig, password: Optional[str]):
        self.cfg = cfg
        self.password = password
        self._export = None           # (replication connection, snapshot name, consistent LSN)
        self._target: Optional[int] = None

    # -- slot --------------------------------------------------------------------
    def _slot(self, conn) -> Optional[tuple]:
        return conn.execute("SELECT confirmed_flush_lsn::text, plugin, database FROM "
                            "pg_replication_slots WHERE slot_name = %s",
                            (self.cfg.slot_name,)).fetchone()

    def _marker(self) -> str:
        return os.path.join(self.cfg.staging_dir, "slot.json")

    def _create_slot(self, export: bool) -> int:
        """Create the slot (over a replication connection, exporting its
        snapshot when ``export``); its consistent point."""
        import psycopg
        try:
            rconn = connect(self.cfg, self.password, replication=True)
        except NoReplicationPrivilege as err:
            raise self._no_privilege(err) from err
        try:
            cur = rconn.execute(
                f"CREATE_REPLICATION_SLOT {quote_ident(self.cfg.slot_name)} LOGICAL pgoutput "
                f"(SNAPSHOT '{'export' if export else 'nothing'}')")
            _, lsn, snapshot, _ = cur.fetchone()
        except psycopg.errors.InsufficientPrivilege as err:
            rconn.close()
            raise self._no_privilege(err) from err
        except BaseException:
            rconn.close()
            raise
        consistent = parse_lsn(lsn)
        os.makedirs(self.cfg.staging_dir, exist_ok=True)
        with open(self._marker(), "w") as f:
            json.dump({"slot": self.cfg.slot_name, "lsn": consistent}, f)
        if export:
            self._export = (rconn, snapshot, consistent)
        else:
            rconn.close()
        return consistent

    def _no_privilege(self, err) -> PostgresCdcError:
        return PostgresCdcError(
            f"user {self.cfg.username!r} may not create replication slot {self.cfg.slot_name!r} "
            f"({' '.join(str(err).split())}): grant it REPLICATION (ALTER ROLE "
            f"{self.cfg.username} REPLICATION; reading a slot needs it too), or have an "
            f"administrator create the slot, SELECT pg_create_logical_replication_slot("
            f"'{self.cfg.slot_name}', 'pgoutput'), and start with 'scan.startup.mode' = "
            "'latest-offset' as a user with REPLICATION")

    def _drop_slot(self, conn) -> None:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (self.cfg.slot_name,))

    def _owned_unused_slot(self, slot) -> bool:
        """The slot exists because this source created it for a query that
        never committed a batch (killed before its first offsets were logged)."""
        try:
            with open(self._marker()) as f:
                marker = json.load(f)
        except (OSError, ValueError):
            return False
        return marker.get("slot") == self.cfg.slot_name and parse_lsn(slot[0]) == marker.get("lsn")

    def initialOffset(self) -> dict:
        """``initial``: ``snapshot@0``; the slot is created (and its snapshot
        exported) when the snapshot micro-batch is planned, in the process that
        then holds the exporting connection; ``lsn`` 0 stands for the slot's
        consistent point.  ``latest-offset``: no snapshot; an existing slot
        streams from its confirmed position (what it kept since it was
        created), a missing one is created at the server's current position."""
        cfg = self.cfg
        if cfg.startup_mode == "initial":
            return {"lsn": 0, "phase": "snapshot"}

        def start_now():
            with connect(cfg, self.password) as conn:
                slot = self._slot(conn)
                self._check_plugin(slot)
                if slot is None:
                    return self._create_slot(export=False)
                return parse_lsn(slot[0])
        return {"lsn": retrying(cfg, "creating the replication slot", start_now), "phase": "stream"}

    def _check_plugin(self, slot) -> None:
        if slot is not None and slot[1] != "pgoutput":
            raise PostgresCdcError(f"replication slot {self.cfg.slot_name!r} uses plugin "
                                   f"{slot[1]!r}; the source decodes pgoutput: name another "
                                   "'slot.name'")

    def prepareForTriggerAvailableNow(self) -> None:
        def target():
            with connect(self.cfg, self.password) as conn:
                return parse_lsn(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
        self._target = retrying(self.cfg, "reading the WAL position", target)

    def latestOffset(self, start: dict, limit=None) -> dict:
        if start["phase"] == "snapshot":
            return {"lsn": start["lsn"], "phase": "stream"}
        cfg = self.cfg
        nchanges = None if isinstance(limit, ReadAllAvailable) and self._target is None \
            else cfg.max_changes_per_batch

        def peek():
            with connect(cfg, self.password) as conn:
                slot = self._slot(conn)
                if slot is None:
                    raise PostgresCdcError(
                        f"replication slot {cfg.slot_name!r} is gone: the changes after "
                        f"{lsn_text(start['lsn'])} cannot be read; start a new query (new "
                        "checkpoint) to take a new snapshot")
                if parse_lsn(slot[0]) < start["lsn"]:     # committed by Spark: release its WAL
                    conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)",
                                 (cfg.slot_name, lsn_text(start["lsn"])))
                upto = None if self._target is None else lsn_text(self._target)
                row = conn.execute(
                    "SELECT max(lsn)::text FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, "
                    "%s, 'proto_version', '1', 'publication_names', %s)",
                    (cfg.slot_name, upto, nchanges, cfg.publication)).fetchone()
                return parse_lsn(row[0]) if row[0] else start["lsn"]
        end = retrying(cfg, "peeking the replication slot", peek)
        return {"lsn": max(end, start["lsn"]), "phase": "stream"}

    def partitions(self, start: dict, end: dict):
        if start["phase"] == "snapshot":
            return self._snapshot_chunks(start)
        if end["lsn"] <= start["lsn"]:
            return []
        return [LogRange(start["lsn"], end["lsn"])]

    # -- snapshot --------------------------------------------------------------------
    def _plan_path(self) -> str:
        return os.path.join(self.cfg.staging_dir, "snapshot-plan.json")

    def _snapshot_chunks(self, start: dict) -> list:
        cfg = self.cfg
        try:
            with open(self._plan_path()) as f:
                plan = json.load(f)
        except (OSError, ValueError):
            plan = None
        if self._export is None:
            if plan is not None and all(os.path.exists(c["path"]) for c in plan["chunks"]):
                return [SnapshotChunk(c["index"], c["lower"], c["upper"], "", plan["lsn"], c["path"])
                        for c in plan["chunks"]]
            # first planned, or the exporting connection died with its process
            # before every chunk was staged (then the batch cannot have reached
            # the sink): create the slot and export its snapshot
            with connect(cfg, self.password) as conn:
                slot = self._slot(conn)
                self._check_plugin(slot)
                if slot is not None:
                    if not self._owned_unused_slot(slot):
                        raise PostgresCdcError(
                            f"replication slot {cfg.slot_name!r} already exists, and a new query "
                            "with 'scan.startup.mode' = 'initial' must create its own slot (the "
                            "snapshot is exported when the slot is created): drop it with SELECT "
                            f"pg_drop_replication_slot('{cfg.slot_name}'), name another "
                            "'slot.name', or start with 'latest-offset'")
                    self._drop_slot(conn)
            shutil.rmtree(cfg.staging_dir, ignore_errors=True)
            self._create_slot(export=True)
            plan = None
        _, snapshot, lsn = self._export
        if plan is None or plan.get("snapshot") != snapshot:
            plan = {"snapshot": snapshot, "lsn": lsn, "chunks": [
                {"index": i, "lower": lo, "upper": hi,
                 "path": os.path.join(cfg.staging_dir, f"chunk-{i:06d}.arrow")}
                for i, (lo, hi) in enumerate(self._chunk_bounds(snapshot))]}
            tmp = self._plan_path() + ".tmp"
            with open(tmp, "w") as f:
                json.dump(plan, f)
            os.replace(tmp, self._plan_path())
        return [SnapshotChunk(c["index"], c["lower"], c["upper"], snapshot, lsn, c["path"])
                for c in plan["chunks"]]

    def _chunk_bounds(self, snapshot: str) -> list:
        """Primary-key ranges of about ``chunk_size`` rows, read in the exported
        snapshot: ``(lower, upper]`` with ``None`` for open ends."""
        cfg = self.cfg
        key = ", ".join(quote_ident(k) for k in cfg.key)
        types = dict(cfg.columns)
        bounds, lower = [], None
        with connect(cfg, self.password, autocommit=False) as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            conn.execute(f"SET TRANSACTION SNAPSHOT '{snapshot}'")
            while True:
                where, params = _key_range(cfg, types, lower, None)
                row = conn.execute(
                    f"SELECT {', '.join(f'{quote_ident(k)}::text AS k{i}' for i, k in enumerate(cfg.key))} "
                    f"FROM {cfg.table} "
                    f"{where} ORDER BY {key} OFFSET %s LIMIT 1",
                    params + [cfg.chunk_size - 1]).fetchone()
                if row is None:
                    bounds.append((lower, None))
                    return bounds
                bounds.append((lower, list(row)))
                lower = list(row)

    def commit(self, end: dict) -> None:
        if end["phase"] != "stream":
            return
        if self._export is not None:
            self._export[0].close()
            self._export = None
        remove_staged_snapshot(self.cfg.staging_dir)
        if end["lsn"] == 0:
            return

        def advance():
            with connect(self.cfg, self.password) as conn:
                slot = self._slot(conn)
                if slot is not None and parse_lsn(slot[0]) < end["lsn"]:
                    conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)",
                                 (self.cfg.slot_name, lsn_text(end["lsn"])))
        retrying(self.cfg, "advancing the replication slot", advance)

    def stop(self) -> None:
        if self._export is not None:
            self._export[0].close()
            self._export = None

    # -- tasks -------------------------------------------------------------------------
    def read(self, partition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, SnapshotChunk):
            yield from read_chunk(self.cfg, self.password, partition)
        else:
            yield from read_log(self.cfg, self.password, partition)


def _key_range(cfg: SourceConfig, types: dict, lower, upper) -> tuple[str, list]:
    key = ", ".join(quote_ident(k) for k in cfg.key)
    typed = ", ".join(f"%s::{types[k]}" for k in cfg.key)
    conds, params = [], []
    if lower is not None:
        conds.append(f"({key}) > ({typed})")
        params += lower
    if upper is not None:
        conds.append(f"({key}) <= ({typed})")
        params += upper
    return ("WHERE " + " AND ".join(conds)) if conds else "", params


def read_chunk(cfg: SourceConfig, password: Optional[str], chunk: SnapshotChunk):
    """One snapshot chunk: from its staged file on a replay, else read in the
    exported snapshot and staged (written aside, then renamed) before it is
    returned."""
    schema = cfg.arrow_schema()
    if os.path.exists(chunk.path):
        with pa.ipc.open_file(chunk.path) as f:
            table = f.read_all()
        yield from table.to_batches()
        return
    types = dict(cfg.columns)
    where, params = _key_range(cfg, types, chunk.lower, chunk.upper)
    cols = ", ".join(f"{quote_ident(n)}::text" for n, _ in cfg.columns)
    with connect(cfg, password, autocommit=False) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute(f"SET TRANSACTION SNAPSHOT '{chunk.snapshot}'")
        rows = conn.execute(f"SELECT {cols} FROM {cfg.table} {where}", params).fetchall()
    from .pgoutput import text_to_arrow
    columns = list(zip(*rows)) if rows else [[] for _ in cfg.columns]
    arrays = [text_to_arrow(list(values), field.type, cfg.table, field.name)
              for values, field in zip(columns, schema)]
    arrays.append(pa.array([0] * len(rows), pa.int8()))
    arrays.append(pa.array([snapshot_seq(chunk.lsn)] * len(rows), pa.int64()))
    batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
    tmp = f"{chunk.path}.{os.getpid()}.tmp"
    with pa.ipc.new_file(tmp, schema) as w:
        w.write_batch(batch)
    os.replace(tmp, chunk.path)
    yield batch


def read_log(cfg: SourceConfig, password: Optional[str], part: LogRange,
             rows_per_batch: int = 50_000):
    """The transactions committed in ``(start, end]``, peeked from the slot
    and decoded; the slot must still hold all of them."""
    schema = cfg.arrow_schema()

    def peek():
        decoder = ChangeDecoder(cfg.table, list(cfg.columns), list(cfg.key), after_lsn=part.start)
        out = []
        with connect(cfg, password) as conn:
            slot = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                                "WHERE slot_name = %s", (cfg.slot_name,)).fetchone()
            if slot is None or parse_lsn(slot[0]) > max(part.start, slot_created_at(cfg)):
                raise PostgresCdcError(
                    f"replication slot {cfg.slot_name!r} "
                    + ("is gone" if slot is None else f"was advanced to {slot[0]}")
                    + f": the micro-batch ({lsn_text(part.start)}, {lsn_text(part.end)}] cannot be "
                    "read again; start a new query (new checkpoint) to take a new snapshot")
            with conn.cursor(binary=True) as cur:
                cur.execute("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, "
                            "NULL, 'proto_version', '1', 'publication_names', %s)",
                            (cfg.slot_name, lsn_text(part.end), cfg.publication))
                while True:
                    rows = cur.fetchmany(10_000)
                    if not rows:
                        break
                    for (data,) in rows:
                        decoder.feed(data)
                    if len(decoder) >= rows_per_batch:
                        out.append(decoder.take(schema))
        if decoder.last_commit_lsn != part.end:
            raise PostgresCdcError(
                f"replication slot {cfg.slot_name!r}: the micro-batch ({lsn_text(part.start)}, "
                f"{lsn_text(part.end)}] ended at {lsn_text(decoder.last_commit_lsn)} when read "
                "again; the slot no longer holds the same transactions")
        out.append(decoder.take(schema))
        return out
    try:
        batches = retrying(cfg, f"reading the replication slot {cfg.slot_name!r}", peek)
    except PgoutputError as err:
        raise PostgresCdcError(str(err)) from err
    yield from batches


def slot_created_at(cfg: SourceConfig) -> int:
    """The consistent point of the slot this source created (offset ``lsn`` 0
    stands for it), from the marker in the staging directory; 0 if none."""
    try:
        with open(os.path.join(cfg.staging_dir, "slot.json")) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return 0
    return int(marker["lsn"]) if marker.get("slot") == cfg.slot_name else 0


def remove_staged_snapshot(staging_dir: str) -> None:
    """Delete the staged chunks and their plan once the snapshot batch is
    committed (the slot marker stays)."""
    if not os.path.isdir(staging_dir):
        return
    for name in os.listdir(staging_dir):
        if name.startswith("chunk-") or name.startswith("snapshot-plan"):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(staging_dir, name))


def default_staging_dir(cfg: SourceConfig) -> str:
    return os.path.join(tempfile.gettempdir(), "spark-changelog-pgcdc",
                        f"{cfg.hostname}-{cfg.port}-{cfg.database}-{cfg.slot_name}")


# --------------------------------------------------------------------------- the reader


#: Flink CDC's option names -> SourceConfig fields (and the ones we add)
OPTIONS = {
    "hostname": "hostname", "port": "port", "username": "username", "password": None,
    "database-name": "database", "schema-name": "schema_name", "table-name": "table_name",
    "slot.name": "slot_name", "decoding.plugin.name": None, "scan.startup.mode": "startup_mode",
    "publication.name": "publication", "debezium.publication.name": "publication",
    "scan.incremental.snapshot.chunk.size": "chunk_size",
    "scan.max-changes-per-batch": "max_changes_per_batch",
    "connect.max-retries": "max_retries", "connect.retry-backoff-ms": "retry_backoff_ms",
    "snapshot.staging-dir": "staging_dir",
}
_INT_FIELDS = {"port", "chunk_size", "max_changes_per_batch", "max_retries", "retry_backoff_ms"}
REQUIRED = ("hostname", "username", "database-name", "table-name", "slot.name")


@dataclasses.dataclass
class PostgresCdcReader:
    """What ``read_postgres_cdc`` returns to the planner: the streaming rows
    and the stream's schema facts; ``progress()`` is the slot's lag for the
    run report."""

    rows: object
    stream_schema: object
    config: SourceConfig
    #: every micro-batch follows the log, so each key's changes arrive in
    #: ``_seq`` order (explain: ``ordered=[log]``, no risk note)
    log_ordered = True
    password: Optional[str] = dataclasses.field(default=None, repr=False)

    def progress(self) -> dict:
        return slot_lag(self.config, self.password)


def source_config(options: dict) -> tuple[SourceConfig, Optional[str]]:
    """Flink CDC style options (strings) -> the config and the password; an
    unknown or missing option is an error naming it."""
    opts = {str(k): v for k, v in options.items() if v is not None}
    unknown = sorted(k for k in opts if k not in OPTIONS)
    if unknown:
        raise PostgresCdcError(f"postgres-cdc: unknown option(s) {unknown}; supported: "
                               f"{sorted(OPTIONS)}")
    missing = [k for k in REQUIRED if k not in opts]
    if missing:
        raise PostgresCdcError(f"postgres-cdc: missing option(s) {missing}")
    plugin = str(opts.get("decoding.plugin.name", "pgoutput")).lower()
    if plugin != "pgoutput":
        raise PostgresCdcError(f"postgres-cdc: 'decoding.plugin.name' = {plugin!r} is not "
                               "supported; the source decodes 'pgoutput' (built into PostgreSQL 10+)")
    mode = str(opts.get("scan.startup.mode", "initial")).lower()
    if mode not in ("initial", "latest-offset"):
        raise PostgresCdcError(f"postgres-cdc: 'scan.startup.mode' = {mode!r}: expected 'initial' "
                               "or 'latest-offset'")
    fields = {"schema_name": "public", "port": 5432, "startup_mode": mode}
    for k, v in opts.items():
        field = OPTIONS[k]
        if field is None or field == "startup_mode":
            continue
        try:
            fields[field] = int(v) if field in _INT_FIELDS else str(v)
        except ValueError:
            raise PostgresCdcError(f"postgres-cdc: option {k!r} = {v!r} is not an integer") from None
    fields.setdefault("publication", f"{fields['slot_name']}_pub")
    cfg = SourceConfig(**fields)
    if not cfg.staging_dir:
        cfg = dataclasses.replace(cfg, staging_dir=default_staging_dir(cfg))
    password = opts.get("password")
    return cfg, None if password is None else str(password)


def read_postgres_cdc(spark, options: dict) -> PostgresCdcReader:
    """Validate the server and table, make sure the publication exists, and
    open the stream (docs/sources.md, "PostgreSQL CDC")."""
    from ..model import ChangelogMode, StreamSchema
    cfg, password = source_config(options)
    cfg = describe_table(cfg, password)
    ensure_publication(cfg, password)
    spark.dataSource.register(PostgresCdcDataSource)
    reader = spark.readStream.format(SOURCE_NAME).option("config", cfg.to_json())
    if password:
        reader = reader.option("password", password)
    df = reader.load()
    columns = tuple(n for n, _ in cfg.columns)
    mode = ChangelogMode.RETRACT if cfg.full_identity else ChangelogMode.UPSERT
    schema = StreamSchema(columns, tuple(cfg.key), tuple(cfg.key), mode)
    return PostgresCdcReader(df, schema, cfg, password)
