"""Window plan nodes (docs/windows.md): traits and explain.  Pure: no Spark."""
from __future__ import annotations

import pytest

from spark_changelog.model import ChangelogMode
from spark_changelog.model.watermark import Punctuated
from spark_changelog.model.windows import Hop, Session, Tumble
from spark_changelog.plan import explain_plan
from spark_changelog.plan.nodes import (Source, WatermarkAssigner, WindowAggregate,
                                         WindowTableFunction)

CLICKS = WatermarkAssigner(Source("clicks", ("id", "u", "rt"), ("id",), ChangelogMode.INSERT_ONLY),
                           "rt", 60_000)


def test_window_table_function_traits():
    tvf = WindowTableFunction(CLICKS, "rt", Hop(30_000, 60_000))
    t = tvf.traits
    assert t.columns == ("id", "u", "rt", "window_start", "window_end")
    # a HOP row is repeated per window: id is unique only with window_start
    assert t.unique_keys == (("id", "window_start"),) and t.upsert_key is None
    assert t.mode is ChangelogMode.INSERT_ONLY


@pytest.mark.parametrize("lateness, mode", [(0, ChangelogMode.INSERT_ONLY),
                                            (10_000, ChangelogMode.RETRACT)])
def test_window_aggregate_traits(lateness, mode):
    agg = WindowAggregate(WindowTableFunction(CLICKS, "rt", Tumble(60_000)), ("u",),
                          (("n", "count", None), ("users", "count_distinct", "u")), lateness)
    t = agg.traits
    key = ("u", "window_start", "window_end")
    assert t.columns == key + ("n", "users")
    assert (t.unique_keys, t.upsert_key, t.primary_key, t.mode) == ((key,), key, key, mode)
    assert t.watermark is None and not t.has_watermark


def test_explain_shows_window_watermark_and_lateness():
    tvf = WindowTableFunction(CLICKS, "rt", Tumble(60_000), partition="p", idle_timeout_ms=30_000)
    text = explain_plan(WindowAggregate(tvf, (), (("users", "count_distinct", "u"),), 5_000))
    assert ("WindowAggregate(groupBy=[], window=[TUMBLE(size=1 min)], select=[COUNT(DISTINCT u) "
            "AS users], allowedLateness=[5000 ms], lateRows=[late output])") in text
    assert ("WindowTableFunction(window=[TUMBLE(size=1 min)], rowtime=[rt], watermark=[rt - "
            "60000 ms, per p, idle after 30000 ms])") in text
    punct = WindowTableFunction(CLICKS, "rt", Session(30_000), Punctuated("rt", "m"))
    assert "SESSION(gap=30 s)" in punct.label() and "punctuated" in punct.label()


def test_window_without_watermark_is_refused():
    src = Source("s", ("u", "rt"), (), ChangelogMode.INSERT_ONLY)
    with pytest.raises(ValueError, match="no watermark"):
        WindowTableFunction(src, "rt", Tumble(60_000)).label()


def test_window_time_is_the_aggregates_event_time_attribute_over_source_watermarks():
    """Cascading windows (docs/windows.md): ``window_time`` after the bounds,
    the output's time attribute when the window waits for the sources'
    watermarks; a second window over it waits for the same source."""
    first = WindowAggregate(WindowTableFunction(CLICKS, "rt", Tumble(60_000)), ("u",),
                            (("n", "count", None),), window_time=True)
    t = first.traits
    assert t.columns == ("u", "window_start", "window_end", "window_time", "n")
    assert (t.time_attribute, t.has_watermark, t.watermark.column) == \
        ("window_time", True, "window_time")
    second = WindowTableFunction(first, "window_time", Tumble(600_000))
    assert second.from_source
    assert ("rowtime=[window_time], watermark=[generated at the source: clicks: rt - 60000 ms"
            in second.label()), second.label()
    # a window with a generator of its own passes no watermark rows on
    own = WindowAggregate(WindowTableFunction(CLICKS, "rt", Tumble(60_000), partition="u"), ("u",),
                          (("n", "count", None),), window_time=True)
    assert own.traits.time_attribute is None and not own.traits.has_watermark
