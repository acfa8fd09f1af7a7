"""The Delta upsert sink on an S3-compatible object store (docs/sinks.md,
"Updates and deletes: deletion vectors", "Object stores"): moto's S3 server
(a separate process on a loopback port) stands in for S3, delta-rs and the
sink reach it through ``storage_options``.  The executors write the data
files and look their keys up in the table's files on the store, the driver
commits each batch with one conditional put (``If-None-Match: *``); a
replay is skipped; another writer taking the version fails the batch whole
and the batch's replay then applies it exactly (at the sink by default; a
streaming query failed by it and restarted from its checkpoint is the long
variant, ``SPARK_CHANGELOG_LONG_TESTS=1``)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import CommitFailedError

from long_variants import long_only
from spark_changelog.sinks.delta import DeltaPath, DeltaUpsertSink, live_rows, read_table

BUCKET = "spark-changelog-tests"
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.int64())])
INPUT = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.int64()),
                   ("_kind", pa.int8()), ("_seq", pa.int64())])
INSERT, UPDATE_AFTER, DELETE = 0, 2, 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server on a free loopback port (its own process: delta-rs'
    file system calls hold the GIL, which an in-process server would need)
    -> the ``storage_options`` of a table in :data:`BUCKET`.  Stopped even
    when a test fails."""
    import boto3
    port = _free_port()
    log = open(tmp_path_factory.mktemp("moto") / "server.log", "wb")
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    options = {"AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
               # delta-rs' own commits: a conditional put too (no lock table)
               "conditional_put": "etag"}
    try:
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                              aws_secret_access_key="testing", region_name="us-east-1")
        deadline = time.monotonic() + 60
        while True:
            try:
                client.create_bucket(Bucket=BUCKET)
                break
            except Exception:                   # noqa: BLE001 (the server is still starting)
                if server.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield options
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def _batches(n_keys: int = 60) -> tuple[list[list[tuple]], dict]:
    """A changelog of four files: inserts, then updates and deletes spread
    over the whole key range, re-inserts of deleted keys and new keys ->
    (rows per file, the final table as {id: (name, score)})."""
    live: dict[int, tuple] = {}
    files: list[list[tuple]] = []
    seq = 0

    def put(rows, kind, k, value=None):
        nonlocal seq
        seq += 1
        if kind == DELETE:
            rows.append((k, *live.pop(k), kind, seq))
        else:
            live[k] = value
            rows.append((k, *value, kind, seq))

    rows: list = []
    for k in range(n_keys):
        put(rows, INSERT, k, (f"a{k}", k))
    files.append(rows)
    for b in range(1, 4):
        rows = []
        for k in range(b, n_keys + 10 * b, 3 + b):
            if k in live and k % 5 == b:
                put(rows, DELETE, k)
            elif k in live:
                put(rows, UPDATE_AFTER, k, (f"b{b}-{k}", k * 10 + b))
            else:
                put(rows, INSERT, k, (f"n{b}-{k}", b))
        files.append(rows)
    return files, dict(live)


def _write_input(directory, files) -> None:
    """One Parquet file per micro-batch, their modification times apart
    (``maxFilesPerTrigger`` takes them oldest first)."""
    os.makedirs(directory)
    now = time.time() - 100
    for i, rows in enumerate(files):
        path = os.path.join(directory, f"part-{i:04d}.parquet")
        pq.write_table(pa.Table.from_pylist([dict(zip(INPUT.names, r)) for r in rows], schema=INPUT), path)
        os.utime(path, (now + 10 * i, now + 10 * i))


def _ours(sink: DeltaUpsertSink) -> dict:
    """The table as the sink reads it: its live files from the log on the
    store, each without the rows its deletion vector deletes."""
    dt = sink._table()
    rows = pa.concat_tables([live_rows(sink, a) for a in sink.live_files(dt.version()).values()]
                            or [SCHEMA.empty_table()])
    out = {r["id"]: (r["name"], r["score"]) for r in rows.to_pylist()}
    assert len(out) == rows.num_rows, "a key twice in the table"
    return out


def _delta_rs(path: str, options: dict) -> dict:
    """The table as delta-rs' DataFusion scan reads it (applies the vectors)."""
    rows = pa.table(QueryBuilder().register("t", DeltaTable(path, storage_options=options))
                    .execute("SELECT id, name, score FROM t")).to_pylist()
    out = {r["id"]: (r["name"], r["score"]) for r in rows}
    assert len(out) == len(rows), "a key twice in the table"
    return out


