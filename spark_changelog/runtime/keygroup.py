"""One call of an operator on one key group: the step every runtime shares."""
from __future__ import annotations

from typing import Optional

import pandas as pd

from ..model import SEQ_COL
from ..operators.base import KeyedOperator, OpContext
from ..operators.keys import distinct_keys
from .state_runs import RunStack


def sort_rows(rows: pd.DataFrame, key) -> pd.DataFrame:
    """Per-key order comes from ``_seq`` only (stable for equal ``_seq``), never
    from arrival order: shuffles do not keep it (spec section 2)."""
    return rows.sort_values(list(key) + [SEQ_COL], kind="stable").reset_index(drop=True)


def process_key_group(operator: KeyedOperator, stack: Optional[RunStack], rows: pd.DataFrame,
                      ctx: OpContext) -> pd.DataFrame:
    """Sort, look up the touched keys' state, run the operator, record the new
    state of exactly those keys as a run.  ``stack=None``: no earlier state and
    nothing to keep (a bounded input processed in one go)."""
    if rows.empty:
        return operator.empty_output()
    rows = sort_rows(rows, operator.key)
    touched = distinct_keys(rows, operator.key)
    state_in = stack.lookup(touched) if stack is not None else None
    if state_in is None:
        state_in = operator.empty_state()
    new_state, out = operator.process(state_in, rows, ctx)
    if stack is not None:
        stack.push(stack.new_run(touched, new_state), retain=lambda df: operator.retain(df, ctx))
    return out
