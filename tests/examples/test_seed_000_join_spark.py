"""The seed example of docs/semantics.md, section 2, end to end through the Python API:

    INSERT INTO t1 SELECT s1.*, s2.attr FROM s1 JOIN s2 ON s1.level = s2.id

with s1/s2 as changelog parquet inputs, ``s1.join(s2, on level = id).select(...)``
into a Delta table with primary key ``id``, in streaming and in batch.

The three sink arrival orders of the spec's table are checked through the
materializer on the recorded Flink cases (LocalRunner, fast); the Spark runs
arrange the join key groups so that the join's output for id 1 comes from two
key groups with unrelated sequence counters, which is how Spark reorders it.
"""
from __future__ import annotations

import os
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from changelog_data import key_groups_separating, load_fixture, schema_of, set_arrival, to_frame, to_rows
from spark_changelog.api import ChangelogStream, PlanWarning
from spark_changelog.model import KIND_COL, SEQ_COL
from spark_changelog.operators.sink_upsert_materializer import SinkUpsertMaterializer
from spark_changelog.plan import PlanError
from spark_changelog.runtime.local import LocalRunner
from spark_changelog.sinks.delta import read_table

S1_COLS, S2_COLS, T1_COLS = ["id", "level"], ["id", "attr"], ["id", "level", "attr"]
S1_ARROW = schema_of(S1_COLS, [pa.int64(), pa.int64()])
S2_ARROW = schema_of(S2_COLS, [pa.int64(), pa.string()])
T1_ARROW = schema_of(T1_COLS, [pa.int64(), pa.int64(), pa.string()])

S2_ROWS = [["+I", [10, "a1"], 1], ["+I", [20, "b1"], 2]]
S1_ROWS = [["+I", [1, 10], 1], ["-U", [1, 10], 2], ["+U", [1, 20], 3]]
WANT = [(1, 20, "b1")]

CASES = {c["name"]: c for c in load_fixture("flink/materializer.json")["cases"]}


# --------------------------------------------------------------------------- the three orders

@pytest.mark.parametrize("name", ["M1_seed_case1_order", "M2_seed_case2_order",
                                  "M3_seed_case3_order"])
def test_each_sink_arrival_order_through_the_materializer(name):
    """Spec section 2 cases 1-3 (as recorded from Flink 2.3): the join output
    reaching the sink in that order, one row per micro-batch and all in one
    batch (arrival order = ``_seq``), ends with (1, 20, b1)."""
    case = CASES[name]
    rows = case["inputs"]["J"]["rows"]
    frame = to_frame(rows, T1_COLS)
    op = SinkUpsertMaterializer(T1_ARROW, ["id"], upsert_key=None)
    one_by_one = LocalRunner(op).run([frame.iloc[[i]] for i in range(len(frame))],
                                     processing_time_ms=0)
    assert to_rows(one_by_one, T1_COLS) == case["expected"]
    runner = LocalRunner(op)
    runner.run_batch(frame, processing_time_ms=0)
    assert [tuple(r) for r in runner.state[T1_COLS].itertuples(index=False)] == WANT


# --------------------------------------------------------------------------- Spark

def write(directory, frames, schema):
    os.makedirs(directory, exist_ok=True)
    for i, f in enumerate(frames):
        path = os.path.join(directory, f"part-{i:04d}.parquet")
        pq.write_table(pa.Table.from_pandas(f, schema=schema, preserve_index=False), path)
        set_arrival(path, i)


def read(spark, directory, schema, pk, streaming, name):
    from pyspark.sql.pandas.types import from_arrow_schema
    st = from_arrow_schema(schema)
    df = (spark.readStream.schema(st).option("maxFilesPerTrigger", 1).parquet(directory)
          if streaming else spark.read.schema(st).parquet(directory))
    return ChangelogStream.from_dataframe(df, primary_key=pk, name=name)


