"""ON CONFLICT DO NOTHING / DO ERROR on Spark (docs/semantics.md, section 3, last paragraphs).

The materializer buffers changes per sink key until the watermark its source
generates passes the one they arrived under (the sources' watermark rows, the
runtime every event-time operator shares: docs/windows.md, "Watermarks from
the source").  These tests run the whole path: a changelog source with
``with_watermark``, ``write_upsert(conflict=...)`` into a Delta table and a
changelog, streaming (one file per micro-batch: a batch's rows arrive under
the watermark of the earlier batches and the watermark their own rows raise
folds them in the same batch, as in Flink a watermark follows the rows that
raised it) and batch (end of input: everything is due).  The expected output
is the operator run by the local event-time runner on the same micro-batches:
the Spark runtime must add nothing and lose nothing.
"""
from __future__ import annotations

import os
import random

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from changelog_data import schema_of, set_arrival, to_frame, to_rows
from kill_restart import Crash
from spark_changelog.api import ChangelogStream
from spark_changelog.model import END_OF_INPUT_MS, KIND_COL, SEQ_COL, RowKind
from spark_changelog.operators.sink_upsert_materializer import (PrimaryKeyConstraintViolation,
                                                                SinkUpsertMaterializer)
from spark_changelog.plan import PlanError
from spark_changelog.model.partition_watermarks import EventTimeSpec
from spark_changelog.model.watermark import BoundedOutOfOrderness
from spark_changelog.runtime.event_time import LocalEventTimeRunner
from spark_changelog.runtime.local import LocalRunner
from spark_changelog.sinks.changelog import read_changelog
from spark_changelog.sinks.delta import read_table

COLS = ["uk", "pk", "v", "t"]
ARROW = schema_of(COLS, [pa.int64(), pa.int64(), pa.string(), pa.int64()])
BOUND_MS = 0

# (uk, pk, v, t): sink key pk, upsert key uk, event time t (ms)
# A change is due once the watermark is above the one it arrived under (Flink
# 2.3, see the operator's docstring): the changes of micro-batch N arrive under
# the watermark of batches < N and are folded by the larger watermark their
# own rows raise at the end of batch N.
FILES = [
    # batch 0, no watermark yet: two upsert keys write sink key 10; the batch
    # raises the watermark to 1299: DO NOTHING keeps the first (+I a), DO ERROR fails
    [["+I", [1, 10, "a", 1000]], ["+I", [2, 10, "b", 1200]], ["+I", [9, 90, "z", 1300]]],
    # batch 1, watermark 1299 -> 4999: c is due
    [["+I", [3, 20, "c", 5000]]],
    # batch 2, 4999 -> 5999: uk 1 changes a -> a2 (the -U is late by event
    # time, but waits with its +U): the update folds into +U a2
    [["-U", [1, 10, "a", 1000]], ["+U", [1, 10, "a2", 6000]], ["+I", [5, 40, "e", 5500]]],
    # batch 3, 5999 -> 19999: d is due; pk 40 (no row in this batch) too
    [["+I", [4, 30, "d", 20000]]],
]


def file_frames(files):
    """One frame per file, ``_seq`` counting on across the files."""
    seq, frames = 0, []
    for rows in files:
        frames.append(to_frame(rows, COLS, seqs=range(seq, seq + len(rows))))
        seq += len(rows)
    return frames


def write_files(directory, files):
    os.makedirs(directory, exist_ok=True)
    frames = file_frames(files)
    for i, f in enumerate(frames):
        path = os.path.join(directory, f"part-{i:04d}.parquet")
        pq.write_table(pa.Table.from_pandas(f, schema=ARROW, preserve_index=False), path)
        set_arrival(path, i)
    return frames


def source(spark, directory, streaming):
    from pyspark.sql.pandas.types import from_arrow_schema
    st = from_arrow_schema(ARROW)
    df = (spark.readStream.schema(st).option("maxFilesPerTrigger", 1).parquet(directory)
          if streaming else spark.read.schema(st).parquet(directory))
    # ordered=True: the files are in sequence order, and these tests compare the
    # materializer alone with its local runner on Spark's watermark schedule (an
    # inserted ChangelogNormalize drops -U and re-emits it with the +U, which
    # moves a -U/+U pair split over two files into the later batch)
    return (ChangelogStream.from_dataframe(df, primary_key=["uk"], name="x", ordered=True)
            .with_column("rt", "timestamp_millis(t)")
            .with_watermark("rt", BOUND_MS))


