"""Placing rows on chosen Spark partitions.

Spark's hash partitioner puts a row on partition ``pmod(hash(col), n)``
(Murmur3, seed 42).  Small ints 0, 1, ... do not land on distinct partitions
(the hashes of 0 and 1 are both odd), so where we decide which task gets
which rows (a window operator's key groups, the line reader's byte ranges)
we repartition by ids chosen to hash where we want them.
"""
from __future__ import annotations


def murmur3_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of an INT (Murmur3 x86 32-bit, seed 42): what its
    hash partitioner places a row by."""
    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF
    k = (value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF
    k = rotl(k, 15) * 0x1B873593 & 0xFFFFFFFF
    h = rotl(seed ^ k, 13)
    h = (h * 5 + 0xE6546B64) & 0xFFFFFFFF
    h ^= 4
    h ^= h >> 16
    h = h * 0x85EBCA6B & 0xFFFFFFFF
    h ^= h >> 13
    h = h * 0xC2B2AE35 & 0xFFFFFFFF
    h ^= h >> 16
    return h - (1 << 32) if h >= 1 << 31 else h


def spread_group_ids(key_groups: int) -> list:
    """For each target ``g`` in ``0 .. key_groups - 1`` the smallest
    non-negative int whose ``pmod(hash(id), key_groups)`` is ``g``: a value
    that Spark's hash partitioner (``repartition(n, col)``) puts on partition
    ``g`` when ``n`` is ``key_groups`` (the window operator's key-group ids,
    the line reader's range placement).  With
    ``0 .. key_groups - 1`` Spark's hash partitioner put key groups 0 and 1
    in the same one of two shuffle partitions (one core did all the work);
    with these ids every shuffle partition count dividing ``key_groups``
    gets the same number of groups.  The ids depend on ``key_groups`` only,
    so a restart finds each group's state under the same id."""
    ids = [None] * key_groups
    i = 0
    while any(x is None for x in ids):
        g = murmur3_int(i) % key_groups
        if ids[g] is None:
            ids[g] = i
        i += 1
    return ids
