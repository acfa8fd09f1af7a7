"""Per-partition watermarks and idleness, combined by minimum (docs/windows.md).

Spark keeps one watermark per query.  An operator that waits for event time
here (the window aggregate) keeps its own: one watermark per *source
partition* (a declared partition column's value, an input file, later a
Kafka partition or a replication slot), combined into the watermark the
operator acts on.  The rules, per micro-batch (one periodic tick after the
batch's rows):

* a partition's *progress* is the maximum its rows proved
  (``WatermarkGenerator.on_events``); its watermark is
  ``on_periodic_emit(progress)`` and never goes backwards;
* a partition without rows for ``idle_timeout_ms`` (processing time) is
  *idle* and leaves the minimum; when it sends rows again it rejoins only
  once its watermark has caught up with the combined one (until then it
  holds nobody back: its rows behind the watermark are late);
* a partition seen for the first time joins at once (and holds the minimum:
  its rows may be older than everyone else's);
* the combined watermark is the minimum over the partitions that count; if
  none counts (all idle), the maximum over all; it never goes backwards.

Everything here is pure and vectorized over partitions: the state is a small
table (one row per partition) plus two numbers, serialised as JSON so a
runtime can keep it in a checkpointed value state.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .source_watermarks import SourceWatermarks
from .watermark import NO_WATERMARK, WatermarkGenerator

#: the partition name of a source that declares no partitions
SINGLE_PARTITION = ""


@dataclasses.dataclass(frozen=True)
class EventTimeSpec:
    """Where event time comes from and how its watermark is kept.

    ``partition``: ``None`` (the source is one partition), a column name (its
    values are the partitions), or :data:`FILE_PARTITIONS` (each input file
    is one; a file is read in one micro-batch, so it leaves the minimum right
    after its batch).  ``idle_timeout_ms``: ``None`` never idles.
    """

    generator: WatermarkGenerator
    partition: Optional[str] = None
    idle_timeout_ms: Optional[int] = None

    @property
    def column(self) -> str:
        return self.generator.column

    @property
    def partitions_end_with_batch(self) -> bool:
        return self.partition == FILE_PARTITIONS

    def idle_timeouts(self, partitions: Sequence[str]) -> Optional[np.ndarray]:
        """Per partition, its idle timeout in ms (``inf``: never idle), or
        None when no partition idles: ``idle_timeout_ms``, unless the source
        the partition belongs to declares its own (``SourceWatermarks``)."""
        own = getattr(self.generator, "idle_timeouts", ())
        if not own:
            return None if self.idle_timeout_ms is None else \
                np.full(len(partitions), float(self.idle_timeout_ms))
        ms = [self.generator.idle_timeout_of(str(p), self.idle_timeout_ms) for p in partitions]
        return np.asarray([np.inf if m is None else float(m) for m in ms], dtype=np.float64)

    def describe(self) -> str:
        parts = ("the minimum over the source partitions"
                 if isinstance(self.generator, SourceWatermarks)
                 else "one partition" if self.partition is None else "per input file"
                 if self.partition == FILE_PARTITIONS else f"per {self.partition}")
        own = getattr(self.generator, "idle_timeouts", ())
        sources = len(getattr(self.generator, "sources", ())) or 1
        one = {ms for _, ms in own} | ({self.idle_timeout_ms} if len(own) < sources else set())
        if len(one) == 1:         # every partition alike
            ms, = one
            idle = "no idleness" if ms is None else f"idle after {ms} ms"
        else:
            rest = "never" if self.idle_timeout_ms is None else f"after {self.idle_timeout_ms} ms"
            idle = "idle: " + "; ".join(f"{src} after {ms} ms" for src, ms in own) + \
                f"; others {rest}"
        return f"{self.generator.describe()}, {parts}, {idle}"


#: ``EventTimeSpec.partition`` value: every input file is a partition
FILE_PARTITIONS = "<file>"

_COLS = ("partition", "progress", "watermark", "last_active_ms", "excluded")


@dataclasses.dataclass
class PartitionWatermarks:
    """The state: one row per partition, the combined watermark, and the
    largest watermark of partitions that ended (files)."""

    table: pd.DataFrame
    combined: int = NO_WATERMARK
    ended_max: int = NO_WATERMARK

    @classmethod
    def empty(cls) -> "PartitionWatermarks":
        return cls(_table([], [], [], [], []))

    # -- reading -----------------------------------------------------------------
    @property
    def combined_or_none(self) -> Optional[int]:
        return None if self.combined == NO_WATERMARK else int(self.combined)

    def idle_partitions(self) -> list:
        return self.table.loc[self.table["excluded"], "partition"].tolist()

    def per_partition(self) -> dict:
        """partition -> watermark (``None``: none yet), for metrics."""
        return {p: (None if w == NO_WATERMARK else int(w))
                for p, w in zip(self.table["partition"], self.table["watermark"])}

    # -- (de)serialisation for a value state --------------------------------------
    def to_json(self) -> str:
        t = self.table
        return json.dumps({"p": t["partition"].tolist(), "g": t["progress"].tolist(),
                           "w": t["watermark"].tolist(), "a": t["last_active_ms"].tolist(),
                           "x": t["excluded"].tolist(), "c": int(self.combined),
                           "e": int(self.ended_max)})

    @classmethod
    def from_json(cls, text: Optional[str]) -> "PartitionWatermarks":
        if not text:
            return cls.empty()
        d = json.loads(text)
        return cls(_table(d["p"], d["g"], d["w"], d["a"], d["x"]), int(d["c"]), int(d["e"]))


def _table(p, g, w, a, x) -> pd.DataFrame:
    return pd.DataFrame({"partition": pd.Series(p, dtype=object),
                         "progress": np.asarray(g, dtype=np.int64),
                         "watermark": np.asarray(w, dtype=np.int64),
                         "last_active_ms": np.asarray(a, dtype=np.int64),
                         "excluded": np.asarray(x, dtype=bool)})


def summarize(partitions: Sequence, progress: np.ndarray) -> pd.DataFrame:
    """Per partition, the maximum progress of a batch (or a piece of one):
    columns ``partition``, ``progress``.  ``partitions``: each row's
    partition, a sequence or an Arrow string array (null: the single one).
    Pieces combine by :func:`summarize` again (maximum), in any order."""
    progress = np.asarray(progress, dtype=np.int64)
    if not len(progress):
        return pd.DataFrame({"partition": pd.Series([], dtype=object),
                             "progress": np.zeros(0, dtype=np.int64)})
    if isinstance(partitions, pa.ChunkedArray):
        partitions = partitions.combine_chunks()
    if isinstance(partitions, pa.Array):
        # a runtime's Arrow column: encoded without a Python object per row
        enc = pc.fill_null(partitions.cast(pa.string()), SINGLE_PARTITION).dictionary_encode()
        dictionary = enc.dictionary.to_pylist()
        order = np.argsort(np.asarray(dictionary, dtype=object), kind="stable")
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        codes = rank[enc.indices.to_numpy(zero_copy_only=False)]
        names = [dictionary[i] for i in order]
    else:
        codes, names = pd.factorize(pd.Series(partitions, dtype=object).fillna(SINGLE_PARTITION),
                                    sort=True)
    best = np.full(len(names), NO_WATERMARK, dtype=np.int64)
    np.maximum.at(best, codes, progress)
    return pd.DataFrame({"partition": pd.Series(list(names), dtype=object), "progress": best})


def advance(state: PartitionWatermarks, batch: pd.DataFrame, processing_time_ms: int,
            spec: EventTimeSpec) -> PartitionWatermarks:
    """The state after a micro-batch whose rows proved ``batch`` (a
    :func:`summarize` table: every partition with rows in the batch, also
    those whose rows proved nothing) and the periodic tick at
    ``processing_time_ms``."""
    batch = summarize(batch["partition"].tolist(), batch["progress"].to_numpy())
    now = np.int64(processing_time_ms)
    old = state.table
    merged = old.merge(batch.rename(columns={"progress": "new"}), on="partition", how="outer",
                       sort=True)
    seen = merged["new"].notna().to_numpy()
    new_progress = merged["new"].fillna(NO_WATERMARK).to_numpy(dtype=np.int64)
    fresh = merged["progress"].isna().to_numpy()
    progress = np.maximum(merged["progress"].fillna(NO_WATERMARK).to_numpy(dtype=np.int64),
                          new_progress)
    last_active = np.where(seen, now, merged["last_active_ms"].fillna(now).to_numpy(dtype=np.int64))
    emitted = np.asarray(spec.generator.on_periodic_emit(progress, int(processing_time_ms)),
                         dtype=np.int64)
    watermark = np.maximum(merged["watermark"].fillna(NO_WATERMARK).to_numpy(dtype=np.int64),
                           emitted)
    was_excluded = (merged["excluded"].to_numpy(dtype=object) == True) & ~fresh  # noqa: E712
    timeouts = spec.idle_timeouts(merged["partition"].tolist())
    if timeouts is None:
        idle = np.zeros(len(merged), dtype=bool)
    else:
        idle = (now - last_active).astype(np.float64) >= timeouts
    # an idle partition leaves the minimum; one that was out rejoins once caught up
    excluded = idle | (was_excluded & (watermark < np.int64(state.combined)))
    ended_max = state.ended_max
    if spec.partitions_end_with_batch:
        # a file is read whole in one batch: after it, it holds nobody back
        ended_max = int(max(ended_max, watermark.max(initial=NO_WATERMARK)))
        counting = np.zeros(len(merged), dtype=bool)
        counting[seen] = True
        candidate_rows = watermark[seen]
    else:
        counting = ~excluded
        candidate_rows = watermark[counting]
    if len(candidate_rows):
        candidate = int(candidate_rows.min())
    else:   # all idle (or ended): the maximum
        candidate = int(max(watermark.max(initial=NO_WATERMARK), ended_max))
    combined = max(int(state.combined), candidate)
    table = _table(merged["partition"].tolist(), progress, watermark, last_active, excluded)
    if spec.partitions_end_with_batch:
        table = table.iloc[0:0]
    return PartitionWatermarks(table, combined, ended_max)


__all__ = ["EventTimeSpec", "PartitionWatermarks", "FILE_PARTITIONS", "SINGLE_PARTITION",
           "summarize", "advance"]
