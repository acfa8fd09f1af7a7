"""Window aggregates replayed against Flink 2.3 (tests/fixtures/flink/windows.json):
the seed example of the watermark article (nine clicks, one-minute windows,
one-minute bound, count distinct users) and the same clicks through HOP and
CUMULATE, one row per micro-batch: the same windows fire after the same
arrival, with the same users, and end of input fires the rest.  Flink SQL
drops the late click (``User5 20:44:54``); we put it in the late output."""
from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from changelog_data import load_fixture, to_rows
from spark_changelog.model import KIND_COL, SEQ_COL
from spark_changelog.model.partition_watermarks import EventTimeSpec
from spark_changelog.model.watermark import BoundedOutOfOrderness
from spark_changelog.operators.window.aggregate import AggCall, WindowAggregate
from spark_changelog.model.windows import Cumulate, Hop, Tumble, assign_windows
from spark_changelog.runtime.event_time import LocalEventTimeRunner

CASES = {c["name"]: c for c in load_fixture("flink/windows.json")["cases"]}
ASSIGNERS = {"W_seed_tumble_count_distinct": Tumble(60_000), "W_seed_tumble_users": Tumble(60_000),
             "W_seed_hop": Hop(60_000, 120_000), "W_seed_cumulate": Cumulate(60_000, 120_000)}
# Flink SQL's WATERMARK rt - INTERVAL '1' MINUTE is W = max - 1 min: bound 1 min - 1 ms here
BOUND_MS = 59_999
SCHEMA = pa.schema([("u", pa.string()), ("t", pa.int64()), ("rt", pa.timestamp("us", tz="UTC")),
                    (KIND_COL, pa.int8()), (SEQ_COL, pa.int64())])


def batch(i, user, t_ms):
    return pa.table({"u": [user], "t": [t_ms], "rt": pa.array([t_ms * 1000], pa.int64()).cast(
        pa.timestamp("us", tz="UTC")), KIND_COL: pa.array([0], pa.int8()),
        SEQ_COL: pa.array([i], pa.int64())})


def hms(ms):
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%H:%M:%S.%f")[:-3]


def runner(name):
    by_user = name == "W_seed_tumble_users"
    projected = SCHEMA.append(pa.field("window_start", pa.timestamp("us", tz="UTC"))).append(
        pa.field("window_end", pa.timestamp("us", tz="UTC")))
    aggs = ([AggCall("clicks", "count")] if by_user else
            [AggCall("users", "count_distinct", "u"), AggCall("clicks", "count")])
    op = WindowAggregate(projected, ["u"] if by_user else [], aggs, time_column="rt")
    spec = EventTimeSpec(BoundedOutOfOrderness("rt", BOUND_MS))
    assigner = ASSIGNERS[name]
    return LocalEventTimeRunner(op, spec, lambda t: assign_windows(t, "rt", assigner)), by_user


def rows_of(out, by_user):
    cols = ["window_start", "window_end"] + (["u", "clicks"] if by_user else ["users", "clicks"])
    rows = to_rows(out, cols)
    for r in rows:
        r[1][0] = r[1][0].tz_convert(None).isoformat()
        r[1][1] = r[1][1].tz_convert(None).isoformat()
    return rows


def as_windows(rows):
    """Per fired window (in firing order), the multiset of its rows: Flink emits
    the users of one window in its timer-heap order, which is no contract."""
    out = []
    for kind, vals in rows:
        w = (kind, vals[0], vals[1])
        if not out or out[-1][0] != w:
            out.append((w, []))
        out[-1][1].append(tuple(vals[2:]))
    return [(w, sorted(v)) for w, v in out]


@pytest.mark.parametrize("name", sorted(ASSIGNERS))
def test_windows_fire_after_the_same_arrival_as_flink(name):
    case = CASES[name]
    run, by_user = runner(name)
    rows = case["inputs"]["T"]["rows"]
    for i, (step, (_, (user, t_ms))) in enumerate(zip(case["expected_steps"], rows)):
        got = rows_of(run.run_batch(batch(i, user, t_ms), processing_time_ms=i), by_user)
        assert as_windows(got) == as_windows(step), (i, user)
    got = rows_of(run.end_of_input(), by_user)
    assert as_windows(got) == as_windows(case["expected_after_end_of_input"])


