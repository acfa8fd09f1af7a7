"""The key group of an event-time operator's row (docs/runtime.md, "Event
time: the sources' watermarks"): a hash of its key that does not depend on
the other rows of the piece it is packed with."""
from __future__ import annotations

import pyarrow as pa

from spark_changelog.runtime.spark_event_time import _key_groups_of

#: a minute boundary (epoch ms)
T0 = 1_600_000_020_000


def test_a_keys_group_does_not_depend_on_a_null_among_its_pieces_rows():
    """The line task packs a piece of lines at a time, the packing pass a
    task's rows: a window's rows must find one key group whatever else is
    in their piece.  A row without event time (no ``window_end``) or a NULL
    group key used to turn the piece's integers into floats, which hash
    differently."""
    ts = pa.timestamp("us", tz="UTC")
    ends = [T0 * 1000 + i * 60_000_000 for i in range(64)]
    plain = pa.table({"g": pa.array(range(64), pa.int64()), "window_end": pa.array(ends, pa.int64()).cast(ts)})
    with_nulls = pa.table({"g": pa.array(list(range(64)) + [None], pa.int64()),
                           "window_end": pa.array(ends + [None], pa.int64()).cast(ts)})
    for key in (("window_end",), ("g", "window_end")):
        groups = _key_groups_of(plain, key, 2)
        assert len(set(groups)) == 2
        assert list(_key_groups_of(with_nulls, key, 2)[:64]) == list(groups)
