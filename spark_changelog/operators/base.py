"""The contract every keyed operator implements (architecture: "operators").

An operator is written once, as a vectorized step over the rows and state of
one *key group*; every runtime (Spark streaming, batch, local reference) calls
the same ``process`` and never re-implements a rule.

``process(state, rows, ctx) -> (new_state, output)``

* ``rows``: the micro-batch's input rows of the key group, data columns plus
  ``_kind`` and ``_seq``, **sorted by the operator's key columns, then ``_seq``**
  (the runtime sorts; arrival order is never trusted, docs/semantics.md, section 2).
* ``state``: every stored state row whose key occurs in ``rows`` (possibly
  several rows per key), in the columns of :attr:`KeyedOperator.state_schema`.
  Keys of ``rows`` without state simply have no state rows.
* ``new_state``: the complete state rows of **every key occurring in ``rows``**
  after the batch; a key with no rows in ``new_state`` has its state cleared.
  Keys not in ``rows`` keep their state untouched, so a batch costs in
  proportion to the keys it touches, not to the whole state.
* ``output``: emitted rows, data columns of :attr:`output_schema` plus
  ``_kind``/``_seq``, in emission order.

Operators that wait for event time (``uses_watermark``) also get the
watermark in ``ctx.watermark_ms`` and implement :meth:`KeyedOperator.due`,
:meth:`KeyedOperator.pending_times` and :meth:`KeyedOperator.on_watermark`:
``process`` acts on the due rows of every key in its ``state`` (the runtime
may add keys with due state and no rows, and then needs their new state
back too), and when the watermark moves without rows for a key group
(:func:`~spark_changelog.runtime.keygroup.fire_watermark`) ``on_watermark``
gets the keys with due rows.  Rows are judged late (or stamped) by
``ctx.arrival_watermark``, the watermark current at their arrival; due state
by ``ctx.watermark_ms``, the watermark after the batch
(:mod:`~spark_changelog.runtime.event_time`).

Counters (superseded changes, unmatched retractions, expired state, ...) go to
``ctx.metrics``; the runtime sums them over key groups and micro-batches.
"""
from __future__ import annotations

import abc
import collections
import dataclasses
import functools
from typing import Optional

import numpy as np
import pandas as pd
import pyarrow as pa

from ..model import KIND_COL, SEQ_COL


@functools.lru_cache(maxsize=512)
def _empty_frame(schema: pa.Schema) -> pd.DataFrame:
    return schema.empty_table().to_pandas()


def empty_frame(schema: pa.Schema) -> pd.DataFrame:
    """An empty frame of ``schema``'s columns and pandas types: Arrow's
    conversion of an empty table, made once per schema (it costs about a
    millisecond, and a key group's step asks for one per operator when the
    state has none of its keys), copied so no caller changes another's."""
    return _empty_frame(schema).copy()


@dataclasses.dataclass
class Metrics:
    """Counters and warnings of one operator call; summed by the runtime."""

    counters: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    warnings: list = dataclasses.field(default_factory=list)
    #: records for a side output, by channel (``"late"``: late rows of windows);
    #: the runtime ships them on the side-row channel and the pipeline writes them
    side_rows: dict = dataclasses.field(default_factory=dict)

    def add(self, name: str, n: int = 1) -> None:
        if n:
            self.counters[name] += int(n)

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def side(self, channel: str, record: dict) -> None:
        self.side_rows.setdefault(channel, []).append(record)

    def merge(self, other: "Metrics") -> None:
        self.counters.update(other.counters)
        self.warnings.extend(other.warnings)
        for channel, records in other.side_rows.items():
            self.side_rows.setdefault(channel, []).extend(records)


@dataclasses.dataclass
class OpContext:
    """What an operator may know besides its rows and state.

    ``next_seq`` is the key group's emission counter, persisted by the runtime
    across micro-batches.  An operator whose output is keyed differently from
    its input (a join, an aggregation) cannot reuse input ``_seq`` values: they
    come from different sources and are not comparable.  It numbers its output
    with :meth:`allocate_seq` instead, which is monotonic per key group, so
    every output row's changes keep the order in which they were emitted.
    """

    processing_time_ms: int
    watermark_ms: Optional[int] = None
    metrics: Metrics = dataclasses.field(default_factory=Metrics)
    next_seq: int = 0
    #: set by an event-time runtime that processes a batch's rows and fires at
    #: the watermark after the batch (``watermark_ms``) in one call: the
    #: watermark at the rows' arrival (``None``: there was none yet)
    arrival_watermark_ms: Optional[int] = None
    arrival_differs: bool = False

    @property
    def arrival_watermark(self) -> Optional[int]:
        """The watermark a row is judged late by (docs/windows.md)."""
        return self.arrival_watermark_ms if self.arrival_differs else self.watermark_ms

    def allocate_seq(self, n: int) -> np.ndarray:
        """``n`` consecutive output sequence numbers, in emission order."""
        out = np.arange(self.next_seq, self.next_seq + n, dtype=np.int64)
        self.next_seq += int(n)
        return out


