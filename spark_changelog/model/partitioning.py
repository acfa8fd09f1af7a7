"""Placing rows on chosen Spark partitions.

Spark's hash partitioner puts a row on partition ``pmod(hash(col), n)``
(Murmur3, seed 42).  Small ints 0, 1, ... do not land on distinct partitions
(the hashes of 0 and 1 are both odd), so where we decide which task gets
which rows (a window operator's key groups, the line reader's byte ranges)
we repartition by ids chosen to hash where we want them.
"""
from __future__ import annotations

#: the fewest key groups a keyed operator gets by default: a Python call per
#: key group and micro-batch costs a few state round trips, so more groups
#: than tasks cost CPU on a laptop (docs/runtime.md, "Why key groups")
MIN_KEY_GROUPS = 32
#: the most (Flink's bound of its max parallelism)
MAX_KEY_GROUPS = 32768
#: the count of checkpoints written before ``plan-fingerprint.json``
#: recorded one (docs/runtime.md, "Key groups and rescaling")
LEGACY_KEY_GROUPS = 32


def default_key_groups(state_partitions: int) -> int:
    """A keyed operator's key-group count when neither the script nor its
    checkpoint sets one: Flink's rule for a default max parallelism
    (``1.5 x`` the parallelism rounded up to a power of two), over the
    stateful stage's parallelism, the state partitions
    (``spark.sql.shuffle.partitions``), between :data:`MIN_KEY_GROUPS` and
    :data:`MAX_KEY_GROUPS`.  The count never caps the stage: 2 partitions
    (``local[2]``) give 32, 200 or 256 give 512."""
    want = max(1, state_partitions + (state_partitions + 1) // 2)
    return min(max(1 << (want - 1).bit_length(), MIN_KEY_GROUPS), MAX_KEY_GROUPS)


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
