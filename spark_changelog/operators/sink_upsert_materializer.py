"""Sink upsert materializer (docs/semantics.md, section 3).

Sits before an upsert sink whose primary key (the *sink key*) does not contain
the upsert key of its input, and turns a changelog whose per-sink-key order is
lost into one whose per-sink-key order is intact.

State per sink key: the rows currently "alive" for it, as an ordered list.

* ADD (``+I``/``+U``): with an upsert key, replace the entry with the same
  upsert key in place (else append).  Emit ``+I`` if the list was empty, else
  ``+U``, with the incoming row.
* RETRACT (``-U``/``-D``): remove the first entry equal to it (on the upsert
  key, or on all data columns; nulls equal nulls; the kind is ignored), then
  emit ``-D`` of the retracted row if the list is now empty, ``+U`` of the new
  last entry if the removed entry was the last, nothing if it was in the
  middle, and nothing plus the ``retract_no_match`` counter and a warning naming
  the key if nothing matched (its state expired by TTL: FLINK-29225).

``conflict="error"``/``"nothing"`` (Flink 2.3 ``ON CONFLICT DO ERROR``/``DO
NOTHING``) buffer changes until the watermark advances past the watermark they
arrived under, fold them with the same list rule, and emit at most one row per
key and watermark.

How it is vectorized (no per-row Python on the hot path)
--------------------------------------------------------
The list rule is decomposed into *slots*: rows that can match each other
(same sink key and upsert key, or same sink key and all data columns).  A
retraction only ever matches an entry of its own slot, so a slot's fate is
independent of the others:

* with an upsert key a slot holds at most one entry: ADD makes it alive (a new
  entry if it was dead, an in-place replacement otherwise), RETRACT kills it;
  "alive before this row" is the previous row of the slot being an ADD;
* without one a slot is a FIFO queue of identical rows: its length follows
  ``c = max(0, c + d)`` (d = +1/-1), solved for all slots at once with the
  reflection formula ``c_t = S_t - min(0, min_{s<=t} S_s)`` on a grouped cumsum,
  and the j-th matching retraction of a slot removes the slot's j-th entry.

Every entry thus gets a start (the row creating it, or "before the batch") and
an end (the row removing it, or never), entries are ordered by creation, and the
sink key's alive count before/after every row is a grouped cumsum.  What is
left is "was the removed entry the last one alive, and which entry is last
now": the nearest entry after it (in creation order) that dies later is alive
at that moment iff it was created before; the nearest entry before it that dies
later is the new last one.  Both are nearest-greater-element queries, answered
for all retractions at once with a sparse table and binary lifting
(``O(n log m)``, m = entries of the largest sink key involved).  The common
cases (ADDs; a retraction emptying its key, which is every retraction when a
key's changes all come from one upsert key) skip that step entirely.

State, compaction, TTL
----------------------
``DO DEDUPLICATE`` stores exactly the alive entries (:class:`SequencedAliveRows`):

* a matched retraction deletes its entry, and a key whose list empties has no
  state rows at all (cleared), so no history or tombstones are kept;
* with an upsert key an ADD replaces the entry of its upsert key in place, so a
  key holds at most one entry per alive upsert key;
* without an upsert key nothing more is dropped: every alive entry, duplicates
  included, can still be retracted by a later equal row, and dropping it would
  change what that retraction emits (the spec's "sequence number or watermark
  proves an entry can never be retracted" needs a guarantee from upstream, such
  as a bound on how late a retraction may come, that this operator is not given);
* ``state_ttl_ms``: a key not touched for that long is dropped whole (by
  :meth:`SinkUpsertMaterializer.retain` at the runtime's compaction, or on
  read in ``process``), counted in ``ttl_expired``; a later retraction that
  finds nothing is counted in ``retract_no_match`` and warned about with the
  key (FLINK-29225 made loud);
* a key whose list crosses ``entries_warn_threshold`` entries (retractions that
  never match, e.g. non-deterministic columns) is warned about once, when it
  crosses.

``DO ERROR``/``DO NOTHING`` store at most one current row per key plus the
changes waiting for the watermark (:class:`WatermarkBufferedRows`), so their
state is bounded by the watermark.  *When* a change is due follows Flink 2.3,
not the change's event time (recorded in ``tests/fixtures/flink/conflict.json``):
Flink stamps every change with the watermark current when it arrives and folds
a key's buffer when a strictly larger watermark arrives.  A ``-U``/``-D``
carries the old row's (old) event time; judged by event time it would be due
at once, never folded with the ``+U`` it belongs to, and the sink would see a
transient ``-D``/``+I`` (or, with ``DO NOTHING``, end on the wrong row).  So a
change is due when ``watermark > stamp`` (stamp = the watermark of its batch;
before any watermark, the first watermark releases it); late rows are
buffered like any other.  Buffered changes are folded in ``_seq`` (arrival)
order.  ``process`` folds the keys of its batch; keys with due changes but no
new rows need the runtime's watermark timer (:meth:`SinkUpsertMaterializer.on_watermark`).
"""
from __future__ import annotations

