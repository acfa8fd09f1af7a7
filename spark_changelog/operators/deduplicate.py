"""Deduplication: keep the first or the last row per key (docs/operators.md,
"Deduplication").

One class per variant, as Flink has one function per variant:

* :class:`ProcTimeKeepFirst`: insert-only input, the first row of a key is
  emitted as ``+I`` on arrival, later rows are dropped;
* :class:`ProcTimeKeepLast`: insert-only input, every row replaces the
  previous one (``+I`` first, then ``-U`` prev / ``+U`` new);
* :class:`RowTimeKeepLast`: insert-only input, a row replaces the kept one if
  its event time is not smaller (``prev.t <= cur.t``; ties: the later arrival);
* :class:`RowTimeKeepFirst`: insert-only input, the row with the smallest
  event time wins (ties: the earlier arrival) and is emitted, as ``+I`` only,
  once the watermark reaches it; rows at or behind the watermark are late and
  dropped (Flink 2.3, recorded in ``tests/fixtures/flink/dedup.json``);
* keep last on a changelog input is
  :class:`~spark_changelog.operators.normalize.ChangelogNormalize`.

The keep-last rule (what a new row emits given the previous one) is
:func:`keep_last_changes`, shared by the keep-last variants and
ChangelogNormalize, as Flink shares ``DeduplicateFunctionHelper``.

Rows reach an operator sorted by key, then ``_seq`` (the arrival order the
spec trusts is the source sequence, never the shuffle's), so "first" and
"last" on processing time mean first and last in sequence order.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from ..model import KIND_COL, SEQ_COL, RowKind
from .base import KeyedOperator, OpContext
from .kernels import concat_frames, event_time_ms, grouped_cummax, rows_equal
from .keys import first_of_key, last_of_key, lookup_unique

TOUCHED_COL = "_ts"        # state: processing time of the last write (TTL)
EMITTED_COL = "_emitted"   # RowTimeKeepFirst state: the key's row was emitted
TIME_COL = "_t"            # state: the kept row's event time in ms
DUE_COL = "_due"           # RowTimeKeepFirst state: the watermark that emits the candidate


def keep_last_changes(rows: pd.DataFrame, cols: Sequence[str], first: np.ndarray,
                      is_add: np.ndarray, stored: pd.DataFrame, stored_pos: np.ndarray, *,
                      suppress_equal: bool, generate_update_before: bool,
                      generate_insert: bool = True, ctx: Optional[OpContext] = None
                      ) -> pd.DataFrame:
    """The keep-last rule for all rows at once (docs/operators.md; Flink's
    ``DeduplicateFunctionHelper.processLastRowOn{ProcTime,Changelog}``).

    ``rows``: the rows to apply, sorted by key then ``_seq``; ``first``: the
    first row of each key; ``stored_pos``: per row, the position in
    ``stored`` of its key's kept row from earlier batches (-1: none; only
    read for first rows).  The previous row of row *i* is row *i-1* if that
    was an ADD, nothing if it was a RETRACT, the stored row for a first row.

    * ADD: no previous row → ``+I`` (``+U`` when neither update-before nor
      insert is generated); otherwise, unless equal to the previous row and
      ``suppress_equal`` (no state TTL), ``-U prev`` (if
      ``generate_update_before``) then ``+U new``;
    * RETRACT: a previous row → ``-D`` of *the previous row* (the retraction
      may carry only the key); otherwise nothing.

    Returns the output (data columns, ``_kind``, ``_seq`` of the causing row)
    in emission order; counts ``unchanged`` and ``retract_no_match`` in
    ``ctx.metrics``."""
    n = len(rows)
    seq = rows[SEQ_COL].to_numpy(np.int64)
    prev_add = np.zeros(n, dtype=bool)
    if n > 1:
        prev_add[1:] = is_add[:-1]
    prev_idx = np.where(first, np.where(stored_pos >= 0, n + stored_pos, -1),
                        np.where(prev_add, np.arange(n) - 1, -1))
    has_prev = prev_idx >= 0
    both = concat_frames([rows[cols], stored[cols]])
    prev = both.iloc[np.where(has_prev, prev_idx, 0)].reset_index(drop=True) if n \
        else both.iloc[:0]
    same = rows_equal(prev, rows, cols) & has_prev if n else np.zeros(0, bool)
    unchanged = is_add & has_prev & same & suppress_equal
    emit_add = is_add & ~unchanged
    emit_ub = emit_add & has_prev & generate_update_before
    emit_del = ~is_add & has_prev
    first_kind = RowKind.INSERT if (generate_insert or generate_update_before) \
        else RowKind.UPDATE_AFTER
    add_kind = np.where(has_prev, RowKind.UPDATE_AFTER, first_kind).astype(np.int8)
    if ctx is not None:
        ctx.metrics.add("unchanged", int(unchanged.sum()))
        ctx.metrics.add("retract_no_match", int((~is_add & ~has_prev).sum()))

    # slot 0 of a row: the retraction of prev (-U on update, -D on delete); slot 1: the add
    slot0 = emit_ub | emit_del
    out0 = prev[slot0].copy()
    kinds0 = np.where(emit_del, RowKind.DELETE, RowKind.UPDATE_BEFORE)
    out0[KIND_COL] = kinds0[slot0].astype(np.int8)
    out0[SEQ_COL] = seq[slot0]
    out0["__o"] = np.flatnonzero(slot0) * 2
    out1 = rows.loc[emit_add, list(cols)].copy()
    out1[KIND_COL] = add_kind[emit_add]
    out1[SEQ_COL] = seq[emit_add]
    out1["__o"] = np.flatnonzero(emit_add) * 2 + 1
    out = concat_frames([out0, out1]).sort_values("__o", kind="stable")
    return out.drop(columns="__o").reset_index(drop=True)


def fold_to_last(rows: pd.DataFrame, key: Sequence[str]) -> pd.DataFrame:
    """Micro-batch folding: only the last row of each key (its net effect on
    a keep-last operator; the intermediate versions are never emitted)."""
    return rows[last_of_key(rows, key)].reset_index(drop=True)


def _check_insert_only(op: KeyedOperator, rows: pd.DataFrame) -> None:
    kinds = rows[KIND_COL].to_numpy(np.int64)
    bad = np.flatnonzero(kinds != RowKind.INSERT)
    if len(bad):
        row = rows.iloc[int(bad[0])]
        # a narrow frame (``ProcTimeKeepFirst.first_in_batch``) shows the columns it has
        shown = ", ".join(f"{c}={_plain(row[c])!r}" for c in op.data_columns if c in row.index)
        more = f" and {len(bad) - 1} more non-insert row(s)" if len(bad) > 1 else ""
        raise ValueError(
            f"{op.name} accepts an insert-only input, got a {RowKind(int(kinds[bad[0]])).short} "
            f"row ({shown}, _seq={_plain(row[SEQ_COL])}){more}; deduplicate a changelog input "
            "with keep='last' (ChangelogNormalize)")


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


class _Dedup(KeyedOperator):
    """What the variants share: insert-only input, state TTL, schemas."""

    def __init__(self, input_schema: pa.Schema, key: Sequence[str], *,
                 state_ttl_ms: Optional[int] = None):
        super().__init__(input_schema, tuple(key))
        self.state_ttl_ms = state_ttl_ms
        data = [input_schema.field(c) for c in self.data_columns]
        self._output_schema = pa.schema(data + [pa.field(KIND_COL, pa.int8()),
                                                pa.field(SEQ_COL, pa.int64())])

    @property
    def row_columns(self) -> list[str]:
        """The columns of a kept row in state: key, other data columns, ``_seq``."""
        return list(self.key) + [c for c in self.data_columns if c not in self.key] + [SEQ_COL]

    def _row_state_schema(self, extra: Sequence[pa.Field]) -> pa.Schema:
        return pa.schema([self.input_schema.field(c) for c in self.row_columns[:-1]]
                         + [pa.field(SEQ_COL, pa.int64())] + list(extra)
                         + [pa.field(TOUCHED_COL, pa.int64())])

    def _live(self, state: pd.DataFrame, ctx: OpContext) -> pd.DataFrame:
        """``state`` without rows expired by TTL (counted)."""
        if self.state_ttl_ms is None or not len(state):
            return state
        alive = state[TOUCHED_COL].to_numpy(np.int64) + self.state_ttl_ms > ctx.processing_time_ms
        ctx.metrics.add("ttl_expired", int((~alive).sum()))
        return state[alive].reset_index(drop=True)

    def retain(self, state: pd.DataFrame, ctx: OpContext):
        if self.state_ttl_ms is None:
            return None
        alive = state[TOUCHED_COL].to_numpy(np.int64) + self.state_ttl_ms > ctx.processing_time_ms
        ctx.metrics.add("ttl_expired", int((~alive).sum()))
        return pd.Series(alive, index=state.index)

    def _stored_keys_untouched(self, state: pd.DataFrame, used: np.ndarray) -> pd.DataFrame:
        return state.iloc[np.setdiff1d(np.arange(len(state)), used)] if len(state) else state


class ProcTimeKeepFirst(_Dedup):
    """Keep the first row per key (processing time, insert-only input):
    ``+I`` of a key's first row, nothing for later rows.  State: the key."""

    name = "DeduplicateKeepFirst(proctime)"

    @property
    def state_is_seen_keys(self) -> bool:
        # without TTL nothing but "seen" matters (with TTL: when it was seen)
        return self.state_ttl_ms is None

    @property
    def state_schema(self) -> pa.Schema:
        return pa.schema([self.input_schema.field(k) for k in self.key]
                         + [pa.field(TOUCHED_COL, pa.int64())])

    def _first_rows(self, rows: pd.DataFrame, ctx: OpContext) -> np.ndarray:
        _check_insert_only(self, rows)
        ctx.metrics.add("rows_in", len(rows))
        return first_of_key(rows, list(self.key))

    def first_in_batch(self, rows: pd.DataFrame, ctx: OpContext) -> np.ndarray:
        """What :meth:`process` emits on an empty state, as a mask over
        ``rows`` (sorted by key, then ``_seq``): each key's first row, emitted as
        it is (an insert: the input is insert-only, checked).  Only the
        key columns, ``_kind`` and ``_seq`` are read, so a runtime keeping the
        seen keys elsewhere (``runtime/spark_seen_keys.py``) hands over just
        those and takes the rows from its own copy.  Counters as in ``process``."""
        first = self._first_rows(rows, ctx)
        ctx.metrics.add("duplicates", int((~first).sum()))
        return first

    def process(self, state, rows, ctx):
        key = list(self.key)
        state = self._live(state, ctx)
        first = self._first_rows(rows, ctx)
        new = first & (lookup_unique(rows, state, key) < 0)
        ctx.metrics.add("duplicates", int((~new).sum()))
        out = rows.loc[new, self.data_columns + [KIND_COL, SEQ_COL]].reset_index(drop=True)
        out[KIND_COL] = np.int8(RowKind.INSERT)
        new_state = rows.loc[first, key].reset_index(drop=True)
        # the TTL clock starts when the key is first seen and is not restarted by
        # later rows (Flink writes keep-first state once; TTL is OnCreateAndWrite)
        seen = lookup_unique(new_state, state, key)
        touched = np.where(seen >= 0, state[TOUCHED_COL].to_numpy(np.int64)[np.maximum(seen, 0)]
                           if len(state) else 0, ctx.processing_time_ms)
        new_state[TOUCHED_COL] = touched.astype(np.int64)
        return new_state, out


