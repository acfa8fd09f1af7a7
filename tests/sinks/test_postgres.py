"""PostgresUpsertSink against a real PostgreSQL server (fixture ``pg_server``, tests/pgserver.py)."""
from __future__ import annotations

import datetime as dt
import decimal
import threading
import uuid

import pandas as pd
import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from spark_changelog.model import RowKind
from spark_changelog.sinks.postgres import PostgresUpsertSink

pytestmark = pytest.mark.postgres

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])


@pytest.fixture(scope="module")
def pg(pg_server):
    """conninfo of a database of this module's own."""
    return pg_server.create_database("test_postgres_sink")


@pytest.fixture
def table():
    return f"t_{uuid.uuid4().hex[:12]}"


def batch(rows, columns=("id", "name", "amount")):
    """rows: (kind, seq, *values) -> a changes frame (data columns + _kind + _seq)."""
    df = pd.DataFrame([r[2:] for r in rows], columns=list(columns))
    df["_kind"] = pd.array([int(RowKind.parse(r[0])) for r in rows], dtype="int8")
    df["_seq"] = pd.array([r[1] for r in rows], dtype="int64")
    return df


def terminate(conninfo: str, pid: int) -> None:
    """Kill a backend from a second connection and wait until it is gone."""
    with psycopg.connect(conninfo, autocommit=True) as c:
        assert c.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,)).fetchone()[0]


def progress_rows(conninfo, sink):
    with psycopg.connect(conninfo) as c:
        return c.execute("SELECT query_id, batch_id FROM spark_changelog_progress WHERE sink_table = %s "
                         "ORDER BY query_id", (sink.sink_table,)).fetchall()


# ---------------------------------------------------------------------------------------

# (batch rows, expected table after the batch)
BATCHES = [
    ([("+I", 1, 1, "a", 1.0), ("+I", 2, 2, "b", 2.0), ("+I", 3, 3, "c", 3.0)],
     [(1, "a", 1.0), (2, "b", 2.0), (3, "c", 3.0)]),
    # update 1 (retraction and addition at equal seq: the addition wins), delete 2, insert 4
    # twice (last by seq wins, arrival order irrelevant), delete of a key that never existed
    ([("+U", 5, 1, "a2", 10.0), ("-U", 5, 1, "a", 1.0), ("-D", 4, 2, "b", 2.0),
      ("+I", 7, 4, "d2", 40.0), ("+I", 6, 4, "d", 4.0), ("-D", 8, 99, None, None)],
     [(1, "a2", 10.0), (3, "c", 3.0), (4, "d2", 40.0)]),
    # a key deleted and re-added in one batch; a key added then deleted in one batch;
    # nulls in value columns
    ([("-D", 9, 3, "c", 3.0), ("+I", 10, 3, "c3", None), ("+I", 11, 5, "e", 5.0), ("-D", 12, 5, "e", 5.0),
      ("+U", 13, 1, None, 11.0)],
     [(1, None, 11.0), (3, "c3", None), (4, "d2", 40.0)]),
    # an empty batch still records its id
    ([], [(1, None, 11.0), (3, "c3", None), (4, "d2", 40.0)]),
    # delete everything, re-insert 2
    ([("-D", 20, 1, None, 11.0), ("-D", 21, 3, "c3", None), ("-D", 22, 4, "d2", 40.0), ("+I", 23, 2, "b2", 2.5)],
     [(2, "b2", 2.5)]),
]


def test_upserts_updates_deletes_over_batches(pg, table):
    sink = PostgresUpsertSink(pg, table, ["id"], SCHEMA)
    assert sink.last_batch_id("q") == -1
    for batch_id, (rows, expected) in enumerate(BATCHES):
        result = sink.write_batch(batch(rows), query_id="q", batch_id=batch_id)
        assert result["skipped_replay"] is False
        assert sink.read_rows() == expected, f"after batch {batch_id}"
        assert sink.last_batch_id("q") == batch_id
    df = sink.read_table()
    assert list(df.columns) == ["id", "name", "amount"]
    assert df.to_dict("records") == [{"id": 2, "name": "b2", "amount": 2.5}]
    sink.close()