class KeyedOperator(abc.ABC):
    """A vectorized, keyed, stateful step (see module docstring)."""

    #: short name used in explain output, metrics and state names
    name: str = "operator"

    #: True when ``process`` puts its rows in its processing order itself
    #: (by key, then ``_seq``) and keeps rows that tie in that order as they
    #: were given: a runtime handing it rows whose order is already
    #: deterministic (an earlier operator's output in a chain of keyed
    #: operators, ``runtime/keyed_chain.py``) need not sort them first
    orders_own_rows: bool = False

    def __init__(self, input_schema: pa.Schema, key: tuple[str, ...]):
        missing = [k for k in key if k not in input_schema.names]
        if missing:
            raise ValueError(f"{self.name}: key column(s) {missing} not in input {input_schema.names}")
        for meta in (KIND_COL, SEQ_COL):
            if meta not in input_schema.names:
                raise ValueError(f"{self.name}: input lacks the {meta} column")
        self.input_schema = input_schema
        self.key = tuple(key)

    @property
    def data_columns(self) -> list[str]:
        return [n for n in self.input_schema.names if n not in (KIND_COL, SEQ_COL)]

    #: set by each operator's constructor (or overridden as a property)
    _state_schema: pa.Schema
    _output_schema: pa.Schema

    @property
    def state_schema(self) -> pa.Schema:
        """Columns of a state row; must start with the key columns."""
        return self._state_schema

    @property
    def output_schema(self) -> pa.Schema:
        """Data columns of the output plus ``_kind`` and ``_seq``."""
        return self._output_schema

    @property
    def output_keys(self) -> tuple[tuple[str, ...], ...]:
        """Sets of output columns whose values alone say which key group an
        output row came from (every row with those values came from one
        key group): the key, when the output carries it under its name.
        A consumer keyed on a superset of one of them needs no repartition
        (``plan/execute.py``, ``_sink_frame``)."""
        return (self.key,) if set(self.key) <= set(self.output_schema.names) else ()

    @abc.abstractmethod
    def process(self, state: pd.DataFrame, rows: pd.DataFrame, ctx: OpContext
                ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """One micro-batch of one key group (module docstring)."""

    # -- event time (operators that wait for the watermark) -------------------
    @property
    def prefolds(self) -> bool:
        """True when :meth:`prefold_keep` may drop rows of a micro-batch
        before ``process`` (any part of the batch, without state)."""
        return False

    def prefold_keep(self, rows: pd.DataFrame) -> np.ndarray:
        """Positions of ``rows`` (part of one micro-batch, any order; the key
        columns, ``_kind`` and ``_seq``) that can change the output of
        ``process``; the others may be dropped before it (only called when
        :attr:`prefolds`)."""
        return np.arange(len(rows))

    @property
    def state_is_seen_keys(self) -> bool:
        """True when the operator's whole cross-batch state is the set of keys
        seen in earlier micro-batches, and a seen key's later rows are dropped:
        ``process`` on an empty state then gives a batch's output up to those
        drops.  A streaming runtime may keep that set in Spark's own
        deduplication state (``spark_seen_keys.apply_seen_keys``), calling
        :meth:`first_in_batch` instead of ``process``."""
        return False

    def first_in_batch(self, rows: pd.DataFrame, ctx: OpContext) -> np.ndarray:
        """For an operator whose :attr:`state_is_seen_keys`: ``process`` on an
        empty state as a mask over ``rows`` (sorted by key, then ``_seq``; the
        key columns, ``_kind`` and ``_seq`` suffice): the rows it emits, as
        they are."""
        raise NotImplementedError(f"{self.name} does not keep only the keys it has seen")

    @property
    def uses_watermark(self) -> bool:
        """True when state waits for the watermark: the runtime then runs it
        with the sources' watermarks (``runtime.spark_event_time``)."""
        return False

    def due(self, state: pd.DataFrame, ctx: OpContext) -> np.ndarray:
        """State rows that ``ctx.watermark_ms`` makes due (they waited for it)."""
        return np.zeros(len(state), dtype=bool)

    def pending_times(self, state: pd.DataFrame) -> np.ndarray:
        """Per state row, the watermark (ms) at which it becomes due; ``inf``
        for rows that wait for nothing."""
        return np.full(len(state), np.inf)

    def on_watermark(self, state: pd.DataFrame, ctx: OpContext
                     ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Act on the due rows of the keys in ``state`` (keys that got no input
        in this batch); returns their new state and the output, like ``process``."""
        return state, self.empty_output()

    def retain(self, state: pd.DataFrame, ctx: OpContext) -> "pd.Series | None":
        """Which state rows survive a compaction (TTL, tombstone retention).

        Called by the runtime when it rewrites a key group's state, on rows no
        batch touched; ``None`` keeps everything.  Dropped rows are counted by
        the operator in ``ctx.metrics``.
        """
        return None

    def empty_state(self) -> pd.DataFrame:
        return empty_frame(self.state_schema)

    def empty_output(self) -> pd.DataFrame:
        return empty_frame(self.output_schema)