def _log(path: str, options: dict, version: int) -> list[dict]:
    sink = DeltaUpsertSink(path, ["id"], SCHEMA, storage_options=options)
    return [json.loads(line) for line in
            sink.store.read(f"_delta_log/{version:020d}.json").decode().splitlines() if line.strip()]


def test_a_streaming_normalize_into_s3_is_written_by_the_executors_with_deletion_vectors(
        spark, tmp_path, s3, monkeypatch):
    from pyspark.sql import DataFrame

    from spark_changelog.api import ChangelogStream
    files, expected = _batches()
    _write_input(tmp_path / "in", files)
    path = f"s3://{BUCKET}/normalize"
    df = (spark.readStream.schema(", ".join(f"{f.name} {t}" for f, t in zip(
        INPUT, ["BIGINT", "STRING", "BIGINT", "TINYINT", "BIGINT"])))
          .option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "in")))

    def collected(self):
        raise AssertionError("the batch was collected on the driver")

    monkeypatch.setattr(DataFrame, "toArrow", collected)
    report = ChangelogStream.from_dataframe(df, primary_key=["id"]).normalize(key_groups=4).write_upsert(
        DeltaPath(path, storage_options=s3), checkpoint=str(tmp_path / "ck"))
    monkeypatch.undo()
    assert report.batches == 4
    # the first batch appends to the new table, the three others update and
    # delete through deletion vectors: none is a MERGE from the driver
    assert report.sink_writes == {"append: empty table": 1, "deletion vectors": 3}
    assert _delta_rs(path, s3) == expected
    sink = DeltaUpsertSink(path, ["id"], SCHEMA, storage_options=s3)
    assert _ours(sink) == expected
    assert sorted(read_table(path, s3)["id"].tolist()) == sorted(expected)
    dt = DeltaTable(path, storage_options=s3)
    assert "deletionVectors" in (dt.protocol().reader_features or [])
    live = sink.live_files(dt.version())
    assert any(a.get("deletionVector") for a in live.values())
    # every batch one commit, with its (query id, batch id); the last is the sink's own (put-if-absent)
    last = _log(path, s3, dt.version())
    assert last[0]["commitInfo"]["clientVersion"] == "spark_changelog"
    query_id = last[1]["txn"]["appId"]
    assert last[1]["txn"]["version"] == 3 and dt.transaction_version(query_id) == 3
    assert [_log(path, s3, v)[1]["txn"]["version"] for v in range(dt.version() - 2, dt.version())] == [1, 2]
    # the key indexes are local only: nothing of them on the object store
    import boto3
    client = boto3.client("s3", endpoint_url=s3["AWS_ENDPOINT_URL"], aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix="normalize/")["Contents"]]
    assert not [k for k in keys if "_spark_changelog_keys" in k]
    assert [k for k in keys if k.rsplit("/", 1)[-1].startswith("deletion_vector_")]

    # a replay of the last batch (a restart whose checkpoint missed its
    # commit): skipped, nothing written
    replay = sink.stage_batch(query_id, 3)
    assert replay.write_partition(pa.table({**{c: [1] for c in ("id", "score")}, "name": ["x"],
                                            "_kind": pa.array([2], pa.int8()), "_seq": [999]}), 0)["files"] == []
    assert replay.commit([])["skipped_replay"]
    assert DeltaTable(path, storage_options=s3).version() == dt.version()


def _changes(rows) -> pa.Table:
    """(kind, id, seq, name) rows -> a batch of the sink's changes."""
    return pa.table({"id": pa.array([r[1] for r in rows], pa.int64()),
                     "name": pa.array([r[3] for r in rows], pa.string()),
                     "score": pa.array([r[2] for r in rows], pa.int64()),
                     "_kind": pa.array([r[0] for r in rows], pa.int8()),
                     "_seq": pa.array([r[2] for r in rows], pa.int64())})


def _staged(sink, rows, batch_id, query_id="q", partitions=2):
    """A batch the way the sink writers run it: split by key, each partition
    written (as an executor would), then -> (stage, what they wrote)."""
    stage = sink.stage_batch(query_id, batch_id)
    written = [stage.write_partition(_changes([r for r in rows if r[1] % partitions == p]), p)
               for p in range(partitions)]
    return stage, written