def test_counts_are_net_changes_per_key(pg, table):
    sink = PostgresUpsertSink(pg, table, "id", SCHEMA)
    r = sink.write_batch(batch([("+I", 1, 1, "a", 1.0), ("+U", 2, 1, "b", 1.0), ("+I", 1, 2, "x", 0.0),
                                ("-D", 3, 2, "x", 0.0), ("-D", 1, 3, "y", 0.0), ("+I", 1, 4, "d", 4.0)]),
                         query_id="q", batch_id=0)
    assert r == {"batch_id": 0, "upserted": 2, "inserted": 2, "updated": 0, "unchanged": 0, "deleted": 0,
                 "missing_deletes": 2, "skipped_replay": False, "committed": True, "retries": 0}
    # key 1 updated, key 4 unchanged (same values: not rewritten), key 5 inserted, key 2 deleted
    r = sink.write_batch(batch([("+U", 5, 1, "c", 1.0), ("+U", 5, 4, "d", 4.0), ("+I", 5, 5, "e", 5.0),
                                ("+I", 5, 2, "x", 0.0), ("-D", 6, 2, "x", 0.0), ("-D", 6, 4, "d", 4.0),
                                ("+I", 7, 4, "d", 4.0)]), query_id="q", batch_id=1)
    assert r == {"batch_id": 1, "upserted": 2, "inserted": 1, "updated": 1, "unchanged": 1, "deleted": 0,
                 "missing_deletes": 1, "skipped_replay": False, "committed": True, "retries": 0}
    r = sink.write_batch(batch([("-D", 8, 4, "d", 4.0)]), query_id="q", batch_id=2)
    assert (r["deleted"], r["missing_deletes"], r["upserted"]) == (1, 0, 0)
    assert sink.read_rows() == [(1, "c", 1.0), (5, "e", 5.0)]
    r = sink.write_batch(batch([]), query_id="q", batch_id=2)
    assert r["skipped_replay"] is True and r["committed"] is False and r["last_batch_id"] == 2


def test_order_within_a_batch_does_not_matter(pg, table):
    rows = [("+I", 1, 1, "a", 1.0), ("-U", 2, 1, "a", 1.0), ("+U", 2, 1, "b", 2.0), ("-U", 3, 1, "b", 2.0),
            ("+U", 3, 1, "c", 3.0), ("+I", 1, 2, "x", 0.0), ("-D", 5, 2, "x", 0.0)]
    sink = PostgresUpsertSink(pg, table, "id", SCHEMA)
    sink.write_batch(batch(rows[::-1]), query_id="q", batch_id=0)
    assert sink.read_rows() == [(1, "c", 3.0)]


def test_replayed_batch_is_skipped(pg, table):
    sink = PostgresUpsertSink(pg, table, ["id"], SCHEMA)
    sink.write_batch(batch([("+I", 1, 1, "a", 1.0)]), query_id="q", batch_id=0)
    sink.write_batch(batch([("+U", 2, 1, "b", 2.0)]), query_id="q", batch_id=1)
    # replays (even with other content) change nothing
    for replay_id in (1, 0):
        r = sink.write_batch(batch([("-D", 3, 1, "b", 2.0), ("+I", 3, 7, "z", 7.0)]), query_id="q",
                             batch_id=replay_id)
        assert r["skipped_replay"] is True and r["upserted"] == 0 and r["deleted"] == 0
    assert sink.read_rows() == [(1, "b", 2.0)]
    assert sink.last_batch_id("q") == 1
    # another query id has its own progress
    r = sink.write_batch(batch([("+I", 1, 8, "h", 8.0)]), query_id="other", batch_id=0)
    assert r["skipped_replay"] is False
    # a new sink object (a restarted query) sees the recorded progress
    sink.close()
    sink2 = PostgresUpsertSink(pg, table, ["id"], SCHEMA)
    assert sink2.last_batch_id("q") == 1 and sink2.last_batch_id("other") == 0
    assert sink2.write_batch(batch([("-D", 9, 1, "b", 2.0)]), query_id="q", batch_id=1)["skipped_replay"]
    sink2.write_batch(batch([("-D", 9, 1, "b", 2.0)]), query_id="q", batch_id=2)
    assert sink2.read_rows() == [(8, "h", 8.0)]
    assert progress_rows(pg, sink2) == [("other", 0), ("q", 2)]


def test_sink_pickles_without_its_connection(pg, table):
    import pickle

    sink = PostgresUpsertSink(pg, table, "id", SCHEMA)
    sink.write_batch(batch([("+I", 1, 1, "a", 1.0)]), query_id="q", batch_id=0)
    clone = pickle.loads(pickle.dumps(sink))
    clone.write_batch(batch([("+U", 2, 1, "b", 2.0)]), query_id="q", batch_id=1)
    assert sink.read_rows() == [(1, "b", 2.0)] and sink.last_batch_id("q") == 1


