"""The blackhole sink's batches stay on the executors (sinks/console.py):
only counts reach the driver."""
from __future__ import annotations

import pytest

from spark_changelog.model import KIND_COL, SEQ_COL
from spark_changelog.sinks.console import BlackholeSink


def test_a_blackhole_batch_is_counted_by_the_executors_never_collected(spark, monkeypatch):
    from pyspark.sql import DataFrame

    from spark_changelog.api import ChangelogStream

    def collected(self):
        raise AssertionError("the batch was collected on the driver")

    monkeypatch.setattr(DataFrame, "toArrow", collected)
    df = spark.createDataFrame([(i, f"n{i}", 0, i) for i in range(25)] + [(3, "n3", 3, 30)],
                               f"id BIGINT, name STRING, {KIND_COL} TINYINT, {SEQ_COL} BIGINT")
    sink = BlackholeSink()
    report = ChangelogStream.from_dataframe(df, primary_key=["id"]).write_upsert(sink)
    assert sink.rows == 26 and report.changes_out == 26


def test_a_bad_kind_in_a_partition_names_the_row():
    import pyarrow as pa
    stage = BlackholeSink().stage_batch("q", 4)
    with pytest.raises(ValueError, match="invalid _kind value 9 .* batch 4"):
        stage.write_partition(pa.table({KIND_COL: pa.array([0, 9], pa.int8())}), 0)
