"""Group aggregation with retraction (docs/operators.md), one row at a time:
the oracle for the accumulators and ``GroupAggregate``.

A literal restatement of Flink 2.3's ``GroupAggFunction.processElement`` per
row (a retraction for a group without state is ignored; the group's state is
cleared when its row count reaches zero) with our emission rule: one change
per group and micro-batch, comparing the group's result before and after it.

Rows are tuples of the input's data columns; kinds ``"+I"``, ``"-U"``,
``"+U"``, ``"-D"``.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

ADD_KINDS = ("+I", "+U")


def is_null(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


class RefFunction:
    """One aggregate function's accumulator for one group."""

    def __init__(self, function: str, column: Optional[int], integer: bool):
        self.function = function
        self.column = column
        self.integer = integer
        self.n = 0
        self.total = 0
        self.counts: dict = {}
        self.entries: list = []          # (value, order), first/last value

    def apply(self, row, sign: int, order: int) -> None:
        f = self.function
        v = None if self.column is None else row[self.column]
        if f == "count" and self.column is None:
            self.n += sign
            return
        if is_null(v):
            return
        if f == "count":
            self.n += sign
        elif f in ("sum", "avg"):
            self.n += sign
            self.total += sign * v
        elif f in ("min", "max", "count_distinct"):
            c = self.counts.get(v, 0) + sign
            if c == 0:
                self.counts.pop(v, None)
            else:
                self.counts[v] = c
        elif f in ("first_value", "last_value"):
            if sign > 0:
                self.entries.append((v, order))
            else:
                for i, (w, _) in enumerate(self.entries):    # oldest equal value
                    if w == v:
                        del self.entries[i]
                        break
        else:
            raise ValueError(f)

    def result(self):
        f = self.function
        if f == "count":
            return self.n
        if f == "sum":
            return self.total if self.n > 0 else None
        if f == "avg":
            if self.n <= 0:
                return None
            if self.integer:
                q = abs(self.total) // self.n
                return q if self.total >= 0 else -q
            return self.total / self.n
        present = [v for v, c in self.counts.items() if c > 0]
        if f == "min":
            return min(present) if present else None
        if f == "max":
            return max(present) if present else None
        if f == "count_distinct":
            return len(present)
        if not self.entries:
            return None
        pick = min if f == "first_value" else max
        return pick(self.entries, key=lambda e: e[1])[0]


class RefGroupAggregate:
    """``GROUP BY key`` with ``aggs = [(function, column index or None, integer)]``.

    ``run_batch(rows)`` takes ``[(kind, row)]`` in processing order and
    returns the emitted ``[(kind, output row)]``; an output row is the key
    values followed by the aggregate results."""

    def __init__(self, key: Sequence[int], aggs, *, generate_update_before: bool = True,
                 emit_unchanged: bool = False):
        self.key = list(key)
        self.aggs = list(aggs)
        self.generate_update_before = generate_update_before
        self.emit_unchanged = emit_unchanged
        self.groups: dict = {}           # key -> [row count, [RefFunction]]
        self.order = 0
        self.ignored_retractions = 0

    def _result(self, k):
        g = self.groups.get(k)
        if g is None:
            return None
        return tuple(k) + tuple(f.result() for f in g[1])

    def run_batch(self, rows):
        touched = []
        before = {}
        for kind, row in rows:
            k = tuple(row[i] for i in self.key)
            k = tuple(None if is_null(v) else v for v in k)
            if k not in before:
                before[k] = self._result(k)
                touched.append(k)
            self.order += 1
            add = kind in ADD_KINDS
            g = self.groups.get(k)
            if g is None:
                if not add:
                    self.ignored_retractions += 1
                    continue
                g = self.groups[k] = [0, [RefFunction(f, c, i) for f, c, i in self.aggs]]
            g[0] += 1 if add else -1
            for f in g[1]:
                f.apply(row, 1 if add else -1, self.order)
            if g[0] == 0:
                del self.groups[k]
        out = []
        for k in sorted(touched, key=_sort_key):
            old, new = before[k], self._result(k)
            if old is None and new is not None:
                out.append(("+I", new))
            elif old is not None and new is None:
                out.append(("-D", old))
            elif old is not None:
                if old == new and not self.emit_unchanged:
                    continue
                if self.generate_update_before:
                    out.append(("-U", old))
                out.append(("+U", new))
        return out

    def table(self) -> list:
        return sorted((self._result(k) for k in self.groups), key=_sort_key)


def _sort_key(row):
    return tuple((v is None, v if v is not None else 0) for v in row)
