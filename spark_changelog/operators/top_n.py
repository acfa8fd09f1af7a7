"""Top-N: ``ROW_NUMBER() OVER (PARTITION BY p ORDER BY x) <= N``
(docs/operators.md, "Top-N").

A micro-batch applies its rows to the partitions it touches, recomputes each
touched partition's top N and emits the difference to the top N emitted
before (Feldera's approach; the result equals Flink's per-row output when a
batch holds one row, recorded in ``tests/fixtures/flink/topn.json``):

* with the rank number in the output, the changes are per rank position, the
  output's upsert key being (partition, rank): a rank whose row changed emits
  ``-U old`` then ``+U new``, a rank that appears ``+I``, one that disappears
  ``-D``; in rank order;
* without it, per row: rows that left the top N emit ``-D`` (in their old
  rank order), then rows that entered emit ``+I`` (in their new rank order).

Ordering: the ``order_by`` columns, then arrival (an earlier row ranks first
among equal sort keys, as in Flink; an updated row arrives anew).  Nulls
sort as the largest value (Calcite's default: last ascending, first
descending).  A retraction removes the oldest equal row of its partition; one
that matches nothing is ignored and counted (``retract_no_match``).

Two variants: :class:`RetractableTopN` keeps every row of a partition (a
retraction may bring a lower row back into the top N); :class:`AppendOnlyTopN`
accepts only inserts and keeps only the current top N.  Deduplication is the
N = 1 case of the same rule; the planner turns ``ROW_NUMBER() ... = 1`` on a
time attribute into the deduplicate operators instead.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from ..model import KIND_COL, SEQ_COL, RowKind
from ..model.rowkind import IS_ADD
from .base import KeyedOperator, OpContext
from .kernels import concat_frames, factorize_rows, fifo_survivors, rows_equal, run_starts
from .keys import GLOBAL_KEY

ORDER_COL = "_order"       # state: arrival order of the row (ties)
TOUCHED_COL = "_ts"        # state: processing time of the last write (TTL)

#: an ORDER BY item: (column, ascending)
OrderItem = tuple


class _TopN(KeyedOperator):
    """What both variants share; see the module docstring."""

    def __init__(self, input_schema: pa.Schema, partition_by: Sequence[str], n: int,
                 order_by: Sequence[OrderItem], *, rank_column: Optional[str] = None,
                 state_ttl_ms: Optional[int] = None):
        if not partition_by:
            raise ValueError(f"{self.name}: the partition needs at least one column (a global "
                             f"Top-N is keyed on a constant column, {GLOBAL_KEY!r}, which the "
                             "lowering adds)")
        super().__init__(input_schema, tuple(partition_by))
        if int(n) < 1:
            raise ValueError(f"{self.name}: N must be at least 1, got {n}")
        self.n = int(n)
        self.order_by = [(c, bool(asc)) for c, asc in order_by]
        missing = [c for c, _ in self.order_by if c not in input_schema.names]
        if missing or not self.order_by:
            raise ValueError(f"{self.name}: ORDER BY column(s) {missing or '(none)'} not in "
                             f"{input_schema.names}")
        if rank_column is not None and rank_column in input_schema.names:
            raise ValueError(f"{self.name}: rank column {rank_column!r} is already an input column")
        self.rank_column = rank_column
        self.state_ttl_ms = state_ttl_ms
        data = [input_schema.field(c) for c in self.data_columns]
        rank = [pa.field(rank_column, pa.int64())] if rank_column else []
        self._output_schema = pa.schema(data + rank + [pa.field(KIND_COL, pa.int8()),
                                                       pa.field(SEQ_COL, pa.int64())])
        self._state_schema = pa.schema(
            [input_schema.field(k) for k in self.key]
            + [f for f in data if f.name not in self.key]
            + [pa.field(ORDER_COL, pa.int64()), pa.field(TOUCHED_COL, pa.int64())])

    def retain(self, state, ctx):
        if self.state_ttl_ms is None:
            return None
        alive = state[TOUCHED_COL].to_numpy(np.int64) + self.state_ttl_ms > ctx.processing_time_ms
        ctx.metrics.add("ttl_expired", int((~alive).sum()))
        return pd.Series(alive, index=state.index)

    # -- ranking -------------------------------------------------------------
    def _ranked(self, entries: pd.DataFrame) -> pd.DataFrame:
        """``entries`` sorted by partition, sort key, arrival, with ``__rank``.
        Nulls are the largest value: a null flag per ORDER BY column sorts
        with the column's direction."""
        key = list(self.key)
        tmp = entries.copy()
        by, asc = list(key), [True] * len(key)
        for i, (c, a) in enumerate(self.order_by):
            tmp[f"__null{i}"] = tmp[c].isna().to_numpy()
            by += [f"__null{i}", c]
            asc += [a, a]
        tmp = tmp.sort_values(by + [ORDER_COL], ascending=asc + [True], kind="stable")
        tmp = tmp.drop(columns=[f"__null{i}" for i in range(len(self.order_by))])
        tmp = tmp.reset_index(drop=True)
        part = factorize_rows(tmp, key)
        first = run_starts(part)
        start = np.maximum.accumulate(np.where(first, np.arange(len(part)), 0)) if len(part) \
            else np.zeros(0, dtype=np.int64)
        tmp["__rank"] = np.arange(len(part), dtype=np.int64) - start + 1
        return tmp

    # -- one key group, one micro-batch --------------------------------------
    def process(self, state: pd.DataFrame, rows: pd.DataFrame, ctx: OpContext):
        key = list(self.key)
        cols = self.data_columns
        m = ctx.metrics
        m.add("rows_in", len(rows))
        self._check_input(rows)
        if self.state_ttl_ms is not None and len(state):
            alive = (state[TOUCHED_COL].to_numpy(np.int64) + self.state_ttl_ms
                     > ctx.processing_time_ms)
            m.add("ttl_expired", int((~alive).sum()))
            state = state[alive].reset_index(drop=True)
        stored = state[key + [c for c in cols if c not in key] + [ORDER_COL]]

        # Apply the batch: stored entries first, then the rows in sequence
        # order; a retraction removes the oldest equal row of its partition.
        ops = rows[cols].copy()
        ops[ORDER_COL] = rows[SEQ_COL].to_numpy(np.int64)
        allrows = concat_frames([stored, ops])
        delta = np.concatenate([np.ones(len(stored), dtype=np.int64),
                                np.where(IS_ADD[rows[KIND_COL].to_numpy(np.int64)], 1, -1)])
        slot = factorize_rows(allrows, key + [c for c in cols if c not in key])
        pos = np.arange(len(allrows))
        perm = np.lexsort((pos, slot))
        alive_sorted, ignored = fifo_survivors(slot[perm], delta[perm])
        alive = np.zeros(len(allrows), dtype=bool)
        alive[perm[alive_sorted]] = True
        m.add("retract_no_match", int(ignored.sum()))
        entries = allrows[alive].reset_index(drop=True)

        old = self._ranked(stored)
        new = self._ranked(entries)
        old_top = old[old["__rank"] <= self.n].reset_index(drop=True)
        new_top = new[new["__rank"] <= self.n].reset_index(drop=True)
        out = self._diff_ranked(old_top, new_top) if self.rank_column else \
            self._diff_rows(old_top, new_top)
        out[SEQ_COL] = ctx.allocate_seq(len(out))
        m.add("rows_out", len(out))

        keep = self._kept_entries(new)
        keep[TOUCHED_COL] = np.int64(ctx.processing_time_ms)
        return keep[self._state_schema.names].reset_index(drop=True), out[self._output_schema.names]

    def _check_input(self, rows: pd.DataFrame) -> None:
        """Variants that accept inserts only raise here."""

    def _kept_entries(self, ranked: pd.DataFrame) -> pd.DataFrame:
        return ranked.drop(columns="__rank")

    def _diff_ranked(self, old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
        """Changes per (partition, rank), in partition then rank order."""
        key, cols, rc = list(self.key), self.data_columns, self.rank_column
        o = old[cols + ["__rank"]].rename(columns={"__rank": rc})
        w = new[cols + ["__rank"]].rename(columns={"__rank": rc})
        both = o[key + [rc]].merge(w[key + [rc]], how="outer", indicator=True).sort_values(
            key + [rc], kind="stable").reset_index(drop=True)
        oi = _positions(both, o, key + [rc])
        wi = _positions(both, w, key + [rc])
        has_o, has_w = oi >= 0, wi >= 0
        orow = o.iloc[np.maximum(oi, 0)].reset_index(drop=True) if len(o) else \
            both.reindex(columns=o.columns)
        wrow = w.iloc[np.maximum(wi, 0)].reset_index(drop=True) if len(w) else \
            both.reindex(columns=w.columns)
        same = rows_equal(orow, wrow, cols) & has_o & has_w
        parts = []
        for mask, frame, kind, slot in ((has_o & has_w & ~same, orow, RowKind.UPDATE_BEFORE, 0),
                                        (has_o & ~has_w, orow, RowKind.DELETE, 0),
                                        (has_o & has_w & ~same, wrow, RowKind.UPDATE_AFTER, 1),
                                        (~has_o & has_w, wrow, RowKind.INSERT, 1)):
            if mask.any():
                p = frame[mask].copy()
                p[KIND_COL] = np.int8(kind)
                p["__o"] = np.flatnonzero(mask) * 2 + slot
                parts.append(p)
        return self._finish(parts)

    def _diff_rows(self, old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
        """Rows that left (``-D``, old rank order), then rows that entered
        (``+I``, new rank order), per partition; equal rows count as a multiset."""
        key, cols = list(self.key), self.data_columns
        both = concat_frames([old[cols], new[cols]])
        code = factorize_rows(both, cols)
        oc, nc = code[:len(old)], code[len(old):]
        # the j-th copy of a row on one side matches the j-th copy on the other
        oj = _occurrence(oc)
        nj = _occurrence(nc)
        left = ~pd.MultiIndex.from_arrays([oc, oj]).isin(pd.MultiIndex.from_arrays([nc, nj])) \
            if len(old) else np.zeros(0, dtype=bool)
        entered = ~pd.MultiIndex.from_arrays([nc, nj]).isin(pd.MultiIndex.from_arrays([oc, oj])) \
            if len(new) else np.zeros(0, dtype=bool)
        parts = []
        part_codes = factorize_rows(concat_frames([old[key], new[key]]), key)
        po, pn = part_codes[:len(old)], part_codes[len(old):]
        scale = len(old) + len(new) + 1
        for mask, frame, kind, pc, slot in ((np.asarray(left), old, RowKind.DELETE, po, 0),
                                            (np.asarray(entered), new, RowKind.INSERT, pn, 1)):
            if mask.any():
                p = frame.loc[mask, cols].copy()
                p[KIND_COL] = np.int8(kind)
                # partitions in first-seen order, deletions before insertions, rank order
                p["__o"] = (pc[mask] * 2 + slot) * scale + np.flatnonzero(mask)
                parts.append(p)
        return self._finish(parts)

    def _finish(self, parts) -> pd.DataFrame:
        if not parts:
            return self.empty_output().drop(columns=[SEQ_COL])
        out = concat_frames(parts).sort_values("__o", kind="stable").drop(columns="__o")
        return out.reset_index(drop=True)


def _positions(frame: pd.DataFrame, table: pd.DataFrame, cols) -> np.ndarray:
    """Row of ``table`` with the same ``cols`` as each row of ``frame``, or -1."""
    if not len(table):
        return np.full(len(frame), -1, dtype=np.int64)
    idx = pd.MultiIndex.from_frame(table[cols])
    return np.asarray(idx.get_indexer(pd.MultiIndex.from_frame(frame[cols])), dtype=np.int64)


def _occurrence(codes: np.ndarray) -> np.ndarray:
    """For each position, how many earlier positions have the same code."""
    if not len(codes):
        return np.zeros(0, dtype=np.int64)
    return pd.Series(codes).groupby(codes).cumcount().to_numpy(np.int64)


class RetractableTopN(_TopN):
    """Top-N over a changelog input: keeps every row of a touched partition."""

    name = "RetractableTopN"


class AppendOnlyTopN(_TopN):
    """Top-N over an insert-only input: keeps only each partition's top N (a
    row that fell out can never come back without retractions)."""

    name = "AppendOnlyTopN"

    def _check_input(self, rows):
        kinds = rows[KIND_COL].to_numpy(np.int64)
        if (kinds != RowKind.INSERT).any():
            i = int(np.flatnonzero(kinds != RowKind.INSERT)[0])
            seq = int(rows[SEQ_COL].iloc[i])
            raise ValueError(f"{self.name} accepts an insert-only input, got a "
                             f"{RowKind(int(kinds[i])).short} row (_seq={seq}); "
                             "use RetractableTopN for a changelog input")

    def _kept_entries(self, ranked):
        return ranked[ranked["__rank"] <= self.n].drop(columns="__rank")


__all__ = ["RetractableTopN", "AppendOnlyTopN"]
