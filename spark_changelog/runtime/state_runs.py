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
seen, and the executor keeps each run as a memory-mapped file with a hash
index of its keys, shared by its workers (:class:`RunFiles`): a lookup reads
only the touched keys' rows.  The Spark runtime reads a run from the state
store only when neither has it (a restart, or a group moving to another
executor).  A run is named when it is
first written (:func:`name_new_runs`) by a digest of its bytes, the runs below
it and its scope (operator and key group): a replayed micro-batch, computing
the same runs from the same state, names them as the killed attempt did, so
the state it writes is byte for byte the same (docs/runtime.md, "Replay is
deterministic").  Checkpoints written with random ids (before) read the same:
an id is only a name.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import io
import os
import threading
import warnings
from typing import Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from ..operators.kernels import arrow_to_pandas, factorize_rows, ranges_to_indices, run_starts
from ..operators.keys import rows_with_keys

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
    """Codes of the rows' keys, numbered in order of their first rows, and
    for a one-column key the distinct keys in that order (None for a key of
    several columns: :attr:`Run.uniques` makes their index when asked)."""
    if len(key) == 1:
        codes, uniques = pd.factorize(df[key[0]], use_na_sentinel=False)
        return codes, pd.Index(uniques)
    return pd.factorize(factorize_rows(df, key))[0], None




@dataclasses.dataclass
class Run:
    """An immutable, key-grouped table of state rows (plus cleared markers);
    ``id`` is None until :func:`name_new_runs` names it."""

    id: Optional[str]
    rows: pd.DataFrame           # grouped by key, a key's rows in their stored order
    key: tuple
    starts: np.ndarray           # first row and row count of each distinct key
    lens: np.ndarray
    table: Optional[pa.Table] = dataclasses.field(default=None, repr=False, compare=False)
    _uniques: Optional[pd.Index] = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def uniques(self) -> pd.Index:
        """The distinct keys, aligned with starts/lens.  For a key of several
        columns an index of their tuples, made on the first lookup or merge
        that needs it: a batch's run is often only written (to the state
        store and the run files, which index it by hash), and that index
        cost about as much as the rest of recording the run."""
        if self._uniques is None:
            firsts = self.rows[list(self.key)].take(self.starts)
            self._uniques = pd.MultiIndex.from_frame(firsts)
        return self._uniques

    @property
    def size(self) -> int:
        return len(self.rows)

    def find(self, probe: "KeyProbe", idx: np.ndarray):
        """The wanted keys ``idx`` (positions in ``probe``) this run holds:
        ``(hit mask over idx, their rows)``; rows None when none is held."""
        if not len(self.starts):
            return np.zeros(len(idx), dtype=bool), None
        pos = np.asarray(self.uniques.get_indexer(probe.index[idx]), dtype=np.int64)
        hit = pos >= 0
        if not hit.any():
            return hit, None
        p = pos[hit]
        return hit, self.rows.take(ranges_to_indices(self.starts[p], self.lens[p]))

    @classmethod
    def build(cls, rows: pd.DataFrame, key: Sequence[str], run_id: Optional[str] = None) -> "Run":
        rows = rows.reset_index(drop=True)
        if len(rows):
            codes, uniques = _factorize_keys(rows, key)
            # codes number the keys by first row: rows already grouped by key
            # (an operator's new state usually is) keep their order untaken
            if (codes[1:] < codes[:-1]).any():
                order = np.argsort(codes, kind="stable")
                rows = rows.take(order).reset_index(drop=True)
                codes = codes[order]
            starts = np.flatnonzero(run_starts(codes))
            ends = np.append(starts[1:], len(codes))
        else:
            uniques = pd.Index([]) if len(key) == 1 else pd.MultiIndex.from_arrays([[]] * len(key))
            starts = ends = np.zeros(0, dtype=np.int64)
        return cls(run_id, rows, tuple(key), starts.astype(np.int64),
                   (ends - starts).astype(np.int64), _uniques=uniques)

    # -- (de)serialization: Arrow IPC, compressed ------------------------------
    def to_bytes(self, schema: pa.Schema) -> bytes:
        # nthreads=1: a thread pool per small conversion costs more than it saves
        table = canonical_table(pa.Table.from_pandas(self.rows, schema=schema,
                                                     preserve_index=False, nthreads=1))
        #: kept for :meth:`RunFiles.write`: the run's rows as the blob holds them
        self.table = table
        sink = io.BytesIO()
        with pa.ipc.new_stream(sink, table.schema,
                               options=pa.ipc.IpcWriteOptions(compression="lz4")) as w:
            w.write_table(table)
        return sink.getvalue()

    @classmethod
    def from_bytes(cls, run_id: str, blob: bytes, key: Sequence[str]) -> "Run":
        table = pa.ipc.open_stream(pa.BufferReader(blob)).read_all()
        run = cls.build(arrow_to_pandas(table), key, run_id)
        run.table = table
        return run


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
        probe = KeyProbe(keys, self.key)
        unresolved = np.ones(len(keys), dtype=bool)
        parts = []
        for run in reversed(self.runs):
            if not unresolved.any():
                break
            idx = np.flatnonzero(unresolved)
            hit, rows = run.find(probe, idx)
            if rows is not None:
                parts.append(rows)
                unresolved[idx[hit]] = False
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
                if newer.size:
                    live &= ~np.asarray(keys.isin(newer.uniques), dtype=bool)
            parts.append(hit[live])
        if not parts:
            return self.runs[-1].rows.iloc[:0].drop(columns=CLEARED_COL) if self.runs \
                else pd.DataFrame()
        return concat_rows(parts).drop(columns=CLEARED_COL)

    def new_run(self, touched: pd.DataFrame, new_state: pd.DataFrame) -> Run:
        """The run recording a batch: new rows of touched keys, markers for cleared ones."""
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
    if len(older.starts) and len(newer.starts):
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


# -- runs mapped from the executor's local disk ---------------------------------
#
# Why (docs/runtime.md, "State that grows"): a worker's cache of decoded runs
# (:data:`WORKER_CACHE`) is per process, and Spark hands a state partition's
# task to whichever Python worker is idle, so a key group's runs were often
# not in the cache of the worker that got them: that worker read every run of
# the group from the state store and decoded all of it, a cost that follows
# the state, not the batch.  So each run is also kept as an uncompressed
# Arrow IPC file in the executor's local directory, with a sorted hash index
# of its keys, which every worker of the executor memory-maps: a lookup
# hashes the touched keys, binary-searches the index and converts only the
# rows it finds.  The files are a cache (the state store stays the truth):
# named by the run's id, a digest of its content, written whole and then
# renamed, so a file is either absent or exactly the run.

_HASH_MIX = np.uint64(0x9E3779B97F4A7C15)


def _indexable(t: pa.DataType) -> bool:
    """Key types whose canonical form (below) is exact: integers, dates,
    timestamps (as int64) and strings."""
    return (pa.types.is_integer(t) or pa.types.is_date(t) or pa.types.is_timestamp(t)
            or pa.types.is_string(t) or pa.types.is_large_string(t))


def _canonical(arr) -> tuple[np.ndarray, np.ndarray]:
    """(values, valid) of a key column: int64 with 0 under nulls, or an object
    array of ``str`` with None under nulls; the same for equal values whatever
    the array came from (a run's file or a batch's pandas frame)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    valid = arr.is_valid().to_numpy(zero_copy_only=False)
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return arr.to_numpy(zero_copy_only=False), valid
    if pa.types.is_date(t):
        arr = arr.cast(pa.int32() if pa.types.is_date32(t) else pa.int64())
    arr = arr.cast(pa.int64()).fill_null(0)
    return arr.to_numpy(zero_copy_only=False), valid


def _hash(columns: list) -> np.ndarray:
    """A uint64 hash per row of canonical key columns (pandas' fixed-key
    hash: the same in every process)."""
    h = np.zeros(len(columns[0][0]), dtype=np.uint64)
    for values, valid in columns:
        v = pd.util.hash_array(values, categorize=False)
        v = np.where(valid, v, np.uint64(0x5BD1E995))
        h = (h ^ v) * _HASH_MIX + np.uint64(1)
    return h


def _equal(a: list, b: list) -> np.ndarray:
    """Row-wise equality of two lists of canonical key columns (nulls equal nulls)."""
    eq = np.ones(len(a[0][0]), dtype=bool)
    for (va, ma), (vb, mb) in zip(a, b):
        same = np.asarray(va == vb, dtype=bool) if len(va) else np.zeros(0, dtype=bool)
        eq &= (ma == mb) & (same | ~ma)
    return eq


class KeyProbe:
    """The keys of one lookup: as a pandas index (for decoded runs) and, when
    first asked for, in canonical form with hashes (for mapped runs)."""

    def __init__(self, keys: pd.DataFrame, key: Sequence[str]):
        self.keys = keys.reset_index(drop=True)
        self.key = list(key)
        self._index = None
        self._canon = {}

    @property
    def index(self) -> pd.Index:
        if self._index is None:
            k = self.keys
            self._index = pd.Index(k[self.key[0]] if len(self.key) == 1
                                   else pd.MultiIndex.from_frame(k[self.key]))
        return self._index

    def canonical(self, fields: tuple):
        """(canonical columns, hashes) of the keys as ``fields`` types them,
        or None when a key does not convert to that type."""
        if fields not in self._canon:
            try:
                cols = [_canonical(pa.array(self.keys[f.name], type=f.type, from_pandas=True))
                        for f in fields]
                self._canon[fields] = (cols, _hash(cols))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                self._canon[fields] = None
        return self._canon[fields]


class MappedRun:
    """A run read from its file (:class:`RunFiles`): looked up through its
    hash index without decoding it; decoded whole (:class:`Run`) only when a
    merge or a scan needs every row."""

    def __init__(self, run_id: str, table: pa.Table, index: np.ndarray, key: Sequence[str]):
        self.id = run_id
        self.table = table
        self.key = list(key)
        # index: rows (hash as int64, first row, row count), sorted by hash
        self._hash = index[0].view(np.uint64)
        self._starts = index[1]
        self._lens = index[2]
        self._fields = tuple(table.schema.field(k) for k in self.key)
        self._run: Optional[Run] = None

    @property
    def size(self) -> int:
        return self.table.num_rows

    def decoded(self) -> Run:
        if self._run is None:
            self._run = Run.build(arrow_to_pandas(self.table), self.key, self.id)
            self._run.table = self.table
        return self._run

    # what merges and scans use: the whole run, decoded once
    rows = property(lambda self: self.decoded().rows)
    uniques = property(lambda self: self.decoded().uniques)
    starts = property(lambda self: self.decoded().starts)
    lens = property(lambda self: self.decoded().lens)

    def find(self, probe: KeyProbe, idx: np.ndarray):
        if self._run is not None:
            return self._run.find(probe, idx)
        canon = probe.canonical(self._fields)
        if canon is None:
            return self.decoded().find(probe, idx)
        cols, hashes = canon
        want = hashes[idx]
        n = len(self._hash)
        hit = np.zeros(len(idx), dtype=bool)
        if not n:
            return hit, None
        p = np.minimum(np.searchsorted(self._hash, want), n - 1)
        cand = np.flatnonzero(self._hash[p] == want)
        if not len(cand):
            return hit, None
        starts, lens = self._starts[p[cand]], self._lens[p[cand]]
        # a hash is not a key: compare the stored keys with the wanted ones
        stored = self.table.select(self.key).take(pa.array(starts))
        same = _equal([_canonical(stored.column(i)) for i in range(len(self.key))],
                      [(v[idx[cand]], m[idx[cand]]) for v, m in cols])
        if not same.any():
            return hit, None
        hit[cand[same]] = True
        rows = self.table.take(pa.array(ranges_to_indices(starts[same], lens[same])))
        return hit, arrow_to_pandas(rows)


def run_index(table: pa.Table, key: Sequence[str]) -> Optional[np.ndarray]:
    """The hash index of a run's table (its rows grouped by key, as
    :meth:`Run.build` orders them): ``int64[3, keys]`` of hash, first row and
    row count, sorted by hash; None when a key type has no exact canonical
    form, or two keys share a hash (then the run is decoded instead)."""
    fields = [table.schema.field(k) for k in key]
    if not all(_indexable(f.type) for f in fields):
        return None
    n = table.num_rows
    if not n:
        return np.zeros((3, 0), dtype=np.int64)
    cols = [_canonical(table.column(k)) for k in key]
    h = _hash(cols)
    new = np.ones(n, dtype=bool)
    new[1:] = ~_equal([(v[1:], m[1:]) for v, m in cols], [(v[:-1], m[:-1]) for v, m in cols])
    starts = np.flatnonzero(new)
    lens = np.diff(np.append(starts, n))
    hs = h[starts]
    order = np.argsort(hs, kind="stable")
    hs = hs[order]
    if len(hs) > 1 and (hs[1:] == hs[:-1]).any():
        return None   # a shared hash, or a key's rows not together
    return np.stack([hs.view(np.int64), starts[order].astype(np.int64), lens[order].astype(np.int64)])


class RunFiles:
    """Runs as files in one local directory, shared by the worker processes
    of an executor (see above).  Every method is best effort: a file that
    cannot be written or read is a cache miss, never an error."""

    def __init__(self, directory: str):
        self.directory = directory

    def _paths(self, run_id: str):
        base = os.path.join(self.directory, run_id)
        return base + ".arrow", base + ".idx.npy"

    def write(self, run, key: Sequence[str]) -> None:
        table = getattr(run, "table", None)
        if table is None or run.id is None:
            return
        data, idx_path = self._paths(run.id)
        if os.path.exists(idx_path):
            return
        index = run_index(table, key)
        if index is None:
            return
        tmp = f".{os.getpid()}-{threading.get_ident()}"
        try:
            os.makedirs(self.directory, exist_ok=True)
            with pa.OSFile(data + tmp, "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
                w.write_table(table)
            os.replace(data + tmp, data)
            with open(idx_path + tmp, "wb") as fh:
                np.save(fh, index)
            os.replace(idx_path + tmp, idx_path)   # the index last: it marks the run complete
        except OSError:
            for p in (data + tmp, idx_path + tmp):
                with contextlib.suppress(OSError):
                    os.remove(p)

    def read(self, run_id: str, key: Sequence[str]) -> Optional[MappedRun]:
        data, idx_path = self._paths(run_id)
        try:
            index = np.load(idx_path, mmap_mode="r")
            table = pa.ipc.open_file(pa.memory_map(data, "r")).read_all()
        except (OSError, ValueError, pa.ArrowInvalid):
            return None
        return MappedRun(run_id, table, np.asarray(index), key)

    def discard(self, run_id: str) -> None:
        for p in self._paths(run_id):
            with contextlib.suppress(OSError):
                os.remove(p)


def executor_run_files() -> Optional[RunFiles]:
    """The run files of this executor: in the first of Spark's local
    directories for the worker (``SPARK_LOCAL_DIRS``, removed with the
    executor), or None outside a Spark worker."""
    dirs = os.environ.get("SPARK_LOCAL_DIRS")
    if not dirs:
        return None
    return RunFiles(os.path.join(dirs.split(",")[0], "spark-changelog-runs"))


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


_RUN_FILES: list = []


def run_files() -> Optional[RunFiles]:
    """This process's :class:`RunFiles` (:func:`executor_run_files`), made once."""
    if not _RUN_FILES:
        _RUN_FILES.append(executor_run_files())
    return _RUN_FILES[0]


def load_run(run_id: str, key: Sequence[str], read_blob) -> tuple["Run | MappedRun", bool]:
    """A run by id: from this worker's cache, else from the executor's run
    files, else decoded from ``read_blob()`` (the state store) and written to
    the run files for the executor's other workers.  Returns the run and
    whether the state store was read."""
    run = WORKER_CACHE.get(run_id)
    if run is not None:
        return run, False
    files = run_files()
    run = files.read(run_id, key) if files is not None else None
    read = run is None
    if run is None:
        run = Run.from_bytes(run_id, read_blob(), key)
        if files is not None:
            files.write(run, key)
    WORKER_CACHE.put(run)
    return run, read


def keep_run(run: "Run", key: Sequence[str]) -> None:
    """A run just written to the state store: into this worker's cache and
    the executor's run files."""
    WORKER_CACHE.put(run)
    files = run_files()
    if files is not None:
        files.write(run, key)


def drop_run(run_id: str) -> None:
    """A run merged away: out of the cache and the run files."""
    WORKER_CACHE.discard(run_id)
    files = run_files()
    if files is not None:
        files.discard(run_id)
