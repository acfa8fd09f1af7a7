"""One call of an operator on one key group: the step every runtime shares."""
from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from ..model import KIND_COL, SEQ_COL
from ..model.rowkind import IS_ADD
from ..operators.base import KeyedOperator, OpContext
from ..operators.kernels import break_ties, stable_order_ties
from ..operators.keys import distinct_keys
from .state_runs import RunStack, concat_rows


def sort_rows(rows: pd.DataFrame, key) -> pd.DataFrame:
    """A key group's rows in one total order, never arrival order (shuffles
    do not keep it, docs/semantics.md section 2): by key, then ``_seq``, and
    rows that tie on both retractions first (``-U`` before ``+U``, the order
    an update's halves sharing one ``_seq`` come in, model/schema.py), then by
    ``_kind``, then by all other columns, in their order (docs/runtime.md,
    "Replay is deterministic").  Rows already in order are only checked,
    not sorted again; only tied rows are looked at for the tie-breaker."""
    columns = list(key) + [SEQ_COL]
    rows = rows.reset_index(drop=True)
    tied = sorted_ties(rows, columns)
    if tied is None:
        order, tied = stable_order_ties(rows, columns)
    elif not tied.any():
        return rows
    else:
        order = np.arange(len(rows))
    if tied.any():
        ties = [c for c in rows.columns if c not in columns and c != KIND_COL]
        kind = rows[KIND_COL].to_numpy(dtype=np.int64)
        order = break_ties(rows, order, tied, ties, leading=(IS_ADD[kind], kind))
    return rows.take(order).reset_index(drop=True)


def sorted_ties(rows: pd.DataFrame, columns) -> Optional[np.ndarray]:
    """``None`` unless ``rows`` are in ascending lexicographic order of
    ``columns`` (vectorized; a null or incomparable value answers None); else
    ``tied``: ``tied[i]`` when row ``i + 1`` equals row ``i`` on every column."""
    if len(rows) < 2:
        return np.zeros(max(len(rows) - 1, 0), dtype=bool)
    ahead = np.zeros(len(rows) - 1, dtype=bool)    # strictly greater on an earlier column
    tied = np.ones(len(rows) - 1, dtype=bool)
    try:
        for c in columns:
            col = rows[c]
            if isinstance(col.dtype, pd.DatetimeTZDtype):
                # to_numpy() would box every value as a Timestamp object
                if col.isna().any():
                    return None
                v = col.array.asi8
            else:
                v = col.to_numpy()
            if v.dtype == object or v.dtype.kind == "f":
                if pd.isna(v).any():
                    return None
            prev, cur = v[:-1], v[1:]
            if not np.all(ahead | ~tied | (cur >= prev)):
                return None
            ahead |= tied & (cur > prev)
            tied &= cur == prev
    except TypeError:
        return None
    return tied


def process_key_group(operator: KeyedOperator, stack: Optional[RunStack], rows: pd.DataFrame,
                      ctx: OpContext, ordered: bool = False) -> pd.DataFrame:
    """Sort, look up the touched keys' state, run the operator, record the new
    state of exactly those keys as a run.  ``stack=None``: no earlier state and
    nothing to keep (a bounded input processed in one go).  ``ordered``: the
    rows' order is already deterministic (an earlier chained operator's
    output, never arrival order); an operator that orders its rows itself
    (``orders_own_rows``) then takes them in it, unsorted.

    For an operator that waits for the watermark, the keys of the group whose
    state the watermark ``ctx.watermark_ms`` made due are handed over too (with
    their state, without rows): one call and one run per batch, instead of a
    second pass by the timer."""
    if rows.empty:
        return operator.empty_output()
    if not (ordered and operator.orders_own_rows):
        rows = sort_rows(rows, operator.key)
    touched = distinct_keys(rows, operator.key)
    if operator.uses_watermark and stack is not None and ctx.watermark_ms is not None:
        due = stack.live_where(lambda r: operator.due(r, ctx))
        if len(due):
            touched = distinct_keys(concat_rows([touched, due[list(operator.key)]]),
                                    operator.key)
    state_in = stack.lookup(touched) if stack is not None else None
    if state_in is None:
        state_in = operator.empty_state()
    new_state, out = operator.process(state_in, rows, ctx)
    if stack is not None:
        stack.push(stack.new_run(touched, new_state), retain=lambda df: operator.retain(df, ctx))
    return out


def fire_watermark(operator: KeyedOperator, stack: RunStack, ctx: OpContext) -> pd.DataFrame:
    """The watermark timer of one key group: ``on_watermark`` for the keys with
    state rows the watermark ``ctx.watermark_ms`` has passed (keys that got
    input were already handled by ``process``), their new state recorded as a
    run.  Returns the output."""
    if ctx.watermark_ms is None or not stack.runs:
        return operator.empty_output()
    due = stack.live_where(lambda rows: operator.due(rows, ctx))
    if due.empty:
        return operator.empty_output()
    keys = distinct_keys(due, operator.key)
    state_in = stack.lookup(keys)
    new_state, out = operator.on_watermark(state_in, ctx)
    stack.push(stack.new_run(keys, new_state), retain=lambda df: operator.retain(df, ctx))
    return out
