"""The changelog output written by the executors (docs/sinks.md, "The changelog
output"): run by the pipeline, each partition of a batch writes its part file
and the driver only commits; the batch is never collected, and it reads back
in emission order across the parts, as the collected path (the driver writing
it whole) does."""
from __future__ import annotations

import os

import pyarrow as pa
import pytest

from spark_changelog.model import KIND_COL, SEQ_COL
from spark_changelog.sinks.changelog import committed_batches, read_changelog
from spark_changelog.sinks.delta import DeltaUpsertSink, read_table

KEYS = range(1, 9)
#: every key inserted at _seq 1, then updated at _seq 2 (a -U/+U pair), key 5
#: deleted at _seq 3; arriving in reverse, so only the emission order orders them
ROWS = ([(k, f"a{k}", 0, 1) for k in KEYS] + [(k, f"a{k}", 1, 2) for k in KEYS]
        + [(k, f"b{k}", 2, 2) for k in KEYS] + [(5, "b5", 3, 3)])[::-1]
#: emission order: _seq, then the key, then the retraction first
EXPECTED = ([("+I", 1, k, f"a{k}") for k in KEYS]
            + [r for k in KEYS for r in (("-U", 2, k, f"a{k}"), ("+U", 2, k, f"b{k}"))]
            + [("-D", 3, 5, "b5")])


def _rows(log):
    return [(r["op"], r["_seq"], r["id"], r["name"]) for _, r in log.iterrows()]


@pytest.mark.parametrize("fmt", ["parquet", "debezium-json"])
def test_the_executors_write_the_parts_and_the_batch_reads_as_the_collected_one(spark, tmp_path, monkeypatch, fmt):
    from pyspark.sql import DataFrame

    from spark_changelog.api import ChangelogStream
    df = spark.createDataFrame(ROWS, f"id BIGINT, name STRING, {KIND_COL} TINYINT, {SEQ_COL} BIGINT")
    stream = ChangelogStream.from_dataframe(df, primary_key=["id"])
    # the reference: a table without deletion vectors that has rows is merged by
    # delta-rs from the driver, so the batch is collected and the changelog
    # written from there
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    merged = DeltaUpsertSink(str(tmp_path / "ref"), ["id"], schema, deletion_vectors=False)
    merged.write_arrow_batch(pa.table({"id": [100], "name": ["x"], KIND_COL: pa.array([0], pa.int8()),
                                       SEQ_COL: [0]}), query_id="setup", batch_id=0)
    ref = stream.write_upsert(merged, changelog_path=str(tmp_path / "reflog"), changelog_format=fmt)
    assert ref.sink_writes == {"merge": 1}

    def collected(self):
        raise AssertionError("the batch was collected on the driver")

    monkeypatch.setattr(DataFrame, "toArrow", collected)
    report = stream.write_upsert(str(tmp_path / "t"), changelog_path=str(tmp_path / "log"),
                                 changelog_format=fmt)
    monkeypatch.undo()
    [(batch_id, parts)] = committed_batches(tmp_path / "log")
    assert batch_id == 0 and len(parts) == 2            # both partitions (of 2) wrote theirs
    assert len({p.parent for p in parts}) == 1           # one attempt's directory
    assert sorted(os.listdir(parts[0].parent.parent)) == sorted(["_commit.json", parts[0].parent.name])
    assert _rows(read_changelog(tmp_path / "log")) == EXPECTED
    assert _rows(read_changelog(tmp_path / "reflog")) == EXPECTED
    assert (report.changes_out, ref.changes_out) == (len(ROWS), len(ROWS))
    assert sorted(read_table(str(tmp_path / "t"))["id"].tolist()) == [k for k in KEYS if k != 5]

