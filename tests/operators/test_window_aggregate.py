"""Window assignment and the window aggregate's timing, in-process (docs/windows.md)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from changelog_data import to_rows
from spark_changelog.model import KIND_COL, SEQ_COL
from spark_changelog.model.partition_watermarks import EventTimeSpec
from spark_changelog.model.watermark import BoundedOutOfOrderness
from spark_changelog.operators.window.aggregate import AggCall, SessionWindowAggregate, WindowAggregate
from spark_changelog.model.windows import (Cumulate, Hop, Tumble, assign_windows,
                                                        merge_sessions)
from spark_changelog.runtime.event_time import LocalEventTimeRunner

TS = pa.timestamp("us", tz="UTC")


def brute_force(assigner, t):
    """Every window of the assigner's grid around t that contains t."""
    out = []
    if isinstance(assigner, Tumble):
        cands = [(s, s + assigner.size_ms) for s in range(t - 3 * assigner.size_ms, t + 1)
                 if (s - assigner.offset_ms) % assigner.size_ms == 0]
    elif isinstance(assigner, Hop):
        cands = [(s, s + assigner.size_ms) for s in range(t - assigner.size_ms - 1, t + 1)
                 if (s - assigner.offset_ms) % assigner.slide_ms == 0]
    else:
        cands = [(b, b + k * assigner.step_ms)
                 for b in range(t - assigner.max_size_ms, t + 1)
                 if (b - assigner.offset_ms) % assigner.max_size_ms == 0
                 for k in range(1, assigner.max_size_ms // assigner.step_ms + 1)]
    out = sorted((s, e) for s, e in cands if s <= t < e)
    return out


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(-500, 500), min_size=1, max_size=6),
       st.sampled_from([Tumble(7), Tumble(10, 3), Hop(5, 15), Hop(4, 8, 1), Cumulate(3, 12),
                        Cumulate(5, 10, 2)]))
def test_assigners_equal_brute_force(times, assigner):
    row, start, end = assigner.assign(np.array(times, dtype=np.int64))
    for i, t in enumerate(times):
        got = sorted(zip(start[row == i].tolist(), end[row == i].tolist()))
        assert got == brute_force(assigner, t), (assigner, t)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 60), st.integers(1, 10)),
                min_size=1, max_size=10))
def test_merge_sessions_equals_transitive_overlap(intervals):
    g = np.array([i[0] for i in intervals])
    s = np.array([i[1] for i in intervals])
    e = s + np.array([i[2] for i in intervals])
    ids = merge_sessions(g, s, e)
    n = len(intervals)
    # brute force: union-find over pairs that overlap or touch within a group
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x
    for a in range(n):
        for b in range(n):
            if g[a] == g[b] and s[a] <= e[b] and s[b] <= e[a]:
                parent[find(a)] = find(b)
    for a in range(n):
        for b in range(n):
            assert (ids[a] == ids[b]) == (find(a) == find(b))


def clicks_runner(lateness_ms=0, session=False):
    schema = pa.schema([("u", pa.string()), ("rt", TS), ("window_start", TS), ("window_end", TS),
                        (KIND_COL, pa.int8()), (SEQ_COL, pa.int64())])
    cls = SessionWindowAggregate if session else WindowAggregate
    op = cls(schema, ["u"], [AggCall("n", "count"), AggCall("first", "min", "rt")],
             allowed_lateness_ms=lateness_ms)
    from spark_changelog.model.windows import Session
    assigner = Session(20_000) if session else Tumble(60_000)
    return LocalEventTimeRunner(op, EventTimeSpec(BoundedOutOfOrderness("rt", 0)),
                                lambda t: assign_windows(t, "rt", assigner))


SEQ = iter(range(10**6))


def clicks(*rows):
    return pa.table({"u": [r[0] for r in rows],
                     "rt": pa.array([r[1] * 1_000_000 for r in rows], pa.int64()).cast(TS),
                     KIND_COL: pa.array([0] * len(rows), pa.int8()),
                     SEQ_COL: pa.array([next(SEQ) for _ in rows], pa.int64())})


def fired(out):
    return [[k, [v[0], int(v[1].timestamp()), int(v[2].timestamp()), v[3],
                 int(v[4].timestamp())]]
            for k, v in to_rows(out, ["u", "window_start", "window_end", "n", "first"])]


