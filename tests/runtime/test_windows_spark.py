"""The window aggregate on Spark (docs/windows.md): streaming over several
micro-batches equals batch; per-partition watermarks with a partition that
stops and resumes (idleness); a kill -9 and restart fires no window twice and
judges no row late that was not late before.  The expected output is the local
event-time runner on the same micro-batches."""
from __future__ import annotations

import pandas as pd
import pytest

from kill_restart import Crash
from spark_changelog.sinks.delta import read_table
from windows_data import (IDLE_FILES, M, S, local_reference, spark_fired, spark_late,
                          window_stream, write_files)

# one partition, in order within the bound: nothing late; the last file's row
# moves the watermark past every earlier window
ORDERED_FILES = [
    [("A", "u1", 5 * S), ("A", "u2", 30 * S), ("A", "u1", 50 * S)],
    [("A", "u2", 45 * S), ("A", "u1", 65 * S), ("A", "u3", 100 * S)],
    [("A", "u1", 119 * S), ("A", "u3", 130 * S)],
    [("A", "u9", 10 * M)],
]


def table_rows(path):
    t = read_table(str(path))
    return sorted((r.u, int(r.window_start.timestamp()), int(r.n)) for r in t.itertuples())


def test_streaming_equals_batch_tumbling_count(spark, tmp_path):
    write_files(tmp_path / "in", ORDERED_FILES)
    reports = {}
    for mode in ("stream", "batch"):
        streaming = mode == "stream"
        reports[mode] = window_stream(spark, tmp_path / "in", streaming, idle_timeout=None,
                                      bound=20 * S).write_upsert(
            str(tmp_path / mode / "table"), changelog_path=str(tmp_path / mode / "log"),
            checkpoint=str(tmp_path / mode / "ck") if streaming else None,
            late_output=str(tmp_path / mode / "late"))
    want_fired, want_late = local_reference(ORDERED_FILES, None, bound_ms=20 * S)
    assert want_late == [] and spark_late(tmp_path / "stream" / "late") == []
    assert spark_fired(tmp_path / "stream" / "log") == want_fired
    # batch: the end of input fires every window, including u9's
    assert table_rows(tmp_path / "batch" / "table") == [
        ("u1", 0, 2), ("u1", 60, 2), ("u2", 0, 2), ("u3", 60, 1), ("u3", 120, 1), ("u9", 600, 1)]
    # streaming fired everything the watermark passed: all but u9's open window
    assert table_rows(tmp_path / "stream" / "table") == table_rows(tmp_path / "batch" / "table")[:-1]
    assert reports["stream"].late_rows == reports["batch"].late_rows == 0
    # explain: the window, its watermark and its lateness
    assert "WindowAggregate(groupBy=[u], window=[TUMBLE(size=1 min)]" in reports["stream"].plan
    assert "watermark=[rt - 20000 ms, per p, no idleness]" in reports["stream"].plan


def test_partition_stops_and_resumes_idleness(spark, tmp_path):
    write_files(tmp_path / "in", IDLE_FILES)
    report = window_stream(spark, tmp_path / "in", True).write_upsert(
        str(tmp_path / "table"), changelog_path=str(tmp_path / "log"),
        checkpoint=str(tmp_path / "ck"), late_output=str(tmp_path / "late"))
    want_fired, want_late = local_reference(IDLE_FILES)
    # spelled out: B idle in batch 1, so A alone moves the watermark past the
    # first minute; B's 20 s click (batch 2) is late; B rejoins in batch 3
    assert want_fired == {1: [("+I", "u1", 0, 1), ("+I", "u2", 0, 1)],
                          3: [("+I", "u1", 60, 2), ("+I", "u3", 60, 1)]}
    assert want_late == [(2, "u2", 20 * S)]
    assert spark_fired(tmp_path / "log") == want_fired
    assert spark_late(tmp_path / "late") == want_late
    assert report.late_rows == 1
    # metrics: the per-partition watermarks after the last batch, nobody idle
    et = report.event_time
    assert et["partitions"] == {"A": 200 * S - 1, "B": 150 * S - 1}
    assert et["watermark_ms"] == 150 * S - 1 and et["idle_partitions"] == []
    assert et["newest_event_ms"] - et["watermark_ms"] == 50 * S + 1      # the lag
    # the plot of event time vs watermark vs arrival, from the late-output directory
    from spark_changelog.cli import main
    png = tmp_path / "wm.png"
    assert main(["plot-watermarks", str(tmp_path / "late"), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _prepare_crash(d, fixture):
    write_files(d / "in", IDLE_FILES)
    return [d / "in", d / "table", d / "ck", d / "log", d / "late"]


#: SIGKILL inside batch 2 (B's late click), its sinks written, Spark's commit not
CRASHES = {"window": Crash("window", _prepare_crash, hang_after=2)}


@pytest.mark.slow
@pytest.mark.shared_crash("window")
def test_kill_and_restart_fires_no_window_twice(spark, crashed):
    """SIGKILL inside batch 2 (B's late click; its sinks written, Spark has not
    logged the batch), restart from the checkpoint: the per-partition
    watermarks, idleness clocks and open windows come back from the state
    store, the replayed batch uses the same batch timestamp, so the changelog
    and the late output equal the reference run's exactly."""
    run = crashed("window")
    assert run.status == "committed window 2", run.status
    report = run.resume(spark)
    assert (report.batches, report.replayed_batches) == (2, 1)
    want_fired, want_late = local_reference(IDLE_FILES)
    assert spark_fired(run.directory / "log") == want_fired
    assert spark_late(run.directory / "late") == want_late
    assert table_rows(run.directory / "table") == [("u1", 0, 1), ("u1", 60, 2), ("u2", 0, 1),
                                                   ("u3", 60, 1)]


def test_window_table_function_alone(spark):
    """HOP as a projection (SELECT * FROM TABLE(HOP(...))), through the plan:
    a row once per window."""
    from spark_changelog.api import ChangelogStream
    from spark_changelog.model import ChangelogMode
    from spark_changelog.model.windows import hop
    df = spark.createDataFrame([("a", 61_000, 0, 1)], "u STRING, t BIGINT, _kind TINYINT, _seq BIGINT")
    s = (ChangelogStream.from_dataframe(df, mode=ChangelogMode.INSERT_ONLY)
         .with_column("rt", "timestamp_millis(t)").with_watermark("rt", 0)
         .window(hop("rt", "30 s", "1 min")).select())
    assert s.traits.columns == ("u", "t", "rt", "window_start", "window_end")
    out = s.collect()
    assert sorted((int(a.timestamp()), int(b.timestamp()))
                  for a, b in zip(pd.to_datetime(out["window_start"], utc=True),
                                  pd.to_datetime(out["window_end"], utc=True))) == [
        (30, 90), (60, 120)]
