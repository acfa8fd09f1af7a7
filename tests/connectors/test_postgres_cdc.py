"""The PostgreSQL CDC source (connectors/postgres_cdc.py) against the real
server the tests start: the seed's join over two tables under a concurrent
workload, snapshot then stream over many micro-batches, into Delta and into a
PostgreSQL upsert table; the final target equals the join PostgreSQL computes
(docs/sources.md, "PostgreSQL CDC")."""
from __future__ import annotations

import psycopg
import pyarrow as pa
import pytest

from pg_cdc_workload import T1_COLS, Workload, create_tables, drop_slots, expected_join
from spark_changelog.api import read_postgres_cdc
from spark_changelog.sinks.delta import read_table
from spark_changelog.sinks.postgres import PostgresUpsertSink

pytestmark = pytest.mark.postgres

T1_ARROW = pa.schema([("id", pa.int64()), ("level", pa.int64()), ("attr", pa.string())])


def source(spark, pg, db, table, slot, tmp_path, **options):
    return read_postgres_cdc(spark, table, hostname=pg.host, port=pg.port, username=pg.user,
                             database_name=db, slot_name=slot,
                             **{"snapshot.staging-dir": str(tmp_path / f"stage-{slot}"),
                                "scan.incremental.snapshot.chunk.size": 16, **options})


def seed_join(spark, pg, db, tmp_path, prefix, **options):
    s1 = source(spark, pg, db, "s1", f"{prefix}_s1", tmp_path, **options)
    s2 = source(spark, pg, db, "s2", f"{prefix}_s2", tmp_path, **options)
    return s1.join(s2, on=[("level", "id")]).select("id", "level", "attr")


def delta_rows(path):
    t = read_table(str(path))
    return sorted(tuple(r) for r in t[T1_COLS].astype(object).values.tolist())


def test_seed_join_snapshot_then_stream_into_delta_and_postgres(spark, pg_server, tmp_path):
    db = "pgcdc_seed"
    conninfo = pg_server.create_database(db)
    create_tables(conninfo)
    limit = {"scan.max-changes-per-batch": 120}
    query = seed_join(spark, pg_server, db, tmp_path, "seed", **limit)
    plan = query.explain(key="id", table="t1")
    assert "ChangelogNormalize" in plan          # s1 has the default identity: upsert mode
    assert "upsert materializer: inserted" in plan
    assert "ordered=[log]" in plan and "declared ordered" not in plan
    pg_query = seed_join(spark, pg_server, db, tmp_path, "seedpg", **limit)
    sink = PostgresUpsertSink(conninfo, "t1", ["id"], T1_ARROW, create=True)
    # the first runs read the snapshot (rows present before the first run)
    first = query.write_upsert(str(tmp_path / "t1"), key="id", checkpoint=str(tmp_path / "ck"))
    assert first.batches == 1
    assert delta_rows(tmp_path / "t1") == expected_join(conninfo)
    assert "slot seed_s1 at" in first.summary() and "bytes of WAL held" in first.summary()
    assert pg_query.write_upsert(sink, key="id", checkpoint=str(tmp_path / "ck_pg")).batches == 1

    # concurrent transactions, then the log in micro-batches of at most 120 changes
    Workload(conninfo, threads=3, transactions=80).start().join()
    want = expected_join(conninfo)
    assert len(want) > 10          # a non-trivial join (the threads interleave: 19-30 rows seen)
    last = query.write_upsert(str(tmp_path / "t1"), key="id", checkpoint=str(tmp_path / "ck"))
    assert last.batches >= 4, last.batches
    assert delta_rows(tmp_path / "t1") == want
    assert last.counters.get("superseded", 0) == 0       # no change arrived twice

    pg_report = pg_query.write_upsert(sink, key="id", checkpoint=str(tmp_path / "ck_pg"))
    assert pg_report.batches >= 4
    with psycopg.connect(conninfo) as c:
        got = [tuple(r) for r in c.execute("SELECT id, level, attr FROM t1 ORDER BY id").fetchall()]
    assert got == want
    # every slot was advanced past the changes of its committed batches
    positions = {s: pos for s, pos in pg_report.sources.items()}
    assert all(p["lag_bytes"] >= 0 for p in positions.values())
    with psycopg.connect(conninfo) as c:
        confirmed = dict(c.execute(
            "SELECT slot_name, confirmed_flush_lsn > %s::pg_lsn FROM pg_replication_slots WHERE "
            "database = %s", (first.sources["postgres-cdc:public.s1"]["confirmed_lsn"], db)).fetchall())
    assert confirmed == {"seed_s1": True, "seed_s2": True, "seedpg_s1": True, "seedpg_s2": True}
    sink.close()
    drop_slots(conninfo)
