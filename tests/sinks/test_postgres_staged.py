"""PostgreSQL written by the executors (docs/sinks.md, "PostgreSQL: staged by
the executors"): partitions COPY into the batch's staging table, the driver
applies it in one transaction, a replay is skipped, a retried partition does
not double its rows, a broken connection retries the commit."""
from __future__ import annotations

import uuid

import psycopg
import pyarrow as pa
import pytest

from spark_changelog.model import KIND_COL, SEQ_COL
from spark_changelog.sinks.changelog import read_changelog
from spark_changelog.sinks.postgres import PostgresUpsertSink

pytestmark = pytest.mark.postgres

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


@pytest.fixture(scope="module")
def pg(pg_server):
    return pg_server.create_database("test_postgres_staged")


@pytest.fixture
def sink(pg):
    s = PostgresUpsertSink(pg, f"t_{uuid.uuid4().hex[:12]}", ["id"], SCHEMA)
    yield s
    s.close()


def changes(rows):
    """rows: (kind, seq, id, name)"""
    return pa.table({"id": pa.array([r[2] for r in rows], pa.int64()),
                     "name": pa.array([r[3] for r in rows], pa.string()),
                     KIND_COL: pa.array([r[0] for r in rows], pa.int8()),
                     SEQ_COL: pa.array([r[1] for r in rows], pa.int64())})


def staging_tables(pg):
    with psycopg.connect(pg) as c:
        return c.execute("SELECT relname FROM pg_class WHERE relname LIKE '\\_spark\\_changelog\\_stage\\_%'"
                         ).fetchall()


def test_staged_partitions_commit_once_and_a_retried_partition_is_not_doubled(pg, sink):
    sink.write_batch(changes([(0, 1, 1, "a"), (0, 2, 2, "b")]).to_pandas(), query_id="q", batch_id=0)
    staged = sink.stage_batch("q", 1)
    assert not staged.replay
    # partition 0: update 1 (-U/+U at equal seq: the addition wins), insert 3
    part0 = changes([(1, 5, 1, "a"), (2, 5, 1, "A"), (0, 6, 3, "c")])
    assert staged.write_partition(part0, 0) == {"adds": 2, "retracts": 0}
    # the same partition again (a retried task attempt): replaces its rows
    assert staged.write_partition(part0, 0) == {"adds": 2, "retracts": 0}
    # partition 1: delete 2 and a delete of an absent key
    w1 = staged.write_partition(changes([(3, 7, 2, "b"), (3, 8, 9, None)]), 1)
    result = staged.commit([{"adds": 2, "retracts": 0}, w1])
    assert (result["inserted"], result["updated"], result["deleted"], result["missing_deletes"]) == (1, 1, 1, 1)
    assert sink.read_rows() == [(1, "A"), (3, "c")]
    assert sink.last_batch_id("q") == 1
    assert staging_tables(pg) == []

    # a replay: no staging table, nothing written, the commit says skipped
    again = sink.stage_batch("q", 1)
    assert again.replay
    assert again.write_partition(changes([(3, 9, 1, "A")]), 0) == {"adds": 0, "retracts": 0}
    assert again.commit([])["skipped_replay"]
    assert sink.read_rows() == [(1, "A"), (3, "c")]


def test_a_connection_lost_in_the_staged_commit_retries_it_whole(pg, pg_server):
    lost = []

    def on_stage(stage, conn):
        if stage == "upserted" and not lost:
            lost.append(stage)
            raise psycopg.OperationalError("connection lost (test)")

    sink = PostgresUpsertSink(pg, f"t_{uuid.uuid4().hex[:12]}", ["id"], SCHEMA, on_stage=on_stage,
                              backoff_s=0.01)
    staged = sink.stage_batch("q", 0)
    w = staged.write_partition(changes([(0, 1, 1, "a"), (0, 2, 2, "b")]), 0)
    result = staged.commit([w])
    assert lost and result["retries"] == 1 and result["inserted"] == 2
    assert sink.read_rows() == [(1, "a"), (2, "b")]
    assert staging_tables(pg) == []
    sink.close()


def test_write_upsert_through_spark_stages_on_the_executors(spark, pg, tmp_path):
    """A bounded run: the executors stage (and write the changelog output's
    parts), the report counts come back, the null-key change goes to the
    dead letter (not to the changelog), no staging table is left."""
    from spark_changelog.api import ChangelogStream
    df = spark.createDataFrame(
        [(1, "a", 0, 1), (2, "b", 0, 2), (1, "a", 1, 3), (1, "z", 2, 3), (2, "b", 3, 4), (None, "n", 0, 5),
         (3, "c", 0, 6)],
        f"id BIGINT, name STRING, {KIND_COL} TINYINT, {SEQ_COL} BIGINT")
    sink = PostgresUpsertSink(pg, f"t_{uuid.uuid4().hex[:12]}", ["id"], SCHEMA)
    report = ChangelogStream.from_dataframe(df, primary_key=["id"]).write_upsert(
        sink, dead_letter=str(tmp_path / "dl"), changelog_path=str(tmp_path / "log"))
    assert sink.read_rows() == [(1, "z"), (3, "c")]
    log = read_changelog(tmp_path / "log")
    assert [(r["op"], r["_seq"], r["id"], r["name"]) for _, r in log.iterrows()] == [
        ("+I", 1, 1, "a"), ("+I", 2, 2, "b"), ("-U", 3, 1, "a"), ("+U", 3, 1, "z"), ("-D", 4, 2, "b"),
        ("+I", 6, 3, "c")]
    assert (report.changes_out, report.upserted, report.deleted, report.invalid) == (6, 2, 0, 1)
    assert report.sink_writes == {"staged": 1}
    assert staging_tables(pg) == []
    sink.close()
