"""Spark's key group of a row, computed in a Python task.

A keyed operator's key group is Spark's ``pmod(hash(key columns), G)``
(``spark_keyed.add_key_group``): the value a checkpoint's state is stored
under.  A Python task that packs rows per key group itself (the Debezium line
task, docs/runtime.md, "Packing in the line task") must give every row the
group Spark would, so :func:`key_groups` is Spark's ``hash`` expression
(``Murmur3Hash``, seed 42: Murmur3 x86 32-bit, with Spark's own treatment of
a string's last bytes), vectorized with numpy over Arrow columns.

Per column, in order, the running hash is the next column's seed; a null
value leaves it as it is.  ``BOOLEAN``/``INT`` hash as a 4-byte int,
``BIGINT`` as an 8-byte long, ``DOUBLE`` as the long of its bits (``-0.0``
as ``0.0``, every NaN as Java's canonical NaN), ``STRING`` as its UTF-8
bytes: the whole 4-byte words little-endian, then each remaining byte alone
as a signed int.  ``tests/model/test_spark_hash.py`` compares it with
Spark's ``hash`` on random values of every type.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Spark's seed of ``hash(...)``
SEED = 42
_C1, _C2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)


def supports(types: Sequence[pa.DataType]) -> bool:
    """Whether :func:`key_groups` hashes columns of these Arrow types."""
    return all(pa.types.is_boolean(t) or pa.types.is_int32(t) or pa.types.is_int64(t)
               or pa.types.is_float64(t) or pa.types.is_string(t) for t in types)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_k1(k1: np.ndarray) -> np.ndarray:
    return _rotl(k1 * _C1, 15) * _C2


def _mix_h1(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    return _rotl(h1 ^ k1, 13) * np.uint32(5) + np.uint32(0xE6546B64)


def _fmix(h1: np.ndarray, length) -> np.ndarray:
    h1 = h1 ^ np.asarray(length, dtype=np.uint32)
    h1 ^= h1 >> np.uint32(16)
    h1 *= np.uint32(0x85EBCA6B)
    h1 ^= h1 >> np.uint32(13)
    h1 *= np.uint32(0xC2B2AE35)
    return h1 ^ (h1 >> np.uint32(16))


def _hash_int(v: np.ndarray, seed: np.ndarray) -> np.ndarray:
    return _fmix(_mix_h1(seed, _mix_k1(v.astype(np.int32).view(np.uint32))), 4)


def _hash_long(v: np.ndarray, seed: np.ndarray) -> np.ndarray:
    u = v.astype(np.int64).view(np.uint64)
    low = (u & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    high = (u >> np.uint64(32)).astype(np.uint32)
    return _fmix(_mix_h1(_mix_h1(seed, _mix_k1(low)), _mix_k1(high)), 8)


def _hash_strings(col: pa.Array, seed: np.ndarray) -> np.ndarray:
    """Spark's ``hashUnsafeBytes`` of each string's UTF-8 bytes."""
    offsets = np.frombuffer(col.buffers()[1], dtype=np.int32)[col.offset:col.offset + len(col) + 1]
    data = np.frombuffer(col.buffers()[2], dtype=np.uint8) if col.buffers()[2] is not None \
        else np.zeros(0, dtype=np.uint8)
    starts = offsets[:-1].astype(np.int64)
    lengths = (offsets[1:] - offsets[:-1]).astype(np.int64)
    words = lengths // 4
    h1 = seed.copy()
    for w in range(int(words.max()) if len(words) else 0):
        rows = np.flatnonzero(words > w)
        at = starts[rows] + 4 * w
        word = (data[at].astype(np.uint32) | (data[at + 1].astype(np.uint32) << np.uint32(8))
                | (data[at + 2].astype(np.uint32) << np.uint32(16))
                | (data[at + 3].astype(np.uint32) << np.uint32(24)))
        h1[rows] = _mix_h1(h1[rows], _mix_k1(word))
    for t in range(3):
        rows = np.flatnonzero(lengths % 4 > t)
        byte = data[starts[rows] + 4 * words[rows] + t].view(np.int8).astype(np.int32).view(np.uint32)
        h1[rows] = _mix_h1(h1[rows], _mix_k1(byte))
    return _fmix(h1, lengths.astype(np.uint32))


def _hash_column(col: pa.Array, seed: np.ndarray) -> np.ndarray:
    t = col.type
    if pa.types.is_string(t):
        h = _hash_strings(col, seed)
    elif pa.types.is_boolean(t):
        h = _hash_int(np.asarray(pc.fill_null(col, False).to_numpy(zero_copy_only=False), dtype=np.int32), seed)
    elif pa.types.is_int32(t):
        h = _hash_int(pc.fill_null(col, 0).to_numpy(), seed)
    elif pa.types.is_int64(t):
        h = _hash_long(pc.fill_null(col, 0).to_numpy(), seed)
    elif pa.types.is_float64(t):
        d = pc.fill_null(col, 0.0).to_numpy().copy()
        d[d == 0.0] = 0.0                                # -0.0 hashes as 0.0
        bits = d.view(np.int64).copy()
        bits[np.isnan(d)] = 0x7FF8000000000000           # Java's canonical NaN
        h = _hash_long(bits, seed)
    else:
        raise TypeError(f"no Spark hash for Arrow type {t}")
    if col.null_count:
        h = np.where(col.is_null().to_numpy(zero_copy_only=False), seed, h)
    return h


def hash_ints(values: np.ndarray) -> np.ndarray:
    """Spark's ``hash(i)`` of each INT value of ``values``, as int32: where
    its hash partitioner places a row keyed by that int
    (``model.partitioning.spread_group_ids``)."""
    return _hash_int(np.asarray(values), np.full(len(values), SEED, dtype=np.uint32)).view(np.int32)


def spark_hash(columns: Sequence[pa.Array]) -> np.ndarray:
    """Spark's ``hash(c1, c2, ...)`` of each row, as int32."""
    n = len(columns[0]) if columns else 0
    h = np.full(n, SEED, dtype=np.uint32)
    for col in columns:
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        h = _hash_column(col, h)
    return h.view(np.int32)


def key_groups(table: pa.Table, key: Sequence[str], groups: int) -> Optional[np.ndarray]:
    """Spark's ``pmod(hash(key), groups)`` of each row of ``table`` (int32);
    None when a key column's type is not one :func:`supports`."""
    columns = [table.column(k) for k in key]
    if not supports([c.type for c in columns]):
        return None
    return np.mod(spark_hash(columns).astype(np.int64), groups).astype(np.int32)