def test_progress_is_per_sink_table(pg, table):
    a = PostgresUpsertSink(pg, table + "_a", "id", SCHEMA)
    b = PostgresUpsertSink(pg, table + "_b", "id", SCHEMA)
    a.write_batch(batch([("+I", 1, 1, "a", 1.0)]), query_id="q", batch_id=0)
    assert b.last_batch_id("q") == -1
    assert b.write_batch(batch([("+I", 1, 1, "b", 1.0)]), query_id="q", batch_id=0)["skipped_replay"] is False
    assert b.read_rows() == [(1, "b", 1.0)]


@pytest.mark.parametrize("stage", PostgresUpsertSink.STAGES)
def test_connection_loss_mid_batch_is_retried_exactly_once(pg, table, stage):
    calls = []

    def kill_first_time(s, conn):
        calls.append(s)
        if s == stage and calls.count(stage) == 1:
            terminate(pg, conn.info.backend_pid)

    sink = PostgresUpsertSink(pg, table, ["id"], SCHEMA, backoff_s=0.01)
    for batch_id, (rows, _) in enumerate(BATCHES[:2]):
        if batch_id == 1:
            sink.on_stage = kill_first_time
        result = sink.write_batch(batch(rows), query_id="q", batch_id=batch_id)
    assert result["retries"] == 1 and result["skipped_replay"] is False
    assert (result["inserted"], result["updated"], result["deleted"], result["missing_deletes"]) == (1, 1, 1, 1)
    assert calls.count(stage) == 2  # the whole transaction ran again
    assert sink.read_rows() == BATCHES[1][1]
    assert sink.last_batch_id("q") == 1
    # and a replay after the retry is still recognised
    assert sink.write_batch(batch(BATCHES[1][0]), query_id="q", batch_id=1)["skipped_replay"] is True


def test_lost_commit_acknowledgement_is_not_reported_as_replay(pg, table):
    """The COMMIT went through but the client saw the connection break: the retry finds the
    batch recorded, does not run it again, and reports it as applied."""
    calls = []

    def lose_ack(s, conn):
        calls.append(s)
        if s == "after_commit" and calls.count(s) == 1:
            terminate(pg, conn.info.backend_pid)
            raise psycopg.OperationalError("simulated: connection lost while reading the COMMIT result")

    sink = PostgresUpsertSink(pg, table, ["id"], SCHEMA, backoff_s=0.01, on_stage=lose_ack)
    result = sink.write_batch(batch(BATCHES[0][0]), query_id="q", batch_id=0)
    assert result["retries"] == 1 and result["skipped_replay"] is False and result["committed"] is True
    assert result["inserted"] == 3  # the counts of the attempt that committed
    assert calls.count("locked") == 1 and calls.count("after_commit") == 1
    assert sink.read_rows() == BATCHES[0][1]
    # a real replay later is reported as one
    assert sink.write_batch(batch(BATCHES[0][0]), query_id="q", batch_id=0)["skipped_replay"] is True


@pytest.mark.slow
def test_server_restart_mid_batch(table):
    """The whole server goes down inside the batch transaction and comes back a second later:
    the sink keeps reconnecting (connection refused is retried with backoff) and applies the
    batch once."""
    from pgserver import PgServer

    with PgServer() as server:
        restarter = []

        def down(s, conn):
            if s == "upserted" and not restarter:
                server.shutdown("immediate")
                t = threading.Timer(1.0, server.restart)
                restarter.append(t)
                t.start()

        sink = PostgresUpsertSink(server.conninfo, table, ["id"], SCHEMA, max_retries=6, backoff_s=0.1)
        sink.write_batch(batch(BATCHES[0][0]), query_id="q", batch_id=0)
        sink.on_stage = down
        result = sink.write_batch(batch(BATCHES[1][0]), query_id="q", batch_id=1)
        restarter[0].join()
        assert result["retries"] >= 2  # at least one attempt found the server down
        sink.on_stage = None
        assert sink.read_rows() == BATCHES[1][1]
        assert sink.last_batch_id("q") == 1
        sink.close()


