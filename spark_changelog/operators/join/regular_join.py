"""Regular (unbounded) stream-stream join (docs/semantics.md, section 4).

Both inputs go through **one** keyed operator, keyed by the join key: a
:class:`JoinInputLayout` defines the union of the two inputs (every row carries
the join key values, its side, both sides' data columns with the other side's
null, ``_kind`` and ``_seq``).  The runtime sorts a micro-batch by (join key,
``_seq``); rows of one join key are then processed as if they arrived one by
one in that order, whichever side they come from.

Emission follows Flink 2.3's ``StreamingJoinOperator.processElement`` exactly
(checked against the 2.3.0 jar), per matched row of the other side *in turn*:

* accumulate on a side: ``-D[null, other]`` if the other side is outer and
  ``other`` had no association, then ``[row, other]`` (``+I`` in outer joins,
  the input kind in inner joins); no match and the side is outer:
  ``+I[row, null]``;
* retraction on a side: ``[row, other]`` (``-D`` from an outer side, the input
  kind from an inner side), then ``+I[null, other]`` if the other side is outer
  and ``other``'s associations drop from 1 to 0; no match and the side is
  outer: ``-D[row, null]``.

A retraction of a row that is not stored still retracts its matches and
decrements their associations, as in Flink (counted as ``retract_no_match``).
Matches come in the arrival order of the stored rows (``state_views``), which
goes beyond Flink (docs/semantics.md, section 4, "Ordering").

Vectorized per batch (``state_views``): each side's stored rows become units
with a lifetime in batch positions; the pairs (event of one side, unit of the
other alive at the event) come from one ``searchsorted`` per unit over the
other side's event positions, so their number is exactly the number of matches
(no key-wise cross product, no per-row or per-round Python loop).  Association
counts are grouped prefix sums over those pairs.  The output is sorted once by
(event position, match arrival, sub-step) and numbered with
``OpContext.allocate_seq``.

Details
-------
* A row whose join key has a null never matches (SQL ``=``; Flink's null
  filter in the join condition): an outer side emits ``+I[row, null]`` /
  ``-D[row, null]`` for it; it is not stored (nothing could ever read it).
* State: one row per stored entry, both sides in one table (``_side``), with
  ``__cnt`` (copies, ``InputSideHasNoUniqueKey``), ``__assoc``
  (``numOfAssociations`` of an outer side), ``__arr`` (arrival number) and
  ``__ts`` (processing time of the last write: add, count change, association
  update).  Like Flink, ``__assoc`` can go negative after retractions of rows
  that were never stored; it is kept as is.
* ``_seq`` of the two inputs come from different sources; the runtime's stable
  sort keeps input order for equal ``_seq`` of one key (``union_pandas`` puts
  left rows first).  Give the inputs comparable ``_seq`` if their relative
  order matters.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import numpy as np
import pandas as pd
import pyarrow as pa

from ...model import KIND_COL, METRICS_COL, SEQ_COL, RowKind, join_output_names
from ...model.rowkind import IS_ADD
from ..base import KeyedOperator, OpContext
from ..kernels import concat_ints, nullable_ints
from ..keys import key_change, lookup_unique
from .state_views import (SideBatch, StateView, choose_view, expand_ranges,
                          group_starts, grouped_exclusive_cumsum)

SIDE_COL = "_side"
LEFT, RIGHT = 0, 1
JOIN_KEY_PREFIX = "__jk"
# state bookkeeping columns
CNT_COL = "__cnt"        # copies of the row (InputSideHasNoUniqueKey), else 1
ASSOC_COL = "__assoc"    # numOfAssociations (outer sides), else 0
ARR_COL = "__arr"        # arrival number: matches are emitted in this order
TS_COL = "__ts"          # processing time of the last write (state TTL)

JOIN_TYPES = ("inner", "left", "right", "full")
_I64 = np.int64


def _reserved(name: str) -> bool:
    return name in (KIND_COL, SEQ_COL, SIDE_COL) or name.startswith("__")


def _data_fields(schema: pa.Schema) -> list[pa.Field]:
    return [f for f in schema if f.name not in (KIND_COL, SEQ_COL)]


def _take(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``values[idx]`` with ``-1`` -> null (ints become float64, or object
    beyond 2**53 (``kernels.nullable_ints``), bools object, when a null
    appears: the pandas convention the runtimes use)."""
    neg = idx < 0
    if not len(idx) or not neg.any():
        return values[idx]
    kind = values.dtype.kind
    if kind in "iu":
        return nullable_ints(values[np.where(neg, 0, idx)] if len(values)
                             else np.zeros(len(idx), values.dtype), neg)
    if kind == "b":
        values = values.astype(object)
    kind = values.dtype.kind
    fill = np.nan if kind in "fc" else (values.dtype.type("NaT") if kind in "mM" else None)
    if not len(values):
        return np.full(len(idx), fill, dtype=values.dtype)
    out = values[np.where(neg, 0, idx)]
    out[neg] = fill
    return out


