"""State views of the regular join (docs/semantics.md, section 4), computed for a whole batch.

Flink keeps, per join key and input side, one of three views (names as in
Flink's ``JoinRecordStateViews`` / ``OuterJoinRecordStateViews``):

=============================  ==============================================
``JoinKeyContainsUniqueKey``   the join key contains a unique key of the side:
                               one row per join key (add replaces, retract
                               clears whatever is stored).
``InputSideHasUniqueKey``      unique key not in the join key: unique key ->
                               row (add replaces the row of its unique key,
                               retract removes it).
``InputSideHasNoUniqueKey``    row -> count (add increments, retract
                               decrements, the row leaves at zero).
=============================  ==============================================

An outer side also stores ``numOfAssociations`` per entry (here: per state
row), the number of rows of the other side it matches.

Beyond Flink, every stored row keeps its *arrival number* (``__arr``) and
matches are emitted in that order (docs/semantics.md, section 4, "Ordering").  A row of
``InputSideHasUniqueKey`` that is replaced arrives anew; a row of
``InputSideHasNoUniqueKey`` keeps the arrival of the add that took its count
from 0 to 1, and its copies are emitted together at that place.

Vectorized formulation
----------------------
The two sides' *contents* evolve independently of each other: what a side
stores after its i-th event depends only on that side's events.  So instead of
replaying events one by one, each view turns a batch into **units**: stored
rows with a lifetime ``(start, end)`` in batch positions (rows are sorted by
join key, then ``_seq``, so the positions of one join key are contiguous; state
rows from earlier batches start just before their key's first position, rows
still stored after the batch end at the key's end).  An event at position
``p`` of the other side sees exactly the units with ``start < p < end``.  The
association counts, the only cross-side dependence, follow from those pairs by
grouped prefix sums (see ``regular_join``).

``InputSideHasNoUniqueKey`` has one unit per *copy* of a row.  Counts follow a
walk clamped at zero (a retraction of a row that is not stored changes
nothing): ``level_t = S_t - min(0, min_{s<=t} S_s)`` with ``S`` the unclamped
prefix sum.  An add creates the copy at its new level, a retraction kills the
copy at its old level (last in, first out), so at every level creations and
kills alternate and each kill belongs to the creation just before it in
``(row, level, position)`` order.  With LIFO, the copy at level 1 is the one
that brought the row into state, which gives every copy the row's arrival.

State rows without events of their own side in the batch are *passive*: they
live through the batch unchanged (except their association counts), so only
the events and the state rows they address go through the sorts above; the
cost per passive row is a few gathers.  Units come out sorted by (join key,
arrival, copy), so a unit's index is its emission rank among the matches of an
event and lifetime starts mostly ascend (cache-friendly ``searchsorted``).

An association count belongs to a *segment*: a unit of the unique-key views, or
for ``InputSideHasNoUniqueKey`` the stretch of a row's life between two adds
(Flink's ``addRecord(record, n)`` resets the count to the current number of
matches, a retraction keeps it).
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from ...model.join_side import (INPUT_SIDE_HAS_NO_UNIQUE_KEY, INPUT_SIDE_HAS_UNIQUE_KEY,
                                JOIN_KEY_CONTAINS_UNIQUE_KEY, join_input_side_spec)


_I64 = np.int64


# --------------------------------------------------------------------------
# small vectorized helpers
# --------------------------------------------------------------------------
def combine_codes(columns: Sequence, n: int) -> np.ndarray:
    """Int64 codes of the row-wise tuple of ``columns``, equal iff the tuples are
    equal (nulls equal to nulls, as in a GROUP BY); not dense (see :func:`dense`).
    ``columns``: arrays of length ``n``; an integer array is used as is."""
    codes = np.zeros(n, dtype=_I64)
    width_total = 1
    for col in columns:
        col = np.asarray(col)
        if col.dtype.kind in "iu":
            c = col.astype(_I64, copy=False)
            lo = int(c.min()) if n else 0
            c = c - lo
        else:
            c, _ = pd.factorize(col, use_na_sentinel=False)
            c = np.asarray(c, dtype=_I64)
        width = int(c.max()) + 1 if n else 1
        if width_total * width >= 2 ** 62:          # re-densify before it overflows
            codes = np.asarray(pd.factorize(codes)[0], dtype=_I64)
            width_total = int(codes.max()) + 1 if n else 1
        codes = codes * width + c
        width_total *= width
    return codes


def dense(codes: np.ndarray) -> np.ndarray:
    return np.asarray(pd.factorize(codes)[0], dtype=_I64) if len(codes) else codes.astype(_I64)


def _concat_columns(first: list, second: list) -> list:
    """Column-wise concatenation of two lists of aligned arrays."""
    return [np.concatenate([np.asarray(a), np.asarray(b)]) if len(a) else np.asarray(b)
            for a, b in zip(first, second)]


def group_starts(sorted_ids: np.ndarray) -> np.ndarray:
    """True where a run of equal ids begins."""
    m = np.ones(len(sorted_ids), dtype=bool)
    if len(sorted_ids) > 1:
        m[1:] = sorted_ids[1:] != sorted_ids[:-1]
    return m


def grouped_exclusive_cumsum(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Exclusive prefix sums restarting where ``starts`` is True."""
    if not len(values):
        return values.astype(_I64)
    cs = np.cumsum(values, dtype=_I64)
    excl = cs - values
    first = np.flatnonzero(starts)
    lens = np.diff(np.append(first, len(values)))
    return excl - np.repeat(excl[first], lens)


