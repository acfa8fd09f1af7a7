"""The window aggregate (docs/windows.md, "Window aggregate").

Input: insert-only rows that went through a window projection
(:mod:`spark_changelog.model.windows`: TUMBLE, HOP, CUMULATE), so every row carries its
``window_start`` / ``window_end``.  The operator's key is the GROUP BY
columns and the window end; each key is one window of one group.

State per key: the *multiset* of the aggregated columns' values (one state
row per distinct value tuple, with its multiplicity ``_n``) and whether the
window has fired.  Aggregates are evaluated over the multiset when a window
fires, so count distinct, min and max need no extra structure, and a re-fire
can retract the previous result by evaluating the multiset before the change.

The aggregate functions are the shared retracting accumulators
(:mod:`spark_changelog.operators.aggregate.accumulators`), fed with the
multiset (a value's multiplicity as its sign), so windows and GROUP BY agree
on every function and result type.  ``FIRST_VALUE``/``LAST_VALUE`` need
arrival order, which a multiset does not keep: not offered here.

Timing (rows are judged by the watermark at their arrival,
``ctx.arrival_watermark``; windows fire at ``ctx.watermark_ms``):

* a window fires (``+I`` of its result) once the watermark reaches
  ``end - 1``;
* with ``allowed_lateness_ms`` it stays open until the watermark reaches
  ``end - 1 + allowed_lateness``: a row arriving meanwhile re-fires it at
  once as ``-U`` old result, ``+U`` new result;
* a row whose window is past that point is *late*: it goes to the late-data
  output (the row, its window, the watermark at its arrival, the reason) and
  is counted (``late_rows``); nothing is dropped silently.  Lateness is per
  window, as in Flink's window operator: a row behind the watermark whose
  window has not fired yet is simply added to it.

The event-time runtime calls :meth:`process` once per batch with both
watermarks: the one at the rows' arrival (before their micro-batch) judges
lateness, the one after the batch fires windows, so a window opened and fired
within one batch never enters the state; ``on_watermark`` fires windows of
key groups without rows.  An end of input is the watermark
``END_OF_INPUT_MS`` (everything fires, nothing is late).
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from ...model import KIND_COL, SEQ_COL, RowKind
from ..aggregate.accumulators import AggregateOverflow, Contributions, make_accumulator
from ..base import KeyedOperator, OpContext
from ..kernels import key_codes, rows_equal, stable_order
from ..keys import GLOBAL_KEY, key_index

WINDOW_START = "window_start"
WINDOW_END = "window_end"
COUNT_COL = "_n"
FIRED_COL = "_fired"

_FUNCS = ("count", "count_distinct", "sum", "avg", "min", "max")


@dataclasses.dataclass(frozen=True)
class AggCall:
    """One aggregate: ``func(column) AS name``; ``column=None`` is ``COUNT(*)``."""

    name: str
    func: str
    column: Optional[str] = None

    def __post_init__(self):
        if self.func not in _FUNCS:
            raise ValueError(f"aggregate {self.func!r} is not supported by the window aggregate "
                             f"(supported: {', '.join(_FUNCS)})")
        if self.column is None and self.func != "count":
            raise ValueError(f"{self.func} needs a column")

    def describe(self) -> str:
        inner = "*" if self.column is None else self.column
        if self.func == "count_distinct":
            return f"COUNT(DISTINCT {inner}) AS {self.name}"
        return f"{self.func.upper()}({inner}) AS {self.name}"


def ms_of(col: pd.Series) -> np.ndarray:
    """Epoch milliseconds of a timestamp column (tz-aware or naive UTC)."""
    if pd.api.types.is_integer_dtype(col.dtype):
        return col.to_numpy(dtype=np.int64)
    arr = col.array if pd.api.types.is_datetime64_any_dtype(col.dtype) else \
        pd.to_datetime(col, utc=True).array
    per_ms = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}[arr.unit]
    raw = arr.asi8
    nat = raw == np.iinfo(np.int64).min
    ms = raw * 1000 if per_ms is None else np.floor_divide(raw, per_ms)
    return np.where(nat, np.iinfo(np.int64).min, ms)


def timestamps(ms: np.ndarray) -> pd.Series:
    return pd.Series(pd.to_datetime(np.asarray(ms, dtype=np.int64), unit="ms", utc=True))


class WindowAggregate(KeyedOperator):
    """GROUP BY keys + window bounds over a window projection (module docstring)."""

    name = "WindowAggregate"

    def __init__(self, input_schema: pa.Schema, group_keys: Sequence[str],
                 aggregates: Sequence[AggCall], *, allowed_lateness_ms: int = 0,
                 time_column: Optional[str] = None):
        keys = tuple(group_keys) + (WINDOW_START, WINDOW_END)
        super().__init__(input_schema, self._operator_key(tuple(group_keys)))
        self.group_keys = tuple(group_keys)
        #: what identifies one window's state and result
        self.window_key = keys
        self.aggregates = tuple(aggregates)
        self.allowed_lateness_ms = int(allowed_lateness_ms)
        self.time_column = time_column
        if self.allowed_lateness_ms < 0:
            raise ValueError("allowed lateness must not be negative")
        cols = []
        for a in self.aggregates:
            if a.column is not None and a.column not in input_schema.names:
                raise ValueError(f"{self.name}: aggregate column {a.column!r} not in input "
                                 f"{input_schema.names}")
            if a.column is not None and a.column not in cols and a.column not in keys:
                cols.append(a.column)
        #: the shared accumulators evaluating each aggregate over a multiset
        self.accumulators = [make_accumulator(a.func, a.name, a.column, input_schema)
                             for a in self.aggregates]
        names = [a.name for a in self.aggregates]
        clash = sorted({n for n in names if names.count(n) > 1 or n in keys})
        if clash:
            raise ValueError(f"{self.name}: output column name(s) {clash} used twice")
        #: the columns whose distinct value tuples the state keeps
        self.value_columns = tuple(cols)
        # the state starts with the operator's key (runtime contract), then the
        # rest of the window bounds
        state_keys = list(self.key) + [k for k in keys if k not in self.key]
        self._state_schema = pa.schema(
            [input_schema.field(k) for k in state_keys] + [input_schema.field(c) for c in cols]
            + [pa.field(COUNT_COL, pa.int64()), pa.field(FIRED_COL, pa.bool_())])
        out = [input_schema.field(k) for k in keys]
        for acc in self.accumulators:
            out.append(pa.field(acc.output, acc.result_type))
        out += [pa.field(KIND_COL, pa.int8()), pa.field(SEQ_COL, pa.int64())]
        self._output_schema = pa.schema(out)

    @staticmethod
    def _operator_key(group_keys: tuple) -> tuple:
        """Each key is one window: the group keys and the window end (TUMBLE,
        HOP and CUMULATE windows of one group never share an end; one
        timestamp column instead of both bounds keeps the runtime's key
        handling on its fast single-column path when there are no group keys)."""
        return group_keys + (WINDOW_END,)

    def describe(self) -> str:
        aggs = ", ".join(a.describe() for a in self.aggregates)
        return (f"{self.name}(groupBy=[{', '.join(self.window_key)}], select=[{aggs}], "
                f"allowedLateness={self.allowed_lateness_ms} ms)")

    # -- timing -----------------------------------------------------------------
    @property
    def uses_watermark(self) -> bool:
        return True

    def _fire_ms(self, frame: pd.DataFrame) -> np.ndarray:
        return ms_of(frame[WINDOW_END]) - 1

    def pending_times(self, state: pd.DataFrame) -> np.ndarray:
        """Unfired windows wait for ``end - 1``, fired ones (allowed lateness)
        for ``end - 1 + lateness``, when their state goes."""
        if state.empty:
            return np.zeros(0)
        fire = self._fire_ms(state).astype(np.float64)
        fired = state[FIRED_COL].to_numpy(dtype=bool)
        return np.where(fired, fire + self.allowed_lateness_ms, fire)

    def due(self, state: pd.DataFrame, ctx: OpContext) -> np.ndarray:
        if state.empty or ctx.watermark_ms is None:
            return np.zeros(len(state), dtype=bool)
        return self.pending_times(state) <= ctx.watermark_ms

    # -- the step -----------------------------------------------------------------
    def process(self, state: pd.DataFrame, rows: pd.DataFrame, ctx: OpContext
                ) -> tuple[pd.DataFrame, pd.DataFrame]:
        kinds = rows[KIND_COL].to_numpy(dtype=np.int64)
        bad = kinds != RowKind.INSERT.value
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"{self.name} accepts insert-only input; got a {RowKind(int(kinds[i])).short} "
                f"row: {rows.iloc[i].drop([KIND_COL]).to_dict()} (normalize or aggregate the "
                f"changelog first)")
        wm = ctx.arrival_watermark
        no_time = rows[WINDOW_END].isna().to_numpy()
        if no_time.any():
            self._late(rows[no_time], ctx, "the event time is null: the row falls in no window")
            rows = rows[~no_time]
        if wm is not None and len(rows):
            closed = self._fire_ms(rows) + self.allowed_lateness_ms <= wm
            if closed.any():
                self._late(rows[closed], ctx, "window closed: its end - 1 ms" + (
                    " + allowed lateness" if self.allowed_lateness_ms else "")
                    + " is at or before the watermark at the row's arrival")
                rows = rows[~closed]
        ctx.metrics.add("rows_in", int((~bad).sum()))
        return self._step(state, rows, ctx)

    def on_watermark(self, state: pd.DataFrame, ctx: OpContext
                     ) -> tuple[pd.DataFrame, pd.DataFrame]:
        return self._step(state, rows=None, ctx=ctx)

    def _late(self, rows: pd.DataFrame, ctx: OpContext, reason: str) -> None:
        """Late rows go to the late output (side-row channel), counted."""
        ctx.metrics.add("late_rows", len(rows))
        # a session window without group keys is keyed on a hidden constant: not the row's
        data = rows.drop(columns=[KIND_COL, SEQ_COL, WINDOW_START, WINDOW_END]
                         + [c for c in rows.columns if c == GLOBAL_KEY])
        bounds = [[None if pd.isna(v) else int(v.value // 1_000_000) for v in rows[c]]
                  for c in (WINDOW_START, WINDOW_END)]
        seqs = rows[SEQ_COL].tolist()
        times = (ms_of(rows[self.time_column]).tolist() if self.time_column in rows.columns
                 else [None] * len(rows))
        for i, rec in enumerate(data.to_dict("records")):
            ctx.metrics.side("late", {
                "operator": self.name, "row": {k: _plain(v) for k, v in rec.items()},
                "event_time_ms": None if times[i] is None or times[i] == np.iinfo(np.int64).min
                else int(times[i]),
                "window_start_ms": bounds[0][i], "window_end_ms": bounds[1][i],
                "watermark_ms": ctx.arrival_watermark, "seq": int(seqs[i]), "reason": reason})

    def _step(self, state: pd.DataFrame, rows: Optional[pd.DataFrame], ctx: OpContext):
        key = list(self.window_key)
        vals = list(self.value_columns)
        wm = ctx.watermark_ms
        if rows is not None and len(rows):
            added = rows[key + vals].copy()
            added[COUNT_COL] = np.int64(1)
            added[FIRED_COL] = False
            touched_keys = key_index(rows, key).unique()
        else:
            added = None
            touched_keys = None
        old = state
        if added is not None:
            both = pd.concat([old, added], ignore_index=True) if len(old) else added
            new = self._fold(both)
        else:
            new = old.reset_index(drop=True)
        out = []
        # windows that fired before and got rows now (allowed lateness): -U old, +U new
        if touched_keys is not None and len(old):
            old_fired = old[old[FIRED_COL].to_numpy(dtype=bool)]
            if len(old_fired):
                hit = np.asarray(key_index(old_fired, key).isin(touched_keys), dtype=bool)
                if hit.any():
                    before = old_fired[hit]
                    after = new[np.asarray(key_index(new, key).isin(key_index(before, key)),
                                           dtype=bool)]
                    out.append(self._refire(before, after))
        # windows the watermark has reached and that have not fired: +I
        if wm is not None and len(new):
            fire_ms = self._fire_ms(new)
            fired = new[FIRED_COL].to_numpy(dtype=bool)
            now = ~fired & (fire_ms <= wm)
            if now.any():
                out.append(self._results(new[now], RowKind.INSERT))
                new.loc[now, FIRED_COL] = True
            # state goes once no row can reach the window any more
            gone = fire_ms + self.allowed_lateness_ms <= wm
            if gone.any():
                ctx.metrics.add("windows_closed", int(key_index(new[gone], key).nunique()))
                new = new[~gone].reset_index(drop=True)
        output = self._concat_output(out, ctx)
        return new[list(self.state_schema.names)], output

    def _fold(self, multiset: pd.DataFrame) -> pd.DataFrame:
        """One row per window and value tuple (multiplicities summed); a
        window has fired or not as a whole."""
        cols = list(self.window_key) + list(self.value_columns)
        codes, n = key_codes(multiset, cols)
        _, first = np.unique(codes, return_index=True)
        out = multiset[cols].take(first).reset_index(drop=True)
        out[COUNT_COL] = np.bincount(codes, weights=multiset[COUNT_COL].to_numpy(np.float64),
                                     minlength=n).astype(np.int64)
        fired = np.bincount(codes, weights=multiset[FIRED_COL].to_numpy(dtype=bool),
                            minlength=n) > 0
        wcodes, wn = key_codes(out, list(self.window_key))
        out[FIRED_COL] = (np.bincount(wcodes, weights=fired, minlength=wn) > 0)[wcodes]
        return out

    # -- results ----------------------------------------------------------------------
    def _results(self, multiset: pd.DataFrame, kind: RowKind) -> pd.DataFrame:
        """One result row per window of ``multiset``, ordered by window end,
        start, then keys (the order the watermark reaches them)."""
        key = list(self.window_key)
        codes, n = key_codes(multiset, key)
        _, first = np.unique(codes, return_index=True)
        res = multiset[key].take(first).reset_index(drop=True)
        rows = Contributions(codes, multiset[COUNT_COL].to_numpy(dtype=np.int64),
                             np.arange(len(multiset), dtype=np.int64),
                             multiset.reset_index(drop=True), n)
        for acc in self.accumulators:
            try:
                res[acc.output] = acc.result(acc.update(acc.empty(n), rows), n)
            except AggregateOverflow as e:
                raise e.naming(res, key) from None
        res[KIND_COL] = np.int8(kind.value)
        order = stable_order(res, [WINDOW_END, WINDOW_START] + list(self.group_keys))
        return res.take(order).reset_index(drop=True)

    def _refire(self, before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
        old = self._results(before, RowKind.UPDATE_BEFORE)
        new = self._results(after, RowKind.UPDATE_AFTER)
        cols = [c for c in old.columns if c != KIND_COL]
        changed = ~rows_equal(old, new, cols)
        old, new = old[changed], new[changed]
        both = pd.concat([old, new], ignore_index=True)
        # -U then +U per window
        pos = np.concatenate([np.arange(len(old)) * 2, np.arange(len(new)) * 2 + 1])
        return both.take(np.argsort(pos, kind="stable")).reset_index(drop=True)

    def _concat_output(self, parts, ctx: OpContext) -> pd.DataFrame:
        parts = [p for p in parts if len(p)]
        if not parts:
            return self.empty_output()
        out = pd.concat(parts, ignore_index=True)
        ctx.metrics.add("windows_fired", int((out[KIND_COL] == RowKind.INSERT.value).sum()))
        ctx.metrics.add("windows_refired", int((out[KIND_COL] == RowKind.UPDATE_AFTER.value).sum()))
        out[SEQ_COL] = ctx.allocate_seq(len(out))
        return out[list(self.output_schema.names)]


class SessionWindowAggregate(WindowAggregate):
    """GROUP BY keys over SESSION windows (docs/windows.md, "Sessions").

    The operator's key is the group keys (they must not be empty: a session
    window without group keys is lowered with a constant hidden key column,
    ``operators.keys.GLOBAL_KEY``, which late-output records leave out); the
    projection gave each row ``[t, t + gap)``.  Per key, a batch's rows and
    the open sessions in state merge where they overlap or touch
    (:func:`~spark_changelog.model.windows.merge_sessions`); a merged session takes the union of
    the multisets.  A session that had fired (allowed lateness) and grows is
    retracted (``-D`` of its result: its bounds are part of the output key)
    and fires again as a new window when the watermark reaches its new end.
    A row is late when the session it would end up in is closed.
    """

    name = "SessionWindowAggregate"

    @staticmethod
    def _operator_key(group_keys: tuple) -> tuple:
        if not group_keys:
            raise ValueError(f"{SessionWindowAggregate.name} is keyed by its group keys "
                             "(sessions merge per key): without any, key it on a constant "
                             f"column ({GLOBAL_KEY!r}, what the lowering adds)")
        return group_keys

    def process(self, state, rows, ctx):
        no_time = rows[WINDOW_END].isna().to_numpy()
        kinds = rows[KIND_COL].to_numpy(dtype=np.int64)
        if (kinds != RowKind.INSERT.value).any() or no_time.any():
            return super().process(state, rows, ctx)   # errors and null times: one place
        state, rows, retracted = self._merge(state, rows, ctx)
        new_state, out = super().process(state, rows, ctx)
        if len(retracted):
            ctx.metrics.add("sessions_retracted", len(retracted))
            out = pd.concat([retracted, out.drop(columns=SEQ_COL)], ignore_index=True)
            out[SEQ_COL] = ctx.allocate_seq(len(out))
            out = out[list(self.output_schema.names)]
        return new_state, out

    def _merge(self, state: pd.DataFrame, rows: pd.DataFrame, ctx: OpContext):
        """Rewrite the window bounds of state and rows to the merged sessions
        and return the ``-D`` rows of fired sessions that grew.  A row whose
        merged session is closed is late (``process`` sends it to the late
        output); such a session holds new rows only (state sessions are all
        still open), so leaving them out changes no stored session."""
        from ...model.windows import merge_sessions
        gk = list(self.group_keys)
        both = pd.concat([state[gk + [WINDOW_START, WINDOW_END]].assign(__src=0),
                          rows[gk + [WINDOW_START, WINDOW_END]].assign(__src=1)],
                         ignore_index=True)
        start, end = ms_of(both[WINDOW_START]), ms_of(both[WINDOW_END])
        from_rows = both["__src"].to_numpy() == 1
        group = key_index(both, gk).factorize()[0]
        sid = merge_sessions(np.asarray(group, dtype=np.int64), start, end)
        new_start = pd.Series(start).groupby(sid).transform("min").to_numpy()
        new_end = pd.Series(end).groupby(sid).transform("max").to_numpy()
        ns, ne = new_start[~from_rows], new_end[~from_rows]
        moved = (ns != start[~from_rows]) | (ne != end[~from_rows])
        retracted = self.empty_output().drop(columns=SEQ_COL)
        state = state.copy()
        if moved.any():
            grown = state[moved & state[FIRED_COL].to_numpy(dtype=bool)]
            if len(grown):
                retracted = self._results(grown, RowKind.DELETE)
            state[WINDOW_START] = timestamps(ns).to_numpy()
            state[WINDOW_END] = timestamps(ne).to_numpy()
            # a grown session is a new window: not fired yet
            state.loc[moved, FIRED_COL] = False
            state = self._fold(state)
        rows = rows.copy()
        rows[WINDOW_START] = timestamps(new_start[from_rows]).to_numpy()
        rows[WINDOW_END] = timestamps(new_end[from_rows]).to_numpy()
        return state, rows, retracted


def _plain(v):
    if isinstance(v, pd.Timestamp):
        return v.isoformat()
    if isinstance(v, np.generic):
        return v.item()
    if v is pd.NaT or (isinstance(v, float) and np.isnan(v)):
        return None
    return v


__all__ = ["WindowAggregate", "SessionWindowAggregate", "AggCall", "WINDOW_START", "WINDOW_END", "ms_of", "timestamps"]