def test_connection_loss_while_blocked_on_a_lock(pg, table):
    """No hook: the test holds a row lock, the sink's upsert waits on it, the test kills the
    sink's backend, releases the lock; the retry applies the batch once."""
    sink = PostgresUpsertSink(pg, table, ["id"], SCHEMA, backoff_s=0.05)
    sink.write_batch(batch(BATCHES[0][0]), query_id="q", batch_id=0)
    blocker = psycopg.connect(pg)
    blocker.execute(sql.SQL("SELECT * FROM {} WHERE id = 1 FOR UPDATE").format(sql.Identifier(table)))
    out = {}

    def run():
        try:
            out["result"] = sink.write_batch(batch(BATCHES[1][0]), query_id="q", batch_id=1)
        except BaseException as e:  # pragma: no cover - reported below
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    with psycopg.connect(pg, autocommit=True) as mon:
        for _ in range(200):
            pids = [r[0] for r in mon.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'spark_changelog.PostgresUpsertSink' "
                "AND wait_event_type = 'Lock'").fetchall()]
            if pids:
                break
            threading.Event().wait(0.05)
        assert len(pids) == 1, "the sink never blocked on the lock"
        # nothing of the open transaction is visible meanwhile
        assert mon.execute(sql.SQL("SELECT count(*) FROM {} WHERE id = 4").format(
            sql.Identifier(table))).fetchone()[0] == 0
        terminate(pg, pids[0])
    blocker.rollback()
    blocker.close()
    t.join(60)
    assert "error" not in out, out.get("error")
    assert out["result"]["retries"] == 1
    assert sink.read_rows() == BATCHES[1][1]
    assert sink.last_batch_id("q") == 1


def test_retries_exhausted_leaves_nothing_partial(pg, table):
    def always_kill(s, conn):
        if s == "deleted":
            terminate(pg, conn.info.backend_pid)

    sink = PostgresUpsertSink(pg, table, ["id"], SCHEMA, max_retries=2, backoff_s=0.01)
    sink.write_batch(batch(BATCHES[0][0]), query_id="q", batch_id=0)
    sink.on_stage = always_kill
    with pytest.raises(psycopg.OperationalError) as ei:
        sink.write_batch(batch(BATCHES[1][0]), query_id="q", batch_id=1)
    assert any("3 attempt(s)" in n for n in getattr(ei.value, "__notes__", []))
    sink.on_stage = None
    assert sink.read_rows() == BATCHES[0][1]
    assert sink.last_batch_id("q") == 0
    # the same batch, written again (as a restarted query would), applies once
    assert sink.write_batch(batch(BATCHES[1][0]), query_id="q", batch_id=1)["skipped_replay"] is False
    assert sink.read_rows() == BATCHES[1][1]


def test_concurrent_writers_of_one_batch_apply_it_once(pg, table):
    """Two sinks (e.g. a zombie and a restarted query) write the same (query_id, batch_id):
    the second waits on the progress row and then finds the batch recorded."""
    first_locked, release = threading.Event(), threading.Event()

    def hold(s, conn):
        if s == "locked":
            first_locked.set()
            release.wait(30)

    a = PostgresUpsertSink(pg, table, ["id"], SCHEMA, on_stage=hold)
    b = PostgresUpsertSink(pg, table, ["id"], SCHEMA)
    rows = [("+I", 1, 1, "a", 1.0)]
    results = {}
    ta = threading.Thread(target=lambda: results.__setitem__("a", a.write_batch(batch(rows), query_id="q", batch_id=0)))
    ta.start()
    assert first_locked.wait(30)
    tb = threading.Thread(target=lambda: results.__setitem__("b", b.write_batch(batch(rows), query_id="q", batch_id=0)))
    tb.start()
    tb.join(0.5)
    assert tb.is_alive(), "the second writer must wait for the first"
    release.set()
    ta.join(30)
    tb.join(30)
    assert results["a"]["skipped_replay"] is False
    assert results["b"]["skipped_replay"] is True
    assert a.read_rows() == [(1, "a", 1.0)]


# ---------------------------------------------------------------------------------------

