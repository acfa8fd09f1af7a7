"""The PostgreSQL CDC stream reader driven directly, as Spark's planner and
tasks call it (initialOffset, latestOffset, partitions, read, commit), against
the real server: changelog rows per change kind, offsets at commit LSNs,
replays that re-read the same changes, the snapshot hand-over, and every bad
case's error (docs/sources.md, "PostgreSQL CDC").  No Spark needed."""
from __future__ import annotations

import decimal

import psycopg
import pyarrow as pa
import pytest

from pg_cdc_workload import drop_slots
from pgserver import PgServer
from spark_changelog.connectors.postgres_cdc import (PostgresCdcError, PostgresCdcStreamReader,
                                                     describe_table, ensure_publication,
                                                     source_config)

pytestmark = pytest.mark.postgres

KINDS = {0: "+I", 1: "-U", 2: "+U", 3: "-D"}


@pytest.fixture
def db(pg_server, request):
    name = "pgcdc_" + request.node.name.lower()[:40]
    conninfo = pg_server.create_database(name)
    yield name, conninfo
    drop_slots(conninfo)


def reader(pg, dbname, table, slot, tmp_path, **options):
    cfg, password = source_config({
        "hostname": pg.host, "port": pg.port, "username": pg.user, "database-name": dbname,
        "table-name": table, "slot.name": slot, "snapshot.staging-dir": str(tmp_path / slot),
        "connect.retry-backoff-ms": 100, **options})
    cfg = describe_table(cfg, password)
    ensure_publication(cfg, password)
    return PostgresCdcStreamReader(cfg, password)


def rows(r, start, end, *, cols=None):
    """Read a micro-batch as the tasks do: (kind, values...) in _seq order, and the seqs."""
    table = pa.Table.from_batches([b for p in r.partitions(start, end) for b in r.read(p)],
                                  schema=r.cfg.arrow_schema())
    table = table.sort_by("_seq")
    cols = cols or [n for n, _ in r.cfg.columns]
    out = [(KINDS[k],) + tuple(v) for k, *v in zip(table["_kind"].to_pylist(),
                                                   *(table[c].to_pylist() for c in cols))]
    return out, table["_seq"].to_pylist()


def batch(r, start, limit=None):
    end = r.latestOffset(start, limit)
    return end, rows(r, start, end)[0]


def run(conninfo, *stmts):
    with psycopg.connect(conninfo, autocommit=True) as c:
        for s in stmts:
            c.execute(s)


def test_kinds_per_change_and_identity(pg_server, db, tmp_path):
    name, conninfo = db
    run(conninfo, "CREATE TABLE u (id int PRIMARY KEY, v text)",
        "CREATE TABLE f (id int PRIMARY KEY, v text)", "ALTER TABLE f REPLICA IDENTITY FULL")
    ru, rf = reader(pg_server, name, "u", "k_u", tmp_path), reader(pg_server, name, "f", "k_f", tmp_path)
    assert not ru.cfg.full_identity and rf.cfg.full_identity
    starts = []
    for r in (ru, rf):
        s0 = r.initialOffset()
        assert s0 == {"lsn": 0, "phase": "snapshot"}
        end = r.latestOffset(s0, None)
        assert rows(r, s0, end)[0] == []             # empty tables: an empty snapshot
        r.commit(end)
        starts.append(end)
    for t in ("u", "f"):
        run(conninfo, f"INSERT INTO {t} VALUES (1, 'a'), (2, 'b')",
            f"BEGIN; UPDATE {t} SET v = 'a2' WHERE id = 1; UPDATE {t} SET id = 3 WHERE id = 2; "
            f"DELETE FROM {t} WHERE id = 1; COMMIT")
    _, got_u = batch(ru, starts[0])
    _, got_f = batch(rf, starts[1])
    # default identity: an update carries the new row only, a delete and a key change the key only
    assert got_u == [("+I", 1, "a"), ("+I", 2, "b"), ("+U", 1, "a2"), ("-D", 2, None),
                     ("+I", 3, "b"), ("-D", 1, None)]
    # REPLICA IDENTITY FULL: the old rows
    assert got_f == [("+I", 1, "a"), ("+I", 2, "b"), ("-U", 1, "a"), ("+U", 1, "a2"),
                     ("-D", 2, "b"), ("+I", 3, "b"), ("-D", 1, "a2")]


