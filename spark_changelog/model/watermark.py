"""Watermark strategies (spec section 6).

A watermark says "no more rows with an event time at or before W are expected".
Operators that wait for it (windows: a row is late when ``t <= W``; ``ON
CONFLICT DO ERROR/NOTHING``: a change waits for the next watermark advance)
get it from the runtime as ``OpContext.watermark_ms``.

:class:`BoundedOutOfOrderness`: ``W = max_event_time_seen - bound - 1 ms``,
never going backwards (Flink's DataStream ``BoundedOutOfOrdernessWatermarks``).
Flink SQL's ``WATERMARK FOR ts AS ts - INTERVAL 'b' ...`` emits the expression
itself, ``max - b``: that is a bound of ``b - 1 ms`` here (observed in the
recordings of ``tests/fixtures/flink/conflict.json``).  Monotonous timestamps
are bound 0 (:func:`monotonous_timestamps`).

On Spark the strategy becomes ``withWatermark(column, bound + 1 ms)``: Spark's
watermark is ``max - delay``, global over the query's partitions and sources
(the minimum over sources), kept in the checkpoint across restarts, and
advanced between micro-batches (a micro-batch runs with the watermark computed
from the batches before it; an extra batch without data runs when only the
watermark moved, so timers fire at the end of an ``availableNow`` run too).
"""
from __future__ import annotations

import dataclasses
import datetime
import re
from typing import Union

#: the watermark of a bounded input at its end (Flink's ``Long.MAX_VALUE``
#: "end of input" watermark): everything waiting for event time fires
END_OF_INPUT_MS = 2 ** 63 - 1

Duration = Union[int, float, str, datetime.timedelta]

_UNITS_MS = {"ms": 1, "millisecond": 1, "milliseconds": 1, "s": 1000, "sec": 1000,
             "second": 1000, "seconds": 1000, "m": 60_000, "min": 60_000, "minute": 60_000,
             "minutes": 60_000, "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
             "d": 86_400_000, "day": 86_400_000, "days": 86_400_000}


def duration_ms(value: Duration) -> int:
    """Milliseconds of ``5000``, ``"5 seconds"``, ``"1.5 min"``, ``"100ms"`` or a timedelta."""
    if isinstance(value, datetime.timedelta):
        return int(round(value.total_seconds() * 1000))
    if isinstance(value, bool):
        raise TypeError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        ms = int(value)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)?\s*", str(value))
        unit = (m.group(2) or "ms").lower() if m else None
        if not m or unit not in _UNITS_MS:
            raise ValueError(f"not a duration: {value!r} (use milliseconds, or e.g. '5 seconds', "
                             "'100 ms', '2 minutes')")
        ms = int(round(float(m.group(1)) * _UNITS_MS[unit]))
    if ms < 0:
        raise ValueError(f"a duration must not be negative: {value!r}")
    return ms


#: one day: ChangelogNormalize's default tombstone retention (docs/semantics.md, section 5)
DAY_MS = 24 * 3600 * 1000


@dataclasses.dataclass(frozen=True)
class WatermarkStrategy:
    """How the watermark of a stream is generated from its event-time column."""

    column: str
    bound_ms: int = 0

    def watermark_for(self, max_event_time_ms: int) -> int:
        return max_event_time_ms - self.bound_ms - 1

    @property
    def spark_delay(self) -> str:
        """The ``withWatermark`` delay giving the same watermark (``max - bound - 1``)."""
        return f"{self.bound_ms + 1} milliseconds"

    def describe(self) -> str:
        return f"{self.column} - {self.bound_ms} ms"

    def renamed(self, column: str) -> "WatermarkStrategy":
        return dataclasses.replace(self, column=column)


@dataclasses.dataclass(frozen=True)
class BoundedOutOfOrderness(WatermarkStrategy):
    """``W = max_event_time - bound - 1 ms`` (spec section 6, W1)."""


def monotonous_timestamps(column: str) -> BoundedOutOfOrderness:
    """Ascending event times: bound 0, ``W = max_event_time - 1 ms``."""
    return BoundedOutOfOrderness(column, 0)


__all__ = ["WatermarkStrategy", "BoundedOutOfOrderness", "monotonous_timestamps",
           "duration_ms", "END_OF_INPUT_MS", "DAY_MS"]