TYPES_SCHEMA = pa.schema([
    ("k", pa.int64()),
    ("d", pa.float64()),
    ("s", pa.string()),
    ("b", pa.bool_()),
    ("ts", pa.timestamp("us")),
    ("tstz", pa.timestamp("us", tz="UTC")),
    ("num", pa.decimal128(12, 3)),
    ("i32", pa.int32()),
    ("i16", pa.int16()),
    ("f32", pa.float32()),
    ("day", pa.date32()),
    ("raw", pa.binary()),
    ("dur", pa.duration("us")),
])
EXPECTED_PG_TYPES = {
    "k": "bigint", "d": "double precision", "s": "text", "b": "boolean",
    "ts": "timestamp without time zone", "tstz": "timestamp with time zone", "num": "numeric(12,3)",
    "i32": "integer", "i16": "smallint", "f32": "real", "day": "date", "raw": "bytea", "dur": "interval",
}
UTC = dt.timezone.utc
TYPED_ROWS = [
    (1, 1.5, "plain", True, dt.datetime(2024, 1, 2, 3, 4, 5, 678901), dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
     decimal.Decimal("123456789.123"), 7, -3, 0.5, dt.date(2024, 2, 29), b"\x00\x01\xff", dt.timedelta(seconds=90)),
    (2, float("inf"), "", False, dt.datetime(1970, 1, 1), dt.datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
     decimal.Decimal("-0.001"), -2**31, 2**15 - 1, -1.25, dt.date(1, 1, 1), b"", dt.timedelta(microseconds=1)),
    (3, None, None, None, None, None, None, None, None, None, None, None, None),
    (4, -0.0, 'quote " comma , newline \n tab \t backslash \\ ü 日本', True, None, None,
     decimal.Decimal("0.000"), 0, 0, None, None, None, dt.timedelta(days=-1)),
    (5, 1e-300, "\\.", None, None, None, None, None, None, None, None, None, None),
    (6, 2.0, "NULL", None, None, None, None, None, None, None, None, None, None),
]


def test_table_creation_and_type_mapping(pg, table):
    sink = PostgresUpsertSink(pg, ("public", table), ["k"], TYPES_SCHEMA)
    assert sink.sink_table == f"public.{table}"
    with psycopg.connect(pg) as c:
        types = dict(c.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped", (table,)).fetchall())
        pk = c.execute("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                       "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary",
                       (table,)).fetchall()
    assert types == EXPECTED_PG_TYPES
    assert pk == [("k",)]
    df = pd.DataFrame(TYPED_ROWS, columns=TYPES_SCHEMA.names)
    df["_kind"] = 0
    df["_seq"] = range(len(df))
    sink.write_batch(df, query_id="q", batch_id=0)
    got = sink.read_rows()
    with psycopg.connect(pg) as c:
        c.execute("SET TimeZone TO 'UTC'")
        nan_check = c.execute(sql.SQL("SELECT s IS NULL, s = '' FROM {} WHERE k IN (2, 3) ORDER BY k").format(
            sql.Identifier(table))).fetchall()
    assert nan_check == [(False, True), (True, None)]  # empty string is not NULL
    assert got == [tuple(r) for r in TYPED_ROWS]
    # read_table goes through the Arrow schema
    frame = sink.read_table()
    assert frame["k"].tolist() == [1, 2, 3, 4, 5, 6]
    assert str(frame["i32"].dtype) == "Int32" and frame["i32"].isna().sum() == 3
    assert str(frame["b"].dtype) == "boolean"
    assert frame["s"].tolist()[:2] == ["plain", ""]
    # pandas-native frame: NaN is pandas' missing value (Spark's toPandas turns NULL into NaN) -> NULL
    df2 = pd.DataFrame({"k": [7], "d": [float("nan")], "s": ["x"], "b": [True],
                        "ts": pd.to_datetime(["2024-05-06 07:08:09.123456789"]),
                        "tstz": pd.to_datetime(["2024-05-06 07:08:09"]).tz_localize("Europe/Berlin"),
                        "num": [decimal.Decimal("1.5")], "i32": [1], "i16": [2], "f32": [0.25],
                        "day": [dt.date(2024, 5, 6)], "raw": [b"ab"], "dur": pd.to_timedelta(["1s"]),
                        "_kind": [0], "_seq": [0]})
    sink.write_batch(df2, query_id="q", batch_id=1)
    row7 = sink.read_rows()[-1]
    assert row7[0] == 7 and row7[1] is None
    assert row7[4] == dt.datetime(2024, 5, 6, 7, 8, 9, 123456)  # truncated to microseconds (as Spark does)
    assert row7[5] == dt.datetime(2024, 5, 6, 5, 8, 9, tzinfo=UTC)
    assert row7[6:] == (decimal.Decimal("1.500"), 1, 2, 0.25, dt.date(2024, 5, 6), b"ab", dt.timedelta(seconds=1))


def test_quoted_identifiers_composite_key_and_schema(pg):
    schema_name = f'Sch "{uuid.uuid4().hex[:6]}"'
    with psycopg.connect(pg, autocommit=True) as c:
        c.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema_name)))
    s = pa.schema([("Order Id", pa.int64()), ("line;--", pa.string()), ('va"l', pa.string())])
    sink = PostgresUpsertSink(pg, (schema_name, 'My "Table"'), ["Order Id", "line;--"], s,
                              progress_table=(schema_name, "progress"))
    cols = ["Order Id", "line;--", 'va"l']
    sink.write_batch(batch([("+I", 1, 1, "a", "x"), ("+I", 2, 1, "b", "y"), ("+I", 3, 2, "a", "z")], cols),
                     query_id="q", batch_id=0)
    sink.write_batch(batch([("+U", 4, 1, "a", "x2"), ("-D", 5, 1, "b", "y")], cols), query_id="q", batch_id=1)
    assert sink.read_rows() == [(1, "a", "x2"), (2, "a", "z")]
    assert sink.last_batch_id("q") == 1