import dataclasses
from typing import Literal, Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from ..model import KIND_COL, SEQ_COL, RowKind
from ..model.rowkind import IS_ADD
from .base import KeyedOperator, OpContext
from .keys import key_index
from .kernels import factorize_rows, grouped_cummin, grouped_cumsum, run_starts

Conflict = Literal["deduplicate", "error", "nothing"]

#: at most this many "retraction matched nothing" warnings per call (the
#: counter still counts every row); the last warning says how many were left out
MAX_WARNINGS_PER_CALL = 10

#: the stamp of a change that arrived before there was any watermark
NO_WATERMARK = np.iinfo(np.int64).min


class PrimaryKeyConstraintViolation(RuntimeError):
    """``ON CONFLICT DO ERROR``: several distinct rows remain for one sink key."""


# --------------------------------------------------------------------------- #
# state views


def _key_first(input_schema: pa.Schema, key: Sequence[str], data_columns: Sequence[str]
               ) -> tuple[tuple, list[str], list[pa.Field]]:
    """A state view's value columns: the sink key first, then the other data
    columns (the key, the column names, their fields)."""
    key = tuple(key)
    columns = list(key) + [c for c in data_columns if c not in key]
    return key, columns, [input_schema.field(c) for c in columns]


class SequencedAliveRows:
    """State of ``DO DEDUPLICATE``: per sink key, the alive entries.

    One state row per alive entry: the sink key columns, the other data
    columns, ``_entry_seq`` and ``_access_ms``.

    ``_entry_seq`` orders the entries of a key like Flink's list positions: it
    is the output ``_seq`` of the ``+I``/``+U`` emitted when the entry was
    created (monotonic per key group, so later entries sort later), and an ADD
    replacing an entry in place keeps it.  "First match" and "last entry" are
    defined by it, never by the position of a row in a frame.

    ``_access_ms`` is the processing time of the last batch that touched the
    key; all entries of a key share it, so a key expires as a whole, like
    Flink's per-key ``ValueState<List>`` with TTL (``OnCreateAndWrite``).
    """

    ENTRY = "_entry_seq"
    ACCESS = "_access_ms"

    def __init__(self, input_schema: pa.Schema, key: Sequence[str], data_columns: Sequence[str]):
        self.key, self.value_columns, fields = _key_first(input_schema, key, data_columns)
        self.schema = pa.schema(fields + [pa.field(self.ENTRY, pa.int64()),
                                          pa.field(self.ACCESS, pa.int64())])

    def frame(self, values: "_Values", take: np.ndarray, key_code: np.ndarray,
              entry_seq: np.ndarray, access_ms: int) -> pd.DataFrame:
        """State rows of the entries whose values are rows ``take`` of ``values``,
        grouped by key (``key_code``), in entry order."""
        order = np.lexsort((entry_seq, key_code))
        return values.frame(np.asarray(take)[order], self.value_columns, {
            self.ENTRY: np.asarray(entry_seq, dtype=np.int64)[order],
            self.ACCESS: np.full(len(order), access_ms, dtype=np.int64)})


class WatermarkBufferedRows:
    """State of ``DO ERROR``/``DO NOTHING``: per sink key, the current value
    (at most one row, ``_buffered`` false) and the changes waiting for the
    watermark (``_buffered`` true, with their ``_kind``, ``_seq`` and
    ``_stamp``: the watermark they arrived under, :data:`NO_WATERMARK` before
    there was one).  ``_access_ms`` as in :class:`SequencedAliveRows`."""

    BUFFERED = "_buffered"
    STAMP = "_stamp"
    ACCESS = "_access_ms"

    def __init__(self, input_schema: pa.Schema, key: Sequence[str], data_columns: Sequence[str]):
        self.key, self.value_columns, fields = _key_first(input_schema, key, data_columns)
        self.schema = pa.schema(fields + [pa.field(KIND_COL, pa.int8()),
                                          pa.field(SEQ_COL, pa.int64()),
                                          pa.field(self.BUFFERED, pa.bool_()),
                                          pa.field(self.STAMP, pa.int64()),
                                          pa.field(self.ACCESS, pa.int64())])


# --------------------------------------------------------------------------- #
# vectorized helpers


class _Values:
    """The data columns of ``[prior rows, op rows]`` as arrays: cheaper than a
    DataFrame for the few gathers an operator call does (a DataFrame column
    selection or assignment costs more than the whole rule on a small batch)."""

    def __init__(self, frames: Sequence[pd.DataFrame], cols: Sequence[str]):
        frames = [f for f in frames if len(f)]
        self.n = sum(len(f) for f in frames)
        if len(frames) == 1:
            self.arrays = {c: _array(frames[0][c]) for c in cols}
        else:
            self.arrays = {c: _array(pd.concat([f[c] for f in frames], ignore_index=True))
                           for c in cols}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, col: str):
        return self.arrays[col]

    def reorder(self, perm: np.ndarray) -> None:
        self.arrays = {c: a.take(perm) for c, a in self.arrays.items()}

    def frame(self, idx: np.ndarray, cols: Sequence[str], extra: Optional[dict] = None
              ) -> pd.DataFrame:
        """Rows ``idx`` as a DataFrame of ``cols`` plus ``extra`` columns."""
        idx = np.asarray(idx, dtype=np.int64)
        data = {c: self.arrays[c].take(idx) for c in cols}
        data.update(extra or {})
        return pd.DataFrame(data, copy=False)

    def row(self, i: int) -> dict:
        return {c: a[int(i)] for c, a in self.arrays.items()}