def _col(df: pd.DataFrame, name: str) -> np.ndarray:
    return df[name].to_numpy()


def conform_arrays(data: dict, schema: pa.Schema) -> dict:
    """Restore integer/bool dtypes of columns (numpy arrays) that hold no nulls."""
    for f in schema:
        col = data.get(f.name)
        if col is None or not isinstance(col, np.ndarray):
            continue
        if pa.types.is_integer(f.type) and col.dtype.kind == "f":
            if not np.isnan(col).any():
                data[f.name] = col.astype(f.type.to_pandas_dtype())
        elif pa.types.is_integer(f.type) and col.dtype == object:
            # Python ints beyond 2**53 (``kernels.nullable_ints``)
            if not pd.isna(col).any():
                data[f.name] = col.astype(f.type.to_pandas_dtype())
        elif pa.types.is_boolean(f.type) and col.dtype == object:
            if not pd.isna(col).any():
                data[f.name] = col.astype(bool)
    return data


def frame(data: dict, schema: pa.Schema) -> pd.DataFrame:
    return pd.DataFrame(conform_arrays(data, schema), columns=schema.names)


class JoinInputLayout:
    """The unioned input of a regular join and the join's output columns.

    ``left_schema``/``right_schema``: the data columns of each input (``_kind``
    and ``_seq`` are ignored if present).  ``left_keys``/``right_keys``: the
    equi-join columns, pairwise.

    Union columns, in order: ``__jk0..__jkN`` (join key values, typed as the
    left key; a right key is cast), ``_side`` (int8: 0 left, 1 right), the left
    data columns, the right data columns, ``_kind``, ``_seq``.  Data columns
    use their *output* names: left columns keep theirs; a right column whose
    name is taken gets the first free ``name0``, ``name1``, ... (Flink/Calcite's
    ``id``, ``id0``).  Names starting with ``__`` and ``_side`` are reserved.

    Output columns: left data columns, right data columns, ``_kind``, ``_seq``.
    """

    def __init__(self, left_schema: pa.Schema, right_schema: pa.Schema,
                 left_keys: Sequence[str], right_keys: Sequence[str]):
        left_keys, right_keys = tuple(left_keys), tuple(right_keys)
        if not left_keys or len(left_keys) != len(right_keys):
            raise ValueError(f"join keys must pair up: {left_keys} vs {right_keys}")
        lf, rf = _data_fields(left_schema), _data_fields(right_schema)
        for side, fields, keys in (("left", lf, left_keys), ("right", rf, right_keys)):
            names = [f.name for f in fields]
            bad = [n for n in names if _reserved(n)]
            if bad:
                raise ValueError(f"{side} input: column name(s) {bad} are reserved by the join")
            missing = [k for k in keys if k not in names]
            if missing:
                raise ValueError(f"{side} join key column(s) {missing} not in {names}")
        self.left_fields = lf
        self.right_source_fields = rf
        self.left_keys, self.right_keys = left_keys, right_keys
        self.right_rename = join_output_names([f.name for f in lf], [f.name for f in rf])
        self.right_fields = [pa.field(self.right_rename[f.name], f.type) for f in rf]
        self.left_columns = [f.name for f in lf]
        self.right_columns = [f.name for f in self.right_fields]
        ltypes = {f.name: f.type for f in lf}
        self.key_fields = [pa.field(f"{JOIN_KEY_PREFIX}{i}", ltypes[k]) for i, k in enumerate(left_keys)]
        self.key_columns = tuple(f.name for f in self.key_fields)
        #: right key columns under their output names
        self.right_keys_out = tuple(self.right_rename[k] for k in right_keys)
        nullable = lambda fs: [pa.field(f.name, f.type, nullable=True) for f in fs]  # noqa: E731
        self.union_schema = pa.schema(
            self.key_fields + [pa.field(SIDE_COL, pa.int8())] + nullable(lf)
            + nullable(self.right_fields)
            + [pa.field(KIND_COL, pa.int8()), pa.field(SEQ_COL, pa.int64())])
        self.output_schema = pa.schema(
            nullable(lf) + nullable(self.right_fields)
            + [pa.field(KIND_COL, pa.int8()), pa.field(SEQ_COL, pa.int64())])

    def side_columns(self, side: int) -> list[str]:
        return self.left_columns if side == LEFT else self.right_columns

    def side_keys(self, side: int) -> tuple[str, ...]:
        """The join key columns of ``side`` under their output names."""
        return self.left_keys if side == LEFT else self.right_keys_out

    # -- building the union ------------------------------------------------------
    def side_projection(self, side: int) -> list[tuple[object, str, pa.DataType]]:
        """How to turn the ``side`` input into union rows, one entry per union
        column in order: ``(source, target, type)`` where ``source`` is a column
        name of that input, ``None`` for a typed null, or, for ``_side`` only,
        the int literal ``side``.  Cast every value to ``type``."""
        keys = self.left_keys if side == LEFT else self.right_keys
        out: list[tuple[object, str, pa.DataType]] = [
            (k, f.name, f.type) for k, f in zip(keys, self.key_fields)]
        out.append((int(side), SIDE_COL, pa.int8()))
        for f in self.left_fields:
            out.append((f.name if side == LEFT else None, f.name, f.type))
        for src, f in zip(self.right_source_fields, self.right_fields):
            out.append((src.name if side == RIGHT else None, f.name, f.type))
        out.append((KIND_COL, KIND_COL, pa.int8()))
        out.append((SEQ_COL, SEQ_COL, pa.int64()))
        return out

    def union_pandas(self, left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
        """The union of two changelog frames (data columns + ``_kind``/``_seq``,
        right columns under their input names), left rows first."""
        frames = [(LEFT, left), (RIGHT, right)]
        projections = [self.side_projection(s) for s, _ in frames]
        data = {}
        for col, (_, tgt, typ) in enumerate(projections[0]):
            parts = []
            for (side, df), proj in zip(frames, projections):
                src = proj[col][0]
                k = len(df) if df is not None else 0
                if df is None:
                    continue
                if isinstance(src, int) and not isinstance(src, bool):
                    parts.append(np.full(k, src, dtype=np.int8))
                elif src is None:
                    numeric = pa.types.is_integer(typ) or pa.types.is_floating(typ)
                    parts.append(np.full(k, np.nan) if numeric else np.full(k, None, dtype=object))
                else:
                    parts.append(df[src].to_numpy())
            if len(parts) == 1:
                data[tgt] = parts[0]
            elif pa.types.is_integer(typ):
                data[tgt] = concat_ints(parts)      # exact beyond 2**53
            else:
                data[tgt] = np.concatenate(parts)
        out = pd.DataFrame(data)
        for c, t in ((SIDE_COL, np.int8), (KIND_COL, np.int8), (SEQ_COL, np.int64)):
            out[c] = out[c].astype(t)
        return out

    def spark_union(self, left_df, right_df, keep: tuple = ()):
        """The same union with Spark column expressions (``unionByName``);
        ``keep``: columns both inputs have that pass through as they are
        (after the union's)."""
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_type

        # side rows (_kind = -1: dead letters, operator counters) keep their
        # payload; their data columns are NULL like a missing side's
        side_rows = METRICS_COL in left_df.columns or METRICS_COL in right_df.columns

        def project(df, side):
            exprs = []
            for src, tgt, typ in self.side_projection(side):
                st = from_arrow_type(typ)
                if isinstance(src, int) and not isinstance(src, bool):
                    e = F.lit(src)
                elif src is None:
                    e = F.lit(None)
                else:
                    e = F.col(f"`{src}`")
                exprs.append(e.cast(st).alias(tgt))
            if side_rows:
                payload = F.col(f"`{METRICS_COL}`") if METRICS_COL in df.columns else F.lit(None)
                exprs.append(payload.cast("string").alias(METRICS_COL))
            return df.select(*exprs, *(F.col(f"`{c}`") for c in keep))

        return project(left_df, LEFT).unionByName(project(right_df, RIGHT))

    def arrow_side(self, table: pa.Table, side: int) -> pa.Table:
        """The ``side`` input's rows (an Arrow table) as union rows, as
        :meth:`spark_union` makes them (side rows keep their ``_metrics``):
        what the operator before the join packs (docs/runtime.md, "Packing in
        the operator before")."""
        n = table.num_rows
        cols, fields = [], []
        for src, tgt, typ in self.side_projection(side):
            if isinstance(src, int) and not isinstance(src, bool):
                col = pa.array(np.full(n, src), typ)
            elif src is None:
                col = pa.nulls(n, typ)
            else:
                col = table.column(src).cast(typ)
            cols.append(col)
            fields.append(pa.field(tgt, typ))
        if METRICS_COL in table.column_names:
            cols.append(table.column(METRICS_COL).cast(pa.string()))
            fields.append(pa.field(METRICS_COL, pa.string()))
        return pa.Table.from_arrays(cols, schema=pa.schema(fields))


Condition = Callable[[pd.DataFrame, pd.DataFrame], np.ndarray]


class RegularJoin(KeyedOperator):
    """INNER/LEFT/RIGHT/FULL regular join on a :class:`JoinInputLayout` union.

    ``left_unique_key``/``right_unique_key``: a unique key of each input (input
    column names), which picks the state view (``state_views.choose_view``).
    ``condition``: an extra non-equi predicate, vectorized over aligned
    candidate pairs: ``condition(left_df, right_df) -> bool array`` with
    output column names; null counts as false.  ``state_ttl_ms``: an int for
    both sides or ``(left, right)``; a stored row not *written* for that long
    is gone (Flink's ``OnCreateAndWrite``/``NeverReturnExpired``): invisible to
    the batch that finds it expired and dropped by :meth:`retain`.
    """

    name = "RegularJoin"

    def __init__(self, layout: JoinInputLayout, join_type: str = "inner",
                 left_unique_key: Optional[Sequence[str]] = None,
                 right_unique_key: Optional[Sequence[str]] = None,
                 condition: Optional[Condition] = None,
                 state_ttl_ms: Union[None, int, tuple] = None):
        super().__init__(layout.union_schema, layout.key_columns)
        join_type = join_type.lower()
        if join_type not in JOIN_TYPES:
            raise ValueError(f"join_type must be one of {JOIN_TYPES}, got {join_type!r}")
        self.layout = layout
        self.join_type = join_type
        self.outer = (join_type in ("left", "full"), join_type in ("right", "full"))
        self.condition = condition
        if state_ttl_ms is None or isinstance(state_ttl_ms, (int, np.integer)):
            ttl = (state_ttl_ms, state_ttl_ms)
        else:
            ttl = tuple(state_ttl_ms)
        if any(t is not None and t <= 0 for t in ttl):
            raise ValueError("state_ttl_ms must be positive")
        self.state_ttl_ms = ttl
        uks = []
        for side, uk in ((LEFT, left_unique_key), (RIGHT, right_unique_key)):
            uk = tuple(uk) if uk else ()
            src_names = [f.name for f in (layout.left_fields if side == LEFT
                                          else layout.right_source_fields)]
            missing = [c for c in uk if c not in src_names]
            if missing:
                raise ValueError(f"{'left' if side == LEFT else 'right'} unique key column(s) "
                                 f"{missing} not in {src_names}")
            if side == RIGHT:
                uk = tuple(layout.right_rename[c] for c in uk)
            uks.append(uk)
        self.unique_keys = tuple(uks)
        self.views: tuple[StateView, StateView] = (
            choose_view(layout.side_keys(LEFT), uks[0]),
            choose_view(layout.side_keys(RIGHT), uks[1]))
        self._int_columns = frozenset(
            f.name for f in list(layout.key_fields) + layout.left_fields + layout.right_fields
            if pa.types.is_integer(f.type))
        self._state_schema = pa.schema(
            list(layout.key_fields) + [pa.field(SIDE_COL, pa.int8())]
            + [pa.field(f.name, f.type, nullable=True) for f in layout.left_fields + layout.right_fields]
            + [pa.field(CNT_COL, pa.int64()), pa.field(ASSOC_COL, pa.int64()),
               pa.field(ARR_COL, pa.int64()), pa.field(TS_COL, pa.int64())])

    @property
    def output_schema(self) -> pa.Schema:
        return self.layout.output_schema

    def _concat(self, column: str, parts: list) -> np.ndarray:
        """Parts of a data or key column, one array: an integer column's
        exactly (``kernels.concat_ints``: int64 beside float64 with NaN would
        round values beyond 2**53)."""
        if column in self._int_columns:
            return concat_ints(parts)
        return np.concatenate([_as_object_if_mixed(parts[0], parts[1])] + parts[1:])

    @property
    def output_keys(self) -> tuple[tuple[str, ...], ...]:
        """The join key columns of each side that is never null-padded (the
        key groups are on the internal ``__jk`` columns, cast from either
        side's key): both for an inner join, the preserved side's for a
        left or right one, none for a full one.  A padded side's key
        columns are null in rows of every key group."""
        return tuple(self.layout.side_keys(side) for side, outer in ((LEFT, self.outer[1]), (RIGHT, self.outer[0]))
                     if not outer)

    def describe(self) -> str:
        return (f"RegularJoin({self.join_type}, key={list(self.layout.left_keys)}="
                f"{list(self.layout.right_keys)}, left={self.views[0]!r}, right={self.views[1]!r}"
                f"{', condition' if self.condition else ''})")

    # -- state TTL -------------------------------------------------------------
    def _expired(self, state: pd.DataFrame, now: int) -> np.ndarray:
        out = np.zeros(len(state), dtype=bool)
        if not len(state) or self.state_ttl_ms == (None, None):
            return out
        side = state[SIDE_COL].to_numpy(dtype=np.int64)
        ts = state[TS_COL].to_numpy(dtype=np.int64)
        for s, ttl in enumerate(self.state_ttl_ms):
            if ttl is not None:
                out |= (side == s) & (ts + int(ttl) <= now)
        return out

    def retain(self, state: pd.DataFrame, ctx: OpContext):
        if self.state_ttl_ms == (None, None):
            return None
        expired = self._expired(state, ctx.processing_time_ms)
        ctx.metrics.add("ttl_expired", int(expired.sum()))
        return pd.Series(~expired, index=state.index)

    # -- one key group, one micro-batch ------------------------------------------
    def process(self, state: pd.DataFrame, rows: pd.DataFrame, ctx: OpContext):
        L = self.layout
        m = ctx.metrics
        now = int(ctx.processing_time_ms)
        n = len(rows)
        m.add("rows_in", n)
        if n == 0:
            return state.reset_index(drop=True), self.empty_output()
        jk = list(L.key_columns)
        change = key_change(rows, jk)
        kc = (np.cumsum(change) - 1).astype(_I64)
        key_first = np.flatnonzero(change).astype(_I64)
        key_end = np.append(key_first[1:], n).astype(_I64)
        nk = len(key_first)
        keyvals = {c: _col(rows, c) for c in jk}
        valid_key = np.ones(n, dtype=bool)
        for c in jk:
            valid_key &= ~pd.isna(keyvals[c])
        side = _col(rows, SIDE_COL).astype(_I64)
        kinds = _col(rows, KIND_COL).astype(_I64)
        is_add = IS_ADD[kinds]
        pos = np.arange(n, dtype=_I64)
        data = {c: _col(rows, c) for c in L.left_columns + L.right_columns}

        # state of the touched keys, minus what expired
        if len(state):
            st_kc = lookup_unique(state, rows.iloc[key_first][jk].reset_index(drop=True), jk)
            expired = self._expired(state, now)
            m.add("ttl_expired", int(expired.sum()))
            keep = (st_kc >= 0) & ~expired
            if not keep.all():
                state = state[keep]
                st_kc = st_kc[keep]
        else:
            st_kc = np.zeros(0, _I64)
        ns_all = len(state)
        stcol = (lambda c, dt=None: state[c].to_numpy(dtype=dt)) if ns_all else \
            (lambda c, dt=None: np.zeros(0, dtype=dt or object))
        st_side = stcol(SIDE_COL, _I64)
        st_arr_all = stcol(ARR_COL, _I64)
        base = np.zeros(nk, _I64)
        if ns_all:
            np.maximum.at(base, st_kc, st_arr_all + 1)
        ev_arr_all = base[kc] + (pos - key_first[kc])
        span = base + (key_end - key_first)            # arrivals of a key are < span
        key_offset = np.concatenate([[0], np.cumsum(span)[:-1]]).astype(_I64)

        # per side: events, state, units; data sources: rows (by position) then state rows
        batches, units, st_rows, sources = [], [], [], []
        for s in (LEFT, RIGHT):
            cols = L.side_columns(s)
            ev = np.flatnonzero((side == s) & valid_key)
            sm = np.flatnonzero(st_side == s)
            st_rows.append(sm)
            src = {c: (self._concat(c, [data[c], stcol(c)[sm]]) if len(sm) else data[c])
                   for c in cols}
            sources.append(src)
            view = self.views[s]
            gcols = [] if view.name == "JoinKeyContainsUniqueKey" else \
                (list(view.unique_key) if view.unique_key else cols)
            b = SideBatch(
                n=n, key_first=key_first, key_end=key_end, key_offset=key_offset,
                ev_pos=ev, ev_add=is_add[ev], ev_key=kc[ev], ev_arr=ev_arr_all[ev],
                ev_group=[data[c][ev] for c in gcols],
                st_key=st_kc[sm], st_cnt=stcol(CNT_COL, _I64)[sm],
                st_assoc=stcol(ASSOC_COL, _I64)[sm], st_arr=st_arr_all[sm],
                st_group=[src[c][n:] for c in gcols])
            u = view.build(b)
            m.add("retract_no_match", u.retract_no_match)
            batches.append(b)
            units.append(u)

        # pairs: event of side A x unit of side B alive at the event
        pairs = []
        for a in (LEFT, RIGHT):
            ub = units[1 - a]
            ev_pos = batches[a].ev_pos
            lo = np.searchsorted(ev_pos, ub.start, side="right")
            hi = np.searchsorted(ev_pos, ub.end, side="left")
            u_idx, e_idx = expand_ranges(lo, hi)
            pairs.append((e_idx, u_idx))
        if self.condition is not None:
            pairs = self._apply_condition(pairs, batches, units, sources)
        m.add("matches", sum(len(e) for e, _ in pairs))

        nmatch = [np.bincount(pairs[a][0], minlength=len(batches[a].ev_pos)).astype(_I64)
                  for a in (LEFT, RIGHT)]

        # associations of the outer sides' stored rows
        assoc_before: list[Optional[np.ndarray]] = [None, None]
        seg_final: list[Optional[np.ndarray]] = [None, None]
        written = [u.ent_written.copy() for u in units]
        for a in (LEFT, RIGHT):
            b_ = 1 - a
            if not self.outer[b_]:
                continue
            ub = units[b_]
            e_idx, u_idx = pairs[a]
            seg_init = np.where(ub.seg_event >= 0,
                                nmatch[b_][np.maximum(ub.seg_event, 0)] if len(nmatch[b_]) else 0,
                                ub.seg_stored).astype(_I64)
            seg = ub.segment_of(u_idx, batches[a].ev_pos[e_idx]) if len(u_idx) else u_idx
            nev = max(len(batches[a].ev_pos), 1)
            code = seg * nev + e_idx
            uniq, inv = np.unique(code, return_inverse=True)
            useg, uev = uniq // nev, uniq % nev
            delta = np.where(batches[a].ev_add[uev], 1, -1).astype(_I64)
            excl = grouped_exclusive_cumsum(delta, group_starts(useg))
            assoc_before[a] = (seg_init[useg] + excl)[inv] if len(uniq) else np.zeros(0, _I64)
            seg_final[b_] = seg_init + np.bincount(useg, weights=delta,
                                                   minlength=len(seg_init)).astype(_I64)
            written[b_][ub.ent[u_idx]] = True

        out = self._emit(n, side, kinds, is_add, batches, units, pairs, nmatch, assoc_before,
                         sources, ctx)
        old_ts = stcol(TS_COL, _I64)
        new_state = self._new_state(keyvals, key_first, units, st_rows, old_ts, sources,
                                    seg_final, written, now)
        m.add("rows_out", len(out))
        return new_state, out

    # -- condition ------------------------------------------------------------------
    def _apply_condition(self, pairs, batches, units, sources):
        L = self.layout
        lsrc, rsrc = [], []
        for a in (LEFT, RIGHT):
            e_idx, u_idx = pairs[a]
            ev_src = batches[a].ev_pos[e_idx]
            un_src = units[1 - a].src[u_idx]
            lsrc.append(ev_src if a == LEFT else un_src)
            rsrc.append(un_src if a == LEFT else ev_src)
        li, ri = np.concatenate(lsrc), np.concatenate(rsrc)
        if not len(li):
            return pairs
        ldf = frame({c: sources[LEFT][c][li] for c in L.left_columns}, pa.schema(L.left_fields))
        rdf = frame({c: sources[RIGHT][c][ri] for c in L.right_columns}, pa.schema(L.right_fields))
        ok = np.asarray(pd.Series(np.asarray(self.condition(ldf, rdf))).fillna(False), dtype=bool)
        if len(ok) != len(li):
            raise ValueError(f"join condition returned {len(ok)} values for {len(li)} pairs")
        n0 = len(pairs[0][0])
        return [(pairs[0][0][ok[:n0]], pairs[0][1][ok[:n0]]),
                (pairs[1][0][ok[n0:]], pairs[1][1][ok[n0:]])]

    # -- output ---------------------------------------------------------------------
    def _emit(self, n, side, kinds, is_add, batches, units, pairs, nmatch, assoc_before,
              sources, ctx) -> pd.DataFrame:
        I, D = int(RowKind.INSERT), int(RowKind.DELETE)
        # order of emission: (event position, unit of the match, sub-step); units are
        # sorted by (join key, arrival) (state_views), so their index is the match order
        nu = max(len(units[0].src), len(units[1].src)) + 1
        frag = {k: [] for k in ("l", "r", "kind", "order")}

        def add(l, r, kind, p, u, sub):
            frag["l"].append(l)
            frag["r"].append(r)
            frag["kind"].append(np.broadcast_to(np.asarray(kind, dtype=_I64), p.shape))
            frag["order"].append((p * nu + u) * 3 + (sub + 1))

        for a in (LEFT, RIGHT):
            b_ = 1 - a
            a_outer, b_outer = self.outer[a], self.outer[b_]
            ba, ub = batches[a], units[b_]
            e_idx, u_idx = pairs[a]
            p = ba.ev_pos[e_idx]
            usrc = ub.src[u_idx]
            e_add = ba.ev_add[e_idx]
            e_kind = kinds[p]
            none = np.full(len(p), -1, _I64)
            lr = (p, usrc) if a == LEFT else (usrc, p)
            null_b = (none, usrc) if a == LEFT else (usrc, none)
            # [row, other]
            pair_kind = np.where(e_add, I if (a_outer or b_outer) else e_kind,
                                 D if a_outer else e_kind)
            add(lr[0], lr[1], pair_kind, p, u_idx, 0)
            if b_outer:
                ab = assoc_before[a]
                sel = e_add & (ab == 0)          # -D[null, other] before the pair
                add(null_b[0][sel], null_b[1][sel], D, p[sel], u_idx[sel], -1)
                sel = ~e_add & (ab == 1)         # +I[null, other] after the pair
                add(null_b[0][sel], null_b[1][sel], I, p[sel], u_idx[sel], 1)
            if a_outer:
                # rows of side A without a match (a null join key never matches)
                unmatched = side == a
                unmatched[ba.ev_pos[nmatch[a] > 0]] = False
                sel = np.flatnonzero(unmatched)
                none = np.full(len(sel), -1, _I64)
                l, r = (sel, none) if a == LEFT else (none, sel)
                add(l, r, np.where(is_add[sel], I, D), sel, np.zeros(len(sel), _I64), 0)

        cat = {k: np.concatenate(v).astype(_I64) for k, v in frag.items()}
        order = np.argsort(cat["order"])          # keys are unique
        li, ri = cat["l"][order], cat["r"][order]
        L = self.layout
        data = {c: _take(sources[LEFT][c], li) for c in L.left_columns}
        data.update({c: _take(sources[RIGHT][c], ri) for c in L.right_columns})
        data[KIND_COL] = cat["kind"][order].astype(np.int8)
        data[SEQ_COL] = ctx.allocate_seq(len(order))
        return frame(data, self.output_schema)

    # -- state --------------------------------------------------------------------
    def _new_state(self, keyvals, key_first, units, st_rows, old_ts, sources, seg_final,
                   written, now) -> pd.DataFrame:
        L = self.layout
        parts = []
        for s in (LEFT, RIGHT):
            u = units[s]
            alive = np.flatnonzero(u.ent_alive)
            if not len(alive):
                continue
            k = len(alive)
            key_rows = key_first[u.ent_key[alive]]
            data = {c: keyvals[c][key_rows] for c in L.key_columns}
            data[SIDE_COL] = np.full(k, s, dtype=np.int8)
            src_idx = u.ent_src[alive]
            none = np.full(k, -1, _I64)
            for side_ in (LEFT, RIGHT):
                for c in L.side_columns(side_):
                    data[c] = _take(sources[side_][c], src_idx if side_ == s else none)
            data[CNT_COL] = u.ent_cnt[alive]
            data[ASSOC_COL] = (seg_final[s][u.ent_last_seg[alive]] if seg_final[s] is not None
                               else np.zeros(k, _I64))
            data[ARR_COL] = u.ent_arr[alive]
            st_idx = u.ent_state[alive]
            prev_ts = old_ts[st_rows[s][np.maximum(st_idx, 0)]] if len(st_rows[s]) else none
            data[TS_COL] = np.where(written[s][alive] | (st_idx < 0), now, prev_ts).astype(_I64)
            parts.append(data)
        if not parts:
            return self.empty_state()
        if len(parts) == 1:
            data = parts[0]
        else:
            data = {c: self._concat(c, [parts[0][c], parts[1][c]]) for c in self._state_schema.names}
        return frame(data, self._state_schema)


def _as_object_if_mixed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Concatenating a string column with an all-null float column must stay object."""
    if a.dtype != b.dtype and (a.dtype == object or b.dtype == object):
        return a.astype(object)
    return a


__all__ = ["JoinInputLayout", "RegularJoin", "SIDE_COL", "JOIN_TYPES"]