class ProcTimeKeepLast(_Dedup):
    """Keep the last row per key (processing time, insert-only input).  With
    ``fold_batch``, a key's rows of one micro-batch are folded first, so only
    the net change is emitted (Flink's mini-batch)."""

    name = "DeduplicateKeepLast(proctime)"

    def __init__(self, input_schema, key, *, state_ttl_ms=None, generate_update_before=True,
                 generate_insert=True, fold_batch=False):
        super().__init__(input_schema, key, state_ttl_ms=state_ttl_ms)
        self.generate_update_before = generate_update_before
        self.generate_insert = generate_insert
        self.fold_batch = fold_batch

    @property
    def state_schema(self) -> pa.Schema:
        return self._row_state_schema([])

    def _kept(self, rows: pd.DataFrame, state: pd.DataFrame, ctx: OpContext) -> pd.DataFrame:
        """The rows that replace their key's kept row (all of them here)."""
        return rows

    def process(self, state, rows, ctx):
        _check_insert_only(self, rows)
        key = list(self.key)
        ctx.metrics.add("rows_in", len(rows))
        state = self._live(state, ctx)
        rows = self._kept(rows, state, ctx)
        if self.fold_batch:
            rows = fold_to_last(rows, key)
        spos = lookup_unique(rows, state, key)
        is_add = np.ones(len(rows), dtype=bool)
        out = keep_last_changes(rows, self.data_columns, first_of_key(rows, key), is_add, state,
                                spos, suppress_equal=self._suppress_equal,
                                generate_update_before=self.generate_update_before,
                                generate_insert=self.generate_insert, ctx=ctx)
        last = last_of_key(rows, key)
        new = rows.loc[last, self.row_columns].copy()
        for name, values in self._extra_state_values(rows, last).items():
            new[name] = values
        new[TOUCHED_COL] = np.int64(ctx.processing_time_ms)
        untouched = self._stored_keys_untouched(state, spos)
        new_state = pd.concat([untouched, new], ignore_index=True) if len(untouched) else new
        return new_state.reset_index(drop=True), out

    @property
    def _suppress_equal(self) -> bool:
        # Flink's processLastRowOnProcTime: an equal row emits nothing unless
        # state TTL is on (then downstream state must be refreshed: D1)
        return self.state_ttl_ms is None

    def _extra_state_values(self, rows: pd.DataFrame, last: np.ndarray) -> dict:
        return {}