def seed_query(spark, base, streaming, key_groups):
    s1 = read(spark, str(base / "s1"), S1_ARROW, ["id"], streaming, "s1")
    s2 = read(spark, str(base / "s2"), S2_ARROW, ["id"], streaming, "s2")
    return s1.join(s2, on=[("level", "id")], key_groups=key_groups).select("id", "level", "attr")


def final(path):
    t = read_table(path)
    return sorted(map(tuple, t[T1_COLS].astype(object).values.tolist()))


@pytest.fixture(scope="module")
def seed_inputs(tmp_path_factory, spark):
    """s2 in one file; s1's insert in a first file, its move to level 20 in a
    second (two micro-batches).  Key groups: the smallest count that puts join
    keys 10 and 20 in different groups, so -U(1,10,a1) and +U(1,20,b1) get
    sequence numbers from different counters (the disorder of docs/semantics.md, section 2)."""
    base = tmp_path_factory.mktemp("seed")
    write(base / "s2", [to_frame(S2_ROWS, S2_COLS)], S2_ARROW)
    write(base / "s1", [to_frame(S1_ROWS[:1], S1_COLS), to_frame(S1_ROWS[1:], S1_COLS)], S1_ARROW)
    return base, key_groups_separating(spark, 10, 20)


def test_seed_explain_from_the_api(spark, seed_inputs):
    base, groups = seed_inputs
    q = seed_query(spark, base, streaming=False, key_groups=groups)
    text = q.explain(key="id", table="t1")
    assert "upsert materializer: inserted: the input has updates" in text
    assert "Join(joinType=[InnerJoin], where=[level = id0], leftInputSpec=[HasUniqueKey], " \
           "rightInputSpec=[JoinKeyContainsUniqueKey])" in text
    assert "left upsert key [id] lost: the input is shuffled by [level]" in text
    assert "Source(name=[s1], fields=[id, level], primaryKey=[id])" in text
    unsafe = q.explain(key="id", materialize="none", table="t1")
    assert "upsertMaterialize=[false]" in unsafe and "UNSAFE" in unsafe
    with pytest.raises(PlanError, match="FLINK-41007"):
        q.write_upsert(str(base / "never"), key="id", materialize="none", conflict="deduplicate")
    # a non-deterministic column in rows without an upsert key: warned at plan time
    from pyspark.sql import functions as F
    nd = q.with_column("ts", F.current_timestamp())
    assert "WARNING: non-deterministic column(s) [ts]" in nd.explain(key="id")


def test_seed_streaming_and_batch(spark, seed_inputs, tmp_path):
    base, groups = seed_inputs
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanWarning)
        rep = seed_query(spark, base, True, groups).write_upsert(
            str(tmp_path / "stream_t1"), key="id", checkpoint=str(tmp_path / "ck"))
    assert rep.batches == 2
    assert "upsert materializer: inserted" in rep.plan
    assert final(tmp_path / "stream_t1") == WANT

    b = seed_query(spark, base, False, groups)
    assert "_metrics" in b.df.columns      # the join's metric rows pass through select
    changes = b.collect()
    assert sorted(to_rows(changes, T1_COLS)) == sorted(
        [["+I", [1, 10, "a1"]], ["-U", [1, 10, "a1"]], ["+U", [1, 20, "b1"]]])
    # the join numbers its output per key group: the move to level 20 does not
    # sort after the retraction of level 10 (docs/semantics.md, section 2, cases 2/3), so a
    # sink ordering id 1's changes by _seq would apply the -U last
    seq = {r[KIND_COL]: r[SEQ_COL] for _, r in changes.iterrows()}
    assert seq[2] < seq[1]
    rep = b.write_upsert(str(tmp_path / "batch_t1"), key="id")
    assert rep.counters.get("retract_no_match", 0) == 0
    assert final(tmp_path / "batch_t1") == WANT
    # without the materializer explain calls it unsafe (the row may be lost)
    assert "UNSAFE" in b.explain(key="id", materialize="none")
