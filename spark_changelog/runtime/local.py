"""Local runtime: runs an operator over pandas micro-batches in this process.

Used by tests to drive operators without Spark, and as the simplest executable
statement of the runtime contract in ``operators.base``: sort by key and
``_seq``, hand the operator the state of the touched keys, replace exactly
those keys' state with what it returns.
"""
from __future__ import annotations

import time
from typing import Iterable, Optional

import pandas as pd

from ..model import SEQ_COL
from ..operators.base import KeyedOperator, Metrics, OpContext
from ..operators.keys import distinct_keys, rows_with_keys
from .keygroup import sort_rows
from .state_runs import concat_rows


class LocalRunner:
    """Keeps one operator's state in memory across ``run_batch`` calls."""

    def __init__(self, operator: KeyedOperator):
        self.operator = operator
        self.state = operator.empty_state()
        self.metrics = Metrics()
        self.next_seq = 0

    def run_batch(self, rows: pd.DataFrame, processing_time_ms: Optional[int] = None,
                  watermark_ms: Optional[int] = None) -> pd.DataFrame:
        op = self.operator
        ctx = OpContext(processing_time_ms=int(time.time() * 1000) if processing_time_ms is None
                        else processing_time_ms, watermark_ms=watermark_ms,
                        next_seq=self.next_seq)
        if rows.empty:
            return op.empty_output()
        rows = sort_rows(rows, op.key)
        touched = distinct_keys(rows, op.key)
        mask = rows_with_keys(self.state, op.key, touched)
        state_in = self.state[mask].reset_index(drop=True)
        new_state, out = op.process(state_in, rows, ctx)
        kept = self.state[~mask]
        self.state = concat_rows([kept, new_state])
        self.metrics.merge(ctx.metrics)
        self.next_seq = ctx.next_seq
        return out.reset_index(drop=True)

    def advance_watermark(self, watermark_ms: int, processing_time_ms: Optional[int] = None
                          ) -> pd.DataFrame:
        """What the Spark runtime's watermark timer does: ``on_watermark`` for
        the keys whose state the watermark has passed (``fire_watermark``)."""
        op = self.operator
        ctx = OpContext(processing_time_ms=int(time.time() * 1000) if processing_time_ms is None
                        else processing_time_ms, watermark_ms=watermark_ms,
                        next_seq=self.next_seq)
        due = op.due(self.state, ctx)
        if not due.any():
            return op.empty_output()
        mask = rows_with_keys(self.state, op.key, distinct_keys(self.state[due], op.key))
        new_state, out = op.on_watermark(self.state[mask].reset_index(drop=True), ctx)
        self.state = concat_rows([self.state[~mask], new_state])
        self.next_seq = ctx.next_seq
        self.metrics.merge(ctx.metrics)
        return out.reset_index(drop=True)

    def run(self, batches: Iterable[pd.DataFrame], **kw) -> pd.DataFrame:
        outs = [self.run_batch(b, **kw) for b in batches]
        outs = [o for o in outs if len(o)]
        return pd.concat(outs, ignore_index=True) if outs else self.operator.empty_output()


def one_row_at_a_time(operator: KeyedOperator, rows: pd.DataFrame, **kw) -> pd.DataFrame:
    """Feed rows one per batch, in ``_seq`` order: the semantics every batching
    must equal.  Rows of one key with equal ``_seq`` come in the order a batch
    sorts them in (``sort_rows``: retractions first, then by value)."""
    runner = LocalRunner(operator)
    ordered = sort_rows(rows, operator.key).sort_values(SEQ_COL, kind="stable")
    return runner.run((ordered.iloc[[i]] for i in range(len(ordered))), **kw)


__all__ = ["LocalRunner", "one_row_at_a_time", "sort_rows"]