def expected(frames, conflict, streaming):
    """(changelog per sink key, final table) from the local event-time runner,
    batch by batch (rows under the watermark before the batch, then the
    watermark they raise); batch = one batch at end of input."""
    op = SinkUpsertMaterializer(ARROW, ["pk"], upsert_key=["uk"], conflict=conflict)
    outs = []
    if not streaming:
        # every row arrives before any watermark, then the end-of-input watermark
        runner = LocalRunner(op)
        outs.append(runner.run_batch(pd.concat(frames, ignore_index=True), processing_time_ms=0))
        outs.append(runner.advance_watermark(END_OF_INPUT_MS, 0))
    else:
        runner = LocalEventTimeRunner(op, EventTimeSpec(BoundedOutOfOrderness("t", BOUND_MS)))
        for f in frames:
            outs.append(runner.run_batch(pa.Table.from_pandas(f, schema=ARROW, preserve_index=False),
                                         processing_time_ms=0))
    out = pd.concat([o for o in outs if len(o)], ignore_index=True)
    per_key: dict = {}
    for kind, vals in to_rows(out, COLS):
        per_key.setdefault(vals[1], []).append([kind, vals])
    table = {}
    for key, rows in per_key.items():
        kind, vals = rows[-1]
        if kind in ("+I", "+U"):
            table[key] = tuple(vals)
    return per_key, table


def actual(report_dir):
    log = read_changelog(report_dir / "log")
    per_key: dict = {}
    for r in log.sort_values(["_batch", SEQ_COL], kind="stable").to_dict("records"):
        per_key.setdefault(int(r["pk"]), []).append(
            [RowKind(int(r[KIND_COL])).short, [int(r["uk"]), int(r["pk"]), r["v"], int(r["t"])]])
    table = read_table(str(report_dir / "table"))
    rows = {int(r.pk): (int(r.uk), int(r.pk), r.v, int(r.t))
            for r in table.itertuples(index=False)}
    return per_key, rows


def run(spark, tmp_path, files, conflict, streaming):
    frames = write_files(tmp_path / "in", files)
    s = source(spark, str(tmp_path / "in"), streaming)
    report = s.write_upsert(str(tmp_path / "table"), key="pk", conflict=conflict,
                            checkpoint=str(tmp_path / "ck") if streaming else None,
                            changelog_path=str(tmp_path / "log"), key_groups=4)
    return frames, report


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "batch"])
def test_do_nothing_keeps_first_row_and_waits_for_the_watermark(spark, tmp_path, streaming):
    frames, report = run(spark, tmp_path, FILES, "nothing", streaming)
    want_log, want_table = expected(frames, "nothing", streaming)
    got_log, got_table = actual(tmp_path)
    assert got_log == want_log
    assert got_table == want_table
    if streaming:
        # spelled out for pk 10: DO NOTHING keeps the first of a and b, drops b;
        # uk 1's -U a / +U a2 fold together into +U a2
        assert want_log[10] == [["+I", [1, 10, "a", 1000]], ["+U", [1, 10, "a2", 6000]]]
        assert want_table[10] == (1, 10, "a2", 6000)
    else:
        # one fold at end of input: a, b, -U a, +U a2 leave [b, a2]: the first is kept
        assert want_log[10] == [["+I", [2, 10, "b", 1200]]]
    # the last row is released by the watermark it raised: in its own batch
    # (streaming), at the end of input (batch)
    assert got_table[30] == (4, 30, "d", 20000)
    if streaming:
        assert report.watermark_ms == 20000 - BOUND_MS - 1
        assert report.event_time["partitions"] == {"x": 20000 - BOUND_MS - 1}
    assert "WatermarkAssigner(rowtime=[rt], watermark=[rt - 0 ms], generated=[" in report.plan
    # explained as the windows' watermark is
    assert ("SinkUpsertMaterializer(key=[pk], upsertKey=[uk], conflictStrategy=[NOTHING], "
            "watermark=[generated at the source: x: rt - 0 ms, the minimum over the source "
            "partitions, no idleness])") in report.plan, report.plan


def test_do_error_stops_the_query_naming_the_key(spark, tmp_path):
    with pytest.raises(PrimaryKeyConstraintViolation) as err:
        run(spark, tmp_path, FILES, "error", True)
    msg = str(err.value)
    assert "pk=10" in msg and "v='a'" in msg and "v='b'" in msg
    # batch 0 raised the watermark that folds its own rows: it failed whole
    assert not os.path.exists(tmp_path / "table") or read_table(str(tmp_path / "table")).empty
    assert not os.path.exists(tmp_path / "log") or read_changelog(tmp_path / "log").empty