def test_allowed_lateness_refires_then_late_output():
    run = clicks_runner(lateness_ms=30_000)
    assert fired(run.run_batch(clicks(("a", 10)), 0)) == []
    # W = 69.999 s: [0, 60) fires
    assert fired(run.run_batch(clicks(("a", 70)), 1)) == [["+I", ["a", 0, 60, 1, 10]]]
    # a row for the fired window, within the lateness: re-fire at once
    assert fired(run.run_batch(clicks(("a", 5), ("a", 85)), 2)) == [
        ["-U", ["a", 0, 60, 1, 10]], ["+U", ["a", 0, 60, 2, 5]]]
    # a row's lateness is judged by the watermark at its arrival (before its batch)
    assert fired(run.run_batch(clicks(("a", 95)), 3)) == []
    # W = 94.999 >= 59.999 + 30: the window is closed; a row for it is late
    assert fired(run.run_batch(clicks(("a", 20)), 4)) == []
    assert [(r["row"]["u"], r["window_start_ms"], r["watermark_ms"]) for r in run.late_rows] == [
        ("a", 0, 94_999)]
    assert run.metrics.counters["late_rows"] == 1
    assert fired(run.end_of_input()) == [["+I", ["a", 60, 120, 3, 70]]]


def test_sessions_merge_and_a_grown_fired_session_is_retracted():
    run = clicks_runner(lateness_ms=100_000, session=True)
    run.run_batch(clicks(("a", 0), ("a", 10)), 0)              # [0, 30)
    assert fired(run.run_batch(clicks(("a", 100)), 1)) == [["+I", ["a", 0, 30, 2, 0]]]
    # a row at 25 s (within lateness) grows the fired session to [0, 45): -D old, +I new
    assert fired(run.run_batch(clicks(("a", 25)), 2)) == [
        ["-D", ["a", 0, 30, 2, 0]], ["+I", ["a", 0, 45, 3, 0]]]
    assert fired(run.end_of_input()) == [["+I", ["a", 100, 120, 1, 100]]]


def test_insert_only_input():
    run = clicks_runner()
    t = clicks(("a", 10))
    t = t.set_column(t.schema.get_field_index(KIND_COL), KIND_COL, pa.array([3], pa.int8()))
    with pytest.raises(ValueError, match="insert-only"):
        run.run_batch(t, 0)


def test_null_event_time_goes_to_the_late_output():
    run = clicks_runner()
    t = pa.table({"u": ["a", "b"], "rt": pa.array([1_000_000, None], pa.int64()).cast(TS),
                  KIND_COL: pa.array([0, 0], pa.int8()), SEQ_COL: pa.array([1, 2], pa.int64())})
    run.run_batch(t, 0)
    assert [(r["row"]["u"], r["reason"][:24]) for r in run.late_rows] == [
        ("b", "the event time is null: ")]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 400)), min_size=1, max_size=30),
       st.lists(st.integers(1, 5), min_size=1, max_size=10), st.integers(0, 60),
       st.sampled_from([0, 30]))
def test_nothing_is_lost_streaming_plus_late_equals_batch(rows, cuts, bound_s, lateness_s):
    """Any micro-batching: the windows fired (last result per window) plus the
    late rows per window equal the batch result (end of input, nothing late),
    for HOP windows where one row lands in several windows."""
    from spark_changelog.model.windows import Hop
    schema = pa.schema([("u", pa.string()), ("rt", TS), ("window_start", TS), ("window_end", TS),
                        (KIND_COL, pa.int8()), (SEQ_COL, pa.int64())])

    def runner():
        op = WindowAggregate(schema, ["u"], [AggCall("n", "count")],
                             allowed_lateness_ms=lateness_s * 1000)
        return LocalEventTimeRunner(op, EventTimeSpec(BoundedOutOfOrderness("rt", bound_s * 1000)),
                                    lambda t: assign_windows(t, "rt", Hop(30_000, 60_000)))

    def results(outs):
        final = {}
        for out in outs:
            for kind, (u, ws, n) in to_rows(out, ["u", "window_start", "n"]):
                if kind in ("+I", "+U"):
                    final[(u, int(ws.timestamp()))] = n
        return final

    whole = runner()
    want = results([whole.run_batch(clicks(*rows), 0), whole.end_of_input()])
    stream, outs, i, b = runner(), [], 0, 0
    while i < len(rows):
        k = cuts[b % len(cuts)]
        outs.append(stream.run_batch(clicks(*rows[i:i + k]), b))
        i, b = i + k, b + 1
    outs.append(stream.end_of_input())
    got = results(outs)
    for r in stream.late_rows:
        w = (r["row"]["u"], r["window_start_ms"] // 1000)
        got[w] = got.get(w, 0) + 1
    assert got == want


def test_progress_line():
    import io
    from spark_changelog.runtime.late_output import event_time_progress
    from spark_changelog.runtime.pipeline import RunReport
    r = RunReport(streaming=True, batches=2, changes_out=5, late_rows=1,
                  counters={"rows_in": 1200},
                  event_time={"watermark_ms": 60_000, "newest_event_ms": 70_500,
                              "idle_partitions": ["B"]})
    buf = io.StringIO()
    event_time_progress(buf)(r)
    assert buf.getvalue() == ("batch 2: rows in 1,200, out 5, watermark 1970-01-01T00:01:00+00:00 "
                              "(lag 10.5 s), late rows 1, idle partitions 1\n")
