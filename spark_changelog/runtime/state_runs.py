"""Keyed state of one key group as a small log-structured merge of immutable runs.

Why (docs/runtime.md has the measurements): Spark's Python stateful APIs cost
about a millisecond per call, so state is kept per *key group* (many keys), not
per key.  If a key group's state were one blob, every micro-batch that touches
the group would rewrite all of it, and a 1M-row batch over 5M keys touches
every group: cost would follow the state size instead of the batch.

So the state of a key group is a list of immutable *runs*, oldest first.  A
micro-batch writes one new run holding only the keys it touched (their complete
new state rows, or a *cleared* marker for a key whose state is now empty).
Lookups take each key from the newest run that has it.  Runs are merged
size-tiered (two newest runs merge when the older is not larger than
``growth`` times the newer), so each row is rewritten about log(state/batch)
times, and a *full* merge (one that reaches the oldest run) is where expired
state is dropped (operator ``retain``) and cleared markers disappear: dropping
them earlier would let an older run's value resurface.

Runs are immutable, so a worker process may cache the decoded runs it has
seen; the Spark runtime reads a run from the state store only on a cache miss
(a restart, or a group moving to another worker).  A run is named when it is
first written (:func:`name_new_runs`) by a digest of its bytes, the runs below
it and its scope (operator and key group): a replayed micro-batch, computing
the same runs from the same state, names them as the killed attempt did, so
the state it writes is byte for byte the same (docs/runtime.md, "Replay is
deterministic").  Checkpoints written with random ids (before) read the same:
an id is only a name.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import io
import threading
import warnings
from typing import Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from ..operators.kernels import ranges_to_indices

CLEARED_COL = "__cleared"


def concat_rows(frames) -> pd.DataFrame:
    """``pd.concat`` of state frames; marker rows are all-null by design, so
    pandas' warning about all-NA entries changing dtypes is expected noise."""
    frames = [f for f in frames if len(f)] or list(frames)[:1]
    if len(frames) == 1:
        return frames[0].reset_index(drop=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return pd.concat(frames, ignore_index=True)


def _factorize_keys(df: pd.DataFrame, key: Sequence[str]):
    if len(key) == 1:
        codes, uniques = pd.factorize(df[key[0]], use_na_sentinel=False)
        return codes, pd.Index(uniques)
    mi = pd.MultiIndex.from_frame(df[list(key)])
    codes, uniques = mi.factorize()
    return codes, uniques




@dataclasses.dataclass
class Run:
    """An immutable, key-grouped table of state rows (plus cleared markers);
    ``id`` is None until :func:`name_new_runs` names it."""

    id: Optional[str]
    rows: pd.DataFrame           # grouped by key, a key's rows in their stored order
    uniques: pd.Index            # distinct keys, aligned with starts/lens
    starts: np.ndarray
    lens: np.ndarray

    @property
    def size(self) -> int:
        return len(self.rows)

    @classmethod
    def build(cls, rows: pd.DataFrame, key: Sequence[str], run_id: Optional[str] = None) -> "Run":
        rows = rows.reset_index(drop=True)
        if len(rows):
            codes, uniques = _factorize_keys(rows, key)
            order = np.argsort(codes, kind="stable")
            rows = rows.take(order).reset_index(drop=True)
            codes = codes[order]
            starts = np.searchsorted(codes, np.arange(len(uniques)), side="left")
            ends = np.searchsorted(codes, np.arange(len(uniques)), side="right")
        else:
            uniques = pd.Index([]) if len(key) == 1 else pd.MultiIndex.from_arrays([[]] * len(key))
            starts = ends = np.zeros(0, dtype=np.int64)
        return cls(run_id, rows, uniques, starts.astype(np.int64),
                   (ends - starts).astype(np.int64))

    # -- (de)serialization: Arrow IPC, compressed ------------------------------
    def to_bytes(self, schema: pa.Schema) -> bytes:
        # nthreads=1: a thread pool per small conversion costs more than it saves
        table = canonical_table(pa.Table.from_pandas(self.rows, schema=schema,
                                                     preserve_index=False, nthreads=1))
        sink = io.BytesIO()
        with pa.ipc.new_stream(sink, table.schema,
                               options=pa.ipc.IpcWriteOptions(compression="lz4")) as w:
            w.write_table(table)
        return sink.getvalue()

    @classmethod
    def from_bytes(cls, run_id: str, blob: bytes, key: Sequence[str]) -> "Run":
        table = pa.ipc.open_stream(pa.BufferReader(blob)).read_all()
        return cls.build(table.to_pandas(maps_as_pydicts="strict"), key, run_id)


def canonical_table(table: pa.Table) -> pa.Table:
    """``table`` with bytes that depend on its values only (docs/runtime.md,
    "Replay is deterministic"): equal rows held with other pandas dtypes (an
    integer column with nulls is object when an operator computed it, float64
    after a decode, i.e. a worker cache hit against a miss) otherwise differ
    in pandas' schema metadata (the frame's numpy dtypes) and in the bytes
    under null slots (0, or what casting NaN left), so a replay would write
    other bytes under another run id.  Fixed-width columns get zeros under
    their nulls (one ``fill_null`` per column with nulls)."""
    columns = []
    for col in table.columns:
        t = col.type
        if col.null_count and (pa.types.is_integer(t) or pa.types.is_floating(t)
                               or pa.types.is_temporal(t) or pa.types.is_decimal(t)
                               or pa.types.is_fixed_size_binary(t)):
            col = _zero_null_slots(col.combine_chunks())
        columns.append(col)
    return pa.table(columns, schema=table.schema.remove_metadata())


def _zero_null_slots(arr: pa.Array) -> pa.Array:
    """A fixed-width array equal to ``arr`` with zero bytes under its nulls."""
    width = arr.type.byte_width
    data = np.frombuffer(arr.buffers()[1], dtype=np.uint8)[
        arr.offset * width:(arr.offset + len(arr)) * width].reshape(len(arr), width).copy()
    valid = arr.is_valid()
    data[~valid.to_numpy(zero_copy_only=False)] = 0
    return pa.Array.from_buffers(arr.type, len(arr), [valid.buffers()[1], pa.py_buffer(data)],
                                 null_count=arr.null_count)


def name_new_runs(runs: Sequence[Run], scope: str, schema: pa.Schema) -> dict[str, bytes]:
    """Name the runs without an id and return their blobs by id.  A run's id
    is a digest of ``scope`` (operator and key group), the ids of the runs
    below it and its own bytes, so the same state and the same batch give the
    same ids in any process (docs/runtime.md, "Replay is deterministic"), and
    two different runs never share one."""
    blobs = {}
    below = hashlib.blake2b(scope.encode(), digest_size=16)
    for run in runs:
        if run.id is None:
            blob = run.to_bytes(schema)
            digest = below.copy()
            digest.update(blob)
            run.id = digest.hexdigest()
            blobs[run.id] = blob
        below.update(run.id.encode())
    return blobs


def run_schema(state_schema: pa.Schema) -> pa.Schema:
    return state_schema.append(pa.field(CLEARED_COL, pa.bool_()))


class RunStack:
    """The runs of one key group, oldest first, and the merge policy."""

    def __init__(self, key: Sequence[str], runs: Sequence[Run] = (), *, growth: float = 1.0,
                 max_runs: int = 8):
        self.key = list(key)
        self.runs = list(runs)
        self.growth = growth
        self.max_runs = max_runs

    @property
    def size(self) -> int:
        return sum(r.size for r in self.runs)

    def lookup(self, keys: pd.DataFrame) -> Optional[pd.DataFrame]:
        """All live state rows of ``keys`` (distinct), each key from its newest
        run; ``None`` when there are none."""
        if not self.runs or keys.empty:
            return None
        want = keys[self.key[0]] if len(self.key) == 1 else pd.MultiIndex.from_frame(keys[self.key])
        want = pd.Index(want)
        unresolved = np.ones(len(want), dtype=bool)
        parts = []
        for run in reversed(self.runs):
            if not unresolved.any():
                break
            if not len(run.uniques):
                continue
            pos = np.asarray(run.uniques.get_indexer(want[unresolved]), dtype=np.int64)
            hit = pos >= 0
            if hit.any():
                p = pos[hit]
                parts.append(run.rows.take(ranges_to_indices(run.starts[p], run.lens[p])))
                idx = np.flatnonzero(unresolved)[hit]
                unresolved[idx] = False
        if not parts:
            return None
        found = concat_rows(parts)
        return found[~found[CLEARED_COL].to_numpy(dtype=bool)].drop(columns=CLEARED_COL).reset_index(drop=True)

    def live_where(self, pred) -> pd.DataFrame:
        """The live state rows (newest run of their key, not cleared) for which
        ``pred(rows) -> bool mask`` holds.  ``pred`` sees each run's rows first,
        so only its matches are checked for being shadowed by a newer run: the
        cost follows the state's size once (vectorized) plus the matches."""
        parts = []
        for i, run in enumerate(self.runs):
            if not run.size:
                continue
            rows = run.rows[~run.rows[CLEARED_COL].to_numpy(dtype=bool, na_value=False)]
            if rows.empty:
                continue
            hit = rows[np.asarray(pred(rows.drop(columns=CLEARED_COL)), dtype=bool)]
            if hit.empty:
                continue
            keys = (pd.Index(hit[self.key[0]]) if len(self.key) == 1
                    else pd.MultiIndex.from_frame(hit[self.key]))
            live = np.ones(len(hit), dtype=bool)
            for newer in self.runs[i + 1:]:
                if len(newer.uniques):
                    live &= ~np.asarray(keys.isin(newer.uniques), dtype=bool)
            parts.append(hit[live])
        if not parts:
            return self.runs[-1].rows.iloc[:0].drop(columns=CLEARED_COL) if self.runs \
                else pd.DataFrame()
        return concat_rows(parts).drop(columns=CLEARED_COL)

    def new_run(self, touched: pd.DataFrame, new_state: pd.DataFrame) -> Run:
        """The run recording a batch: new rows of touched keys, markers for cleared ones."""
        from ..operators.keys import rows_with_keys
        present = rows_with_keys(touched, self.key, new_state)
        markers = touched[~present].copy()
        rows = new_state.copy()
        rows[CLEARED_COL] = False
        if len(markers):
            for c in new_state.columns:
                if c not in markers.columns:
                    markers[c] = None
            markers = markers[list(new_state.columns)]
            markers[CLEARED_COL] = True
            rows = concat_rows([rows, markers])
        return Run.build(rows, self.key)

    def push(self, run: Run, retain=None) -> None:
        """Add a batch's run and merge per policy; ``retain(rows) -> bool mask``
        is applied on full merges only.  Callers diff run ids before and after
        to know what to write and delete."""
        self.runs.append(run)
        while len(self.runs) >= 2 and (
                self.runs[-2].size <= self.growth * self.runs[-1].size or len(self.runs) > self.max_runs):
            full = len(self.runs) == 2
            self.runs[-2:] = [merge_runs(self.runs[-2], self.runs[-1], self.key, full=full, retain=retain)]


def merge_runs(older: Run, newer: Run, key: Sequence[str], *, full: bool, retain=None) -> Run:
    """Keys of ``newer`` replace those of ``older``; on a full merge markers and
    rows rejected by ``retain`` are dropped."""
    if len(older.uniques) and len(newer.uniques):
        shadowed = np.asarray(older.uniques.isin(newer.uniques), dtype=bool)
        keep_old = ranges_to_indices(older.starts[~shadowed], older.lens[~shadowed])
        rows = concat_rows([older.rows.take(keep_old), newer.rows])
    else:
        rows = concat_rows([older.rows, newer.rows])
    if full:
        rows = rows[~rows[CLEARED_COL].to_numpy(dtype=bool)]
        if retain is not None and len(rows):
            mask = retain(rows.drop(columns=CLEARED_COL))
            if mask is not None:
                rows = rows[np.asarray(mask, dtype=bool)]
    return Run.build(rows, key)


class RunCache:
    """Decoded runs by id, per worker process, bounded by total rows (LRU)."""

    def __init__(self, max_rows: int = 50_000_000):
        self.max_rows = max_rows
        self._runs: "collections.OrderedDict[str, Run]" = collections.OrderedDict()
        self._rows = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, run_id: str) -> Optional[Run]:
        with self._lock:
            run = self._runs.get(run_id)
            if run is not None:
                self._runs.move_to_end(run_id)
                self.hits += 1
            else:
                self.misses += 1
            return run

    def put(self, run: Run) -> None:
        with self._lock:
            if run.id in self._runs:
                return
            self._runs[run.id] = run
            self._rows += run.size
            while self._rows > self.max_rows and len(self._runs) > 1:
                _, old = self._runs.popitem(last=False)
                self._rows -= old.size

    def discard(self, run_id: str) -> None:
        with self._lock:
            old = self._runs.pop(run_id, None)
            if old is not None:
                self._rows -= old.size


#: one cache per Python worker process (workers are reused across tasks)
WORKER_CACHE = RunCache()
