"""Kill a streaming normalize job writing to PostgreSQL (PostgresUpsertSink)
after a batch committed to the database but before Spark logged it, restart it
from its checkpoint: Spark replays the batch, the sink skips it (its progress
row already holds the batch id), and the final table is exact."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from changelog_data import to_frame

pytestmark = pytest.mark.postgres

JOB = os.path.join(os.path.dirname(__file__), "jobs", "pg_job.py")
COLS = ["id", "name", "score"]
ARROW = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.int64()),
                   ("_kind", pa.int8()), ("_seq", pa.int64())])
TABLE = "customers_crash"

# one file = one micro-batch
FILES = [
    [["+I", [1, "a", 1], 1], ["+I", [2, "b", 1], 2], ["+I", [3, "c", 1], 3]],
    [["+U", [1, "a2", 2], 5], ["-D", [2, "b", 1], 6], ["+I", [4, "d", 1], 7]],
    [["+U", [3, "c2", 2], 9], ["+I", [2, "b2", 3], 10], ["+U", [1, "a3", 3], 11]],
    [["-D", [4, "d", 1], 13], ["+U", [3, "c3", 4], 14], ["+I", [5, "e", 1], 15]],
]
AFTER_BATCH_1 = [(1, "a2", 2), (3, "c", 1), (4, "d", 1)]
EXPECTED_TABLE = [(1, "a3", 3), (2, "b2", 3), (3, "c3", 4), (5, "e", 1)]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(JOB))] + sys.path)
    return env


def _start(args):
    return subprocess.Popen([sys.executable, JOB, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, start_new_session=True, env=_env())


def _rows(conninfo):
    with psycopg.connect(conninfo) as c:
        return c.execute(f"SELECT id, name, score FROM {TABLE} ORDER BY id").fetchall()


@pytest.mark.slow
def test_kill_after_pg_commit_and_restart_skips_replay(tmp_path, pg_server):
    conninfo = pg_server.create_database("test_postgres_pipeline")
    os.makedirs(tmp_path / "in")
    for i, f in enumerate(FILES):
        pq.write_table(pa.Table.from_pandas(to_frame(f, COLS), schema=ARROW, preserve_index=False),
                       tmp_path / "in" / f"part-{i:04d}.parquet")
    args = [str(tmp_path / "in"), conninfo, TABLE, str(tmp_path / "ck")]

    # crash: hang inside batch 1 after the PostgreSQL commit, then SIGKILL the whole job
    job = _start(args + ["1"])
    deadline = time.time() + 600
    seen = []
    try:
        for line in job.stdout:
            seen.append(line.strip())
            if line.strip() == "committed 1" or time.time() > deadline:
                break
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=60)
    assert "committed 1" in seen, seen
    assert _rows(conninfo) == AFTER_BATCH_1
    with psycopg.connect(conninfo) as c:
        (query_id, recorded), = c.execute(
            "SELECT query_id, batch_id FROM spark_changelog_progress WHERE sink_table = %s",
            (f"public.{TABLE}",)).fetchall()
    assert recorded == 1

    restart = _start(args)
    out, _ = restart.communicate(timeout=900)
    assert restart.returncode == 0, out
    # Spark replays batch 1 (its commit was never logged): the PostgreSQL sink skips it
    # this run: batch 1 (replayed, skipped), 2 and 3
    assert "finished batches=3 replayed=1 " in out, out
    assert _rows(conninfo) == EXPECTED_TABLE
    with psycopg.connect(conninfo) as c:
        assert c.execute("SELECT query_id, batch_id FROM spark_changelog_progress WHERE sink_table = %s",
                         (f"public.{TABLE}",)).fetchall() == [(query_id, 3)]
