"""Watermark strategies and per-partition watermarks with idleness (docs/windows.md)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
from hypothesis import given, settings, strategies as st

from spark_changelog.model.partition_watermarks import (FILE_PARTITIONS, EventTimeSpec,
                                                        PartitionWatermarks, advance, summarize)
from spark_changelog.model.watermark import (NO_WATERMARK, BoundedOutOfOrderness,
                                             MonotonousTimestamps, Punctuated,
                                             WatermarkGenerator)


def run(spec, batches, state=None):
    """batches: [(processing time, [(partition, event ms[, marker]), ...])] ->
    combined watermark after each batch (None: none yet), final state."""
    state = state or PartitionWatermarks.empty()
    marks = []
    for now, rows in batches:
        parts = [r[0] for r in rows]
        ev = np.array([r[1] for r in rows], dtype=np.int64)
        table = pa.table({"m": [bool(r[2]) if len(r) > 2 else False for r in rows]})
        prog = spec.generator.on_events(ev, table)
        state = advance(state, summarize(parts, prog), now, spec)
        marks.append(state.combined_or_none)
    return marks, state


def test_w1_bounded_out_of_orderness_one_partition():
    spec = EventTimeSpec(BoundedOutOfOrderness("t", 10))
    marks, _ = run(spec, [(0, [("", 1337)]), (1, [("", 12345)]), (2, [("", 12300)]),
                          (3, [("", 12340)]), (4, [("", 12280)])])
    assert marks == [1326, 12334, 12334, 12334, 12334]


def test_monotonous_and_punctuated():
    marks, _ = run(EventTimeSpec(MonotonousTimestamps("t")), [(0, [("", 100), ("", 250)])])
    assert marks == [249]
    spec = EventTimeSpec(Punctuated("t", "m"))
    marks, _ = run(spec, [(0, [("", 100), ("", 500)]),          # no marker: nothing proven
                          (1, [("", 300, True), ("", 900)]),    # marker at 300: W = 300
                          (2, [("", 200, True)])])              # an older marker: no change
    assert marks == [None, 300, 300]


class EveryTenthRowIsAClock(WatermarkGenerator):
    """A custom generator: progress is the largest event time of rows whose
    ``m`` flag is set, and the watermark trails it by 5 ms on each tick."""
    column = "t"

    def on_events(self, event_ms, rows):
        m = rows.column("m").to_numpy(zero_copy_only=False)
        return np.where(m, event_ms, NO_WATERMARK)

    def on_periodic_emit(self, progress, processing_time_ms):
        return np.where(progress == NO_WATERMARK, NO_WATERMARK, progress - 5)


def test_custom_generator_interface():
    marks, _ = run(EventTimeSpec(EveryTenthRowIsAClock()),
                   [(0, [("", 50), ("", 70, True)]), (1, [("", 60, True)])])
    assert marks == [65, 65]


def test_minimum_over_partitions_idleness_and_rejoin():
    spec = EventTimeSpec(BoundedOutOfOrderness("t", 0), partition="p", idle_timeout_ms=100)
    marks, state = run(spec, [
        (0, [("a", 1000), ("b", 5000)]),     # min(999, 4999)
        (50, [("b", 6000)]),                 # a not idle yet: still 999
        (100, [("b", 7000)]),                # a idle (no rows for 100 ms): b alone: 6999
        (150, [("a", 2000)]),                # a back, behind: stays out until caught up
        (160, [("a", 8000), ("b", 7500)]),   # a caught up (7999 >= 6999): min(7999, 7499)
    ])
    assert marks == [999, 999, 6999, 6999, 7499]
    assert state.idle_partitions() == []


def test_all_idle_takes_the_maximum_and_never_goes_back():
    spec = EventTimeSpec(BoundedOutOfOrderness("t", 0), partition="p", idle_timeout_ms=10)
    marks, state = run(spec, [(0, [("a", 100), ("b", 900)]),
                              (20, [("c", 50)]),    # a, b idle; c new joins at once, holds 99
                              (40, [])])            # all idle: the maximum
    assert marks == [99, 99, 899]
    assert sorted(state.idle_partitions()) == ["a", "b", "c"]


def test_new_partition_holds_the_minimum_until_it_catches_up():
    spec = EventTimeSpec(BoundedOutOfOrderness("t", 0), partition="p")
    marks, _ = run(spec, [(0, [("a", 1000)]), (1, [("b", 10)]), (2, [("a", 3000), ("b", 2000)])])
    assert marks == [999, 999, 1999]


def test_file_partitions_leave_after_their_batch():
    spec = EventTimeSpec(BoundedOutOfOrderness("t", 0), partition=FILE_PARTITIONS)
    marks, state = run(spec, [(0, [("f1", 1000), ("f2", 500)]), (1, [("f3", 800)])])
    assert marks == [499, 799]
    assert state.table.empty


def test_state_round_trips_through_json():
    spec = EventTimeSpec(BoundedOutOfOrderness("t", 0), partition="p", idle_timeout_ms=10)
    _, state = run(spec, [(0, [("a", 100), ("b", 900)]), (20, [("a", 50)])])
    back = PartitionWatermarks.from_json(state.to_json())
    pd.testing.assert_frame_equal(back.table, state.table)
    assert (back.combined, back.ended_max) == (state.combined, state.ended_max)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30),
                          st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 10_000)),
                                   max_size=5)), max_size=12),
       st.sampled_from([None, 5, 50]))
def test_combined_never_goes_backwards_and_is_at_most_the_max(steps, idle):
    spec = EventTimeSpec(BoundedOutOfOrderness("t", 3), partition="p", idle_timeout_ms=idle)
    now, batches = 0, []
    for gap, rows in steps:
        now += gap
        batches.append((now, rows))
    marks, state = run(spec, batches)
    seen = [m for m in marks if m is not None]
    assert seen == sorted(seen)
    if seen:
        assert seen[-1] <= int(state.table["watermark"].max())
    # one partition: exactly the bounded-out-of-orderness watermark of everything seen
    if all(p == "a" for _, rows in steps for p, _ in rows) and idle is None:
        evs = [t for _, rows in steps for _, t in rows]
        assert (marks[-1] if marks else None) == (max(evs) - 4 if evs else None)
