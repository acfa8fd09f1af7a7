"""Kill -9 the streaming process of the seed's join over two PostgreSQL CDC
sources at random points while a workload runs, restart it from its checkpoint
each time: the PostgreSQL target equals the join PostgreSQL computes, and no
change is applied twice (docs/sources.md, "Offsets, exactly once, and the slot").

Runs only with ``SPARK_CHANGELOG_LONG_TESTS=1`` (twelve kills over a longer
workload; ``LONG`` below): five kills already took 3-6 minutes, a quarter of
the default suite, one JVM start per kill.  The default run checks the same
pipeline uninterrupted (tests/connectors/test_postgres_cdc.py) and replays
of the reader (test_postgres_cdc_reader.py)."""
from __future__ import annotations

import os
import random
import re
import signal
import time

import psycopg
import pytest

from kill_restart import start_job
from pg_cdc_workload import Workload, create_tables, drop_slots, expected_join

pytestmark = pytest.mark.postgres

from long_variants import LONG


def run_until_killed(args, delay_s: float, after_commit: bool, superseded: list) -> list[str]:
    """Start the job and SIGKILL its process group ``delay_s`` after its first
    committed micro-batch (``after_commit``) or after its start (possibly
    inside the snapshot batch, or before it)."""
    job = start_job("pg_cdc_job.py", list(args) + ["loop"])
    seen = []
    kill_at = None if after_commit else time.time() + delay_s
    give_up = time.time() + 300
    try:
        os.set_blocking(job.stdout.fileno(), False)
        while job.poll() is None and time.time() < give_up:
            line = job.stdout.readline()
            if line:
                seen.append(line.strip())
                m = re.match(r"committed \d+ superseded=(\d+)", line.strip())
                if m:
                    superseded.append(int(m.group(1)))
                    if kill_at is None:
                        kill_at = time.time() + delay_s
                continue
            if kill_at is not None and time.time() >= kill_at:
                break
            time.sleep(0.05)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=60)
    return seen


@pytest.mark.slow
@pytest.mark.skipif(not LONG, reason="long variant: SPARK_CHANGELOG_LONG_TESTS=1 (3-6 min)")
def test_kill_nine_at_random_points_while_the_workload_runs(pg_server, tmp_path):
    db = "pgcdc_kill"
    conninfo = pg_server.create_database(db)
    # both tables with the default identity: both streams go through a sequence-aware
    # ChangelogNormalize, whose 'superseded' count would show a change delivered twice
    create_tables(conninfo, s1_rows=200, s2_rows=20, s2_identity_full=False)
    args = [pg_server.host, pg_server.port, pg_server.user, db, tmp_path / "stage", tmp_path / "ck"]
    kills = 12
    work = Workload(conninfo, threads=2, transactions=100_000, pause_s=0.25).start()
    rnd = random.Random(23)
    superseded: list = []
    try:
        for i in range(kills):
            # the first kill lands around the snapshot batch, the others anywhere in the log's
            run_until_killed(args, rnd.uniform(6, 14) if i == 0 else rnd.uniform(0, 4),
                             after_commit=i > 0, superseded=superseded)
    finally:
        work.stop()
    assert work.committed > 50
    job = start_job("pg_cdc_job.py", list(args) + ["once"])
    out, _ = job.communicate(timeout=900)
    assert job.returncode == 0, out
    superseded += [int(n) for n in re.findall(r"superseded=(\d+)", out)]
    assert superseded and sum(superseded) == 0     # no change reached the operators twice
    with psycopg.connect(conninfo) as c:
        got = [tuple(r) for r in c.execute("SELECT id, level, attr FROM t1 ORDER BY id").fetchall()]
    assert got == expected_join(conninfo)
    drop_slots(conninfo)
