"""The one runtime step that generates watermarks at the source
(docs/windows.md, "Watermarks from the source"; the model is
:mod:`spark_changelog.model.source_watermarks`).

Where a stream declares its watermark (``with_watermark`` / ``WATERMARK
FOR``), one Arrow pass keeps every row and adds, per piece of a micro-batch
(an Arrow batch of a Spark task), one watermark row per source partition:
the generator's watermark over the piece's rows.  The watermark rows then
travel with the stream as side rows, so what a filter, projection, join or
union does to the data rows does not change them, and every event-time
operator downstream folds the same watermarks (the minimum over its inputs'
partitions, idle partitions left out).  Spark's processing of the side rows
costs a few rows per task and micro-batch.
"""
from __future__ import annotations

from typing import Iterator, Optional

import numpy as np
import pyarrow as pa

from ..model import KIND_COL, METRICS_COL, METRICS_KIND
from ..model.partition_watermarks import summarize
from ..model.source_watermarks import watermark_payloads
from ..model.watermark import WatermarkGenerator
from ..model.windows import event_ms_of
from .keyed_rows import arrow_schema_of, spark_schema


def watermark_rows(data: pa.Table, generator: WatermarkGenerator, source: str,
                   partition: Optional[str], schema: pa.Schema) -> Optional[pa.RecordBatch]:
    """The watermark rows (``schema``'s columns, null but ``_kind`` and the
    payload) of one piece: ``data``, a piece's data rows (no side rows), or
    None when it has none.  ``generator`` keeps its own state across the
    pieces of a task."""
    if not data.num_rows:
        return None
    progress = generator.on_events(event_ms_of(data.column(generator.column)), data)
    parts = (data.column(partition).cast(pa.string()) if partition is not None
             else pa.nulls(data.num_rows, pa.string()))
    payloads = watermark_payloads(source, summarize(parts, progress), generator)
    n = len(payloads)
    cols = []
    for f in schema:
        if f.name == KIND_COL:
            cols.append(pa.array(np.full(n, METRICS_KIND), f.type))
        elif f.name == METRICS_COL:
            cols.append(pa.array(payloads, pa.string()))
        else:
            cols.append(pa.nulls(n, f.type))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def _data_rows(t: pa.Table) -> pa.Table:
    """``t`` without its side rows."""
    kinds = t.column(KIND_COL).to_numpy(zero_copy_only=False)
    is_data = kinds != METRICS_KIND
    return t if is_data.all() else t.filter(pa.array(is_data))


def _generate(generator: WatermarkGenerator, source: str, partition: Optional[str],
              schema: pa.Schema):
    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for rb in batches:
            yield pa.RecordBatch.from_arrays(rb.columns, schema=schema)
            if not rb.num_rows:
                continue
            marks = watermark_rows(_data_rows(pa.Table.from_batches([rb])), generator, source,
                                   partition, schema)
            if marks is not None:
                yield marks

    return fn


def generate_watermarks(df, generator: WatermarkGenerator, source: str,
                        partition: Optional[str] = None):
    """``df`` with its watermark rows (module docstring): ``source`` names
    the source; ``partition``: a column whose values are its partitions
    (default: the source is one partition)."""
    from pyspark.sql import functions as F
    if METRICS_COL not in df.columns:
        df = df.withColumn(METRICS_COL, F.lit(None).cast("string"))
    schema = pa.schema([f.with_nullable(True) for f in arrow_schema_of(df)])
    return df.mapInArrow(_generate(generator, source, partition, schema), spark_schema(schema))


__all__ = ["generate_watermarks", "watermark_rows"]
