"""Watermarks generated at the source and carried with the stream
(docs/windows.md, "Watermarks from the source").

Flink generates a watermark where ``WATERMARK FOR`` is declared and passes it
unchanged through projections, filters, joins and unions to every event-time
operator; an operator with several inputs takes the minimum.  Here the
source's runtime step (:mod:`spark_changelog.runtime.source_watermarks`)
turns every piece of a micro-batch into *watermark rows*: side rows
(``_kind = -1``) whose payload is ``{"watermark": {"partition": p,
"watermark": w}}``, one per source partition, ``w`` the generator's watermark
over the piece's rows (``on_periodic_emit(max(on_events))``).  Side rows pass
through every step (projections null their data columns, filters keep them,
a join's input union carries both sides', keyed operators pass them on), so
rows a filter drops have already moved the watermark.

An event-time operator folds the watermark rows it receives with
:func:`~.partition_watermarks.advance` and :class:`SourceWatermarks` (the
generator that emits what the sources generated): per partition the maximum,
never backwards, idle partitions leave the minimum, and the minimum over the
partitions of every input.  Partition names carry the source's name, so the
inputs of a join are distinct partitions.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Iterable, Optional

import numpy as np
import pandas as pd

from .watermark import NO_WATERMARK, WatermarkGenerator

#: the payload key of a watermark row
WATERMARK_PAYLOAD = "watermark"


@dataclasses.dataclass(frozen=True)
class SourceWatermarks(WatermarkGenerator):
    """The generator of an operator fed by watermark rows: each partition's
    progress already is its watermark (the source applied its own
    generator), so emission is the identity.  ``sources``: what each source
    generates, for explain (``clicks: rt - 59999 ms``); ``idle_timeouts``:
    ``(source name, ms)`` per source that declares its own idle timeout
    (``'scan.watermark.idle-timeout'``): its partitions go idle after it."""

    column: str
    sources: tuple = ()
    idle_timeouts: tuple = ()

    def idle_timeout_of(self, partition: str, default: Optional[int]) -> Optional[int]:
        """The idle timeout of a source partition (``source`` or ``source/p``)."""
        for source, ms in self.idle_timeouts:
            if partition == source or partition.startswith(source + "/"):
                return ms
        return default

    def on_events(self, event_ms: np.ndarray, rows=None) -> np.ndarray:
        # rows reaching the operator prove nothing: their source's watermark rows do
        return np.full(len(event_ms), NO_WATERMARK, dtype=np.int64)

    def on_periodic_emit(self, progress: np.ndarray, processing_time_ms: int = 0) -> np.ndarray:
        return np.asarray(progress, dtype=np.int64)

    def describe(self) -> str:
        return f"generated at the source{'s' if len(self.sources) > 1 else ''}: " + \
            "; ".join(self.sources)


def partition_name(source: str, partition: Optional[str]) -> str:
    """A source partition's name: the source's, then the partition's value."""
    return source if partition is None else f"{source}/{partition}"


def watermark_payloads(source: str, partitions: pd.DataFrame,
                       generator: WatermarkGenerator, processing_time_ms: int = 0) -> list[str]:
    """The payloads of one piece's watermark rows: ``partitions`` is a
    :func:`~.partition_watermarks.summarize` table (``partition``,
    ``progress``) of the piece's rows."""
    marks = generator.on_periodic_emit(partitions["progress"].to_numpy(dtype=np.int64),
                                       processing_time_ms)
    return [json.dumps({WATERMARK_PAYLOAD: {"partition": partition_name(source, p or None),
                                            "watermark": int(w)}})
            for p, w in zip(partitions["partition"].tolist(), marks)]


def is_watermark_payload(payload: dict) -> bool:
    return WATERMARK_PAYLOAD in payload


def watermark_progress(payloads: Iterable[dict]) -> pd.DataFrame:
    """The watermark rows' payloads as a progress table (``partition``,
    ``progress``: the maximum watermark per partition)."""
    rows = [p[WATERMARK_PAYLOAD] for p in payloads if WATERMARK_PAYLOAD in p]
    frame = pd.DataFrame({"partition": pd.Series([r["partition"] for r in rows], dtype=object),
                          "progress": np.asarray([r["watermark"] for r in rows], dtype=np.int64)})
    if not len(frame):
        return frame
    return frame.groupby("partition", sort=True)["progress"].max().reset_index()


__all__ = ["SourceWatermarks", "WATERMARK_PAYLOAD", "watermark_payloads", "watermark_progress",
           "is_watermark_payload", "partition_name"]