class RowTimeKeepLast(ProcTimeKeepLast):
    """Keep the row with the latest event time per key (insert-only input): a
    row replaces the kept one if ``prev.t <= cur.t`` (ties: the later
    arrival); older rows are dropped (counted as ``out_of_order``), late or
    not (Flink 2.3, D4).  Equal rows are emitted as ``-U``/``+U`` like Flink's
    ``RowTimeDeduplicateFunction`` (no equality check there)."""

    name = "DeduplicateKeepLast(rowtime)"

    def __init__(self, input_schema, key, time_column: str, **kw):
        if time_column not in input_schema.names:
            raise ValueError(f"{self.name}: time column {time_column!r} not in "
                             f"{input_schema.names}")
        self.time_column = time_column
        super().__init__(input_schema, key, **kw)

    @property
    def state_schema(self) -> pa.Schema:
        return self._row_state_schema([pa.field(TIME_COL, pa.int64())])

    @property
    def _suppress_equal(self) -> bool:
        return False

    def _kept(self, rows, state, ctx):
        key = list(self.key)
        t = event_time_ms(rows[self.time_column])
        spos = lookup_unique(rows, state, key)
        stored_t = np.where(spos >= 0, state[TIME_COL].to_numpy(np.int64)[np.maximum(spos, 0)]
                            if len(state) else 0, np.iinfo(np.int64).min)
        first = first_of_key(rows, key)
        # kept iff t >= the max event time before it (stored or earlier in the
        # batch): a dropped row is below that max, so it never raises it
        running = grouped_cummax(np.where(first, np.maximum(stored_t, t), t), first)
        before = np.where(first, stored_t, np.r_[np.iinfo(np.int64).min, running[:-1]])
        kept = t >= before
        ctx.metrics.add("out_of_order", int((~kept).sum()))
        return rows[kept].reset_index(drop=True)

    def _extra_state_values(self, rows, last):
        return {TIME_COL: event_time_ms(rows.loc[last, self.time_column])}


