"""Kill a streaming normalize job writing to PostgreSQL (PostgresUpsertSink)
after a batch committed to the database but before Spark logged it, restart it
from its checkpoint: Spark replays the batch, the sink skips it (its progress
row already holds the batch id), and the final table is exact."""
from __future__ import annotations

import psycopg
import pytest

from kill_restart import AFTER_BATCH_1, EXPECTED_TABLE, crash_in_batch, restart, write_input

pytestmark = pytest.mark.postgres

TABLE = "customers_crash"


def _rows(conninfo):
    with psycopg.connect(conninfo) as c:
        return c.execute(f"SELECT id, name, score FROM {TABLE} ORDER BY id").fetchall()


@pytest.mark.slow
def test_kill_after_pg_commit_and_restart_skips_replay(tmp_path, pg_server):
    conninfo = pg_server.create_database("test_postgres_pipeline")
    write_input(tmp_path / "in")
    args = [tmp_path / "in", conninfo, TABLE, tmp_path / "ck"]

    # crash: hang inside batch 1 after the PostgreSQL commit, then SIGKILL the whole job
    crash_in_batch("pg_job.py", args, 1)
    assert _rows(conninfo) == AFTER_BATCH_1
    with psycopg.connect(conninfo) as c:
        (query_id, recorded), = c.execute(
            "SELECT query_id, batch_id FROM spark_changelog_progress WHERE sink_table = %s",
            (f"public.{TABLE}",)).fetchall()
    assert recorded == 1

    out = restart("pg_job.py", args)
    # Spark replays batch 1 (its commit was never logged): the PostgreSQL sink skips it
    # this run: batch 1 (replayed, skipped), 2 and 3
    assert "finished batches=3 replayed=1 " in out, out
    assert _rows(conninfo) == EXPECTED_TABLE
    with psycopg.connect(conninfo) as c:
        assert c.execute("SELECT query_id, batch_id FROM spark_changelog_progress WHERE sink_table = %s",
                         (f"public.{TABLE}",)).fetchall() == [(query_id, 3)]
