"""Spec section 4, one row at a time: the oracle for ``RegularJoin``.

A literal restatement of Flink 2.3's ``StreamingJoinOperator.processElement``
with its three state views, plus our ordering rule: stored rows are kept in
arrival order (a replaced row arrives anew; a row of a no-unique-key side keeps
the place of the add that brought it into state) and matches are visited in
that order.

Rows are tuples of one side's data columns; kinds are ``"+I"``, ``"-U"``,
``"+U"``, ``"-D"``; outputs are ``(kind, left_row_or_None, right_row_or_None)``.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

ADD_KINDS = ("+I", "+U")
LEFT, RIGHT = 0, 1


def is_null(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def norm(row) -> tuple:
    """Nulls as None, so that a row can be a dict key (null equal to null)."""
    return tuple(None if is_null(v) else v for v in row)


class Entry:
    def __init__(self, row: tuple, count: int, assoc: int, ts: int):
        self.row, self.count, self.assoc, self.ts = row, count, assoc, ts


class ReferenceJoin:
    """One join key at a time, one row at a time."""

    def __init__(self, left_columns: Sequence[str], right_columns: Sequence[str],
                 left_keys: Sequence[str], right_keys: Sequence[str], join_type: str,
                 left_unique_key: Optional[Sequence[str]] = None,
                 right_unique_key: Optional[Sequence[str]] = None,
                 condition: Optional[Callable[[dict, dict], bool]] = None,
                 state_ttl_ms: Optional[int] = None):
        self.columns = (list(left_columns), list(right_columns))
        self.keys = (list(left_keys), list(right_keys))
        self.outer = (join_type in ("left", "full"), join_type in ("right", "full"))
        self.unique = (list(left_unique_key or ()), list(right_unique_key or ()))
        self.condition = condition
        self.ttl = state_ttl_ms
        # side -> join key -> entry key -> Entry; dicts keep insertion (= arrival) order
        self.state: tuple[dict, dict] = ({}, {})
        self.retract_no_match = 0
        self.ttl_expired = 0

    # -- the state view of a side ------------------------------------------------------
    def view(self, side: int) -> str:
        uk = self.unique[side]
        if not uk:
            return "InputSideHasNoUniqueKey"
        if set(uk) <= set(self.keys[side]):
            return "JoinKeyContainsUniqueKey"
        return "InputSideHasUniqueKey"

    def entry_key(self, side: int, row: tuple):
        v = self.view(side)
        if v == "JoinKeyContainsUniqueKey":
            return ()
        if v == "InputSideHasUniqueKey":
            return tuple(row[self.columns[side].index(c)] for c in self.unique[side])
        return row

    def join_key(self, side: int, row: tuple) -> tuple:
        return tuple(row[self.columns[side].index(c)] for c in self.keys[side])

    def add_record(self, side, jk, row, assoc, now):
        entries = self.state[side].setdefault(jk, {})
        ek = self.entry_key(side, row)
        if self.view(side) == "InputSideHasNoUniqueKey":
            e = entries.get(ek)
            if e is not None:               # same row again: count + 1, keeps its place
                e.count += 1
                e.assoc = assoc
                e.ts = now
                return
        else:
            entries.pop(ek, None)           # replaced: arrives anew
        entries[ek] = Entry(row, 1, assoc, now)

    def retract_record(self, side, jk, row, now) -> None:
        entries = self.state[side].get(jk, {})
        ek = self.entry_key(side, row)
        e = entries.get(ek)
        if e is None:
            self.retract_no_match += 1
            return
        if self.view(side) == "InputSideHasNoUniqueKey" and e.count > 1:
            e.count -= 1
            e.ts = now
        else:
            del entries[ek]

    def matches(self, side, jk, row):
        """[(entry, assoc as read)] of the other side, copies repeated, in arrival order."""
        other = 1 - side
        out = []
        if any(v is None for v in jk):
            return out
        for e in self.state[other].get(jk, {}).values():
            l, r = (row, e.row) if side == LEFT else (e.row, row)
            if self.condition is not None:
                ok = self.condition(dict(zip(self.columns[LEFT], l)), dict(zip(self.columns[RIGHT], r)))
                if not ok:
                    continue
            assoc = e.assoc                 # read once per entry, shared by its copies
            out.extend([(e, assoc)] * e.count)
        return out

    def expire(self, jk, now) -> None:
        if self.ttl is None:
            return
        for side in (LEFT, RIGHT):
            entries = self.state[side].get(jk)
            if not entries:
                continue
            for ek in [ek for ek, e in entries.items() if e.ts + self.ttl <= now]:
                del entries[ek]
                self.ttl_expired += 1

    # -- processElement ----------------------------------------------------------------
    def process(self, side: int, kind: str, row, now: int = 0) -> list:
        row = norm(row)
        jk = self.join_key(side, row)
        self.expire(jk, now)
        valid = not any(v is None for v in jk)
        other = 1 - side
        in_outer, other_outer = self.outer[side], self.outer[other]
        out = []

        def emit(k, mine, theirs):
            out.append((k, mine, theirs) if side == LEFT else (k, theirs, mine))

        if kind in ADD_KINDS:
            if in_outer:
                ms = self.matches(side, jk, row)
                if not ms:
                    emit("+I", row, None)
                    if valid:
                        self.add_record(side, jk, row, 0, now)
                else:
                    for e, assoc in ms:
                        if other_outer:
                            if assoc == 0:
                                emit_null_other(out, side, "-D", e.row)
                            e.assoc = assoc + 1
                            e.ts = now
                        emit("+I", row, e.row)
                    self.add_record(side, jk, row, len(ms), now)
            else:
                if valid:
                    self.add_record(side, jk, row, 0, now)
                for e, assoc in self.matches(side, jk, row):
                    if other_outer:
                        if assoc == 0:
                            emit_null_other(out, side, "-D", e.row)
                        e.assoc = assoc + 1
                        e.ts = now
                        emit("+I", row, e.row)
                    else:
                        emit(kind, row, e.row)
        else:
            if valid:
                self.retract_record(side, jk, row, now)
            ms = self.matches(side, jk, row)
            if not ms:
                if in_outer:
                    emit("-D", row, None)
            else:
                for e, assoc in ms:
                    emit("-D" if in_outer else kind, row, e.row)
                    if other_outer:
                        if assoc == 1:
                            emit_null_other(out, side, "+I", e.row)
                        e.assoc = assoc - 1
                        e.ts = now
        return out


def emit_null_other(out: list, side: int, kind: str, other_row) -> None:
    """``[null, other]`` seen from the input side."""
    out.append((kind, None, other_row) if side == LEFT else (kind, other_row, None))


__all__ = ["ReferenceJoin", "norm", "is_null"]
