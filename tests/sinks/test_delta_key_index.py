"""The key index of the Delta sink's data files (docs/sinks.md, "Updates and
deletes: deletion vectors"): a file sorted by its one integer key has its
keys as ``.npy`` beside it, which look-ups map instead of reading the
Parquet file; ``compact_table`` indexes delta-rs' compacted files, a file
of another writer gets one at its first look-up; a vacuum through ``compact_table`` deletes the indexes of the files
it deleted; the table stays exact throughout."""
from __future__ import annotations

import os

import numpy as np
import pyarrow.parquet as pq

from sink_changes import SCHEMA, changes
from spark_changelog.sinks import delta
from spark_changelog.sinks.delta import KEY_INDEX_DIR, DeltaUpsertSink, compact_table, read_table


def indexes(path) -> set[str]:
    d = os.path.join(path, KEY_INDEX_DIR)
    return {n[:-len(".keys.npy")] for n in os.listdir(d)} if os.path.isdir(d) else set()


def data_files(path) -> set[str]:
    return {n for n in os.listdir(path) if n.endswith(".parquet")}


def test_sorted_files_have_a_key_index_that_lookups_map_and_vacuum_cleans(tmp_path):
    path = str(tmp_path / "t")
    sink = DeltaUpsertSink(path, ["id"], SCHEMA, auto_compact=False)
    sink.write_arrow_batch(changes([(0, i, k, f"a{k}") for i, k in enumerate([1, 3, 5, 9])]),
                           query_id="q", batch_id=0)
    (first,) = data_files(path)
    assert indexes(path) == set()            # delta-rs wrote this one (the append into the empty table)

    sink.write_arrow_batch(changes([(2, 10, 3, "b3"), (3, 11, 9, None), (0, 12, 7, "a7")]),
                           query_id="q", batch_id=1)
    assert indexes(path) == data_files(path)  # the first file's at its look-up, the new one's when written
    keys = np.load(os.path.join(path, KEY_INDEX_DIR, first + ".keys.npy"))
    assert keys.tolist() == pq.read_table(os.path.join(path, first))["id"].to_pylist() == [1, 3, 5, 9]

    delta._KEY_CACHE.clear()                 # a new process: the indexes are mapped, not read
    sink.write_arrow_batch(changes([(2, 13, 1, "b1")]), query_id="q", batch_id=2)
    assert isinstance(delta._KEY_CACHE[os.path.join(path, first)], np.memmap)
    assert read_table(path)[["id", "name"]].values.tolist() == [[1, "b1"], [3, "b3"], [5, "a5"], [7, "a7"]]

    before = data_files(path)
    compact_table(path)                      # delta-rs' sorted files: indexed by the command
    (compacted,) = data_files(path) - before
    assert compacted in indexes(path)
    # an index that does not fit its file (here: one key short) is not used but written again,
    # as a lost one (or a file of another writer) is built at the look-up
    np.save(os.path.join(path, KEY_INDEX_DIR, compacted + ".keys.npy"), np.array([3, 5], dtype=np.int64))
    delta._KEY_CACHE.clear()
    sink.write_arrow_batch(changes([(3, 20, 1, None), (2, 21, 5, "b5")]), query_id="q", batch_id=3)
    assert np.load(os.path.join(path, KEY_INDEX_DIR, compacted + ".keys.npy")).tolist() == [1, 3, 5, 7]
    assert read_table(path)[["id", "name"]].values.tolist() == [[3, "b3"], [5, "b5"], [7, "a7"]]

    compact_table(path, vacuum_hours=0)      # the vacuum deletes old files and their indexes
    assert indexes(path) <= data_files(path) and compacted not in indexes(path)
    assert read_table(path)[["id", "name"]].values.tolist() == [[3, "b3"], [5, "b5"], [7, "a7"]]