class RowTimeKeepFirst(_Dedup):
    """Keep the row with the earliest event time per key (insert-only input),
    emitted as ``+I`` when the watermark reaches it (Flink 2.3:
    ``outputInsertOnly``, recorded D2b/D3b/D3c/D6/D8).

    State per key: the candidate (the earliest row so far; ties: the earlier
    arrival) until it is emitted, then the key marked emitted: later rows of
    the key are dropped.  A row whose event time is at or behind the watermark
    of its batch is late and dropped (counted as ``late``).

    As in Flink, a row is late if its event time is *behind* the watermark
    (``t < W``), and it is emitted by a watermark that *arrives* at or past
    its time: a row with ``t == W`` waits for the next watermark (D6, D8), so
    its due time is ``t + 1``."""

    name = "DeduplicateKeepFirst(rowtime)"

    def __init__(self, input_schema, key, time_column: str, *, state_ttl_ms=None):
        if time_column not in input_schema.names:
            raise ValueError(f"{self.name}: time column {time_column!r} not in "
                             f"{input_schema.names}")
        self.time_column = time_column
        super().__init__(input_schema, key, state_ttl_ms=state_ttl_ms)

    @property
    def state_schema(self) -> pa.Schema:
        return self._row_state_schema([pa.field(TIME_COL, pa.int64()),
                                       pa.field(DUE_COL, pa.int64()),
                                       pa.field(EMITTED_COL, pa.bool_())])

    @property
    def uses_watermark(self) -> bool:
        return True

    def pending_times(self, state):
        if not len(state):
            return np.zeros(0)
        emitted = state[EMITTED_COL].to_numpy(dtype=bool)
        return np.where(emitted, np.inf, state[DUE_COL].to_numpy(np.float64))

    def due(self, state, ctx):
        if ctx.watermark_ms is None or not len(state):
            return np.zeros(len(state), dtype=bool)
        return self.pending_times(state) <= ctx.watermark_ms

    def on_watermark(self, state, ctx):
        return self.process(state, self.input_schema.empty_table().to_pandas(), ctx)

    def process(self, state, rows, ctx):
        _check_insert_only(self, rows)
        key = list(self.key)
        # late and "at the watermark" are judged by the watermark current at
        # the rows' arrival; due candidates by the watermark after the batch
        # (the same watermark unless the runtime tells them apart)
        arrival, wm = ctx.arrival_watermark, ctx.watermark_ms
        ctx.metrics.add("rows_in", len(rows))
        state = self._live(state, ctx)
        t = event_time_ms(rows[self.time_column])
        spos = lookup_unique(rows, state, key)
        emitted = np.where(spos >= 0, state[EMITTED_COL].to_numpy(bool)[np.maximum(spos, 0)]
                           if len(state) else False, False)
        late = np.zeros(len(rows), dtype=bool) if arrival is None else t < arrival
        ctx.metrics.add("late", int((late & ~emitted).sum()))
        ctx.metrics.add("duplicates", int(emitted.sum()))
        fresh = rows[~late & ~emitted].reset_index(drop=True)
        cand = fresh[self.row_columns].copy() if len(fresh) else None

        # candidates: stored (not emitted) rows first, then the batch's rows;
        # the smallest event time wins, ties the earlier one (stable sort)
        stored = state[~state[EMITTED_COL].to_numpy(bool)] if len(state) else state
        parts = [stored.drop(columns=[TOUCHED_COL])]
        if cand is not None:
            cand[TIME_COL] = t_fresh = t[~late & ~emitted]
            cand[DUE_COL] = t_fresh + (t_fresh == arrival) if arrival is not None else t_fresh
            cand[EMITTED_COL] = False
            parts.append(cand)
        pool = pd.concat([p for p in parts if len(p)], ignore_index=True) \
            if any(len(p) for p in parts) else parts[0]
        if len(pool):
            pool = pool.sort_values(key + [TIME_COL], kind="stable").reset_index(drop=True)
            pool = pool[first_of_key(pool, key)].reset_index(drop=True)
        due = (pool[DUE_COL].to_numpy(np.int64) <= wm) if (wm is not None and len(pool)) \
            else np.zeros(len(pool), dtype=bool)
        # emitted in event-time order, like Flink's timers (D8)
        out = pool.loc[due, self.data_columns + [SEQ_COL, TIME_COL]]
        out = out.sort_values(TIME_COL, kind="stable").drop(columns=TIME_COL).reset_index(drop=True)
        out[KIND_COL] = np.int8(RowKind.INSERT)
        out = out[self.output_schema.names]
        pool[EMITTED_COL] = due
        pool[TOUCHED_COL] = np.int64(ctx.processing_time_ms)
        done = state[state[EMITTED_COL].to_numpy(bool)] if len(state) else state
        new_state = pd.concat([p for p in (done, pool) if len(p)], ignore_index=True) \
            if len(done) or len(pool) else self.empty_state()
        return new_state[self.state_schema.names].reset_index(drop=True), out


__all__ = ["ProcTimeKeepFirst", "ProcTimeKeepLast", "RowTimeKeepFirst", "RowTimeKeepLast",
           "keep_last_changes", "fold_to_last"]
