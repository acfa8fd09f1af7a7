"""Watermark strategies (docs/semantics.md, section 6, W1) and durations."""
from __future__ import annotations

import datetime

import pytest

from spark_changelog.model import BoundedOutOfOrderness, duration_ms, monotonous_timestamps


def test_w1_bounded_out_of_orderness():
    s = BoundedOutOfOrderness("ts", 10)
    assert s.watermark_for(1337) == 1326
    # then events 12345, 12300, 12340, 12280: the watermark follows the maximum
    seen = [1337, 12345, 12300, 12340, 12280]
    marks, wm = [], None
    for i in range(1, len(seen) + 1):
        w = s.watermark_for(max(seen[:i]))
        wm = w if wm is None else max(wm, w)
        marks.append(wm)
    assert marks == [1326, 12334, 12334, 12334, 12334]
    assert s.spark_delay == "11 milliseconds"           # Spark: max - delay
    assert monotonous_timestamps("ts").watermark_for(100) == 99


@pytest.mark.parametrize("text, ms", [(5000, 5000), ("5 seconds", 5000), ("100ms", 100),
                                      ("1.5 min", 90_000), ("2 hours", 7_200_000),
                                      (datetime.timedelta(seconds=3), 3000)])
def test_durations(text, ms):
    assert duration_ms(text) == ms


@pytest.mark.parametrize("bad", ["soon", "5 parsecs", -1, True])
def test_bad_durations(bad):
    with pytest.raises((ValueError, TypeError)):
        duration_ms(bad)