def _array(col: pd.Series):
    """A column's values: numpy for numpy dtypes, else its extension array."""
    return col.to_numpy() if isinstance(col.dtype, np.dtype) else col.array










def _nearest_greater(seg: np.ndarray, val: np.ndarray, query: np.ndarray, forward: bool
                     ) -> np.ndarray:
    """For each position ``query[i]``, the nearest position p in the same run
    of ``seg`` (after it if ``forward`` else before it) with ``val[p] >
    val[query[i]]``, or -1.  Sparse table of range maxima + binary lifting:
    ``O(n log m)`` for runs of at most m elements, no Python loop over rows."""
    n = len(val)
    first = run_starts(seg)
    run = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], n] - 1             # last position of each run
    longest = int((ends - starts).max()) + 1 if n else 1
    levels = max(int(longest).bit_length(), 1)
    table = [val]                               # table[k][i] = max(val[i : i + 2**k])
    for k in range(1, levels):
        prev = table[-1]
        half = 1 << (k - 1)
        cur = prev.copy()
        cur[:n - half] = np.maximum(prev[:n - half], prev[half:])
        table.append(cur)
    q = np.asarray(query, dtype=np.int64)
    limit = val[q]
    if forward:
        pos = q + 1                              # candidates: [pos, run end]
        bound = ends[run[q]]
        for k in range(levels - 1, -1, -1):
            step = 1 << k
            ok = pos + step - 1 <= bound
            idx = np.flatnonzero(ok)
            skip = table[k][pos[idx]] <= limit[idx]
            pos[idx[skip]] += step
        return np.where(pos <= bound, pos, -1)
    pos = q.copy()                               # candidates: [run start, pos - 1]
    bound = starts[run[q]]
    for k in range(levels - 1, -1, -1):
        step = 1 << k
        idx = np.flatnonzero(pos - step >= bound)
        skip = table[k][pos[idx] - step] <= limit[idx]
        pos[idx[skip]] -= step
    return np.where(pos - 1 >= bound, pos - 1, -1)


@dataclasses.dataclass
class _Replay:
    """Outcome of applying the list rule to one batch of ops (see module doc).

    Ops are indexed in processing order (sorted by sink key, then ``_seq``).
    Entries are the prior state entries (``0..n_prior-1``) then one per
    creating ADD.  Values are indices into ``V = [prior values, op rows]``.
    """

    n_prior: int
    matched: np.ndarray        # op: retraction that removed an entry
    op_entry: np.ndarray       # op: the entry a matched retraction removed, else -1
    count_before: np.ndarray   # op: alive entries of its sink key before it
    count_after: np.ndarray
    e_sk: np.ndarray
    e_new: np.ndarray          # entry created in this batch
    e_order: np.ndarray        # prior: stored entry seq; new: creating op
    e_start: np.ndarray        # -1 (prior) or creating op
    e_end: np.ndarray          # removing op, or n_ops ("alive at the end")
    e_val: np.ndarray          # value of the entry when created (index into V)
    e_grp: np.ndarray
    add_keys: np.ndarray       # sorted grp * (n_ops + 1) + op of every ADD
    replace: bool

    def value_at(self, entries: np.ndarray, op: np.ndarray) -> np.ndarray:
        """Index into V of the entries' values just after ``op`` (in-place
        replacements by later ADDs of the same slot included)."""
        val = self.e_val[entries].copy()
        if not self.replace or not len(self.add_keys):
            return val
        width = len(self.matched) + 1
        grp = self.e_grp[entries]
        i = np.searchsorted(self.add_keys, grp * width + op, side="right") - 1
        ok = i >= 0
        cand = self.add_keys[np.maximum(i, 0)]
        ok &= cand // width == grp
        # the slot's latest ADD up to ``op`` is this entry's creation or a
        # replacement of it: an alive entry is the slot's only incarnation since
        val[ok] = self.n_prior + cand[ok] % width
        return val

    def creation_order(self, entries: np.ndarray) -> np.ndarray:
        """Entries sorted by sink key, then list position."""
        return entries[np.lexsort((self.e_order[entries], self.e_new[entries],
                                   self.e_sk[entries]))]


