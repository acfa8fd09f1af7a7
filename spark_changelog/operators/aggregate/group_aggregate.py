"""GroupAggregate: ``GROUP BY`` over a changelog, with retraction
(docs/operators.md, "Group aggregation").

Per group, rows are applied in sequence order as Flink's ``GroupAggFunction``
does: an ADD (``+I``/``+U``) accumulates, a RETRACT (``-U``/``-D``) retracts;
a retraction for a group without state is ignored (counted as
``retract_no_match``), and when a group's row count reaches zero its state
is cleared, so rows after that start from fresh accumulators.

Emission is once per group and micro-batch (Flink's mini-batch aggregation):
the group's result before the batch is compared with its result after it:

* no result before, one after: ``+I``;
* one before, none after (row count zero): ``-D`` of the old result;
* both: ``-U`` old (when update-before is generated) then ``+U`` new; skipped
  when the result did not change, unless ``emit_unchanged`` (by default on
  exactly when a state TTL is set, like Flink, so downstream state is
  refreshed).

With one row per micro-batch this is Flink's per-row output; with larger
batches a group's intermediate results are folded into one change.

State per group (all rows share the key columns and ``_ts``, the processing
time of the last write, for the TTL): one *main* row (``_slot`` 0) holding
the row count and every accumulator's scalar fields, plus *entry* rows
(``_slot`` j + 1) holding accumulator j's remembered values (value counts for
MIN/MAX/COUNT DISTINCT, ordered values for FIRST/LAST_VALUE).  Fields that do
not apply to a row hold 0 (numbers) or null (others), so integer columns have
no nulls and survive the state's Arrow round trip exactly.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from ...model import KIND_COL, SEQ_COL, RowKind
from ...model.rowkind import IS_ADD
from ..base import KeyedOperator, OpContext
from ..kernels import clamped_count, concat_frames, key_codes, rows_equal, run_ends, run_starts
from ..keys import lookup_unique
from .accumulators import (GROUP, Accumulator, AccState, AggregateOverflow, Contributions,
                           make_accumulator)

SLOT_COL = "_slot"
ROWS_COL = "_rows"
TOUCHED_COL = "_ts"

#: an aggregate call: (function, column or None, output name)
AggCall = tuple


class GroupAggregate(KeyedOperator):
    """``SELECT key..., f(col) AS out, ... GROUP BY key...`` over a changelog."""

    name = "GroupAggregate"

    def __init__(self, input_schema: pa.Schema, key: Sequence[str], aggs: Sequence[AggCall], *,
                 generate_update_before: bool = True, emit_unchanged: Optional[bool] = None,
                 state_ttl_ms: Optional[int] = None):
        super().__init__(input_schema, tuple(key))
        if not aggs:
            raise ValueError("GroupAggregate needs at least one aggregate function")
        self.accumulators: list[Accumulator] = [make_accumulator(f, out, col, input_schema)
                                                for f, col, out in aggs]
        outputs = [a.output for a in self.accumulators]
        clash = sorted({o for o in outputs if outputs.count(o) > 1 or o in self.key})
        if clash:
            raise ValueError(f"GroupAggregate: output column name(s) {clash} used twice")
        self.generate_update_before = generate_update_before
        self.state_ttl_ms = state_ttl_ms
        self.emit_unchanged = state_ttl_ms is not None if emit_unchanged is None else emit_unchanged
        keys = [input_schema.field(k) for k in self.key]
        self._output_schema = pa.schema(
            keys + [pa.field(a.output, a.result_type) for a in self.accumulators]
            + [pa.field(KIND_COL, pa.int8()), pa.field(SEQ_COL, pa.int64())])
        fields = [f for a in self.accumulators for f in a.scalar_fields + a.entry_fields]
        self._state_schema = pa.schema(
            keys + [pa.field(SLOT_COL, pa.int8()), pa.field(ROWS_COL, pa.int64())] + fields
            + [pa.field(TOUCHED_COL, pa.int64())])

    @property
    def result_columns(self) -> list[str]:
        return list(self.key) + [a.output for a in self.accumulators]

    # -- TTL ----------------------------------------------------------------
    def _alive(self, state: pd.DataFrame, ctx: OpContext) -> np.ndarray:
        if self.state_ttl_ms is None:
            return np.ones(len(state), dtype=bool)
        return state[TOUCHED_COL].to_numpy(np.int64) + self.state_ttl_ms > ctx.processing_time_ms

    def retain(self, state, ctx):
        if self.state_ttl_ms is None:
            return None
        alive = self._alive(state, ctx)
        ctx.metrics.add("ttl_expired", int((~alive & (state[SLOT_COL].to_numpy() == 0)).sum()))
        return pd.Series(alive, index=state.index)

    # -- state <-> accumulators ------------------------------------------------
    def _prior(self, state: pd.DataFrame, groups: pd.DataFrame, n: int
               ) -> tuple[np.ndarray, list[AccState]]:
        """Row count and accumulator state of the ``n`` groups from ``state``."""
        key = list(self.key)
        slot = state[SLOT_COL].to_numpy(np.int64) if len(state) else np.zeros(0, np.int64)
        main = state[slot == 0].reset_index(drop=True)
        pos = lookup_unique(groups, main, key)
        has = pos >= 0
        take = np.maximum(pos, 0)
        rows = np.where(has, main[ROWS_COL].to_numpy(np.int64)[take] if len(main) else 0, 0)
        accs = []
        for j, a in enumerate(self.accumulators):
            acc = a.empty(n)
            for f in a.scalar_fields:
                if len(main):
                    vals = main[f.name].to_numpy()[take]
                    acc.scalars[f.name] = np.where(has, vals, acc.scalars[f.name]).astype(
                        acc.scalars[f.name].dtype)
            if a.entry_fields:
                ent = state[slot == j + 1].reset_index(drop=True)
                if len(ent):
                    g = lookup_unique(ent, groups, key)
                    frame = ent.loc[g >= 0, [f.name for f in a.entry_fields]].reset_index(drop=True)
                    frame.insert(0, GROUP, g[g >= 0])
                    acc.entries = frame
            accs.append(acc)
        return rows, accs

    def _state_rows(self, groups: pd.DataFrame, alive: np.ndarray, rows: np.ndarray,
                    accs: list[AccState], now: int) -> pd.DataFrame:
        """State rows of the ``alive`` groups (main rows, then entry rows)."""
        idx = np.flatnonzero(alive)
        parts = []
        main = groups.iloc[idx].reset_index(drop=True)
        main[SLOT_COL] = np.int8(0)
        main[ROWS_COL] = rows[idx]
        for a, acc in zip(self.accumulators, accs):
            for f in a.scalar_fields:
                main[f.name] = acc.scalars[f.name][idx]
        parts.append(main)
        for j, (a, acc) in enumerate(zip(self.accumulators, accs)):
            if not a.entry_fields or not len(acc.entries):
                continue
            e = acc.entries[alive[acc.entries[GROUP].to_numpy(np.int64)]]
            ent = groups.iloc[e[GROUP].to_numpy(np.int64)].reset_index(drop=True)
            ent[SLOT_COL] = np.int8(j + 1)
            ent[ROWS_COL] = np.int64(0)
            for f in a.entry_fields:
                ent[f.name] = e[f.name].to_numpy()
            parts.append(ent)
        for p in parts:
            p[TOUCHED_COL] = np.int64(now)
            for f in self._state_schema:
                if f.name not in p.columns:
                    numeric = pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
                    p[f.name] = np.zeros(len(p), dtype=f.type.to_pandas_dtype()) if numeric \
                        else np.full(len(p), None, dtype=object)
        return concat_frames([p[self._state_schema.names] for p in parts])

    def _results(self, groups: pd.DataFrame, accs: list[AccState], n: int) -> pd.DataFrame:
        out = groups.reset_index(drop=True).copy()
        for a, acc in zip(self.accumulators, accs):
            try:
                out[a.output] = a.result(acc, n)
            except AggregateOverflow as e:
                raise e.naming(groups, self.key) from None
        return out

    # -- one key group, one micro-batch --------------------------------------
    def process(self, state: pd.DataFrame, rows: pd.DataFrame, ctx: OpContext):
        key = list(self.key)
        m = ctx.metrics
        m.add("rows_in", len(rows))
        if len(state):
            alive = self._alive(state, ctx)
            m.add("ttl_expired", int((~alive & (state[SLOT_COL].to_numpy() == 0)).sum()))
            state = state[alive].reset_index(drop=True)
        g, n = key_codes(rows, key)
        first = run_starts(g)
        groups = rows.loc[first, key].reset_index(drop=True)
        prior_rows, prior = self._prior(state, groups, n)

        # The group's row count after each row: c = c + 1 on ADD, c - 1 on a
        # RETRACT while c > 0; a RETRACT at zero is ignored (no state).
        is_add = IS_ADD[rows[KIND_COL].to_numpy(np.int64)]
        delta = np.where(is_add, 1, -1).astype(np.int64)
        count = clamped_count(prior_rows[g], delta, first)
        before = np.where(first, prior_rows[g], np.r_[0, count[:-1]])
        effective = is_add | (before > 0)
        m.add("retract_no_match", int((~effective).sum()))
        # A group whose count reaches zero is cleared: later rows start afresh.
        death = effective & ~is_add & (count == 0)
        pos = np.arange(len(rows))
        last_death = np.full(n, -1, dtype=np.int64)
        np.maximum.at(last_death, g[death], pos[death])
        contributes = effective & (pos > last_death[g])
        reset = last_death >= 0

        sign = np.where(is_add, 1, -1).astype(np.int64)
        batch = Contributions(g, sign, rows[SEQ_COL].to_numpy(np.int64), rows, n).take(contributes)
        new_accs = []
        for a, acc in zip(self.accumulators, prior):
            start = acc
            if reset.any():
                fresh = a.empty(n)
                scalars = {k: np.where(reset, fresh.scalars[k], v) for k, v in acc.scalars.items()}
                entries = acc.entries
                if entries is not None and len(entries):
                    entries = entries[~reset[entries[GROUP].to_numpy(np.int64)]]
                start = AccState(scalars, entries)
            try:
                new_accs.append(a.update(start, batch))
            except AggregateOverflow as e:
                raise e.naming(groups, self.key) from None

        final = count[run_ends(g)]
        had, has = prior_rows > 0, final > 0
        old = self._results(groups, prior, n)
        new = self._results(groups, new_accs, n)
        cols = self.result_columns
        same = rows_equal(old, new, cols)
        ins = ~had & has
        dele = had & ~has
        upd = had & has & (~same | self.emit_unchanged)
        m.add("unchanged", int((had & has & same).sum()) if not self.emit_unchanged else 0)

        # emission order: per group, [-U/-D old, +U/+I new]
        parts = []
        ub = upd & self.generate_update_before
        for mask, frame, kind, slot in ((ub, old, RowKind.UPDATE_BEFORE, 0),
                                        (dele, old, RowKind.DELETE, 0),
                                        (ins, new, RowKind.INSERT, 1),
                                        (upd, new, RowKind.UPDATE_AFTER, 1)):
            if mask.any():
                p = frame[mask].copy()
                p[KIND_COL] = np.int8(kind)
                p["__o"] = np.flatnonzero(mask) * 2 + slot
                parts.append(p)
        if parts:
            out = concat_frames(parts).sort_values("__o", kind="stable").drop(columns="__o")
            out = out.reset_index(drop=True)
        else:
            out = self.empty_output().drop(columns=[SEQ_COL])
        out[SEQ_COL] = ctx.allocate_seq(len(out))
        m.add("rows_out", len(out))
        new_state = self._state_rows(groups, has, final, new_accs, ctx.processing_time_ms)
        return new_state, out[self._output_schema.names]


__all__ = ["GroupAggregate"]
