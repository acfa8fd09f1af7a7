"""Placing rows on chosen Spark partitions.

Spark's hash partitioner puts a row on partition ``pmod(hash(col), n)``
(Murmur3, seed 42).  Small ints 0, 1, ... do not land on distinct partitions
(the hashes of 0 and 1 are both odd), so where we decide which task gets
which rows (a window operator's key groups, the line reader's byte ranges)
we repartition by ids chosen to hash where we want them.
"""
from __future__ import annotations

import functools

import numpy as np

from .spark_hash import hash_ints

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
    checkpoint sets one: at least ``1.5 x`` the stateful stage's parallelism,
    the state partitions (``spark.sql.shuffle.partitions``), as Flink's
    default max parallelism is, and at least :data:`MIN_KEY_GROUPS`,
    rounded up to a multiple of the partitions (Flink rounds to a power of
    two): with the spread ids (:func:`spread_group_ids`) every partition
    then gets the same number of key groups, whatever the count of
    partitions.  At most :data:`MAX_KEY_GROUPS`.  The count never caps the
    stage: 2 partitions (``local[2]``) or 4 give 32, 200 give 400, 256 give
    512 (docs/runtime.md, "Why key groups")."""
    n = max(1, state_partitions)
    want = max(n + (n + 1) // 2, MIN_KEY_GROUPS)
    return min(-(-want // n) * n, MAX_KEY_GROUPS)


@functools.lru_cache(maxsize=64)
def _spread_ids(key_groups: int) -> tuple:
    ids = np.full(key_groups, -1, dtype=np.int64)
    start, step = 0, max(4 * key_groups, 1024)
    while (ids < 0).any():
        candidates = np.arange(start, start + step, dtype=np.int64)
        groups = np.mod(hash_ints(candidates).astype(np.int64), key_groups)
        # the first (smallest) candidate of each group not found yet
        found, first = np.unique(groups, return_index=True)
        todo = ids[found] < 0
        ids[found[todo]] = candidates[first[todo]]
        start += step
    return tuple(int(i) for i in ids)


def spread_group_ids(key_groups: int) -> list:
    """For each target ``g`` in ``0 .. key_groups - 1`` the smallest
    non-negative int whose ``pmod(hash(id), key_groups)`` is ``g``: a value
    that Spark's hash partitioner (``repartition(n, col)``) puts on partition
    ``g`` when ``n`` is ``key_groups`` (the keyed and window operators'
    key-group ids, the line reader's range placement).  With
    ``0 .. key_groups - 1`` Spark's hash partitioner put key groups 0 and 1
    in the same one of two shuffle partitions (one core did all the work),
    and 32 groups 20/12 over two; with these ids every shuffle partition
    count dividing ``key_groups`` gets the same number of groups.  The ids
    depend on ``key_groups`` only, so a restart finds each group's state
    under the same id."""
    return list(_spread_ids(key_groups))


#: how a keyed operator's key-group index ``pmod(hash(key), G)`` maps to the
#: value of its grouping column, the id its state is stored under
#: (docs/runtime.md, "Key groups over the state partitions"); recorded in a checkpoint's
#: ``plan-fingerprint.json`` as ``key_group_ids``
SPREAD_IDS = "spread"       # :func:`spread_group_ids`: even over the state partitions
PLAIN_IDS = "plain"         # the index itself: checkpoints written before the layout was recorded
KEY_GROUP_ID_LAYOUTS = (SPREAD_IDS, PLAIN_IDS)


def key_group_ids(key_groups: int, layout: str) -> list:
    """The id of each key-group index ``0 .. key_groups - 1`` under
    ``layout`` (:data:`SPREAD_IDS` or :data:`PLAIN_IDS`)."""
    if layout == SPREAD_IDS:
        return spread_group_ids(key_groups)
    if layout == PLAIN_IDS:
        return list(range(key_groups))
    raise ValueError(f"unknown key-group id layout {layout!r} (one of {', '.join(KEY_GROUP_ID_LAYOUTS)})")