def test_do_error_batch(spark, tmp_path):
    with pytest.raises(PrimaryKeyConstraintViolation, match=r"pk=10"):
        run(spark, tmp_path, FILES, "error", False)


def test_do_error_without_conflict_passes(spark, tmp_path):
    files = [rows for rows in FILES]
    files[0] = [["+I", [1, 10, "a", 1000]], ["+I", [2, 11, "b", 1200]]]
    frames, report = run(spark, tmp_path, files, "error", True)
    want_log, want_table = expected(frames, "error", True)
    assert actual(tmp_path) == (want_log, want_table)
    assert want_table[11] == (2, 11, "b", 1200)


def test_random_changelog_streaming_equals_local_runner(spark, tmp_path):
    """200 changes over 8 sink keys and 30 upsert keys, out-of-order event
    times, 6 micro-batches: Spark's output per key equals the local runner's."""
    rnd = random.Random(7)
    alive: dict = {}
    rows = []
    t = 1000
    for _ in range(200):
        uk = rnd.randrange(30)
        t += rnd.randrange(0, 400)
        et = t - rnd.randrange(0, 1500)            # out of order, some late
        if uk in alive and rnd.random() < 0.3:
            rows.append(["-D", alive.pop(uk)])
        elif uk in alive:
            old = alive[uk]
            new = [uk, old[1], f"v{len(rows)}", et]
            rows += [["-U", old], ["+U", new]]
            alive[uk] = new
        else:
            alive[uk] = [uk, rnd.randrange(8), f"v{len(rows)}", et]
            rows.append(["+I", alive[uk]])
    cuts = sorted(rnd.sample(range(1, len(rows)), 5))
    files = [rows[a:b] for a, b in zip([0] + cuts, cuts + [len(rows)])]
    frames, report = run(spark, tmp_path, files, "nothing", True)
    want_log, want_table = expected(frames, "nothing", True)
    got_log, got_table = actual(tmp_path)
    assert got_log == want_log
    assert got_table == want_table
    assert len(want_table) >= 3


def test_watermark_needs_a_timestamp_column(spark):
    df = spark.createDataFrame(pd.DataFrame({"uk": [1], "pk": [1], "v": ["a"], "t": [1],
                                             KIND_COL: np.array([0], np.int8),
                                             SEQ_COL: [0]}))
    s = ChangelogStream.from_dataframe(df, primary_key=["uk"])
    with pytest.raises(TypeError, match="timestamp_millis"):
        s.with_watermark("t", 10)
    with pytest.raises(PlanError, match="before stateful"):
        s.normalize().with_column("rt", "timestamp_millis(t)").with_watermark("rt", 10)


def test_conflict_nothing_needs_a_watermark_not_the_time_column(spark, tmp_path):
    df = spark.createDataFrame(pd.DataFrame({"uk": [1], "pk": [1], "v": ["a"], "t": [1],
                                             KIND_COL: np.array([0], np.int8),
                                             SEQ_COL: [0]}))
    s = ChangelogStream.from_dataframe(df, primary_key=["uk"])
    with pytest.raises(PlanError, match="watermark"):
        s.write_upsert(str(tmp_path / "t"), key="pk", conflict="nothing")
    # the event-time column itself need not reach the sink (timing follows the
    # watermark, not the rows' times)
    (s.with_column("rt", "timestamp_millis(t)").with_watermark("rt", 0)
     .select("uk", "pk", "v").write_upsert(str(tmp_path / "t"), key="pk", conflict="nothing"))
    assert [tuple(r) for r in read_table(str(tmp_path / "t"))[["uk", "pk", "v"]]
            .itertuples(index=False)] == [(1, 1, "a")]


def _prepare_crash(d, fixture):
    write_files(d / "in", FILES)
    return [d / "in", d / "table", d / "ck", d / "log"]


#: SIGKILL inside batch 2, after its sinks were written, before Spark logged it
CRASHES = {"conflict": Crash("conflict", _prepare_crash, hang_after=2)}


@pytest.mark.slow
@pytest.mark.shared_crash("conflict")
def test_kill_and_restart_keeps_watermarks_and_buffered_changes(spark, crashed):
    """SIGKILL the job inside batch 2 (after its sinks were written, before
    Spark logged it), restart from the checkpoint: Spark replays batch 2, the
    per-partition watermarks and buffered changes come back from the state
    store, and the table and the changelog equal an uninterrupted run's."""
    run = crashed("conflict")
    assert run.status == "committed conflict 2", run.status
    report = run.resume(spark)
    assert (report.batches, report.replayed_batches) == (2, 1)
    assert actual(run.directory) == expected(file_frames(FILES), "nothing", True)
