"""One micro-batch of an operator that keeps its own watermarks (docs/windows.md).

Every runtime runs an event-time operator (the window aggregate) the same way:

1. the batch's rows prove progress per source partition
   (:func:`batch_progress`: the watermark generator's ``on_events``, maximum
   per partition);
2. the periodic tick (:func:`~spark_changelog.model.partition_watermarks.advance`)
   moves the per-partition watermarks, idleness and the combined watermark;
3. the rows are processed in one operator call with two watermarks: the one
   *before* the batch (current at their arrival: it decides what is late,
   ``OpContext.arrival_watermark_ms``) and the combined watermark *after*
   the batch, at which due state fires (a window whose rows all arrive in
   the batch that passes its end is fired without ever being stored).

The Spark runtime (:mod:`.spark_event_time`) runs 2-3 once per key group
with a copy of the watermark state in each key group's checkpointed state;
:class:`LocalEventTimeRunner` runs them in-process (tests, the reference).
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

import pandas as pd
import pyarrow as pa

from ..model.partition_watermarks import (FILE_PARTITIONS, EventTimeSpec,
                                          PartitionWatermarks, advance, summarize)
from ..model.watermark import END_OF_INPUT_MS
from ..model.windows import event_ms_of
from ..operators.base import KeyedOperator, Metrics, OpContext
from ..operators.kernels import arrow_to_pandas
from .keygroup import fire_watermark, process_key_group
from .state_runs import RunStack


def batch_progress(table: pa.Table, spec: EventTimeSpec,
                   partitions: Optional[Sequence] = None) -> pd.DataFrame:
    """Per source partition, the progress a batch (or a piece of it) proves.
    ``partitions``: each row's partition (default: ``spec.partition``'s
    column, or one partition)."""
    ev = event_ms_of(table.column(spec.column))
    progress = spec.generator.on_events(ev, table)
    if partitions is None:
        if spec.partition is None:
            partitions = pa.nulls(table.num_rows, pa.string())
        elif spec.partition == FILE_PARTITIONS:
            raise ValueError("per-file watermarks need each row's file (the Spark runtime "
                             "passes it)")
        else:
            partitions = [None if v is None else str(v)
                          for v in table.column(spec.partition).to_pylist()]
    return summarize(partitions, progress)


def run_event_time_batch(operator: KeyedOperator, stack: RunStack, rows: pd.DataFrame,
                         watermarks: PartitionWatermarks, progress: Optional[pd.DataFrame],
                         spec: EventTimeSpec, processing_time_ms: int, next_seq: int,
                         end_of_input: bool = False
                         ) -> tuple[pd.DataFrame, PartitionWatermarks, OpContext]:
    """Steps 2-4 of the module docstring for one key group.  ``progress``:
    the whole batch's :func:`batch_progress` (``None``: no tick, e.g. a
    replayed state read).  Returns the output, the new watermark state and
    the context (metrics, ``next_seq``, ``watermark_ms`` after the batch)."""
    before = watermarks.combined_or_none
    if progress is not None:
        watermarks = advance(watermarks, progress, processing_time_ms, spec)
    after = END_OF_INPUT_MS if end_of_input else watermarks.combined_or_none
    ctx = OpContext(processing_time_ms=processing_time_ms, watermark_ms=after, next_seq=next_seq,
                    arrival_watermark_ms=before, arrival_differs=True)
    if len(rows):
        # fires the group's due keys too (process_key_group hands them over)
        out = process_key_group(operator, stack, rows, ctx)
    elif after is not None and after != before:
        out = fire_watermark(operator, stack, ctx)
    else:
        out = operator.empty_output()
    return out, watermarks, ctx


class LocalEventTimeRunner:
    """An event-time operator over pandas/Arrow micro-batches in this process,
    with the window projection (if any) applied first: the reference the
    Spark runtime is tested against."""

    def __init__(self, operator: KeyedOperator, spec: EventTimeSpec, projection=None):
        self.operator = operator
        self.spec = spec
        self.projection = projection      # Arrow table -> projected Arrow table
        self.stack = RunStack(operator.key)
        self.watermarks = PartitionWatermarks.empty()
        self.next_seq = 0
        self.metrics = Metrics()

    def run_batch(self, rows: pa.Table, processing_time_ms: Optional[int] = None,
                  partitions: Optional[Sequence] = None) -> pd.DataFrame:
        now = int(time.time() * 1000) if processing_time_ms is None else processing_time_ms
        progress = batch_progress(rows, self.spec, partitions)
        projected = rows
        if self.projection is not None:
            projected = self.projection(rows)
        from .keyed_rows import utc_timestamps
        pdf = utc_timestamps(arrow_to_pandas(projected), None)
        out, self.watermarks, ctx = run_event_time_batch(
            self.operator, self.stack, pdf, self.watermarks, progress, self.spec, now,
            self.next_seq)
        self.next_seq = ctx.next_seq
        self.metrics.merge(ctx.metrics)
        return out.reset_index(drop=True)

    def end_of_input(self) -> pd.DataFrame:
        """Flink's end-of-input watermark: every open window fires."""
        empty = self.operator.empty_output().iloc[0:0]
        out, self.watermarks, ctx = run_event_time_batch(
            self.operator, self.stack, pd.DataFrame(), self.watermarks, None, self.spec, 0,
            self.next_seq, end_of_input=True)
        self.next_seq = ctx.next_seq
        self.metrics.merge(ctx.metrics)
        return out.reset_index(drop=True) if len(out) else empty

    @property
    def late_rows(self) -> list:
        return self.metrics.side_rows.get("late", [])


__all__ = ["batch_progress", "run_event_time_batch", "LocalEventTimeRunner"]