def test_another_writer_taking_the_version_fails_the_batch_whole_and_its_replay_applies_it(s3):
    path = f"s3://{BUCKET}/concurrent"
    sink = DeltaUpsertSink(path, ["id"], SCHEMA, storage_options=s3, compact_min_files=3)
    stage, written = _staged(sink, [(INSERT, k, k, f"a{k}") for k in range(20)], 0)
    assert stage.commit(written)["write"] == "append: empty table"
    stage, written = _staged(sink, [(UPDATE_AFTER, k, 100 + k, f"b{k}") for k in range(0, 20, 3)]
                             + [(DELETE, 5, 200, None)], 1)
    assert stage.commit(written)["deleted"] == 1
    before = DeltaTable(path, storage_options=s3).version()

    # batch 2 is staged and its files written; another writer commits first
    mine = [(UPDATE_AFTER, 1, 300, "mine"), (DELETE, 2, 301, None), (INSERT, 40, 302, "new")]
    stage, written = _staged(sink, mine, 2)
    DeltaUpsertSink(path, ["id"], SCHEMA, storage_options=s3).write_arrow_batch(
        _changes([(UPDATE_AFTER, 7, 400, "theirs")]), query_id="p", batch_id=0)
    with pytest.raises(CommitFailedError, match="replays it"):
        stage.commit(written)
    theirs = {k: (f"b{k}" if k % 3 == 0 else f"a{k}", 100 + k if k % 3 == 0 else k) for k in range(20) if k != 5}
    theirs[7] = ("theirs", 400)
    assert _delta_rs(path, s3) == theirs                    # nothing of batch 2 is visible
    assert DeltaTable(path, storage_options=s3).version() == before + 1
    assert DeltaTable(path, storage_options=s3).transaction_version("q") == 1
    store = sink.store
    for f in (f for w in written for f in w["files"]):     # its data files were deleted
        with pytest.raises(FileNotFoundError):
            store.read(f["path"])

    # the restart replays batch 2 on top of the new version: exact
    stage, written = _staged(sink, mine, 2)
    result = stage.commit(written)
    assert (result["write"], result["updated"], result["deleted"], result["inserted"]) == \
        ("deletion vectors", 1, 1, 1)
    final = {**theirs, 1: ("mine", 300), 40: ("new", 302)}
    del final[2]
    assert _delta_rs(path, s3) == final
    assert _ours(DeltaUpsertSink(path, ["id"], SCHEMA, storage_options=s3)) == final
    assert DeltaTable(path, storage_options=s3).transaction_version("q") == 2
    # the automatic compaction (three small files) committed on the store too
    assert result.get("compaction", {}).get("files_added") == 1
    assert _delta_rs(path, s3) == final
    dt = DeltaTable(path, storage_options=s3)
    assert len(dt.file_uris()) == 1
    assert _log(path, s3, dt.version())[0]["commitInfo"]["operation"] == "OPTIMIZE"


@long_only("a streaming run failed by the concurrent commit and its restart, about a minute and a half")
def test_a_concurrent_commit_fails_the_streaming_batch_and_the_restart_replays_it_exactly(spark, tmp_path, s3,
                                                                                        monkeypatch):
    from spark_changelog.api import ChangelogStream
    from spark_changelog.sinks.delta import StagedUpsert
    files, expected = _batches()
    _write_input(tmp_path / "in", files)
    path = f"s3://{BUCKET}/restart"
    spoiled = []
    commit = StagedUpsert.commit_batch

    def another_writer_first(self, written):
        # batch 2's files are written and its lookups made: another writer
        # takes the next version before the driver's commit (once)
        if self.batch_id == 2 and not spoiled:
            spoiled.append(DeltaUpsertSink(path, ["id"], SCHEMA, storage_options=s3).write_arrow_batch(
                _changes([(UPDATE_AFTER, 10_000, 1, "theirs")]), query_id="other", batch_id=0))
        return commit(self, written)

    def run():
        df = (spark.readStream.schema("id BIGINT, name STRING, score BIGINT, _kind TINYINT, _seq BIGINT")
              .option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "in")))
        return ChangelogStream.from_dataframe(df, primary_key=["id"]).normalize(key_groups=4).write_upsert(
            DeltaPath(path, storage_options=s3), checkpoint=str(tmp_path / "ck"))

    monkeypatch.setattr(StagedUpsert, "commit_batch", another_writer_first)
    with pytest.raises(Exception, match="replays it"):
        run()
    assert spoiled
    dt = DeltaTable(path, storage_options=s3)
    [query_id] = [a["txn"]["appId"] for a in _log(path, s3, 2) if "txn" in a]    # batch 0's append
    assert dt.transaction_version(query_id) == 1            # batches 0 and 1 only: nothing of batch 2
    report = run()                                          # the restart replays batch 2, then batch 3
    assert report.batches == 2
    assert DeltaTable(path, storage_options=s3).transaction_version(query_id) == 3
    assert _delta_rs(path, s3) == {**expected, 10_000: ("theirs", 1)}
    assert _ours(DeltaUpsertSink(path, ["id"], SCHEMA, storage_options=s3)) == {**expected, 10_000: ("theirs", 1)}
