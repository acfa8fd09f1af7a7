"""ChangelogNormalize: keep-last deduplication on a changelog input (docs/semantics.md, section 5).

Flink inserts this operator after an upsert or duplicate-producing CDC source
(``DeduplicateFunctionHelper.processLastRowOnChangelog``).  Per primary key:

* ADD (``+I``/``+U``): no previous row → ``+I``; otherwise, unless the row
  equals the previous one and no state TTL is set, ``-U prev`` (when
  update-before is generated) then ``+U new``.  The row becomes the state.
* RETRACT (``-D``): a previous row exists → emit *the stored row* as ``-D``
  (the incoming one may carry only the key, e.g. a tombstone) and clear it;
  otherwise emit nothing.
* ``-U`` input rows are dropped first, like Flink's ``DropUpdateBefore`` in front
  of ChangelogNormalize: the ``+U`` that follows carries the new content and the
  stored row provides the retraction.  (Readers turn a key-changing update into
  ``-D`` + ``+I``, so no information is lost.)

Beyond Flink, the operator is **sequence-aware across micro-batches**: state
keeps the ``_seq`` of the last applied change of each key, also after a delete
(a *tombstone*), and a change whose ``_seq`` is not higher than that is
*superseded*: it arrived after a newer change of its key (another file, a later
micro-batch, a replay) and must not overwrite it.  Superseded changes are
counted, never applied.  Tombstones are kept for ``tombstone_retention_ms`` of
processing time so that a late, older insert cannot bring a deleted key back.

The keep-last rule itself is :func:`~.deduplicate.keep_last_changes`, shared with
the deduplicate operators (as Flink shares ``DeduplicateFunctionHelper``); this
class adds the sequence awareness and the state.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from ..model import KIND_COL, SEQ_COL, RowKind
from ..model.rowkind import IS_ADD
from ..model.watermark import DAY_MS
from .base import KeyedOperator, OpContext
from .deduplicate import keep_last_changes
from .kernels import stable_order
from .keys import first_of_key, last_of_key, lookup_unique

DELETED_COL = "_deleted"   # state: True for a tombstone
TOUCHED_COL = "_ts"        # state: processing time of the last write/read (TTL)


class ChangelogNormalize(KeyedOperator):
    """Keep the last change per primary key (docs/semantics.md, section 5, "keep last on a
    changelog input"), sequence-aware across micro-batches.

    ``fold_batch`` (micro-batch folding, Flink's mini-batch; off by default as
    in Flink): a key's changes within one micro-batch are folded into its net
    change: nothing, ``+I``, ``-U old``/``+U new`` or ``-D old`` (docs/operators.md,
    "Micro-batch folding")."""

    name = "ChangelogNormalize"

    def __init__(self, input_schema: pa.Schema, key: Sequence[str], *,
                 state_ttl_ms: Optional[int] = None,
                 tombstone_retention_ms: Optional[int] = DAY_MS,
                 generate_update_before: bool = True, fold_batch: bool = False):
        super().__init__(input_schema, tuple(key))
        self.fold_batch = fold_batch
        self.state_ttl_ms = state_ttl_ms
        self.tombstone_retention_ms = tombstone_retention_ms
        self.generate_update_before = generate_update_before
        data = [input_schema.field(c) for c in self.data_columns]
        self._state_schema = pa.schema(
            [input_schema.field(k) for k in self.key]
            + [f for f in data if f.name not in self.key]
            + [pa.field(SEQ_COL, pa.int64()), pa.field(DELETED_COL, pa.bool_()),
               pa.field(TOUCHED_COL, pa.int64())])
        self._output_schema = pa.schema(data + [pa.field(KIND_COL, pa.int8()),
                                                pa.field(SEQ_COL, pa.int64())])

    # -- micro-batch folding before the keyed step ---------------------------
    @property
    def prefolds(self) -> bool:
        return self.fold_batch

    def prefold_keep(self, rows: pd.DataFrame) -> np.ndarray:
        """With folding, only each key's last change by ``_seq`` (other than
        ``-U``) can matter: every other row of the key in the batch is older
        than it, so ``process`` folds it away, or drops it as superseded if
        the last one is superseded too.  Holds for any part of the batch, so
        a runtime may apply it per input partition, before the shuffle."""
        key = list(self.key)
        adds = np.flatnonzero(rows[KIND_COL].to_numpy(np.int64) != RowKind.UPDATE_BEFORE)
        candidates = rows.iloc[adds]
        order = stable_order(candidates, key + [SEQ_COL])
        last = last_of_key(candidates[key].iloc[order].reset_index(drop=True), key)
        return np.sort(adds[order[last]])

    # -- state expiry -------------------------------------------------------
    def _expired(self, state: pd.DataFrame, now: int) -> np.ndarray:
        touched = state[TOUCHED_COL].to_numpy(dtype=np.int64)
        deleted = state[DELETED_COL].to_numpy(dtype=bool)
        out = np.zeros(len(state), dtype=bool)
        if self.state_ttl_ms is not None:
            out |= ~deleted & (touched + self.state_ttl_ms <= now)
        if self.tombstone_retention_ms is not None:
            out |= deleted & (touched + self.tombstone_retention_ms <= now)
        return out

    def retain(self, state: pd.DataFrame, ctx: OpContext):
        expired = self._expired(state, ctx.processing_time_ms)
        deleted = state[DELETED_COL].to_numpy(dtype=bool)
        ctx.metrics.add("ttl_expired", int((expired & ~deleted).sum()))
        ctx.metrics.add("tombstones_expired", int((expired & deleted).sum()))
        return pd.Series(~expired, index=state.index)

    # -- one key group, one micro-batch --------------------------------------
    def process(self, state: pd.DataFrame, rows: pd.DataFrame, ctx: OpContext):
        now = ctx.processing_time_ms
        key = list(self.key)
        cols = self.data_columns
        m = ctx.metrics
        m.add("rows_in", len(rows))

        kinds = rows[KIND_COL].to_numpy(dtype=np.int64)
        keep = kinds != RowKind.UPDATE_BEFORE
        rows = rows[keep].reset_index(drop=True)
        kinds = kinds[keep]

        # State of each row's key (at most one state row per key).
        if len(state):
            expired = self._expired(state, now)
            m.add("ttl_expired", int((expired & ~state[DELETED_COL].to_numpy(bool)).sum()))
            m.add("tombstones_expired", int((expired & state[DELETED_COL].to_numpy(bool)).sum()))
            state = state[~expired].reset_index(drop=True)
        spos = lookup_unique(rows, state, key)                    # -1: no state
        has_state = spos >= 0
        s_seq = np.where(has_state, state[SEQ_COL].to_numpy(np.int64)[spos] if len(state) else 0,
                         np.iinfo(np.int64).min)
        s_alive = has_state & ~(state[DELETED_COL].to_numpy(bool)[spos] if len(state)
                                else np.zeros(len(rows), bool))

        # Superseded: not newer than what was already applied for the key.
        # A repeated (key, _seq) inside the batch is a duplicate delivery.
        seq = rows[SEQ_COL].to_numpy(np.int64)
        dup = ~first_of_key(rows, key) & (seq == np.roll(seq, 1)) if len(rows) else np.zeros(0, bool)
        fresh = (seq > s_seq) & ~dup
        m.add("superseded", int((~fresh).sum()))
        rows, kinds, seq = rows[fresh].reset_index(drop=True), kinds[fresh], seq[fresh]
        spos, s_alive = spos[fresh], s_alive[fresh]

        if self.fold_batch:
            # mini-batch: only each key's last fresh change is applied, so the
            # output is the key's net change over the batch (stored row before
            # against last row after); the table after the batch is the same
            folded = last_of_key(rows, key)
            m.add("folded", int((~folded).sum()))
            rows, kinds, seq = rows[folded].reset_index(drop=True), kinds[folded], seq[folded]
            spos, s_alive = spos[folded], s_alive[folded]

        # a tombstone is no previous row
        is_add = IS_ADD[kinds] if len(rows) else np.zeros(0, bool)
        out = keep_last_changes(rows, cols, first_of_key(rows, key), is_add, state,
                                np.where(s_alive, spos, -1),
                                suppress_equal=self.state_ttl_ms is None,
                                generate_update_before=self.generate_update_before, ctx=ctx)
        m.add("rows_out", len(out))

        # New state: the last fresh row of each key; keys whose rows were all
        # superseded keep their stored row.
        last = last_of_key(rows, key)
        new = rows.loc[last, key + [c for c in cols if c not in key]].copy()
        new[SEQ_COL] = seq[last]
        new[DELETED_COL] = ~is_add[last]
        new[TOUCHED_COL] = np.int64(now)
        untouched_state = state.iloc[np.setdiff1d(np.arange(len(state)), spos)] if len(state) else state
        new_state = pd.concat([untouched_state, new], ignore_index=True) if len(untouched_state) else new
        return new_state.reset_index(drop=True), out