def _replay(sk_prior: np.ndarray, grp_prior: np.ndarray, order_prior: np.ndarray,
            sk_ops: np.ndarray, grp_ops: np.ndarray, add_ops: np.ndarray,
            n_groups: int, n_keys: int, replace: bool) -> _Replay:
    """The list rule of docs/semantics.md, section 3 for every sink key at once."""
    n_s, n_r = len(sk_prior), len(sk_ops)
    init = np.bincount(grp_prior, minlength=n_groups)

    # --- per slot: alive count before each op, which ops match/create -------
    perm = np.argsort(grp_ops, kind="stable")           # slot, then op order
    g = grp_ops[perm]
    a = add_ops[perm]
    first = run_starts(g)
    c_before = np.empty(n_r, dtype=np.int64)
    if replace:
        c_before[1:] = a[:-1]
    else:
        s = init[g] + grouped_cumsum(np.where(a, 1, -1), first)
        c_after = s - np.minimum(grouped_cummin(s, first), 0)
        c_before[1:] = c_after[:-1]
    c_before[first] = init[g[first]]
    matched_p = ~a & (c_before > 0)
    creates_p = a & (c_before == 0) if replace else a

    matched = np.zeros(n_r, dtype=bool)
    matched[perm] = matched_p
    creates = np.zeros(n_r, dtype=bool)
    creates[perm] = creates_p

    # --- entries: prior ones, then one per creating ADD ---------------------
    new_ops = np.flatnonzero(creates)
    e_grp = np.concatenate([grp_prior, grp_ops[new_ops]])
    e_sk = np.concatenate([sk_prior, sk_ops[new_ops]])
    e_new = np.concatenate([np.zeros(n_s, dtype=np.int8), np.ones(len(new_ops), dtype=np.int8)])
    e_order = np.concatenate([order_prior.astype(np.int64), new_ops])
    e_start = np.concatenate([np.full(n_s, -1, dtype=np.int64), new_ops])
    e_val = np.concatenate([np.arange(n_s, dtype=np.int64), n_s + new_ops])
    e_end = np.full(len(e_grp), n_r, dtype=np.int64)

    # the j-th matching retraction of a slot removes the slot's j-th entry
    # (FIFO without upsert key; with one, creations and removals alternate)
    # (a slot's entries: its prior ones by stored order, then its created ones
    # in op order, which is the order of ``perm`` restricted to creating ops)
    j = grouped_cumsum(matched_p.astype(np.int64), first) - matched_p
    mp = np.flatnonzero(matched_p)
    gm, jm = g[mp], j[mp]
    removed = np.empty(len(mp), dtype=np.int64)
    from_prior = jm < init[gm]
    if from_prior.any():
        prior_sorted = np.lexsort((order_prior, grp_prior))
        pstart = np.cumsum(init) - init
        removed[from_prior] = prior_sorted[pstart[gm[from_prior]] + jm[from_prior]]
    if not from_prior.all():
        entry_of_op = n_s + np.cumsum(creates) - 1
        new_sorted = entry_of_op[perm[creates_p]]
        ncount = np.bincount(g[creates_p], minlength=n_groups)
        nstart = np.cumsum(ncount) - ncount
        nn = ~from_prior
        removed[nn] = new_sorted[nstart[gm[nn]] + jm[nn] - init[gm[nn]]]
    op_entry = np.full(n_r, -1, dtype=np.int64)
    op_entry[perm[mp]] = removed
    e_end[removed] = perm[mp]

    # --- per sink key: alive count around each op ---------------------------
    sk_init = np.bincount(sk_prior, minlength=n_keys)
    delta = creates.astype(np.int64) - matched
    count_after = sk_init[sk_ops] + grouped_cumsum(delta, run_starts(sk_ops))
    count_before = count_after - delta

    add_pos = np.flatnonzero(add_ops)
    add_keys = np.sort(grp_ops[add_pos] * (n_r + 1) + add_pos) if replace else add_pos[:0]
    return _Replay(n_s, matched, op_entry, count_before, count_after, e_sk, e_new, e_order,
                   e_start, e_end, e_val, e_grp, add_keys, replace)