def test_all_columns_in_key(pg, table):
    s = pa.schema([("a", pa.int64()), ("b", pa.string())])
    sink = PostgresUpsertSink(pg, table, ["a", "b"], s)
    cols = ["a", "b"]
    sink.write_batch(batch([("+I", 1, 1, "x"), ("+I", 2, 1, "y")], cols), query_id="q", batch_id=0)
    sink.write_batch(batch([("+I", 3, 1, "x"), ("-D", 4, 1, "y"), ("+I", 5, 2, "z")], cols), query_id="q", batch_id=1)
    assert sink.read_rows() == [(1, "x"), (2, "z")]


def test_existing_table_is_validated(pg, table):
    with psycopg.connect(pg, autocommit=True) as c:
        c.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, name text, amount double precision)").format(
            sql.Identifier(table)))
        c.execute(sql.SQL("CREATE TABLE {} (id bigint, name text, amount double precision)").format(
            sql.Identifier(table + "_nopk")))
        c.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, name text)").format(
            sql.Identifier(table + "_cols")))
    with pytest.raises(ValueError, match=r"PRIMARY KEY \['id'\] but the sink key is \['id', 'name'\]"):
        PostgresUpsertSink(pg, table, ["id", "name"], SCHEMA)
    with pytest.raises(ValueError, match="PRIMARY KEY"):
        PostgresUpsertSink(pg, table, ["name"], SCHEMA)
    with pytest.raises(ValueError, match="has no PRIMARY KEY"):
        PostgresUpsertSink(pg, table + "_nopk", ["id"], SCHEMA)
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['amount'\]"):
        PostgresUpsertSink(pg, table + "_cols", ["id"], SCHEMA)
    with pytest.raises(ValueError, match="does not exist"):
        PostgresUpsertSink(pg, table + "_missing", ["id"], SCHEMA, create=False)
    # a matching existing table (created by someone else, narrower types) is used as is
    sink = PostgresUpsertSink(pg, table, ["id"], SCHEMA, create=False)
    sink.write_batch(batch([("+I", 1, 1, "a", 1.0)]), query_id="q", batch_id=0)
    assert sink.read_rows() == [(1, "a", 1.0)]


def test_bad_arguments(pg, table):
    with pytest.raises(ValueError, match="not in schema"):
        PostgresUpsertSink(pg, table, ["nope"], SCHEMA)
    with pytest.raises(ValueError, match="reserved"):
        PostgresUpsertSink(pg, table, ["id"], pa.schema([("id", pa.int64()), ("_seq", pa.int64())]))
    with pytest.raises(TypeError, match="no PostgreSQL column type"):
        PostgresUpsertSink(pg, table, ["id"], pa.schema([("id", pa.int64()), ("l", pa.list_(pa.int64()))]))
    sink = PostgresUpsertSink(pg, table, ["id"], SCHEMA)
    with pytest.raises(ValueError, match=r"missing \['amount'\]"):
        sink.write_batch(batch([("+I", 1, 1, "a", 1.0)]).drop(columns=["amount"]), query_id="q", batch_id=0)
    with pytest.raises(ValueError, match="batch_id"):
        sink.write_batch(batch([("+I", 1, 1, "a", 1.0)]), query_id="q", batch_id=-1)


def test_null_key_is_rejected(pg, table):
    s = pa.schema([("a", pa.int64()), ("b", pa.string()), ("v", pa.float64())])
    sink = PostgresUpsertSink(pg, table, ["a", "b"], s)
    df = batch([("+I", 1, 1, "x", 1.0), ("+I", 2, 2, None, 2.0)], ["a", "b", "v"])
    with pytest.raises(ValueError, match=r"null value in primary key column 'b' at row 1"):
        sink.write_batch(df, query_id="q", batch_id=0)
    assert sink.read_rows() == [] and sink.last_batch_id("q") == -1
