"""Which windows a row belongs to (docs/windows.md, "Windows"): the window
table functions TUMBLE, HOP and CUMULATE as a projection that repeats a row
once per window it falls in, and SESSION, whose windows are merged per key by
the aggregate (a row first gets ``[t, t + gap)``).

A window is ``[start, end)`` in epoch milliseconds; it *fires* when the
watermark reaches ``end - 1`` (its last millisecond).  Everything is
vectorized over the rows of a batch; this module is the only place that
knows the window arithmetic.
"""
from __future__ import annotations

import abc
import dataclasses

import numpy as np
import pandas as pd

from .watermark import Duration, duration_ms


def _floor(t: np.ndarray, size: int, offset: int) -> np.ndarray:
    """The largest ``offset + k * size`` at or below ``t`` (also for t < 0)."""
    return np.floor_divide(t - offset, size) * size + offset


def _expand(counts: np.ndarray):
    """For rows repeated ``counts`` times: (row index, 0-based repetition)."""
    counts = np.asarray(counts, dtype=np.int64)
    idx = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts
    rep = np.arange(len(idx), dtype=np.int64) - np.repeat(starts, counts)
    return idx, rep


class WindowAssigner(abc.ABC):
    """Assigns event times (ms) to windows."""

    #: session windows merge per key; the others are fixed by the event time alone
    merging: bool = False

    @abc.abstractmethod
    def assign(self, event_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(row, start, end)``: for every window of every row, the row's
        index, the window's start and end (ms); a row's windows are adjacent,
        in ascending start order."""

    @abc.abstractmethod
    def describe(self) -> str:
        """``TUMBLE(1 min)``-style text for explain."""


def _text(ms: int) -> str:
    for unit, size in (("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms} ms"


@dataclasses.dataclass(frozen=True)
class Tumble(WindowAssigner):
    """Fixed, non-overlapping windows of ``size_ms`` (aligned to ``offset_ms``)."""

    size_ms: int
    offset_ms: int = 0

    def __post_init__(self):
        if self.size_ms <= 0:
            raise ValueError(f"TUMBLE: the size must be positive, got {self.size_ms} ms")

    def assign(self, event_ms):
        t = np.asarray(event_ms, dtype=np.int64)
        start = _floor(t, self.size_ms, self.offset_ms)
        return np.arange(len(t), dtype=np.int64), start, start + self.size_ms

    def describe(self) -> str:
        return f"TUMBLE(size={_text(self.size_ms)})"


@dataclasses.dataclass(frozen=True)
class Hop(WindowAssigner):
    """Sliding windows: size ``size_ms``, a new one every ``slide_ms`` (the
    size must be a multiple of the slide, as in Flink's HOP)."""

    slide_ms: int
    size_ms: int
    offset_ms: int = 0

    def __post_init__(self):
        if self.slide_ms <= 0 or self.size_ms <= 0 or self.size_ms % self.slide_ms:
            raise ValueError(f"HOP: size ({self.size_ms} ms) must be a positive multiple of the "
                             f"slide ({self.slide_ms} ms)")

    def assign(self, event_ms):
        t = np.asarray(event_ms, dtype=np.int64)
        n = self.size_ms // self.slide_ms
        last = _floor(t, self.slide_ms, self.offset_ms)
        row, rep = _expand(np.full(len(t), n))
        start = last[row] - (n - 1 - rep) * self.slide_ms
        return row, start, start + self.size_ms

    def describe(self) -> str:
        return f"HOP(slide={_text(self.slide_ms)}, size={_text(self.size_ms)})"


@dataclasses.dataclass(frozen=True)
class Cumulate(WindowAssigner):
    """Windows that grow by ``step_ms`` from a common start up to
    ``max_size_ms`` (a multiple of the step): ``[s, s+step)``, ``[s, s+2 step)``, ..."""

    step_ms: int
    max_size_ms: int
    offset_ms: int = 0

    def __post_init__(self):
        if self.step_ms <= 0 or self.max_size_ms <= 0 or self.max_size_ms % self.step_ms:
            raise ValueError(f"CUMULATE: max size ({self.max_size_ms} ms) must be a positive "
                             f"multiple of the step ({self.step_ms} ms)")

    def assign(self, event_ms):
        t = np.asarray(event_ms, dtype=np.int64)
        base = _floor(t, self.max_size_ms, self.offset_ms)
        first = np.floor_divide(t - base, self.step_ms) + 1      # the first step ending after t
        steps = self.max_size_ms // self.step_ms
        row, rep = _expand(steps - first + 1)
        return row, base[row], base[row] + (first[row] + rep) * self.step_ms

    def describe(self) -> str:
        return f"CUMULATE(step={_text(self.step_ms)}, max size={_text(self.max_size_ms)})"


@dataclasses.dataclass(frozen=True)
class Session(WindowAssigner):
    """Sessions per key: a row opens ``[t, t + gap)``; windows of one key that
    overlap merge (:func:`merge_sessions`)."""

    gap_ms: int
    merging = True

    def __post_init__(self):
        if self.gap_ms <= 0:
            raise ValueError(f"SESSION: the gap must be positive, got {self.gap_ms} ms")

    def assign(self, event_ms):
        t = np.asarray(event_ms, dtype=np.int64)
        return np.arange(len(t), dtype=np.int64), t, t + self.gap_ms

    def describe(self) -> str:
        return f"SESSION(gap={_text(self.gap_ms)})"


def merge_sessions(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per interval, the id of the merged session it belongs to: intervals of
    the same ``group`` (an int code per key) that overlap chain into one
    session (``[a, b)`` and ``[b, c)`` touch and merge, as in Flink).  Input
    in any order; ids are dense, in (group, start) order."""
    n = len(start)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((start, group))
    g, s, e = group[order], start[order], end[order]
    first = np.ones(n, dtype=bool)
    first[1:] = g[1:] != g[:-1]
    # a new session starts where the start lies beyond every earlier end of the group
    reach = pd.Series(e).groupby(np.cumsum(first)).cummax().to_numpy()
    new_session = first.copy()
    new_session[1:] |= s[1:] > reach[:-1]
    out = np.empty(n, dtype=np.int64)
    out[order] = np.cumsum(new_session) - 1
    return out


def tumble(column: str, size: Duration, offset: Duration = 0) -> tuple[str, Tumble]:
    return column, Tumble(duration_ms(size), duration_ms(offset))


def hop(column: str, slide: Duration, size: Duration, offset: Duration = 0) -> tuple[str, Hop]:
    return column, Hop(duration_ms(slide), duration_ms(size), duration_ms(offset))


def cumulate(column: str, step: Duration, max_size: Duration, offset: Duration = 0
             ) -> tuple[str, Cumulate]:
    return column, Cumulate(duration_ms(step), duration_ms(max_size), duration_ms(offset))


def session(column: str, gap: Duration) -> tuple[str, Session]:
    return column, Session(duration_ms(gap))


def event_ms_of(column) -> np.ndarray:
    """Epoch milliseconds of an Arrow timestamp (or integer ms) column; nulls
    become ``NO_WATERMARK``."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from .watermark import NO_WATERMARK
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    t = column.type
    if pa.types.is_timestamp(t):
        per_ms = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}[t.unit]
        raw = column.view(pa.int64()) if hasattr(column, "view") else pc.cast(column, pa.int64())
        raw = pc.fill_null(raw, NO_WATERMARK).to_numpy()
        nulls = raw == NO_WATERMARK
        ms = raw * 1000 if per_ms is None else np.floor_divide(raw, per_ms)
        return np.where(nulls, NO_WATERMARK, ms).astype(np.int64)
    if pa.types.is_integer(t):
        return pc.fill_null(pc.cast(column, pa.int64()), NO_WATERMARK).to_numpy().astype(np.int64)
    raise TypeError(f"event-time column has type {t}; it must be a TIMESTAMP")


def assign_windows(table, column: str, assigner: WindowAssigner):
    """The window projection: ``table`` (Arrow) with each row repeated once
    per window it falls in, plus ``window_start``/``window_end`` (UTC
    timestamps).  A row whose event time is null falls in no window: it is
    kept once, with null bounds, so the aggregate can send it to the late
    output (counted) instead of losing it."""
    import pyarrow as pa
    from .watermark import NO_WATERMARK
    ev = event_ms_of(table.column(column))
    has_time = ev != NO_WATERMARK
    keep = np.flatnonzero(has_time)
    row, start, end = assigner.assign(ev[keep])
    ts = pa.timestamp("us", tz="UTC")
    take = keep[row]
    starts = pa.array(start * 1000, pa.int64()).cast(ts)
    ends = pa.array(end * 1000, pa.int64()).cast(ts)
    if not has_time.all():
        lost = np.flatnonzero(~has_time)
        take = np.concatenate([take, lost])
        starts = pa.concat_arrays([starts, pa.nulls(len(lost), ts)])
        ends = pa.concat_arrays([ends, pa.nulls(len(lost), ts)])
    out = table.take(pa.array(take))
    return out.append_column("window_start", starts).append_column("window_end", ends)