def expand_ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For ranges ``[lo_i, hi_i)``: (owner i, index) for every index in them."""
    cnt = np.maximum(hi - lo, 0).astype(_I64)
    total = int(cnt.sum())
    owner = np.repeat(np.arange(len(lo), dtype=_I64), cnt)
    if not total:
        return owner, np.zeros(0, dtype=_I64)
    offsets = np.arange(total, dtype=_I64) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    return owner, np.repeat(lo.astype(_I64), cnt) + offsets


# --------------------------------------------------------------------------
# inputs and results of a view
# --------------------------------------------------------------------------
@dataclasses.dataclass
class SideBatch:
    """One side's events and state in one batch.

    Events are this side's rows with a non-null join key, ascending by position.
    Source indexes: event at position ``p`` -> ``p``; state row ``j`` (of this
    side, after TTL) -> ``n + j``.
    """

    n: int                      # rows in the batch (positions 0..n-1, both sides)
    key_first: np.ndarray       # per key code: first position
    key_end: np.ndarray         # per key code: one past the last position
    key_offset: np.ndarray      # per key code: offset making (key, arrival) one int64 order
    ev_pos: np.ndarray          # positions of the events
    ev_add: np.ndarray          # bool
    ev_key: np.ndarray          # key code
    ev_arr: np.ndarray          # arrival number
    ev_group: list              # columns identifying the entry (unique key / whole row)
    st_key: np.ndarray          # key code of each state row
    st_cnt: np.ndarray
    st_assoc: np.ndarray
    st_arr: np.ndarray
    st_group: list              # same columns for the state rows


@dataclasses.dataclass
class Units:
    """Stored rows of one side over one batch (module docstring)."""

    # one entry per unit (a stored row, or a copy of one)
    src: np.ndarray
    start: np.ndarray
    end: np.ndarray
    arr: np.ndarray
    tie: np.ndarray             # order among copies of one row
    ent: np.ndarray             # entry (state row to be) of the unit
    # association segments
    seg_event: np.ndarray       # index of the event that started it, or -1 (from state)
    seg_stored: np.ndarray      # the stored count for segments from state
    # entries: what is stored after the batch
    ent_alive: np.ndarray
    ent_src: np.ndarray
    ent_key: np.ndarray
    ent_cnt: np.ndarray
    ent_arr: np.ndarray
    ent_last_seg: np.ndarray
    ent_state: np.ndarray       # state row index, or -1 when new
    ent_written: np.ndarray     # changed by an event of its own side
    retract_no_match: int
    # segment lookup for InputSideHasNoUniqueKey (None: a unit's segment is itself)
    _seg_keys: Optional[np.ndarray] = None      # sorted starts of the walk's segments
    _unit_ent: Optional[np.ndarray] = None
    _width: int = 0
    _seg_direct: Optional[np.ndarray] = None    # per unit: its only segment, or -1

    def segment_of(self, units: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """The association segment of ``units`` as seen by an event at ``pos``."""
        if self._seg_keys is None:
            return units
        seg = self._seg_direct[units]
        need = np.flatnonzero(seg < 0)
        if len(need):
            probe = self.ent[units[need]] * self._width + (pos[need] + 2)
            seg[need] = np.searchsorted(self._seg_keys, probe, side="left") - 1
        return seg


class StateView:
    """Base of the three views; ``name`` is Flink's."""

    name = "view"

    def __init__(self, unique_key: Sequence[str] = ()):
        self.unique_key = tuple(unique_key)

    def build(self, b: SideBatch) -> Units:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{self.name}({', '.join(self.unique_key)})"


