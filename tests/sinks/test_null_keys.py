"""Changes whose sink key is null (docs/semantics.md, section 3, "bad input"): they go to the
dead-letter output with a reason naming the field, or stop the run before
anything of the batch is written; they never reach the materializer's state."""
from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from changelog_data import schema_of, set_arrival, to_frame, to_rows
from spark_changelog.api import ChangelogStream
from spark_changelog.connectors.dead_letter import read_dead_letter
from spark_changelog.operators.sink_upsert_materializer import SinkUpsertMaterializer
from spark_changelog.runtime.local import LocalRunner
from spark_changelog.sinks.delta import read_table

COLS = ["uk", "pk", "v"]
ARROW = schema_of(COLS, [pa.int64(), pa.int64(), pa.string()])
ROWS = [["+I", [1, 10, "a"]], ["+I", [2, None, "b"]], ["+I", [3, None, "c"]],
        ["-D", [2, None, "b"]], ["+I", [4, 40, "d"]]]


def test_materializer_passes_null_keys_through_without_state():
    op = SinkUpsertMaterializer(ARROW, ["pk"], upsert_key=["uk"])
    runner = LocalRunner(op)
    out = runner.run_batch(to_frame(ROWS, COLS), processing_time_ms=0)
    # null-key rows first (unchanged kinds), then the materialized ones
    assert to_rows(out, COLS) == [["+I", [2, None, "b"]], ["+I", [3, None, "c"]],
                                  ["-D", [2, None, "b"]], ["+I", [1, 10, "a"]],
                                  ["+I", [4, 40, "d"]]]
    assert runner.metrics.counters["null_key_passthrough"] == 3
    assert runner.state["pk"].notna().all() and len(runner.state) == 2


def write_input(directory):
    os.makedirs(directory, exist_ok=True)
    f = to_frame(ROWS, COLS)
    for i, part in enumerate((f.iloc[:3], f.iloc[3:])):
        path = os.path.join(directory, f"part-{i}.parquet")
        pq.write_table(pa.Table.from_pandas(part, schema=ARROW, preserve_index=False), path)
        set_arrival(path, i)


def stream(spark, directory, streaming):
    from pyspark.sql.pandas.types import from_arrow_schema
    st = from_arrow_schema(ARROW)
    df = (spark.readStream.schema(st).option("maxFilesPerTrigger", 1).parquet(directory)
          if streaming else spark.read.schema(st).parquet(directory))
    return ChangelogStream.from_dataframe(df, primary_key=["uk"], name="x")


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "batch"])
def test_null_sink_keys_go_to_the_dead_letter_output(spark, tmp_path, streaming):
    write_input(tmp_path / "in")
    s = stream(spark, str(tmp_path / "in"), streaming)
    report = s.write_upsert(str(tmp_path / "table"), key="pk", dead_letter=str(tmp_path / "dl"),
                            checkpoint=str(tmp_path / "ck") if streaming else None, key_groups=4)
    table = read_table(str(tmp_path / "table")).sort_values("pk")
    assert [tuple(r) for r in table[COLS].itertuples(index=False)] == [(1, 10, "a"), (4, 40, "d")]
    dead = read_dead_letter(str(tmp_path / "dl"))
    assert report.invalid == 3 and report.counters["null_sink_key"] == 3
    assert report.counters["null_key_passthrough"] == 3          # by the materializer
    assert sorted((json.loads(d["raw"])["op"], json.loads(d["raw"])["v"]) for d in dead) == \
        [("+I", "b"), ("+I", "c"), ("-D", "b")]
    for d in dead:
        assert d["file"] == f"sink:{tmp_path / 'table'}"
        assert d["reason"].startswith("field 'pk': primary key of the sink table is null")
        assert json.loads(d["raw"])["pk"] is None
    if streaming:
        assert all(n.startswith("sink-batch-") for n in os.listdir(tmp_path / "dl")
                   if n.endswith(".jsonl"))


def test_null_sink_key_without_dead_letter_stops_before_writing(spark, tmp_path):
    write_input(tmp_path / "in")
    s = stream(spark, str(tmp_path / "in"), False)
    with pytest.raises(ValueError, match=r"null sink key.*field 'pk'.*\"v\": \"b\""):
        s.write_upsert(str(tmp_path / "table"), key="pk")
    assert not (tmp_path / "table").exists() or read_table(str(tmp_path / "table")).empty