def test_offsets_are_commits_replays_read_the_same_and_commit_advances(pg_server, db, tmp_path):
    name, conninfo = db
    run(conninfo, "CREATE TABLE t (id int PRIMARY KEY, n numeric(12,3), ts timestamptz, d date, "
        "b bool, j jsonb, by bytea, u uuid, f float8, s smallint, ntz timestamp)",
        "INSERT INTO t SELECT g, g / 8.0, '2024-01-01 00:00:00+02', '2024-02-29', g % 2 = 0, "
        "'{\"a\": 1}', '\\x00ff', '00000000-0000-0000-0000-000000000001', g / 3.0, g, "
        "'2024-01-01 10:00:00.5' FROM generate_series(1, 50) g")
    r = reader(pg_server, name, "t", "off", tmp_path, **{"scan.incremental.snapshot.chunk.size": 8,
                                                       "scan.max-changes-per-batch": 3})
    s0 = r.initialOffset()
    end0 = r.latestOffset(s0, None)
    chunks = r.partitions(s0, end0)
    assert len(chunks) == 7                            # 50 rows in key ranges of 8
    snap, seqs = rows(r, s0, end0)
    assert [x[1] for x in snap] == list(range(1, 51)) and len(set(seqs)) == 1
    first = snap[0]
    assert first[2] == decimal.Decimal("0.125") and str(first[3]) == "2023-12-31 22:00:00+00:00"
    assert str(first[4]) == "2024-02-29" and first[5] is False and first[6] == '{"a": 1}'
    assert first[7] == b"\x00\xff" and first[8] == "00000000-0000-0000-0000-000000000001"
    assert first[10] == 1 and str(first[11]) == "2024-01-01 10:00:00.500000"
    r.commit(end0)
    # three transactions of 2, 2 and 1 changes; a batch of at most 3 pgoutput messages
    # still holds the whole first transaction (BEGIN, 2 changes, COMMIT)
    run(conninfo, "BEGIN; UPDATE t SET n = 1.5 WHERE id = 1; DELETE FROM t WHERE id = 2; COMMIT",
        "BEGIN; INSERT INTO t (id) VALUES (100); UPDATE t SET n = n + 1 WHERE id = 100; COMMIT",
        "DELETE FROM t WHERE id = 3")
    cols = ["id", "n"]
    end1 = r.latestOffset(end0, None)
    got1, seq1 = rows(r, end0, end1, cols=cols)
    assert got1 == [("+U", 1, decimal.Decimal("1.500")), ("-D", 2, None)]
    assert seq1 == sorted(seq1) and seq1[0] > seqs[0]
    # a replay (Spark restarted before committing) reads exactly the same, in a new reader
    r2 = reader(pg_server, name, "t", "off", tmp_path, **{"scan.max-changes-per-batch": 3})
    assert rows(r2, end0, end1, cols=cols) == (got1, seq1)
    r2.commit(end1)
    with psycopg.connect(conninfo) as c:
        confirmed = c.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE "
                              "slot_name = 'off'").fetchone()[0]
    assert str(confirmed) == f"{end1['lsn'] >> 32:X}/{end1['lsn'] & 0xFFFFFFFF:X}"
    end2 = r2.latestOffset(end1, None)
    assert rows(r2, end1, end2, cols=cols)[0] == [("+I", 100, None), ("+U", 100, None)]
    r2.commit(end2)
    end3 = r2.latestOffset(end2, None)
    assert rows(r2, end2, end3, cols=cols)[0] == [("-D", 3, None)]
    r2.commit(end3)
    assert r2.latestOffset(end3, None) == end3          # nothing new: no batch
    # read again after the slot moved past the batch: an error, never other rows
    with pytest.raises(PostgresCdcError, match="cannot be read again"):
        rows(r2, end0, end1)


def test_snapshot_hand_over_and_a_crash_during_the_snapshot(pg_server, db, tmp_path):
    name, conninfo = db
    run(conninfo, "CREATE TABLE h (id int PRIMARY KEY, v int)",
        "INSERT INTO h SELECT g, 0 FROM generate_series(1, 30) g")
    opts = {"scan.incremental.snapshot.chunk.size": 10}
    r = reader(pg_server, name, "h", "hand", tmp_path, **opts)
    s0 = r.initialOffset()
    end0 = r.latestOffset(s0, None)
    chunks = r.partitions(s0, end0)
    list(r.read(chunks[0]))                           # one chunk staged, then the process dies
    run(conninfo, "UPDATE h SET v = 1 WHERE id <= 15")
    r.stop()
    # the restarted planner cannot use the dead snapshot: it takes it again, at the
    # slot's new consistent point, and the log continues exactly from there
    r2 = reader(pg_server, name, "h", "hand", tmp_path, **opts)
    snap, _ = rows(r2, s0, end0)
    assert [(x[1], x[2]) for x in snap] == [(i, 1 if i <= 15 else 0) for i in range(1, 31)]
    # a replay of the now fully staged snapshot reads the staged chunks
    r3 = reader(pg_server, name, "h", "hand", tmp_path, **opts)
    assert rows(r3, s0, end0)[0] == snap
    run(conninfo, "UPDATE h SET v = 2 WHERE id = 1")
    r2.commit(end0)
    end1, got = batch(r2, end0)
    assert got == [("+U", 1, 2)]                       # the UPDATE before the snapshot is not doubled


