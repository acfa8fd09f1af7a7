"""Deduplication (docs/operators.md), one row at a time: the oracle for the
operators of ``spark_changelog.operators.deduplicate``.

Literal restatements of Flink 2.3's ``DeduplicateFunctionHelper`` functions
(``processFirstRowOnProcTime``, ``processLastRowOnProcTime``, the row-time
keep-last) and of the recorded row-time keep-first (a candidate per key, the
smallest event time, emitted by a watermark arriving at or past it; rows
behind the watermark are late).  Rows are tuples; outputs ``(kind, row)``.
"""
from __future__ import annotations

import math


def _norm(row):
    return tuple(None if (v is None or (isinstance(v, float) and math.isnan(v))) else v
                 for v in row)


class RefKeepFirst:
    """Processing time: the first row of a key is emitted, later ones dropped."""

    def __init__(self, key):
        self.key = list(key)
        self.seen = set()

    def run_batch(self, rows, watermark=None):
        out = []
        for row in rows:
            k = tuple(row[i] for i in self.key)
            if k not in self.seen:
                self.seen.add(k)
                out.append(("+I", row))
        return out


class RefKeepLast:
    """Processing time (``time=None``) or event time (``time`` = index of the
    event-time field: a row older than the kept one is dropped)."""

    def __init__(self, key, *, time=None, suppress_equal=True, generate_update_before=True,
                 generate_insert=True):
        self.key = list(key)
        self.time = time
        self.suppress_equal = suppress_equal
        self.gub = generate_update_before
        self.gi = generate_insert
        self.prev = {}

    def run_batch(self, rows, watermark=None):
        out = []
        for row in rows:
            k = tuple(row[i] for i in self.key)
            p = self.prev.get(k)
            if self.time is not None and p is not None and row[self.time] < p[self.time]:
                continue
            self.prev[k] = row
            if p is None:
                out.append(("+I" if (self.gi or self.gub) else "+U", row))
            elif self.suppress_equal and _norm(p) == _norm(row):
                continue
            else:
                if self.gub:
                    out.append(("-U", p))
                out.append(("+U", row))
        return out


class RefRowTimeKeepFirst:
    """Event time keep first, emitted when the watermark reaches the row."""

    def __init__(self, key, time):
        self.key = list(key)
        self.time = time
        self.cand = {}
        self.emitted = set()

    def run_batch(self, rows, watermark=None):
        for row in rows:
            k = tuple(row[i] for i in self.key)
            if k in self.emitted:
                continue
            t = row[self.time]
            if watermark is not None and t < watermark:
                continue                                   # late
            c = self.cand.get(k)
            if c is None or t < c[0][self.time]:
                # a row at the watermark waits for the next one
                self.cand[k] = (row, t + 1 if t == watermark else t)
        return self.fire(watermark)

    def fire(self, watermark):
        if watermark is None:
            return []
        out = []
        for k in sorted(self.cand, key=lambda k: self.cand[k][0][self.time]):
            if self.cand[k][1] <= watermark:
                out.append(("+I", self.cand.pop(k)[0]))
                self.emitted.add(k)
        return out