def _has_events(b: SideBatch) -> np.ndarray:
    """Per state row: does its join key have events of this side in the batch?
    State rows of other keys are *passive*: stored before and after the batch."""
    has = np.zeros(len(b.key_first), dtype=bool)
    has[b.ev_key] = True
    return has[b.st_key]


def _unit_order(b: SideBatch, key: np.ndarray, arr: np.ndarray,
                tie: Optional[np.ndarray] = None) -> np.ndarray:
    """Permutation sorting units by (join key, arrival, tie): the emission order
    of matches, and ascending lifetimes starts (fast ``searchsorted``)."""
    okey = b.key_offset[key] + arr
    if tie is None:
        return np.argsort(okey, kind="stable")
    return np.lexsort((tie, okey))


class _KeyedEntries(StateView):
    """JoinKeyContainsUniqueKey and InputSideHasUniqueKey: entry = (join key, unique key)."""

    def build(self, b: SideBatch) -> Units:
        ns, ne = len(b.st_key), len(b.ev_pos)
        # state rows whose entry has events of this side take part in the walk
        sa = np.flatnonzero(_has_events(b))
        if b.ev_group and len(sa):
            gid = self._entry_codes(b, sa)
            keep = gid[:len(sa)] >= 0
            sa, gid = sa[keep], np.concatenate([gid[:len(sa)][keep], gid[len(sa):]])
        elif b.ev_group:
            gid = dense(combine_codes([b.ev_key] + [np.asarray(c) for c in b.ev_group], ne))
        else:
            gid = np.concatenate([b.st_key[sa], b.ev_key]).astype(_I64)
        passive = np.ones(ns, dtype=bool)
        passive[sa] = False
        sp = np.flatnonzero(passive)
        na = len(sa)

        # the walk: items = active state rows (just before their key) and events
        key = np.concatenate([b.st_key[sa], b.ev_key]).astype(_I64)
        time = np.concatenate([b.key_first[b.st_key[sa]] - 1, b.ev_pos]).astype(_I64)
        creator = np.concatenate([np.ones(na, bool), b.ev_add])
        order = np.argsort(gid * (b.n + 2) + (time + 1), kind="stable")
        g, t, c, k = gid[order], time[order], creator[order], key[order]
        first = group_starts(g)
        last = np.append(first[1:], True) if len(g) else first
        nxt = np.append(t[1:], 0)
        end = np.where(last, b.key_end[k], nxt) if len(k) else nxt
        prev_creator = np.concatenate([[False], c[:-1]]) if len(c) else c
        retract = ~c
        no_match = int((retract & (first | ~prev_creator)).sum())

        u = order[c]                        # item index: < na active state, else na + event
        u_st = u < na
        u_ev = np.maximum(u - na, 0)
        u_stidx = np.where(u_st, sa[np.minimum(u, max(na - 1, 0))] if na else 0, -1)
        u_end = end[c]
        u_key = k[c]
        # all units: passive state rows, then the walk's units
        src = np.concatenate([b.n + sp, np.where(u_st, b.n + u_stidx, b.ev_pos[u_ev] if ne else 0)])
        start = np.concatenate([b.key_first[b.st_key[sp]] - 1, t[c]])
        endall = np.concatenate([b.key_end[b.st_key[sp]], u_end])
        keys = np.concatenate([b.st_key[sp], u_key]).astype(_I64)
        st_arr = lambda j: b.st_arr[j] if ns else np.zeros(len(j), _I64)      # noqa: E731
        arr = np.concatenate([st_arr(sp), np.where(u_st, st_arr(np.maximum(u_stidx, 0)),
                                                   b.ev_arr[u_ev] if ne else 0)]).astype(_I64)
        state_idx = np.concatenate([sp, u_stidx]).astype(_I64)
        seg_event = np.concatenate([np.full(len(sp), -1, _I64),
                                    np.where(u_st, -1, u_ev)]).astype(_I64)
        st_assoc = lambda j: b.st_assoc[j] if ns else np.zeros(len(j), _I64)  # noqa: E731
        seg_stored = np.concatenate([st_assoc(sp), np.where(u_st, st_assoc(np.maximum(u_stidx, 0)),
                                                            0)]).astype(_I64)
        alive = endall == b.key_end[keys]

        o = _unit_order(b, keys, arr)
        nu = len(o)
        src, start, endall, keys, arr = src[o], start[o], endall[o], keys[o], arr[o]
        state_idx, seg_event, seg_stored, alive = state_idx[o], seg_event[o], seg_stored[o], alive[o]
        ids = np.arange(nu, dtype=_I64)
        return Units(
            src=src.astype(_I64), start=start.astype(_I64), end=endall.astype(_I64), arr=arr,
            tie=np.zeros(nu, _I64), ent=ids, seg_event=seg_event, seg_stored=seg_stored,
            ent_alive=alive, ent_src=src.astype(_I64), ent_key=keys, ent_cnt=np.ones(nu, _I64),
            ent_arr=arr, ent_last_seg=ids, ent_state=state_idx,
            ent_written=state_idx < 0, retract_no_match=no_match)


    @staticmethod
    def _entry_codes(b: SideBatch, sa: np.ndarray) -> np.ndarray:
        """Dense codes of (join key, unique key) for the state rows ``sa`` then the
        events; ``-1`` for a state row whose entry has no event (one hash pass
        over the state rows: they usually outnumber the events)."""
        ne = len(b.ev_pos)
        # unique-key columns as one code per row, known from the events
        if len(b.ev_group) == 1:
            ev_uk, uniques = pd.factorize(np.asarray(b.ev_group[0]), use_na_sentinel=False)
            st_uk = pd.Index(uniques).get_indexer(np.asarray(b.st_group[0])[sa])
        else:
            evi = pd.MultiIndex.from_arrays([np.asarray(c) for c in b.ev_group])
            ev_uk, uniques = pd.factorize(evi)
            st_uk = uniques.get_indexer(pd.MultiIndex.from_arrays(
                [np.asarray(c)[sa] for c in b.st_group]))
        ev_uk, st_uk = np.asarray(ev_uk, _I64), np.asarray(st_uk, _I64)
        width = int(ev_uk.max()) + 1 if ne else 1
        ev_code = b.ev_key.astype(_I64) * width + ev_uk
        st_code = np.where(st_uk >= 0, b.st_key[sa].astype(_I64) * width + st_uk, -1)
        ev_dense, uniq = pd.factorize(ev_code)
        st_dense = np.where(st_uk >= 0, pd.Index(uniq).get_indexer(st_code), -1)
        return np.concatenate([st_dense, ev_dense]).astype(_I64)


