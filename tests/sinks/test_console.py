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


def test_a_keyed_blackhole_batch_is_not_shuffled_by_its_key(spark, monkeypatch):
    """A blackhole keeps nothing, so its sink writers take the partitions as
    they are: no exchange by the sink key (Flink's blackhole has none either),
    and still every row counted, a null key a reject."""
    from spark_changelog.runtime import sink_writers

    df = spark.createDataFrame([(i, 0, i) for i in range(25)] + [(None, 0, 99)],
                               f"id BIGINT, {KIND_COL} TINYINT, {SEQ_COL} BIGINT").repartition(3)
    plans = []
    real = type(df).mapInArrow

    def spy(self, fn, schema, *a, **kw):
        plans.append(self._jdf.queryExecution().analyzed().toString())
        return real(self, fn, schema, *a, **kw)

    monkeypatch.setattr(type(df), "mapInArrow", spy)
    stage = BlackholeSink(["id"]).stage_batch("q", 0)
    side, rejects, written = sink_writers.write_partitions(df, [stage], ["id"], "t")
    assert sum(w["rows"] for w in written[0]) == 25 and len(rejects) == 1 and side == []
    assert len(plans) == 1 and "RepartitionByExpression [id" not in plans[0]
    assert sink_writers.POSITION_COL not in plans[0]