def test_seed_late_click_goes_to_the_late_output():
    run, _ = runner("W_seed_tumble_count_distinct")
    for i, (_, (user, t_ms)) in enumerate(CASES["W_seed_tumble_count_distinct"]["inputs"]["T"]["rows"]):
        run.run_batch(batch(i, user, t_ms), processing_time_ms=i)
    late = run.late_rows
    # the row, its window, and the watermark at its arrival (max 20:47:44 - 1 min)
    assert [(r["row"]["u"], hms(r["row"]["t"]), hms(r["window_start_ms"]),
             hms(r["window_end_ms"]), hms(r["watermark_ms"])) for r in late] == [
        ("User5", "20:44:54.000", "20:44:00.000", "20:45:00.000", "20:46:44.000")]
    assert run.metrics.counters["late_rows"] == 1
    assert "window closed" in late[0]["reason"]
    assert hms(late[0]["event_time_ms"]) == "20:44:54.000"


def test_batch_end_of_input_fires_every_window_nothing_late():
    """A bounded input: all rows arrive before any watermark, then the end of input."""
    run, _ = runner("W_seed_tumble_count_distinct")
    rows = CASES["W_seed_tumble_count_distinct"]["inputs"]["T"]["rows"]
    whole = pa.concat_tables([batch(i, u, t) for i, (_, (u, t)) in enumerate(rows)])
    # no tick: the rows are judged with no watermark at all, like Flink's batch mode
    from spark_changelog.runtime.event_time import run_event_time_batch
    from spark_changelog.runtime.keyed_rows import utc_timestamps
    projected = assign_windows(whole, "rt", Tumble(60_000))
    out, _, ctx = run_event_time_batch(run.operator, run.stack, utc_timestamps(projected.to_pandas(), None),
                                       run.watermarks, None, run.spec, 0, 0, end_of_input=True)
    assert rows_of(out, False) == [
        ["+I", ["2021-01-15T20:44:00", "2021-01-15T20:45:00", 2, 2]],
        ["+I", ["2021-01-15T20:45:00", "2021-01-15T20:46:00", 3, 3]],
        ["+I", ["2021-01-15T20:46:00", "2021-01-15T20:47:00", 2, 2]],
        ["+I", ["2021-01-15T20:47:00", "2021-01-15T20:48:00", 2, 2]]]
    assert ctx.metrics.counters["late_rows"] == 0


def test_session_windows_fire_after_the_same_arrival_as_flink():
    """SESSION(gap 30 s) on the seed clicks.  Sessions merge per key; Flink's
    global session is keyed on the constant column the lowering adds
    (``GLOBAL_KEY``), which the late rows leave out."""
    from spark_changelog.operators.keys import GLOBAL_KEY as g
    from spark_changelog.operators.window.aggregate import SessionWindowAggregate
    from spark_changelog.model.windows import Session
    case = CASES["W_seed_session"]
    ts = pa.timestamp("us", tz="UTC")
    schema = pa.schema([(g, pa.int64())] + list(SCHEMA)[:3] + [
        pa.field("window_start", ts), pa.field("window_end", ts)] + list(SCHEMA)[3:])
    op = SessionWindowAggregate(schema, [g], [AggCall("users", "count_distinct", "u"),
                                                AggCall("clicks", "count")])
    run = LocalEventTimeRunner(op, EventTimeSpec(BoundedOutOfOrderness("rt", BOUND_MS)),
                               lambda t: assign_windows(t, "rt", Session(30_000)))
    rows = case["inputs"]["T"]["rows"]
    for i, (step, (_, (user, t_ms))) in enumerate(zip(case["expected_steps"], rows)):
        b = batch(i, user, t_ms)
        out = run.run_batch(b.add_column(0, g, pa.array([1], pa.int64())), processing_time_ms=i)
        assert rows_of(out, False) == step, (i, user)
    assert rows_of(run.end_of_input(), False) == case["expected_after_end_of_input"]
    # the late click: its own session [20:44:54, 20:45:24) closed at 20:46:44
    assert [r["row"]["u"] for r in run.late_rows] == ["User5"]
    assert g not in run.late_rows[0]["row"]