def test_bad_cases_are_clear_errors(pg_server, db, tmp_path):
    name, conninfo = db
    run(conninfo, "CREATE TABLE nopk (id int, v text)",
        "CREATE TABLE nothing (id int PRIMARY KEY)", "ALTER TABLE nothing REPLICA IDENTITY NOTHING",
        "CREATE TABLE odd (id int PRIMARY KEY, i interval)",
        "CREATE TABLE loose (id int PRIMARY KEY, n numeric)",
        "CREATE TABLE ok (id int PRIMARY KEY, v text)")
    with pytest.raises(PostgresCdcError, match=r"public.nopk has no primary key.*ADD PRIMARY KEY"):
        reader(pg_server, name, "nopk", "x", tmp_path)
    with pytest.raises(PostgresCdcError, match="REPLICA IDENTITY NOTHING.*REPLICA IDENTITY DEFAULT"):
        reader(pg_server, name, "nothing", "x", tmp_path)
    with pytest.raises(PostgresCdcError, match=r"column 'i': type interval is not supported"):
        reader(pg_server, name, "odd", "x", tmp_path)
    with pytest.raises(PostgresCdcError, match=r"column 'n': numeric without precision"):
        reader(pg_server, name, "loose", "x", tmp_path)
    with pytest.raises(PostgresCdcError, match="table public.missing does not exist"):
        reader(pg_server, name, "missing", "x", tmp_path)
    with pytest.raises(PostgresCdcError, match="refused user 'nobody'"):
        cfg, _ = source_config({"hostname": pg_server.host, "port": pg_server.port,
                                "username": "nobody", "database-name": name, "table-name": "ok",
                                "slot.name": "x"})
        describe_table(cfg, "wrong")
    with pytest.raises(PostgresCdcError, match="unknown option.*'slot'"):
        source_config({"slot": "x"})
    with pytest.raises(PostgresCdcError, match="'decoding.plugin.name' = 'wal2json'"):
        source_config({"hostname": "h", "username": "u", "database-name": "d", "table-name": "t",
                       "slot.name": "s", "decoding.plugin.name": "wal2json"})
    # a slot that exists already cannot export its snapshot: the error says what to do
    run(conninfo, "SELECT pg_create_logical_replication_slot('taken', 'pgoutput')")
    r = reader(pg_server, name, "ok", "taken", tmp_path)
    s0 = r.initialOffset()
    with pytest.raises(PostgresCdcError, match=r"slot 'taken' already exists.*pg_drop_replication_slot"):
        r.partitions(s0, r.latestOffset(s0, None))
    # latest-offset uses it (and creates a missing one)
    r = reader(pg_server, name, "ok", "taken", tmp_path, **{"scan.startup.mode": "latest-offset"})
    start = r.initialOffset()
    run(conninfo, "INSERT INTO ok VALUES (1, 'x')")
    assert batch(r, start)[1] == [("+I", 1, "x")]
    # the slot dropped under a running query
    run(conninfo, "SELECT pg_drop_replication_slot('taken')")
    with pytest.raises(PostgresCdcError, match="slot 'taken' is gone"):
        r.latestOffset(start, None)


def test_schema_change_while_streaming_is_an_error(pg_server, db, tmp_path):
    name, conninfo = db
    run(conninfo, "CREATE TABLE s (id int PRIMARY KEY, v text)")
    r = reader(pg_server, name, "s", "sch", tmp_path, **{"scan.startup.mode": "latest-offset"})
    start = r.initialOffset()
    run(conninfo, "ALTER TABLE s ADD COLUMN w int", "INSERT INTO s VALUES (1, 'a', 2)")
    end = r.latestOffset(start, None)
    with pytest.raises(PostgresCdcError, match=r"table \"public\".\"s\".*changed its columns while "
                                               r"streaming \(added \['w'\]\)"):
        rows(r, start, end)


