"""Every operator of a chained pipeline reports its counters: an upstream
operator's metric rows travel through the next keyed operator (key group -1)
instead of being dropped."""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from changelog_data import schema_of, set_arrival, to_frame
from spark_changelog.api import ChangelogStream
from spark_changelog.sinks.delta import read_table

COLS = ["id", "v"]
ARROW = schema_of(COLS, [pa.int64(), pa.string()])
FILES = [
    [["+I", [1, "a"], 10], ["+I", [2, "b"], 11], ["+U", [1, "a2"], 12]],
    # an older change of id 1 arrives late: superseded by normalize
    [["+U", [1, "old"], 5], ["-D", [2, "b"], 13], ["+I", [3, "c"], 14]],
]


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "batch"])
def test_normalize_then_materializer_reports_both(spark, tmp_path, streaming):
    os.makedirs(tmp_path / "in")
    for i, rows in enumerate(FILES):
        path = str(tmp_path / "in" / f"part-{i}.parquet")
        pq.write_table(pa.Table.from_pandas(to_frame(rows, COLS), schema=ARROW, preserve_index=False), path)
        set_arrival(path, i)
    from pyspark.sql.pandas.types import from_arrow_schema
    st = from_arrow_schema(ARROW)
    d = str(tmp_path / "in")
    df = (spark.readStream.schema(st).option("maxFilesPerTrigger", 1).parquet(d) if streaming
          else spark.read.schema(st).parquet(d))
    s = ChangelogStream.from_dataframe(df, primary_key=["id"]).normalize(key_groups=4)
    report = s.write_upsert(str(tmp_path / "t"), materialize="force", key_groups=4,
                            checkpoint=str(tmp_path / "ck") if streaming else None)
    table = read_table(str(tmp_path / "t")).sort_values("id")
    assert [tuple(r) for r in table[COLS].itertuples(index=False)] == [(1, "a2"), (3, "c")]
    assert set(report.operators) == {"ChangelogNormalize", "sink_upsert_materializer"}
    assert report.operators["ChangelogNormalize"]["rows_in"] == 6
    if streaming:   # batch sorts all six by _seq: nothing arrives after a newer change
        assert report.operators["ChangelogNormalize"]["superseded"] == 1
    assert report.rows_in == 6
    # the materializer counts its input too: normalize's output
    assert report.operators["sink_upsert_materializer"]["rows_in"] == report.operators["ChangelogNormalize"]["rows_out"]


def test_a_plan_without_keyed_operators_says_its_rows_in_are_not_counted(spark, tmp_path):
    """Sources straight into the sink (a batch over an ordered input): no
    operator counts the rows in, and the summary says so instead of 0."""
    os.makedirs(tmp_path / "in")
    pq.write_table(pa.Table.from_pandas(to_frame(FILES[0], COLS), schema=ARROW, preserve_index=False),
                   str(tmp_path / "in" / "part-0.parquet"))
    from pyspark.sql.pandas.types import from_arrow_schema
    df = spark.read.schema(from_arrow_schema(ARROW)).parquet(str(tmp_path / "in"))
    report = ChangelogStream.from_dataframe(df, primary_key=["id"]).write_upsert(str(tmp_path / "t"))
    assert report.rows_in is None and report.changes_out == 3
    assert report.summary().splitlines()[0] == "changelog rows in: not counted (no keyed operator)   " \
                                               "changes out: 3   batches: 1"
