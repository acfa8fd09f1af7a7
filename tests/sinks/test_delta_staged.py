"""Delta appends written by the executors (docs/sinks.md, "Appends written by
the executors"): the data files come from the partitions, the driver commits
them once with the batch id; a replay writes nothing; a MERGE batch is not
staged; another writer's commit in between fails the batch, never doubles it."""
from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from sink_changes import SCHEMA, changes
from spark_changelog.model import KIND_COL, SEQ_COL
from spark_changelog.sinks.delta import DeltaUpsertSink, StagedUpsert, read_table



def test_a_first_batch_is_written_by_the_executors_and_committed_once(spark, tmp_path):
    from spark_changelog.api import ChangelogStream
    df = spark.createDataFrame(
        [(i, f"n{i}", 0, i) for i in range(1, 41)] + [(7, "n7", 3, 100), (8, "n8", 1, 101), (8, "m8", 2, 101)],
        f"id BIGINT, name STRING, {KIND_COL} TINYINT, {SEQ_COL} BIGINT")
    path = str(tmp_path / "t")
    DeltaUpsertSink(path, ["id"], SCHEMA).write_arrow_batch(changes([]), query_id="setup", batch_id=0)
    report = ChangelogStream.from_dataframe(df, primary_key=["id"]).write_upsert(path)
    table = read_table(path)
    assert table["id"].tolist() == [i for i in range(1, 41) if i != 7]
    assert table.set_index("id").loc[8, "name"] == "m8"
    assert report.sink_writes == {"append: empty table": 1}
    assert (report.upserted, report.changes_out) == (39, 43)
    adds = pa.table(DeltaTable(path).get_add_actions(flatten=True)).to_pylist()
    assert sum(a["num_records"] for a in adds) == 39 and len(adds) >= 2   # one file per partition
    assert all(a["min.id"] is not None for a in adds)                     # stats to prune by


def test_replays_are_not_written_merges_without_deletion_vectors_are_collected_and_a_concurrent_commit_fails_the_append(
        tmp_path):
    path = str(tmp_path / "t")
    sink = DeltaUpsertSink(path, ["id"], SCHEMA)
    staged = sink.stage_batch("q", 0)                  # the table is created empty, then staged
    assert staged.reason == "append: empty table"
    w = staged.write_partition(changes([(0, 1, 1, "a"), (0, 2, 2, "b"), (3, 3, 9, None)]), 0)
    assert (w["adds"], w["retracts"], json.loads(w["files"][0]["stats"])["numRecords"]) == (2, 1, 2)
    result = staged.commit([w])
    assert (result["inserted"], result["missing_deletes"], result["committed"]) == (2, 1, True)
    assert sink.last_batch_id("q") == 0

    replay = sink.stage_batch("q", 0)
    assert replay.reason is None and replay.write_partition(changes([(0, 5, 3, "c")]), 0)["files"] == []
    assert replay.commit([])["skipped_replay"]
    assert isinstance(sink.stage_batch("q", 1), StagedUpsert)   # the table has rows: deletion vectors
    plain = DeltaUpsertSink(str(tmp_path / "plain"), ["id"], SCHEMA, deletion_vectors=False)
    plain.write_arrow_batch(changes([(0, 1, 1, "a")]), query_id="q", batch_id=0)
    assert plain.stage_batch("q", 1) is None           # no deletion vectors: a MERGE, from the driver

    other = str(tmp_path / "u")
    sink = DeltaUpsertSink(other, ["id"], SCHEMA)
    sink.write_arrow_batch(changes([]), query_id="setup", batch_id=0)
    staged = sink.stage_batch("q", 0)
    w = staged.write_partition(changes([(0, 1, 1, "a")]), 0)
    DeltaUpsertSink(other, ["id"], SCHEMA).write_arrow_batch(changes([(0, 1, 1, "x")]), query_id="p", batch_id=0)
    with pytest.raises(Exception, match="(?i)commit|version|conflict"):
        staged.commit([w])
    assert read_table(other)["name"].tolist() == ["x"]
    staged.drop([w])                                   # the failed batch's file is deleted
    assert not os.path.exists(os.path.join(other, w["files"][0]["path"]))
