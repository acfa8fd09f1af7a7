"""Kill a streaming normalize job writing to PostgreSQL (PostgresUpsertSink)
after a batch committed to the database but before Spark logged it, restart it
from its checkpoint: Spark replays the batch, the sink skips it (its progress
row already holds the batch id), and the final table is exact."""
from __future__ import annotations

import psycopg
import pytest

from kill_restart import AFTER_BATCH_1, EXPECTED_TABLE, Crash, write_input

pytestmark = pytest.mark.postgres

TABLE = "customers_crash"


def _prepare(d, fixture):
    write_input(d / "in")
    return [d / "in", fixture("pg_server").create_database("test_postgres_pipeline"), TABLE, d / "ck"]


#: hang inside batch 1 after the PostgreSQL commit, then SIGKILL the whole job
CRASHES = {"normalize_pg": Crash("normalize_pg", _prepare, hang_after=1)}


def _rows(conninfo):
    with psycopg.connect(conninfo) as c:
        return c.execute(f"SELECT id, name, score FROM {TABLE} ORDER BY id").fetchall()


@pytest.mark.slow
@pytest.mark.shared_crash("normalize_pg")
def test_kill_after_pg_commit_and_restart_skips_replay(spark, crashed):
    run = crashed("normalize_pg")
    assert run.status == "committed normalize_pg 1", run.status
    conninfo = run.args[1]
    assert _rows(conninfo) == AFTER_BATCH_1
    with psycopg.connect(conninfo) as c:
        (query_id, recorded), = c.execute(
            "SELECT query_id, batch_id FROM spark_changelog_progress WHERE sink_table = %s",
            (f"public.{TABLE}",)).fetchall()
    assert recorded == 1

    report = run.resume(spark)
    # Spark replays batch 1 (its commit was never logged): the PostgreSQL sink skips it
    # this run: batch 1 (replayed, skipped), 2 and 3
    assert (report.batches, report.replayed_batches) == (3, 1)
    assert _rows(conninfo) == EXPECTED_TABLE
    with psycopg.connect(conninfo) as c:
        assert c.execute("SELECT query_id, batch_id FROM spark_changelog_progress WHERE sink_table = %s",
                         (f"public.{TABLE}",)).fetchall() == [(query_id, 3)]
