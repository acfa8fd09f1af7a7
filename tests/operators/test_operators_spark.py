"""Deduplication, group aggregation and Top-N on real Spark: streaming (one
file per micro-batch, state in the state store) and batch give the final
table of the row-at-a-time reference (docs/operators.md)."""
from __future__ import annotations

import os
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from changelog_data import schema_of, set_arrival, to_frame, to_rows
from spark_changelog.model import END_OF_INPUT_MS
from spark_changelog.model.partition_watermarks import EventTimeSpec
from spark_changelog.model.watermark import BoundedOutOfOrderness
from spark_changelog.operators.aggregate.group_aggregate import GroupAggregate
from spark_changelog.operators.deduplicate import ProcTimeKeepFirst, RowTimeKeepFirst, RowTimeKeepLast
from spark_changelog.operators.top_n import RetractableTopN
from spark_changelog.runtime.event_time import LocalEventTimeRunner
from spark_changelog.runtime.local import LocalRunner
from spark_changelog.runtime.pipeline import split_metrics
from spark_changelog.runtime.spark_event_time import apply_event_time
from spark_changelog.runtime.spark_keyed import apply_keyed
from spark_changelog.runtime.spark_seen_keys import FIRST_STEP_TASKS_CONF
from tests.reference.aggregate import RefGroupAggregate
from tests.reference.deduplicate import RefKeepFirst, RefKeepLast
from tests.reference.top_n import RefTopN

COLS = ["k", "v", "t"]
ARROW = schema_of(COLS, [pa.int64(), pa.int64(), pa.int64()])


def insert_only_files(seed, n_files=3, per_file=15):
    rnd = random.Random(seed)
    files, seq = [], 0
    for f in range(n_files):
        rows = []
        for _ in range(per_file):
            rows.append(["+I", [rnd.randrange(6), rnd.randrange(4), 1000 * f + rnd.randrange(900)],
                         seq])
            seq += 1
        files.append(rows)
    return files


def changelog_files(seed, n_files=3, per_file=15):
    """Valid histories: inserts, updates (-U/+U in one file), deletes."""
    rnd = random.Random(seed)
    alive, files, seq = {}, [], 0
    for f in range(n_files):
        rows = []
        while len(rows) < per_file:
            ident = rnd.randrange(12)
            new = [rnd.randrange(3), rnd.randrange(5), ident]
            if ident not in alive:
                rows.append(["+I", new, seq])
                alive[ident] = new
            elif rnd.random() < 0.6:
                rows += [["-U", alive[ident], seq], ["+U", new, seq + 1]]
                seq += 1
                alive[ident] = new
            else:
                rows.append(["-D", alive.pop(ident), seq])
            seq += 1
        files.append(rows)
    return files


def write_files(directory, files):
    os.makedirs(directory, exist_ok=True)
    for i, rows in enumerate(files):
        path = os.path.join(directory, f"part-{i:04d}.parquet")
        pq.write_table(pa.Table.from_pandas(to_frame(rows, COLS), schema=ARROW,
                                            preserve_index=False), path)
        set_arrival(path, i)


def run_spark(spark, directory, operator, streaming, watermark=False):
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema
    schema = from_arrow_schema(ARROW)
    if streaming:
        df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(directory)
    else:
        df = spark.read.schema(schema).parquet(directory)
    if watermark:
        # an event-time operator: its own watermark, max(rt) - 1 ms
        df = df.withColumn("rt", F.timestamp_millis("t"))
        out = apply_event_time(df, operator, EventTimeSpec(BoundedOutOfOrderness("rt", 0)),
                               key_groups=2)
    else:
        out = apply_keyed(df, operator, key_groups=2)
    if not streaming:
        return [split_metrics(out.toArrow())[0]]
    batches = []
    query = (out.writeStream.foreachBatch(lambda b, _: batches.append(b.toArrow()))
             .trigger(availableNow=True)
             .option("checkpointLocation", os.path.join(directory, "..", "ck")).start())
    query.awaitTermination()
    return [split_metrics(b)[0] for b in batches]


def final_table(changes, key_len):
    """Apply a changelog to a table keyed on its first ``key_len`` columns."""
    table = {}
    for kind, row in changes:
        k = tuple(row[:key_len])
        if kind in ("+I", "+U"):
            table[k] = tuple(row)
        else:
            assert table.pop(k) == tuple(row), (kind, row)
    return sorted(table.values())


def spark_table(frames, cols, key_len):
    changes = [(k, v) for f in frames for k, v in to_rows(f, cols)]
    return final_table(changes, key_len)


