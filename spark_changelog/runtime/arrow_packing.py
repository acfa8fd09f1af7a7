"""Rows packed per key group: how rows cross to Spark's Python stateful step.

``transformWithStateInPandas`` costs per input row: Spark shuffles and sorts
every row, writes it to Arrow in the JVM and converts it to pandas in ~10k-row
chunks before the processor sees it (docs/runtime.md, "Packed key groups").
An Arrow pass before the shuffle (``mapInArrow``) therefore packs, per Spark
partition, all rows of one key group into ONE row: the key group and an LZ4
compressed Arrow IPC stream of its rows.  Spark then shuffles, sorts and hands
over a few rows per key group and micro-batch; the processor unpacks them
(:func:`unpack`) into one Arrow table.  Used by the keyed operators
(``spark_keyed``) and the event-time operators (``spark_event_time``).
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa

from ..model import KIND_COL, METRICS_COL, SEQ_COL
from ..operators.kernels import run_starts

#: the column of the packed rows (one Arrow IPC blob per key group and Spark partition)
PACKED_COL = "rows"


def packed_schema(group_col: str) -> pa.Schema:
    """The rows a packing pass emits: the key group, the blob."""
    return pa.schema([pa.field(group_col, pa.int32()), pa.field(PACKED_COL, pa.binary())])


#: a table at least this large (Arrow buffer bytes) is packed LZ4-compressed,
#: a smaller one as it is: LZ4 costs a fixed ~0.2-1 ms per blob and per
#: unpacking (a frame per column buffer), against ~0.02-0.04 ms uncompressed,
#: and a small micro-batch packs one small blob per key group and input
#: partition (docs/runtime.md, "Packed key groups")
COMPRESS_FROM_BYTES = 64 * 1024
#: Arrow's IPC reader and writer without their thread pool: Spark runs one
#: Python worker per task slot, so the pool's threads only contend with the
#: other slot's worker; reading the join's packed blobs took about a third of
#: the CPU without it (docs/runtime.md, "Chained keyed operators")
_LZ4 = pa.ipc.IpcWriteOptions(compression="lz4", use_threads=False)
_PLAIN = pa.ipc.IpcWriteOptions(use_threads=False)
_READ = pa.ipc.IpcReadOptions(use_threads=False)


def pack(table: pa.Table, compress: bool = True) -> bytes:
    """``table`` as one Arrow IPC stream, LZ4-compressed from
    :data:`COMPRESS_FROM_BYTES` unless ``compress`` is false (a blob that
    stays in its stage, never shuffled); :func:`unpack` reads either."""
    sink = pa.BufferOutputStream()
    options = _LZ4 if compress and table.nbytes >= COMPRESS_FROM_BYTES else _PLAIN
    with pa.ipc.new_stream(sink, table.schema, options=options) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


class Picked:
    """A ``pack`` (a keyed step's output table -> (group, blob) pairs) of
    the output after a projection that picks and renames columns
    (``picked``: (column, output name) pairs); the step's ``_kind``,
    ``_seq`` and side rows' columns follow as they are (``plan/lower.py``,
    ``_packs_through``)."""

    def __init__(self, pack, picked: tuple):
        self.pack, self.picked = pack, tuple(picked)

    def __call__(self, table: pa.Table):
        rest = [c for c in (KIND_COL, SEQ_COL, METRICS_COL) if c in table.column_names]
        columns = [table.column(c) for c, _ in self.picked] + [table.column(c) for c in rest]
        return self.pack(pa.table(columns, names=[n for _, n in self.picked] + rest))


def unpack(blobs) -> pa.Table:
    """The rows of the blobs :func:`pack` made, as one Arrow table (in the
    order of ``blobs``)."""
    return pa.concat_tables([pa.ipc.open_stream(pa.BufferReader(b), options=_READ).read_all()
                             for b in blobs])


def pack_groups(table: pa.Table, groups: np.ndarray) -> Iterator[tuple[int, bytes]]:
    """(group, blob) for each distinct value of ``groups`` (one per row of
    ``table``), in ascending group order; each blob holds the group's rows
    in their order in ``table``."""
    if not table.num_rows:
        return
    keys = groups
    if len(groups) and -(1 << 15) <= groups.min() and groups.max() < 1 << 15:
        keys = groups.astype(np.int16)         # numpy's stable sort of 16-bit ints is a radix sort
    order = np.argsort(keys, kind="stable")
    ordered = groups[order]
    starts = np.flatnonzero(run_starts(ordered))
    ends = np.r_[starts[1:], len(ordered)]
    # one gather of the whole table, then each group a zero-copy slice of it
    # (one ``take`` per group cost a kernel call and allocation each)
    table = table.take(pa.array(order)).combine_chunks()
    for s, e in zip(starts, ends):
        yield int(ordered[s]), pack(table.slice(s, e - s))


def packed_batch(pairs, group_col: str) -> pa.RecordBatch:
    """(group, blob) pairs as one record batch of :func:`packed_schema`."""
    groups = [g for g, _ in pairs]
    blobs = [b for _, b in pairs]
    return pa.record_batch([pa.array(groups, pa.int32()), pa.array(blobs, pa.binary())],
                           schema=packed_schema(group_col))


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with exactly ``schema``'s columns and types (a missing column
    all null)."""
    cols = [table.column(f.name).cast(f.type) if f.name in table.column_names
            else pa.nulls(table.num_rows, f.type) for f in schema]
    return pa.Table.from_arrays(cols, schema=schema)