class JoinKeyContainsUniqueKey(_KeyedEntries):
    """One row per join key: an add replaces it, a retraction clears it."""

    name = JOIN_KEY_CONTAINS_UNIQUE_KEY

    def build(self, b: SideBatch) -> Units:
        return super().build(dataclasses.replace(b, ev_group=[], st_group=[]))


class InputSideHasUniqueKey(_KeyedEntries):
    """Unique key -> row within a join key."""

    name = INPUT_SIDE_HAS_UNIQUE_KEY


class InputSideHasNoUniqueKey(StateView):
    """Row -> count within a join key (module docstring for the copy walk)."""

    name = INPUT_SIDE_HAS_NO_UNIQUE_KEY

    def build(self, b: SideBatch) -> Units:
        ne = len(b.ev_pos)
        zeros = lambda k: np.zeros(k, _I64)      # noqa: E731
        # entities (distinct rows): state rows of keys with events and events go
        # through the walk; the other state rows are passive
        act = _has_events(b)
        sa, sp = np.flatnonzero(act), np.flatnonzero(~act)
        gcols = _concat_columns([np.asarray(c)[sa] for c in b.st_group], b.ev_group)
        codes = dense(combine_codes([np.concatenate([b.st_key[sa], b.ev_key]).astype(_I64)] + gcols,
                                    len(sa) + ne))
        # only rows with events of their own take part in the walk
        has = np.zeros(int(codes.max()) + 1 if len(codes) else 0, dtype=bool)
        has[codes[len(sa):]] = True
        remap = np.cumsum(has) - 1
        st_act = has[codes[:len(sa)]]
        st_ent = remap[codes[:len(sa)][st_act]].astype(_I64)
        ev_ent = remap[codes[len(sa):]].astype(_I64)
        sp = np.sort(np.concatenate([sp, sa[~st_act]]))
        sa = sa[st_act]
        na = len(sa)
        n_act = int(has.sum())

        ent_key = zeros(n_act)
        ent_key[ev_ent] = b.ev_key
        ent_key[st_ent] = b.st_key[sa]
        c0 = zeros(n_act)
        c0[st_ent] = b.st_cnt[sa]
        ent_state = np.full(n_act, -1, _I64)
        ent_state[st_ent] = sa
        ent_src = zeros(n_act)
        if ne:
            ent_src[ev_ent] = b.ev_pos
        ent_src[st_ent] = b.n + sa
        start_time = b.key_first[ent_key] - 1 if n_act else zeros(0)

        # --- the clamped count walk over each row's events -------------------
        order = np.argsort(ev_ent * (b.n + 2) + b.ev_pos, kind="stable") if ne else zeros(0)
        e_ent = ev_ent[order]
        d = np.where(b.ev_add[order], 1, -1).astype(_I64)
        starts = group_starts(e_ent)
        S = c0[e_ent] + grouped_exclusive_cumsum(d, starts) + d
        big = 2 * (ne + int(c0.max(initial=0))) + 4
        grp = np.cumsum(starts) - 1
        run_min = (np.minimum.accumulate(S - grp * big) + grp * big) if ne else S
        level_after = S - np.minimum(0, run_min)
        level_before = np.where(starts, c0[e_ent], np.concatenate([[0], level_after[:-1]])) \
            if ne else zeros(0)
        is_add = d > 0
        kill = ~is_add & (level_before > 0)
        no_match = int((~is_add & (level_before == 0)).sum())

        ent_written = np.zeros(n_act, bool)
        ent_written[e_ent[is_add | kill]] = True
        final_level = c0.copy()
        if ne:
            last = np.append(starts[1:], True)
            final_level[e_ent[last]] = level_after[last]

        # --- copies: initial ones (levels 1..c0) and one per add --------------
        init_ent = np.repeat(np.arange(n_act, dtype=_I64), c0)
        init_level = np.arange(len(init_ent), dtype=_I64) - np.repeat(np.cumsum(c0) - c0, c0) + 1
        add_items = np.flatnonzero(is_add)
        add_pos = b.ev_pos[order[add_items]].astype(_I64)
        cr_ent = np.concatenate([init_ent, e_ent[add_items]])
        cr_level = np.concatenate([init_level, level_after[add_items]])
        cr_time = np.concatenate([start_time[init_ent], add_pos]).astype(_I64)
        cr_src = np.concatenate([ent_src[init_ent], add_pos]).astype(_I64)
        st_arr_of_ent = zeros(n_act)
        st_arr_of_ent[st_ent] = b.st_arr[sa]
        cr_own_arr = np.concatenate([st_arr_of_ent[init_ent],
                                     b.ev_arr[order[add_items]]]).astype(_I64)
        ncr = len(cr_ent)

        # lifetimes: pair every kill with the creation just before it at its level
        kill_items = np.flatnonzero(kill)
        k_ent, k_level = e_ent[kill_items], level_before[kill_items]
        k_time = b.ev_pos[order[kill_items]].astype(_I64)
        all_ent = np.concatenate([cr_ent, k_ent])
        all_level = np.concatenate([cr_level, k_level])
        all_time = np.concatenate([cr_time, k_time])
        is_kill = np.concatenate([np.zeros(ncr, bool), np.ones(len(k_ent), bool)])
        o = np.lexsort((all_time, all_level, all_ent))
        end = b.key_end[ent_key[cr_ent]].astype(_I64) if ncr else zeros(0)
        kpos = np.flatnonzero(is_kill[o])
        if len(kpos):
            end[o[kpos - 1]] = all_time[o[kpos]]

        # arrival of the row = arrival of the level-1 copy alive at creation time
        oa = np.lexsort((cr_level, cr_time, cr_ent))
        idx = np.where(cr_level[oa] == 1, np.arange(ncr), 0)
        idx = np.maximum.accumulate(idx) if ncr else idx
        arr = zeros(ncr)
        arr[oa] = cr_own_arr[oa][idx]

        # --- association segments: from state, and one per add ---------------
        width = b.n + 4
        seg_ent = np.concatenate([st_ent, e_ent[add_items]]).astype(_I64)
        seg_time = np.concatenate([b.key_first[b.st_key[sa]] - 1, add_pos]).astype(_I64)
        seg_event_u = np.concatenate([np.full(na, -1, _I64), order[add_items]]).astype(_I64)
        seg_stored_u = np.concatenate([b.st_assoc[sa].astype(_I64), zeros(len(add_items))])
        seg_keys_u = seg_ent * width + (seg_time + 2)
        so = np.argsort(seg_keys_u, kind="stable")
        alive_cr = end == b.key_end[ent_key[cr_ent]] if ncr else np.zeros(0, bool)
        ent_arr = zeros(n_act)
        ent_arr[cr_ent[alive_cr]] = arr[alive_cr]

        # --- passive rows: entities n_act.., one segment each, c0 copies -------
        npv = len(sp)
        pv_ent = n_act + np.arange(npv, dtype=_I64)
        pv_cnt = b.st_cnt[sp].astype(_I64)
        pv_key = b.st_key[sp].astype(_I64)
        pc_ent = np.repeat(pv_ent, pv_cnt)
        pc_i = np.repeat(np.arange(npv, dtype=_I64), pv_cnt)
        pc_level = np.arange(len(pc_ent), dtype=_I64) - np.repeat(np.cumsum(pv_cnt) - pv_cnt,
                                                                  pv_cnt) + 1
        n_seg_act = len(seg_ent)
        seg_keys = seg_keys_u[so]
        seg_event = np.concatenate([seg_event_u[so], np.full(npv, -1, _I64)])
        seg_stored = np.concatenate([seg_stored_u[so], b.st_assoc[sp].astype(_I64)])
        ent_last_seg = (np.searchsorted(seg_keys[:n_seg_act],
                                        np.arange(n_act, dtype=_I64) * width + width,
                                        side="left") - 1) if n_act else zeros(0)

        # --- all copies, in emission order ------------------------------------
        u_ent = np.concatenate([cr_ent, pc_ent])
        u_key = np.concatenate([ent_key[cr_ent], pv_key[pc_i]])
        u_arr = np.concatenate([arr, b.st_arr[sp][pc_i]]).astype(_I64)
        u_tie = np.concatenate([cr_level, pc_level])
        u_src = np.concatenate([cr_src, b.n + sp[pc_i]]).astype(_I64)
        u_start = np.concatenate([cr_time, b.key_first[pv_key[pc_i]] - 1]).astype(_I64)
        u_end = np.concatenate([end, b.key_end[pv_key[pc_i]]]).astype(_I64)
        uo = _unit_order(b, u_key, u_arr, u_tie)
        return Units(
            src=u_src[uo], start=u_start[uo], end=u_end[uo], arr=u_arr[uo], tie=u_tie[uo],
            ent=u_ent[uo], seg_event=seg_event, seg_stored=seg_stored,
            ent_alive=np.concatenate([final_level > 0, pv_cnt > 0]),
            ent_src=np.concatenate([ent_src, b.n + sp]).astype(_I64),
            ent_key=np.concatenate([ent_key, pv_key]),
            ent_cnt=np.concatenate([final_level, pv_cnt]),
            ent_arr=np.concatenate([ent_arr, b.st_arr[sp].astype(_I64)]),
            ent_last_seg=np.concatenate([ent_last_seg, n_seg_act + np.arange(npv, dtype=_I64)]),
            ent_state=np.concatenate([ent_state, sp]).astype(_I64),
            ent_written=np.concatenate([ent_written, np.zeros(npv, bool)]),
            retract_no_match=no_match,
            _seg_keys=seg_keys[:n_seg_act], _unit_ent=u_ent[uo], _width=width,
            _seg_direct=np.concatenate([np.full(len(cr_ent), -1, _I64),
                                        n_seg_act + pc_i])[uo])


def choose_view(join_key: Sequence[str], unique_key: Optional[Sequence[str]]) -> StateView:
    """The view of a side with this unique key (``model.join_side``, the rule
    the planner's explain shows)."""
    spec = join_input_side_spec(join_key, [unique_key] if unique_key else [])
    view = {v.name: v for v in (JoinKeyContainsUniqueKey, InputSideHasUniqueKey,
                                InputSideHasNoUniqueKey)}[spec.view]
    return view(spec.unique_key or ())


__all__ = ["JoinKeyContainsUniqueKey", "InputSideHasUniqueKey", "InputSideHasNoUniqueKey",
           "StateView", "SideBatch", "Units", "choose_view", "combine_codes", "expand_ranges",
           "group_starts", "grouped_exclusive_cumsum"]
