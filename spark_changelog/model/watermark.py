"""Watermark strategies (docs/windows.md, "Watermarks").

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

import abc
import dataclasses
import datetime
import re
from typing import Union

import numpy as np

#: "no watermark yet" / "this row proves nothing" (Flink's ``Long.MIN_VALUE``)
NO_WATERMARK = np.iinfo(np.int64).min

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


class WatermarkGenerator(abc.ABC):
    """How a watermark is generated, vectorized over a batch (docs/windows.md).

    Per source partition the runtime keeps one number, the partition's
    *progress* (``int64``, :data:`NO_WATERMARK` until something is proven).
    A generator says

    * :meth:`on_events`: per row of a batch, the progress that row proves
      (``NO_WATERMARK`` for none).  The runtime takes the maximum per
      partition, over pieces of the batch seen in parallel and over batches,
      so the value must be one whose maximum means something (an event
      time, a marker's time); progress never goes backwards;
    * :meth:`on_periodic_emit`: on each periodic tick (once per micro-batch,
      after its rows), the watermark of each partition from its progress.
      The runtime keeps each partition's watermark from going backwards.

    Flink's ``WatermarkGenerator.onEvent`` / ``onPeriodicEmit`` are the same
    two calls, per row and per generator; here they take arrays.
    """

    column: str

    @abc.abstractmethod
    def on_events(self, event_ms: np.ndarray, rows) -> np.ndarray:
        """Progress proven by each row (``int64`` array, same length).
        ``event_ms``: the rows' event times in ms (``NO_WATERMARK`` where
        null); ``rows``: the batch as a ``pyarrow.Table`` (for marker columns)."""

    @abc.abstractmethod
    def on_periodic_emit(self, progress: np.ndarray, processing_time_ms: int) -> np.ndarray:
        """Watermark per partition (``int64``) from its progress; must map
        ``NO_WATERMARK`` to ``NO_WATERMARK``."""

    def describe(self) -> str:
        return type(self).__name__

    def renamed(self, column: str) -> "WatermarkGenerator":
        return dataclasses.replace(self, column=column)


def _minus(progress: np.ndarray, delta: int) -> np.ndarray:
    progress = np.asarray(progress, dtype=np.int64)
    return np.where(progress == NO_WATERMARK, NO_WATERMARK, progress - np.int64(delta))


#: one day: ChangelogNormalize's default tombstone retention (docs/semantics.md, section 5)
DAY_MS = 24 * 3600 * 1000


@dataclasses.dataclass(frozen=True)
class WatermarkStrategy(WatermarkGenerator):
    """Bounded out-of-orderness: ``W = max_event_time_seen - bound - 1 ms``.
    The base of the strategies Spark's own ``withWatermark`` can express."""

    column: str
    bound_ms: int = 0

    def watermark_for(self, max_event_time_ms: int) -> int:
        return max_event_time_ms - self.bound_ms - 1

    def on_events(self, event_ms: np.ndarray, rows=None) -> np.ndarray:
        return np.asarray(event_ms, dtype=np.int64)

    def on_periodic_emit(self, progress: np.ndarray, processing_time_ms: int = 0) -> np.ndarray:
        return _minus(progress, self.bound_ms + 1)

    @property
    def spark_delay(self) -> str:
        """The ``withWatermark`` delay giving the same watermark (``max - bound - 1``)."""
        return f"{self.bound_ms + 1} milliseconds"

    def describe(self) -> str:
        return f"{self.column} - {self.bound_ms} ms"


@dataclasses.dataclass(frozen=True)
class BoundedOutOfOrderness(WatermarkStrategy):
    """``W = max_event_time - bound - 1 ms`` (docs/semantics.md, section 6, W1)."""


@dataclasses.dataclass(frozen=True)
class MonotonousTimestamps(WatermarkStrategy):
    """Ascending event times: ``W = max_event_time - 1 ms`` (bound 0)."""

    bound_ms: int = 0

    def __post_init__(self):
        if self.bound_ms != 0:
            raise ValueError("monotonous timestamps have bound 0; use BoundedOutOfOrderness")

    def describe(self) -> str:
        return f"{self.column} - 1 ms (monotonous)"


def monotonous_timestamps(column: str) -> MonotonousTimestamps:
    """Ascending event times: bound 0, ``W = max_event_time - 1 ms``."""
    return MonotonousTimestamps(column)


@dataclasses.dataclass(frozen=True)
class Punctuated(WatermarkGenerator):
    """A marker row emits the watermark: a row whose boolean ``marker`` column
    is true and whose event time is ``t`` says "every row at or before ``t`` -
    ``bound`` has arrived": ``W = t - bound`` (the marker row itself is not
    late: it is judged by the watermark before it).  Other rows move nothing.
    Spark's ``withWatermark`` cannot express it; only operators that track
    their own watermarks (windows) accept it."""

    column: str
    marker: str
    bound_ms: int = 0

    def on_events(self, event_ms: np.ndarray, rows) -> np.ndarray:
        import pyarrow.compute as pc
        flags = pc.fill_null(rows.column(self.marker), False).to_numpy(zero_copy_only=False)
        return np.where(flags.astype(bool), np.asarray(event_ms, dtype=np.int64), NO_WATERMARK)

    def on_periodic_emit(self, progress: np.ndarray, processing_time_ms: int = 0) -> np.ndarray:
        return _minus(progress, self.bound_ms)

    def describe(self) -> str:
        return f"{self.column} at rows where {self.marker} (punctuated, - {self.bound_ms} ms)"


__all__ = ["WatermarkGenerator", "WatermarkStrategy", "BoundedOutOfOrderness",
           "MonotonousTimestamps", "Punctuated", "monotonous_timestamps", "duration_ms",
           "END_OF_INPUT_MS", "NO_WATERMARK", "DAY_MS"]