def test_server_gone_mid_stream_retries_then_says_so(pg_server, db, tmp_path):
    name, conninfo = db
    run(conninfo, "CREATE TABLE g (id int PRIMARY KEY)")
    r = reader(pg_server, name, "g", "gone", tmp_path, **{"scan.startup.mode": "latest-offset",
                                                        "connect.max-retries": 2})
    start = r.initialOffset()
    run(conninfo, "INSERT INTO g VALUES (1)")
    end = r.latestOffset(start, None)
    pg_server.shutdown()
    try:
        with pytest.raises(PostgresCdcError, match=r"unreachable: reading the replication slot "
                                                   r"'gone' failed 3 times.*not committed"):
            rows(r, start, end)
    finally:
        pg_server.restart()
    # back: the same micro-batch reads the same change
    assert rows(r, start, end)[0] == [("+I", 1)]


def test_wal_level_not_logical_says_what_to_set(tmp_path):
    with PgServer(settings={"wal_level": "replica"}) as pg:
        cfg, _ = source_config({"hostname": pg.host, "port": pg.port, "username": pg.user,
                                "database-name": pg.dbname, "table-name": "t", "slot.name": "s"})
        with pytest.raises(PostgresCdcError, match="wal_level = replica.*ALTER SYSTEM SET "
                                                   "wal_level = logical"):
            describe_table(cfg, None)


def test_a_user_who_may_not_create_the_slot_is_told_the_sql(pg_server, db, tmp_path):
    name, conninfo = db
    run(conninfo, "CREATE TABLE w (id int PRIMARY KEY)", "CREATE PUBLICATION weak_pub FOR TABLE w",
        "DROP ROLE IF EXISTS weak", "CREATE ROLE weak LOGIN", "GRANT SELECT ON w TO weak")
    pg = pg_server
    cfg, _ = source_config({"hostname": pg.host, "port": pg.port, "username": "weak",
                            "database-name": name, "table-name": "w", "slot.name": "weak",
                            "snapshot.staging-dir": str(tmp_path / "weak"),
                            "scan.startup.mode": "latest-offset"})
    r = PostgresCdcStreamReader(describe_table(cfg, None), None)
    with pytest.raises(PostgresCdcError, match=r"user 'weak' may not create replication slot 'weak'.*"
                                               r"ALTER ROLE weak REPLICATION.*SELECT "
                                               r"pg_create_logical_replication_slot\('weak', "
                                               r"'pgoutput'\)"):
        r.initialOffset()


def test_truncate_and_unchanged_large_values_are_errors_not_wrong_rows(pg_server, db, tmp_path):
    name, conninfo = db
    run(conninfo, "CREATE TABLE big (id int PRIMARY KEY, n int, doc text)",
        "CREATE TABLE tr (id int PRIMARY KEY)")
    rb = reader(pg_server, name, "big", "big", tmp_path, **{"scan.startup.mode": "latest-offset"})
    rt = reader(pg_server, name, "tr", "tr", tmp_path, **{"scan.startup.mode": "latest-offset"})
    sb, st = rb.initialOffset(), rt.initialOffset()
    # a value stored out of line (TOASTed): an update of another column does not resend it
    run(conninfo, "INSERT INTO big SELECT 1, 0, string_agg(md5(g::text), '') FROM "
                  "generate_series(1, 400) g", "UPDATE big SET n = 1 WHERE id = 1",
        "INSERT INTO tr VALUES (1)", "TRUNCATE tr")
    with pytest.raises(PostgresCdcError, match=r"unchanged, and pgoutput does not send it.*column "
                                               r"'doc'|column 'doc'.*REPLICA IDENTITY FULL"):
        rows(rb, sb, rb.latestOffset(sb, None))
    with pytest.raises(PostgresCdcError, match="TRUNCATE is not supported"):
        rows(rt, st, rt.latestOffset(st, None))
    # with REPLICA IDENTITY FULL the old row carries the value: the new row gets it from there
    start = rb.latestOffset(sb, None)
    rb.commit(start)                # the batch that failed is skipped here
    run(conninfo, "ALTER TABLE big REPLICA IDENTITY FULL", "UPDATE big SET n = 2 WHERE id = 1")
    got, _ = rows(rb, start, rb.latestOffset(start, None))
    doc = "".join(__import__("hashlib").md5(str(g).encode()).hexdigest() for g in range(1, 401))
    assert got == [("-U", 1, 1, doc), ("+U", 1, 2, doc)]
