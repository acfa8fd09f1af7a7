"""Spec section 3, one row at a time: the oracle for ``SinkUpsertMaterializer``.

Rows are tuples of the data columns; kinds are ``"+I"``, ``"-U"``, ``"+U"``, ``"-D"``.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

ADD_KINDS = ("+I", "+U")


def same_value(a, b) -> bool:
    """Equality where null equals null (None, NaN)."""
    a_null = a is None or (isinstance(a, float) and math.isnan(a))
    b_null = b is None or (isinstance(b, float) and math.isnan(b))
    if a_null or b_null:
        return a_null and b_null
    return a == b


class ReferenceSinkUpsertMaterializer:
    """``ON CONFLICT DO DEDUPLICATE``: per sink key the list of alive rows."""

    def __init__(self, columns: Sequence[str], sink_key: Sequence[str],
                 upsert_key: Optional[Sequence[str]] = None):
        self.columns = list(columns)
        self.key_pos = [self.columns.index(c) for c in sink_key]
        self.match_pos = ([self.columns.index(c) for c in upsert_key] if upsert_key
                          else list(range(len(self.columns))))
        self.has_upsert_key = bool(upsert_key)
        self.state: dict[tuple, list[tuple]] = {}
        self.unmatched: list[tuple] = []        # sink keys of retractions matching nothing

    def key_of(self, row: tuple) -> tuple:
        return tuple(row[i] for i in self.key_pos)

    def _equal(self, a: tuple, b: tuple) -> bool:
        return all(same_value(a[i], b[i]) for i in self.match_pos)

    def _find_first(self, values: list, row: tuple) -> int:
        for i, v in enumerate(values):
            if self._equal(v, row):
                return i
        return -1

    def apply(self, kind: str, row: tuple) -> list[tuple[str, tuple]]:
        """One input row; returns the emitted rows."""
        row = tuple(row)
        key = self.key_of(row)
        values = self.state.setdefault(key, [])
        if kind in ADD_KINDS:
            out_kind = "+I" if not values else "+U"
            index = self._find_first(values, row) if self.has_upsert_key else -1
            if index == -1:
                values.append(row)
            else:
                values[index] = row
            return [(out_kind, row)]
        last = len(values) - 1
        index = self._find_first(values, row)
        if index == -1:
            if not values:
                del self.state[key]
            self.unmatched.append(key)
            return []
        del values[index]
        if not values:
            del self.state[key]
            return [("-D", row)]
        if index == last:
            return [("+U", values[-1])]
        return []

    def run(self, changes: Sequence[tuple[str, tuple]]) -> list[tuple[str, tuple]]:
        out = []
        for kind, row in changes:
            out.extend(self.apply(kind, row))
        return out

    def table(self) -> dict[tuple, tuple]:
        """What an upsert sink holds: the last alive row of every key."""
        return {k: v[-1] for k, v in self.state.items() if v}


class ReferenceWatermarkMaterializer:
    """``ON CONFLICT DO ERROR`` / ``DO NOTHING``: buffer each change with the
    watermark it arrived under (its stamp); when the watermark is above the
    stamp (Flink 2.3: the next watermark advance), fold the key's due changes
    (adds replace by upsert key, retracts remove the first match) starting
    from the current value, then emit."""

    def __init__(self, columns: Sequence[str], sink_key: Sequence[str],
                 upsert_key: Optional[Sequence[str]], conflict: str):
        self.list_rule = ReferenceSinkUpsertMaterializer(columns, sink_key, upsert_key)
        self.conflict = conflict
        self.current: dict[tuple, tuple] = {}
        self.buffer: dict[tuple, list[tuple[int, str, tuple, int]]] = {}

    def add(self, kind: str, row: tuple, seq: int, stamp: int) -> None:
        self.buffer.setdefault(self.list_rule.key_of(row), []).append(
            (seq, kind, tuple(row), stamp))

    def advance(self, watermark: int) -> list[tuple[str, tuple]]:
        out = []
        for key in sorted(self.buffer):
            pending = self.buffer[key]
            due = sorted((c for c in pending if c[3] < watermark),
                         key=lambda c: (c[0], c[1] in ADD_KINDS))
            if not due:
                continue
            self.buffer[key] = [c for c in pending if c[3] >= watermark]
            previous = self.current.get(key)
            rule = self.list_rule
            rule.state = {key: [previous]} if previous is not None else {}
            for _, kind, row, _ in due:
                rule.apply(kind, row)
            folded = rule.state.get(key, [])
            if len(folded) > 1:
                if self.conflict == "error":
                    raise AssertionError(f"primary key constraint violation for {key}: {folded}")
                folded = folded[:1]          # DO NOTHING: the first row of the folded list
            if not folded:
                if previous is not None:
                    out.append(("-D", previous))
                    del self.current[key]
            else:
                new = folded[0]
                if previous is None:
                    out.append(("+I", new))
                    self.current[key] = new
                elif not all(same_value(a, b) for a, b in zip(previous, new)):
                    out.append(("+U", new))
                    self.current[key] = new
        return out
