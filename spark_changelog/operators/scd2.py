"""SCD type 2 history of a keyed changelog (docs/operators.md, "SCD type 2 history").

Per key, the history is a list of *versions*: one row per version, with
``__START_AT`` (the sequence value of the change that opened it) and
``__END_AT`` (the sequence value of the change that closed it; null for the
current version), named as Spark's ``create_auto_cdc_flow`` names them.  An
upsert whose tracked columns differ from the current version's (or that
follows a delete, or is the key's first) opens a version and closes the
current one; an upsert that changes only untracked columns updates the current
version in place; a delete closes the current version.

**Correct under disorder.**  The history of a key is a pure function of the
*set* of its changes, whatever order they arrive in.  So the state of a key is
its applied changes (the input rows, after column selection), and a
micro-batch recomputes the history of each key it touches from its old and
from its merged changes, vectorized over all those keys at once, and emits the
difference, keyed by the history key ``(key..., __START_AT)``:

* ``+I`` a version that is new;
* ``-U old`` / ``+U new`` a version whose values or ``__END_AT`` changed
  (closed by a newer change, updated in place, or cut short by a late change
  that falls inside it and opens a version of its own);
* ``-D`` a version that no longer exists (a late change that makes two
  versions one, e.g. a late upsert that equals the next version's tracked
  values).

The history table after any interleaving of files and micro-batches is
therefore the history of the in-order run (property-tested).  Each changed
history key gets one sequence number per micro-batch (``-U``/``+U`` share it),
so an upsert sink keyed by ``(key..., __START_AT)`` applies it as is.

``ignore_null_updates``: a null in an upsert keeps the key's previous value
(partial updates); after a delete there is no previous value.  A late change
re-fills the nulls of the changes after it, which is why the changes, not the
versions, are the state.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from ..model import KIND_COL, SEQ_COL, RowKind
from ..model.history import history_columns
from ..model.rowkind import IS_ADD
from .base import KeyedOperator, OpContext
from .kernels import concat_frames, factorize_rows, rows_equal, run_ends, stable_order
from .keys import first_of_key

_ADD = "__is_add"


class ScdType2History(KeyedOperator):
    """One row per version of each key (module docstring).

    ``sequence_by``: the columns that order a key's changes, compared field by
    field (ties broken by the next field, then by the source sequence
    ``_seq``); ``()`` orders by ``_seq`` alone.  ``columns``: the history's
    data columns (default: all; the key among them); ``track_history``: the
    columns whose change opens a version (default: every non-key column of
    ``columns``).
    Input ``-U`` rows are dropped (the ``+U`` carries the new row)."""

    name = "ScdType2History"

    def __init__(self, input_schema: pa.Schema, key: Sequence[str], *,
                 sequence_by: Sequence[str] = (), columns: Optional[Sequence[str]] = None,
                 track_history: Optional[Sequence[str]] = None,
                 ignore_null_updates: bool = False):
        super().__init__(input_schema, tuple(key))
        data = self.data_columns
        self.sequence_by = tuple(sequence_by)
        self.columns = tuple(columns) if columns is not None else tuple(data)
        missing = [c for c in self.columns + self.sequence_by if c not in data]
        if missing:
            raise ValueError(f"{self.name}: column(s) {missing} not in input {data}")
        lost = [k for k in self.key if k not in self.columns]
        if lost:
            raise ValueError(f"{self.name}: the key column(s) {lost} must be among the columns")
        values = tuple(c for c in self.columns if c not in self.key)
        self.track_history = values if track_history is None else tuple(track_history)
        bad = [c for c in self.track_history if c not in values]
        if bad:
            raise ValueError(f"{self.name}: tracked column(s) {bad} are not non-key columns of "
                             f"the history {list(values)}")
        self.values = values
        self.ignore_null_updates = bool(ignore_null_updates)
        self.start_columns, self.end_columns = history_columns(self.sequence_by)
        clash = [c for c in self.start_columns + self.end_columns if c in data]
        if clash:
            raise ValueError(f"{self.name}: the input already has column(s) {clash}")
        seq_fields = ([input_schema.field(c) for c in self.sequence_by]
                      or [pa.field(SEQ_COL, pa.int64())])
        self.history_key = self.key + self.start_columns
        # state: the key's applied changes (key columns first)
        stored = list(self.key) + list(values) + [
            c for c in self.sequence_by if c not in self.columns]
        self._state_schema = pa.schema([input_schema.field(c)
                                        for c in stored + [KIND_COL, SEQ_COL]])
        self._output_schema = pa.schema(
            [input_schema.field(c) for c in self.columns]
            + [pa.field(n, f.type) for n, f in zip(self.start_columns, seq_fields)]
            + [pa.field(n, f.type) for n, f in zip(self.end_columns, seq_fields)]
            + [pa.field(KIND_COL, pa.int8()), pa.field(SEQ_COL, pa.int64())])

    @property
    def _sequence(self) -> list[str]:
        return list(self.sequence_by) or [SEQ_COL]

    # -- the history of a set of changes ------------------------------------
    def _changes(self, events: pd.DataFrame) -> pd.DataFrame:
        """``events`` (any order, possibly repeated) as the applied changes:
        sorted by key and sequence, one per (key, sequence value): the last
        by ``_seq``, an addition after a retraction at equal ``_seq``."""
        events = events.assign(**{_ADD: IS_ADD[events[KIND_COL].to_numpy(np.int64)]})
        order = stable_order(events, list(self.key) + self._sequence + [SEQ_COL, _ADD])
        events = events.take(order).reset_index(drop=True)
        nulls = events[self._sequence].isna().any(axis=1).to_numpy()
        if nulls.any():
            row = events[nulls].iloc[0]
            key = {k: row[k].item() if hasattr(row[k], "item") else row[k] for k in self.key}
            raise ValueError(f"{self.name}: a change of key {key} has a null sequence value "
                             f"({', '.join(self._sequence)}); every change needs one to be placed")
        last = run_ends(factorize_rows(events, list(self.key) + self._sequence))
        return events[last].reset_index(drop=True)

    def versions(self, changes: pd.DataFrame) -> pd.DataFrame:
        """The version rows of the applied ``changes`` (from :meth:`_changes`),
        sorted by history key; vectorized over all keys."""
        n = len(changes)
        out_cols = list(self.columns) + list(self.start_columns) + list(self.end_columns)
        if not n:
            return pd.DataFrame({c: pd.Series(dtype=object) for c in out_cols})
        first = first_of_key(changes, self.key)
        is_add = changes[_ADD].to_numpy(bool)
        prev_add = np.r_[False, is_add[:-1]] & ~first
        if self.ignore_null_updates and self.values:
            # a null keeps the previous value of the key, until a delete
            segment = np.cumsum(first | ~prev_add)
            filled = changes[list(self.values)].groupby(segment).ffill()
            changes = changes.assign(**{c: filled[c] for c in self.values})
        prev = changes.shift(1)
        same_tracked = rows_equal(changes, prev, self.track_history) if self.track_history \
            else np.ones(n, dtype=bool)
        opens = is_add & (~prev_add | ~same_tracked)
        closes = ~is_add & prev_add                      # a delete of a live version
        boundary = np.flatnonzero(opens | closes)
        openers = np.flatnonzero(opens)
        # the values of a version: its last upsert (in-place updates)
        version = np.cumsum(opens) - 1
        adds = np.flatnonzero(is_add)
        last_add = adds[run_ends(version[adds])]
        rows = changes.iloc[last_add].reset_index(drop=True)
        # the end: the next boundary of the same key
        nxt = np.searchsorted(boundary, openers, side="right")
        has_next = nxt < len(boundary)
        nxt_pos = boundary[np.minimum(nxt, max(len(boundary) - 1, 0))]
        key_run = np.cumsum(first)
        has_next &= key_run[nxt_pos] == key_run[openers]
        out = rows[list(self.columns)].copy()
        seq_cols = self._sequence
        for name, c in zip(self.start_columns, seq_cols):
            out[name] = changes[c].iloc[openers].reset_index(drop=True)
        for name, c in zip(self.end_columns, seq_cols):
            ends = changes[c].iloc[nxt_pos].reset_index(drop=True)
            out[name] = ends.where(pd.Series(has_next)).astype(
                "Int64" if ends.dtype.kind in "iu" else ends.dtype)
        return out

    # -- one key group, one micro-batch --------------------------------------
    def process(self, state: pd.DataFrame, rows: pd.DataFrame, ctx: OpContext):
        m = ctx.metrics
        m.add("rows_in", len(rows))
        rows = rows[rows[KIND_COL].to_numpy(np.int64) != RowKind.UPDATE_BEFORE]
        stored = list(self._state_schema.names)
        rows = rows[stored].reset_index(drop=True)
        old = self._changes(state) if len(state) else state.assign(**{_ADD: np.zeros(0, bool)})
        merged = self._changes(concat_frames([state[stored], rows]) if len(state) else rows)
        m.add("superseded", len(state) + len(rows) - len(merged))
        out = self._difference(self.versions(old), self.versions(merged), ctx)
        m.add("rows_out", len(out))
        return merged[stored].reset_index(drop=True), out

    def _difference(self, before: pd.DataFrame, after: pd.DataFrame, ctx: OpContext
                    ) -> pd.DataFrame:
        """The changes that turn the version rows ``before`` into ``after``,
        keyed by the history key, one sequence number per changed version."""
        hk = list(self.history_key)
        both = concat_frames([before, after]) if len(before) and len(after) else \
            (after if len(after) else before)
        codes = factorize_rows(both, hk) if len(both) else np.zeros(0, np.int64)
        b_codes, a_codes = codes[:len(before)], codes[len(before):]
        if not len(after):
            a_codes = np.zeros(0, np.int64)
        if not len(before):
            b_codes = np.zeros(0, np.int64)
        kept_before = np.isin(b_codes, a_codes)
        kept_after = np.isin(a_codes, b_codes)
        where = np.full(int(codes.max()) + 1 if len(codes) else 0, -1, dtype=np.int64)
        where[b_codes] = np.arange(len(b_codes))
        pairs_after = np.flatnonzero(kept_after)
        pairs_before = where[a_codes[pairs_after]]
        compared = list(self.columns) + list(self.end_columns)
        changed = ~rows_equal(before.iloc[pairs_before].reset_index(drop=True),
                              after.iloc[pairs_after].reset_index(drop=True), compared)
        parts = [
            before[~kept_before].assign(**{KIND_COL: np.int8(RowKind.DELETE)}),
            before.iloc[pairs_before[changed]].assign(**{KIND_COL: np.int8(RowKind.UPDATE_BEFORE)}),
            after.iloc[pairs_after[changed]].assign(**{KIND_COL: np.int8(RowKind.UPDATE_AFTER)}),
            after[~kept_after].assign(**{KIND_COL: np.int8(RowKind.INSERT)}),
        ]
        out = concat_frames(parts)
        if not len(out):
            return self.empty_output()
        out = out.take(stable_order(out, hk + [KIND_COL])).reset_index(drop=True)
        first = first_of_key(out, hk)
        out[SEQ_COL] = ctx.allocate_seq(int(first.sum()))[np.cumsum(first) - 1]
        # -U sorts after -D/+I codes but must precede its +U: order within a history key
        rank = np.array([1, 0, 2, 1])[out[KIND_COL].to_numpy(np.int64)]
        out = out.take(np.lexsort((rank, np.cumsum(first)))).reset_index(drop=True)
        return out[list(self.output_schema.names)]


class ScdType1Table(ScdType2History):
    """The table (SCD type 1) of the same changes: each key's current version,
    keyed by the key (``+I``/``-U``/``+U``/``-D`` per key).

    For the cases ChangelogNormalize cannot serve exactly: partial updates
    (``ignore_null_updates``: a late change re-fills the nulls of the changes
    after it, so the state must keep the changes, as the history does) and a
    sequence of several columns.  Otherwise ChangelogNormalize is the type 1
    table with one state row per key, and Auto CDC uses it (docs/operators.md,
    "Auto CDC")."""

    name = "ScdType1Table"

    def __init__(self, input_schema: pa.Schema, key: Sequence[str], **options):
        super().__init__(input_schema, key, **options)
        self.history_key = self.key
        self._output_schema = pa.schema([input_schema.field(c) for c in self.columns]
                                        + [pa.field(KIND_COL, pa.int8()),
                                           pa.field(SEQ_COL, pa.int64())])

    def versions(self, changes: pd.DataFrame) -> pd.DataFrame:
        """The current version of each key that is not deleted."""
        out = super().versions(changes)
        return out[out[self.end_columns[0]].isna().to_numpy()].reset_index(drop=True)


__all__ = ["ScdType2History", "ScdType1Table"]