CASES = {
    "keep_first_proctime": (insert_only_files, lambda s: ProcTimeKeepFirst(s, ["k"]),
                            lambda: RefKeepFirst([0]), COLS, 1),
    "keep_last_rowtime": (insert_only_files, lambda s: RowTimeKeepLast(s, ["k"], "t"),
                          lambda: RefKeepLast([0], time=2, suppress_equal=False), COLS, 1),
    "group_aggregate": (changelog_files,
                        lambda s: GroupAggregate(s, ["k"], [("count", None, "c"),
                                                            ("sum", "v", "s"), ("min", "v", "mn")]),
                        lambda: RefGroupAggregate([0], [("count", None, False),
                                                        ("sum", 1, True), ("min", 1, True)]),
                        ["k", "c", "s", "mn"], 1),
    "top2": (changelog_files, lambda s: RetractableTopN(s, ["k"], 2, [("v", False)],
                                                        rank_column="rn"),
             lambda: RefTopN([0], 2, [(1, False)], True), COLS + ["rn"], None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_streaming_and_batch_give_the_reference_table(spark, tmp_path, name):
    make_files, make_op, make_ref, out_cols, key_len = CASES[name]
    files = make_files(seed=len(name))
    write_files(tmp_path / "in", files)
    ref = make_ref()
    changes = [(kind, tuple(vals)) for rows in files for kind, vals, _ in rows]
    # the deduplicate references take insert-only rows without their kind
    want = ref.run_batch([r for _, r in changes] if name.startswith("keep") else changes)
    if key_len is None:                   # Top-N with the rank: keyed on (partition, rank)
        out_cols = ["k", "rn", "v", "t"]
        want = [(kind, (r[0], r[3], r[1], r[2])) for kind, r in want]
        key_len = 2
    expected = final_table(want, key_len)
    assert expected                                            # the test has something to compare
    for streaming in (True, False):
        frames = run_spark(spark, str(tmp_path / "in"), make_op(ARROW), streaming)
        if streaming:
            assert len(frames) >= len(files)
        assert spark_table(frames, out_cols, key_len) == expected, f"streaming={streaming}"


def test_rowtime_keep_first_waits_for_the_watermark_on_spark(spark, tmp_path):
    """Streaming: a batch's rows arrive under the watermark of the earlier
    batches (max event time - 1 ms) and the candidates are emitted once the
    watermark passes them, the one their own batch raises included, as the
    local event-time runner does; batch: the end of input emits all."""
    files = insert_only_files(seed=7)
    # a new key with the largest event time: no watermark ever passes it in streaming
    files[-1].append(["+I", [9, 0, 2999], files[-1][-1][2] + 1])
    write_files(tmp_path / "in", files)
    arrow = ARROW.insert(3, pa.field("rt", pa.timestamp("us", tz="UTC")))   # as Spark hands it over

    local = LocalEventTimeRunner(RowTimeKeepFirst(ARROW, ["k"], "t"),
                                 EventTimeSpec(BoundedOutOfOrderness("t", 0)))
    out = []
    for rows in files:
        table = pa.Table.from_pandas(to_frame(rows, COLS), schema=ARROW, preserve_index=False)
        out += to_rows(local.run_batch(table, processing_time_ms=0), COLS)
    expected_stream = sorted(tuple(v) for _, v in out)
    batch_runner = LocalRunner(RowTimeKeepFirst(ARROW, ["k"], "t"))
    batch_runner.run_batch(to_frame([r for f in files for r in f], COLS), processing_time_ms=0)
    everything = final_table(to_rows(batch_runner.advance_watermark(END_OF_INPUT_MS,
                                                                    processing_time_ms=0), COLS), 1)

    frames = run_spark(spark, str(tmp_path / "in"), RowTimeKeepFirst(arrow, ["k"], "rt"),
                       True, watermark=True)
    got = sorted(tuple(v)[:3] for f in frames for _, v in to_rows(f, COLS))
    assert got == expected_stream and len(got) < len(everything)
    frames = run_spark(spark, str(tmp_path / "in"), RowTimeKeepFirst(arrow, ["k"], "rt"),
                       False, watermark=True)
    assert sorted(tuple(v)[:3] for f in frames for _, v in to_rows(f, COLS)) == everything


def test_api_methods_build_the_operators_batch(spark):
    """deduplicate / group_by().agg / top_n through the plan and its lowering,
    on a bounded input: the final tables of the reference."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from spark_changelog.api import ChangelogStream
    from spark_changelog.model import ChangelogMode
    rows = insert_only_files(seed=3, n_files=1, per_file=25)[0]
    df = spark.createDataFrame(to_frame(rows, COLS), schema=from_arrow_schema(ARROW))
    s = ChangelogStream.from_dataframe(df, mode=ChangelogMode.INSERT_ONLY, name="t")
    data = [tuple(v) for _, v, _ in rows]

    def table(stream, cols, key_len):
        return final_table([(k, v) for k, v in to_rows(stream.collect(), cols)], key_len)

    first = {}
    for r in data:
        first.setdefault(r[0], r)
    assert table(s.deduplicate("k", keep="first"), COLS, 1) == sorted(first.values())
    earliest = {}
    for r in data:                       # smallest t, ties: the earlier row
        if r[0] not in earliest or r[2] < earliest[r[0]][2]:
            earliest[r[0]] = r
    timed = s.with_column("rt", "timestamp_millis(t)").with_watermark("rt", 0)
    assert table(timed.deduplicate("k", order_by="rt", keep="first").select("k", "v", "t"),
                 COLS, 1) == sorted(earliest.values())
    want = final_table(RefGroupAggregate([0], [("count", None, False), ("max", 1, True)])
                       .run_batch([("+I", r) for r in data]), 1)
    assert table(s.group_by("k").agg("COUNT(*) AS n", mx="MAX(v)"), ["k", "n", "mx"], 1) == want
    ref = RefTopN([0], 2, [(1, False)], True).run_batch([("+I", r) for r in data])
    want = final_table([(kind, (r[0], r[3], r[1], r[2])) for kind, r in ref], 2)
    assert table(s.top_n(2, "k", "v DESC", with_rank=True), ["k", "rn", "v", "t"], 2) == want


@pytest.mark.parametrize("first_step_tasks", [1, 3])
def test_streaming_keep_first_on_spark_dedup_state_is_exact_and_passes_side_rows(
        spark, tmp_path, first_step_tasks):
    """Streaming keep first keeps its seen keys in Spark's dedup state
    (``apply_seen_keys``): per batch the smallest ``_seq`` of a new key wins
    whatever the file order, keys of earlier batches are dropped, and an
    upstream side row passes through once per batch; with the first step in
    one task (coalesced batch, the default) and over three (repartitioned)."""
    import json
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema
    files = [
        [["+I", [1, 10, 0], 5], ["+I", [2, 20, 0], 9], ["+I", [1, 11, 0], 3],   # key 1: _seq 3 wins
         ["+I", [2, 21, 0], 8]],                                              # key 2: _seq 8 wins
        [["+I", [1, 12, 0], 1], ["+I", [3, 30, 0], 12], ["+I", [3, 31, 0], 11]],  # 1 seen; 3: _seq 11
        [["+I", [2, 22, 0], 0], ["+I", [4, 40, 0], 20]],
    ]
    write_files(tmp_path / "in", files)
    df = (spark.readStream.schema(from_arrow_schema(ARROW)).option("maxFilesPerTrigger", 1)
          .parquet(str(tmp_path / "in")))
    # a side row per file, as a reader's dead letter would travel (key columns null)
    side = json.dumps({"dead_letter": {"reason": "x"}})
    df = df.withColumn("_metrics", F.lit(None).cast("string")).unionByName(
        df.where("k = 1 AND v IN (11, 12)").select(
            *[F.lit(None).cast(c.dataType).alias(c.name) for c in df.schema.fields
              if c.name not in ("_kind", "_seq")],
            F.lit(-1).cast("tinyint").alias("_kind"), F.col("_seq"),
            F.lit(side).alias("_metrics")))
    op = ProcTimeKeepFirst(ARROW, ["k"])
    spark.conf.set(FIRST_STEP_TASKS_CONF, str(first_step_tasks))
    try:
        out = apply_keyed(df, op, key_groups=2)
    finally:
        spark.conf.unset(FIRST_STEP_TASKS_CONF)
    assert "_side_id" not in out.columns
    batches = []
    query = (out.writeStream.foreachBatch(lambda b, _: batches.append(b.toArrow()))
             .trigger(availableNow=True).option("checkpointLocation", str(tmp_path / "ck")).start())
    query.awaitTermination()
    got = [sorted((kind, tuple(v)) for kind, v in to_rows(split_metrics(b)[0], COLS))
           for b in batches]
    assert got == [[("+I", (1, 11, 0)), ("+I", (2, 21, 0))],
                   [("+I", (3, 31, 0))],
                   [("+I", (4, 40, 0))]]
    metrics = [m for b in batches for m in split_metrics(b)[1]]
    assert sum("dead_letter" in m for m in metrics) == 2
    counters = [m["counters"] for m in metrics if m.get("operator") == op.name]
    assert sum(c.get("rows_in", 0) for c in counters) == 9

    # all three files in one batch (an input partition per file): a key's
    # smallest _seq wins across the batch's partitions
    one = (spark.readStream.schema(from_arrow_schema(ARROW)).option("maxFilesPerTrigger", 3)
           .parquet(str(tmp_path / "in")))
    spark.conf.set(FIRST_STEP_TASKS_CONF, str(first_step_tasks))
    try:
        out = apply_keyed(one, op, key_groups=2)
    finally:
        spark.conf.unset(FIRST_STEP_TASKS_CONF)
    batches.clear()
    query = (out.writeStream.foreachBatch(lambda b, _: batches.append(b.toArrow()))
             .trigger(availableNow=True).option("checkpointLocation", str(tmp_path / "ck1")).start())
    query.awaitTermination()
    assert [sorted((kind, tuple(v)) for kind, v in to_rows(split_metrics(b)[0], COLS))
            for b in batches] == [[("+I", (1, 12, 0)), ("+I", (2, 22, 0)), ("+I", (3, 31, 0)),
                                   ("+I", (4, 40, 0))]]