def _last_alive_after_removal(rp: _Replay, ops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For matched retractions ``ops`` whose key keeps entries: was the removed
    entry the last alive one, and if so which entry is last now (else -1)."""
    removed = rp.op_entry[ops]
    involved = np.zeros(int(rp.e_sk.max()) + 1, dtype=bool)
    involved[rp.e_sk[removed]] = True
    order = rp.creation_order(np.flatnonzero(involved[rp.e_sk]))
    where = np.empty(len(rp.e_sk), dtype=np.int64)
    where[order] = np.arange(len(order))
    seg, end = rp.e_sk[order], rp.e_end[order]
    q = where[removed]
    # later-created entries that die later: the nearest one was alive at the
    # removal iff it had been created by then; if so the removed one was not last
    nxt = _nearest_greater(seg, end, q, forward=True)
    was_last = (nxt < 0) | (rp.e_start[order[np.maximum(nxt, 0)]] > ops)
    # the nearest earlier-created entry still alive after the removal is last now
    prv = _nearest_greater(seg, end, q[was_last], forward=False)
    if (prv < 0).any():  # pragma: no cover - count_after > 0 guarantees one
        raise AssertionError("sink upsert materializer: alive count and entries disagree")
    new_last = np.full(len(ops), -1, dtype=np.int64)
    new_last[was_last] = order[prv]
    return was_last, new_last


# --------------------------------------------------------------------------- #
# the operator


class SinkUpsertMaterializer(KeyedOperator):
    """Keyed by the sink key; see the module docstring for the rule.

    ``upsert_key``: the input's upsert key (``None``/empty when a shuffle lost
    it; rows are then compared on all data columns).  ``state_ttl_ms``: drop a
    key's entries when no batch touched it for that long (``ttl_expired``); a
    retraction later finding nothing is counted (``retract_no_match``) and
    warned about with its key.  ``conflict``: ``"deduplicate"`` (default) or
    ``"error"``/``"nothing"``, which need a watermark on the sources (the
    planner checks it: ``plan.rules``).  ``entries_warn_threshold``: warn
    when a key's alive list grows past it (retractions that never match, e.g.
    non-deterministic columns without an upsert key).
    """

    name = "sink_upsert_materializer"
    #: ``_prepare`` puts the rows in processing order (sink key, ``_seq``,
    #: retractions first), a stable sort that checks first: rows in the
    #: normalize's order (by ``id``, then ``_seq``) are in it already
    orders_own_rows = True

    def __init__(self, input_schema: pa.Schema, sink_key: Sequence[str],
                 upsert_key: Optional[Sequence[str]] = None, state_ttl_ms: Optional[int] = None,
                 conflict: Conflict = "deduplicate",
                 entries_warn_threshold: int = 10_000):
        super().__init__(input_schema, tuple(sink_key))
        if not self.key:
            raise ValueError(f"{self.name}: the sink key must not be empty")
        self.upsert_key = tuple(upsert_key) if upsert_key else None
        missing = [c for c in (self.upsert_key or ()) if c not in self.data_columns]
        if missing:
            raise ValueError(f"{self.name}: upsert key column(s) {missing} not in input "
                             f"{self.data_columns}")
        if conflict not in ("deduplicate", "error", "nothing"):
            raise ValueError(f"{self.name}: conflict must be 'deduplicate', 'error' or "
                             f"'nothing', got {conflict!r}")
        if state_ttl_ms is not None and state_ttl_ms <= 0:
            raise ValueError(f"{self.name}: state_ttl_ms must be positive, got {state_ttl_ms}")
        self.conflict = conflict
        self.state_ttl_ms = state_ttl_ms
        self.entries_warn_threshold = entries_warn_threshold
        if conflict != "deduplicate":
            self.view = WatermarkBufferedRows(input_schema, self.key, self.data_columns)
        else:
            self.view = SequencedAliveRows(input_schema, self.key, self.data_columns)
        clash = [c for c in self.view.schema.names[len(self.data_columns):]
                 if c in self.data_columns]
        if clash:
            raise ValueError(f"{self.name}: column name(s) {clash} are reserved for its state")
        # columns besides the sink key that make two rows "the same slot" (docs/semantics.md, section 3)
        self._slot_cols = [c for c in (self.upsert_key or self.data_columns) if c not in self.key]

    # -- schemas ------------------------------------------------------------
    @property
    def state_schema(self) -> pa.Schema:
        return self.view.schema

    @property
    def output_schema(self) -> pa.Schema:
        return pa.schema([self.input_schema.field(c) for c in self.data_columns]
                         + [pa.field(KIND_COL, pa.int8()), pa.field(SEQ_COL, pa.int64())])

    # -- KeyedOperator ------------------------------------------------------
    def retain(self, state: pd.DataFrame, ctx: OpContext) -> "pd.Series | None":
        if self.state_ttl_ms is None or state.empty:
            return None
        keep = self._alive_by_ttl(state, ctx)
        ctx.metrics.add("ttl_expired", int((~keep).sum()))
        return pd.Series(keep, index=state.index)

    def process(self, state: pd.DataFrame, rows: pd.DataFrame, ctx: OpContext
                ) -> tuple[pd.DataFrame, pd.DataFrame]:
        ctx.metrics.add("rows_in", len(rows))
        expired_keys = None
        if self.state_ttl_ms is not None and len(state):
            keep = self._alive_by_ttl(state, ctx)
            if not keep.all():
                ctx.metrics.add("ttl_expired", int((~keep).sum()))
                expired_keys = state.loc[~keep, list(self.key)].drop_duplicates()
                state = state[keep].reset_index(drop=True)
        null_key = rows[list(self.key)].isna().any(axis=1).to_numpy()
        passed = None
        if null_key.any():
            # a change without a sink key cannot be materialized (it would pair up
            # with every other null-key change): it passes through untouched, and
            # the sink sends it to the dead-letter output (sinks.base.split_null_keys)
            ctx.metrics.add("null_key_passthrough", int(null_key.sum()))
            passed = rows[null_key][self.data_columns + [KIND_COL]].assign(
                **{SEQ_COL: ctx.allocate_seq(int(null_key.sum()))})
            rows = rows[~null_key].reset_index(drop=True)
        if self.conflict == "deduplicate":
            new_state, out = self._process_deduplicate(state, rows, ctx, expired_keys)
        else:
            new_state, out = self._process_buffered(state, rows, ctx, expired_keys)
        if passed is not None:
            out = pd.concat([passed, out], ignore_index=True) if len(out) else \
                passed.reset_index(drop=True)
        return new_state, out

    @property
    def uses_watermark(self) -> bool:
        return self.conflict != "deduplicate"

    def pending_times(self, state: pd.DataFrame) -> np.ndarray:
        if self.conflict == "deduplicate" or state.empty:
            return np.full(len(state), np.inf)
        buffered = state[WatermarkBufferedRows.BUFFERED].to_numpy(dtype=bool, na_value=False)
        stamp = state[WatermarkBufferedRows.STAMP].to_numpy(dtype=np.float64, na_value=np.inf)
        # due once the watermark is strictly above the stamp
        return np.where(buffered, stamp + 1, np.inf)

    def on_watermark(self, state: pd.DataFrame, ctx: OpContext
                     ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """``DO ERROR``/``DO NOTHING``: fold the buffered changes the watermark
        ``ctx.watermark_ms`` has passed, for keys that got no rows in this batch
        (``process`` already does it for the keys it sees).  ``state``: the state
        rows of the keys to flush (e.g. those for which :meth:`due` is true);
        returns their new state and the output, like ``process``."""
        if self.conflict == "deduplicate" or state.empty:
            return state, self.empty_output()
        return self._process_buffered(state, self.input_schema.empty_table().to_pandas(), ctx,
                                      None, touch=False)

    def due(self, state: pd.DataFrame, ctx: OpContext) -> np.ndarray:
        """State rows holding buffered changes that ``ctx.watermark_ms`` has passed."""
        if self.conflict == "deduplicate" or state.empty or ctx.watermark_ms is None:
            return np.zeros(len(state), dtype=bool)
        buffered = state[WatermarkBufferedRows.BUFFERED].to_numpy(dtype=bool, na_value=False)
        stamp = state[WatermarkBufferedRows.STAMP].to_numpy(dtype=np.float64, na_value=np.inf)
        return buffered & (stamp < ctx.watermark_ms)

    # -- DO DEDUPLICATE -----------------------------------------------------
    def _process_deduplicate(self, state, rows, ctx, expired_keys):
        view: SequencedAliveRows = self.view
        n_s, n_r = len(state), len(rows)
        if n_r == 0:
            return state, self.empty_output()
        values, sk, grp, kinds, _ = self._prepare(state, rows)
        sk_s, sk_r = sk[:n_s], sk[n_s:]
        grp_s, grp_r = grp[:n_s], grp[n_s:]
        is_add = IS_ADD[kinds]
        order_s = state[view.ENTRY].to_numpy(dtype=np.int64) if n_s else np.zeros(0, np.int64)
        n_keys = int(sk.max()) + 1
        rp = _replay(sk_s, grp_s, order_s, sk_r, grp_r, is_add, int(grp.max()) + 1, n_keys,
                     replace=self.upsert_key is not None)

        # --- what each op emits -------------------------------------------
        out_kind = np.where(rp.count_before == 0, RowKind.INSERT, RowKind.UPDATE_AFTER
                            ).astype(np.int8)
        out_val = n_s + np.arange(n_r, dtype=np.int64)
        emit = is_add.copy()
        deleted = rp.matched & (rp.count_after == 0)
        out_kind[deleted] = RowKind.DELETE
        emit |= deleted
        query = np.flatnonzero(rp.matched & (rp.count_after > 0))
        if len(query):
            was_last, new_last = _last_alive_after_removal(rp, query)
            q = query[was_last]
            emit[q] = True
            out_kind[q] = RowKind.UPDATE_AFTER
            out_val[q] = rp.value_at(new_last[was_last], q)
        unmatched = ~is_add & ~rp.matched
        if unmatched.any():
            self._warn_unmatched(values, n_s + np.flatnonzero(unmatched), kinds[unmatched], ctx,
                                 expired_keys)

        emitted = np.flatnonzero(emit)
        seqs = ctx.allocate_seq(len(emitted))
        out = values.frame(out_val[emitted], self.data_columns,
                           {KIND_COL: out_kind[emitted], SEQ_COL: seqs})

        # --- new state: the alive entries ---------------------------------
        alive = np.flatnonzero(rp.e_end == n_r)
        op_seq = np.empty(n_r, dtype=np.int64)
        op_seq[emitted] = seqs
        entry_seq = np.where(rp.e_new[alive] == 1, op_seq[rp.e_start[alive]], rp.e_order[alive])
        new_state = view.frame(values, rp.value_at(alive, np.full(len(alive), n_r)),
                               rp.e_sk[alive], entry_seq, ctx.processing_time_ms)
        self._warn_growth(np.bincount(sk_s, minlength=n_keys), rp.e_sk[alive], n_keys, values,
                          rp.e_val[alive], ctx)
        return new_state, out

    # -- DO ERROR / DO NOTHING ----------------------------------------------
    def _process_buffered(self, state, rows, ctx, expired_keys, touch=True):
        view: WatermarkBufferedRows = self.view
        buffered_in = rows[self.data_columns + [KIND_COL, SEQ_COL]].copy()
        buffered_in[view.BUFFERED] = True
        # stamped with the watermark current at the rows' arrival
        arrival = ctx.arrival_watermark
        buffered_in[view.STAMP] = np.int64(NO_WATERMARK if arrival is None else arrival)
        buffered_in[view.ACCESS] = np.int64(ctx.processing_time_ms)
        parts = [p for p in (state, buffered_in) if len(p)]
        if not parts:
            return self.empty_state(), self.empty_output()
        allrows = pd.concat(parts, ignore_index=True)[view.schema.names]
        if touch:                                   # every key of ``state`` has rows
            allrows[view.ACCESS] = np.int64(ctx.processing_time_ms)
        due = self.due(allrows, ctx)
        if not due.any():
            return allrows, self.empty_output()
        is_buf = allrows[view.BUFFERED].to_numpy(dtype=bool)
        sk_all = factorize_rows(allrows, self.key)
        fold_key = np.zeros(int(sk_all.max()) + 1, dtype=bool)
        fold_key[sk_all[due]] = True
        folding = fold_key[sk_all]
        current = allrows[folding & ~is_buf].reset_index(drop=True)
        changes = allrows[due].reset_index(drop=True)
        keep = allrows[~folding | (is_buf & ~due)]

        n_s, n_r = len(current), len(changes)
        values, sk, grp, kinds, _ = self._prepare(current, changes)
        n_keys = int(sk.max()) + 1
        is_add = IS_ADD[kinds]
        rp = _replay(sk[:n_s], grp[:n_s], np.zeros(n_s, dtype=np.int64), sk[n_s:], grp[n_s:],
                     is_add, int(grp.max()) + 1, n_keys, replace=self.upsert_key is not None)
        unmatched = ~is_add & ~rp.matched
        if unmatched.any():
            self._warn_unmatched(values, n_s + np.flatnonzero(unmatched), kinds[unmatched], ctx,
                                 expired_keys)

        # per sink key: previous value, folded list (first entry, count)
        alive = rp.creation_order(np.flatnonzero(rp.e_end == n_r))
        alive_sk = rp.e_sk[alive]
        count = np.bincount(alive_sk, minlength=n_keys)
        head = np.full(n_keys, -1, dtype=np.int64)
        head_pos = np.flatnonzero(run_starts(alive_sk))
        head[alive_sk[head_pos]] = rp.value_at(alive[head_pos], np.full(len(head_pos), n_r))
        prev = np.full(n_keys, -1, dtype=np.int64)
        prev[sk[:n_s]] = np.arange(n_s)
        if self.conflict == "error" and (count > 1).any():
            self._raise_conflict(values, rp, alive, alive_sk, count, ctx)

        has_prev = prev >= 0
        many = count > 1
        new_val = np.where(count == 1, head, -1)
        # DO NOTHING keeps the first row of the folded list: the previous value
        # while it is still alive (it is the oldest entry), else the oldest
        # survivor.  Flink 2.3 keeps the previous value even when the fold
        # retracted it, so the sink keeps a row whose source row was deleted
        # (recorded: conflict.json C11); we keep the spec's "first row" instead.
        new_val = np.where(many, head, new_val)
        kind = np.full(n_keys, -1, dtype=np.int8)
        kind[(new_val < 0) & has_prev] = RowKind.DELETE
        kind[(new_val >= 0) & ~has_prev] = RowKind.INSERT
        changed = (new_val >= 0) & has_prev & (new_val != prev)
        if changed.any():
            both = values.frame(np.r_[prev[changed], new_val[changed]], self.data_columns)
            codes = factorize_rows(both, self.data_columns)
            m = int(changed.sum())
            differs = codes[:m] != codes[m:]
            idx = np.flatnonzero(changed)[differs]
            kind[idx] = RowKind.UPDATE_AFTER
        keys_out = np.flatnonzero(kind >= 0)
        out_val = np.where(kind[keys_out] == RowKind.DELETE, prev[keys_out], new_val[keys_out])
        out = values.frame(out_val, self.data_columns,
                           {KIND_COL: kind[keys_out], SEQ_COL: ctx.allocate_seq(len(keys_out))})

        stay = new_val[new_val >= 0]
        m = len(stay)
        cur = values.frame(stay, view.value_columns, {
            KIND_COL: np.full(m, RowKind.INSERT, dtype=np.int8),
            SEQ_COL: np.full(m, -1, dtype=np.int64), view.BUFFERED: np.zeros(m, dtype=bool),
            view.STAMP: np.full(m, NO_WATERMARK, dtype=np.int64),
            view.ACCESS: np.full(m, ctx.processing_time_ms, dtype=np.int64)})
        parts = [p for p in (keep, cur) if len(p)]
        new_state = pd.concat(parts, ignore_index=True) if parts else self.empty_state()
        return new_state, out

    def _raise_conflict(self, values, rp, alive, alive_sk, count, ctx):
        bad = np.flatnonzero(count > 1)
        first_bad = bad[0]
        entries = alive[alive_sk == first_bad]
        rows = [values.row(i) for i in
                rp.value_at(entries, np.full(len(entries), len(rp.matched)))]
        listed = "; ".join(_describe(r, self.data_columns) for r in rows)
        more = f" ({len(bad) - 1} more key(s) in conflict)" if len(bad) > 1 else ""
        key_list = ", ".join(f"{c}={_plain(rows[0][c])}" for c in self.key)
        raise PrimaryKeyConstraintViolation(
            f"Primary key constraint violation (ON CONFLICT DO ERROR): multiple distinct records "
            f"with the same primary key detected. Conflicting key: [{key_list}]: sink key "
            f"{self._key_text(rows[0])} has {len(entries)} distinct rows after folding the "
            f"changes released by watermark {ctx.watermark_ms}: {listed}{more}. Use ON CONFLICT "
            f"DO NOTHING to keep the first record, or DO DEDUPLICATE.")

    # -- shared -------------------------------------------------------------
    def _prepare(self, prior: pd.DataFrame, ops: pd.DataFrame):
        """Values V = [prior, ops], sink key and slot codes over V, and the ops'
        kinds and ``_seq``, with the ops put in processing order (sink key,
        ``_seq``, retractions first at ties)."""
        values = _Values([prior, ops], self.data_columns)
        sk = factorize_rows(values, self.key)
        n_s = len(prior)
        sk_r = sk[n_s:]
        seq = ops[SEQ_COL].to_numpy(dtype=np.int64)
        kinds = ops[KIND_COL].to_numpy(dtype=np.int64)
        add = IS_ADD[kinds]
        # processing order: the rows as given, sorted stably by sink key,
        # then ``_seq``, then retractions first; checked in two steps, as
        # rows in a normalize's order (by ``id``, then ``_seq``) need no
        # sort or only the first
        perm = None
        if int(run_starts(sk_r).sum()) != np.count_nonzero(np.bincount(sk_r)):
            # a sink key's rows apart (an ``id`` back on an earlier ``g``):
            # group them, stably, by the keys numbered in order of their
            # first rows, so the sort has little to move
            perm = np.argsort(pd.factorize(sk_r)[0], kind="stable")
        g_sk, g_seq, g_add = (sk_r, seq, add) if perm is None else (sk_r[perm], seq[perm], add[perm])
        same = ~run_starts(g_sk)[1:]
        if (same & ((g_seq[1:] < g_seq[:-1])
                    | ((g_seq[1:] == g_seq[:-1]) & g_add[:-1] & ~g_add[1:]))).any():
            perm = np.lexsort((add, seq, sk_r))
        if perm is not None:
            full = np.concatenate([np.arange(n_s), n_s + perm])
            values.reorder(full)
            sk, kinds, seq = sk[full], kinds[perm], seq[perm]
        grp = factorize_rows(values, self._slot_cols, codes=sk) if self._slot_cols else sk
        return values, sk, grp, kinds, seq

    def _alive_by_ttl(self, state: pd.DataFrame, ctx: OpContext) -> np.ndarray:
        access = state[self.view.ACCESS].to_numpy(dtype=np.int64)
        return access + self.state_ttl_ms > ctx.processing_time_ms

    def _key_text(self, row) -> str:
        return _describe(row, self.key)

    def _warn_unmatched(self, values: _Values, idx: np.ndarray, kinds: np.ndarray,
                        ctx: OpContext, expired_keys) -> None:
        """Retractions ``values[idx]`` (kinds ``kinds``) matched nothing."""
        ctx.metrics.add("retract_no_match", len(idx))
        rows = values.frame(idx, self.data_columns, {KIND_COL: kinds})
        keys = rows.drop_duplicates(subset=list(self.key))
        expired = None
        if expired_keys is not None and len(expired_keys):
            expired = np.asarray(key_index(keys, self.key).isin(key_index(expired_keys, self.key)))
        ttl = (f"state TTL is {self.state_ttl_ms} ms" if self.state_ttl_ms is not None
               else "no state TTL is set")
        for i, (_, row) in enumerate(keys.head(MAX_WARNINGS_PER_CALL).iterrows()):
            cause = ("its state expired by TTL in this batch" if expired is not None and expired[i]
                     else f"its state expired ({ttl}) or its ADD never arrived")
            ctx.metrics.warn(
                f"{self.name}: a {RowKind(int(row[KIND_COL])).short} retraction for sink key "
                f"{self._key_text(row)} matched no alive row ({cause}); the sink may keep a stale "
                f"row for this key (FLINK-29225). Retraction: {_describe(row, self.data_columns)}")
        if len(keys) > MAX_WARNINGS_PER_CALL:
            ctx.metrics.warn(f"{self.name}: {len(keys) - MAX_WARNINGS_PER_CALL} more sink keys had "
                             f"retractions matching no alive row (see metric retract_no_match)")

    def _warn_growth(self, before, alive_sk, n_keys, values, alive_val, ctx) -> None:
        after = np.bincount(alive_sk, minlength=n_keys)
        limit = self.entries_warn_threshold
        crossed = np.flatnonzero((before < limit) & (after >= limit))
        for k in crossed[:MAX_WARNINGS_PER_CALL]:
            row = values.row(alive_val[np.flatnonzero(alive_sk == k)[0]])
            ctx.metrics.warn(
                f"{self.name}: sink key {self._key_text(row)} holds {after[k]} alive rows; "
                "retractions are probably not matching (non-deterministic columns without an "
                "upsert key?), so its state keeps growing")
        ctx.metrics.add("keys_over_entries_threshold", len(crossed))


def _describe(row, cols) -> str:
    """``(c1=v1, c2=v2)`` of a row (a mapping or a Series)."""
    return "(" + ", ".join(f"{c}={_plain(row[c])!r}" for c in cols) + ")"


def _plain(value):
    """numpy scalars as Python values and timestamps as ISO text, so messages
    read ``id=1`` and ``ts='2026-11-22T10:00:00+00:00'``."""
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    return value.item() if isinstance(value, np.generic) else value


__all__ = ["SinkUpsertMaterializer", "SequencedAliveRows", "WatermarkBufferedRows",
           "PrimaryKeyConstraintViolation"]
