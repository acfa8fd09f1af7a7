"""``spark-changelog compact`` (docs/sinks.md, "Compaction and vacuum"): small
files of many micro-batches become one, clustered by the key, rows unchanged,
no batch id recorded; with ``--vacuum-hours 0`` the replaced files are deleted
and the table still reads the same."""
from __future__ import annotations

import glob
import os

import pyarrow as pa

from spark_changelog.cli import main
from spark_changelog.sinks.delta import DeltaUpsertSink, read_table

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def batch(ids, kind=0, seq0=0):
    return pa.table({"id": pa.array(ids, pa.int64()), "name": pa.array([f"n{i}" for i in ids]),
                     "_kind": pa.array([kind] * len(ids), pa.int8()),
                     "_seq": pa.array(range(seq0, seq0 + len(ids)), pa.int64())})


def live_files(path):
    from deltalake import DeltaTable
    return DeltaTable(path).file_uris()


def data_files(path):
    return sorted(glob.glob(os.path.join(path, "*.parquet")))


def test_compact_then_vacuum_keeps_the_rows_and_drops_the_old_files(tmp_path, capsys):
    path = str(tmp_path / "t")
    sink = DeltaUpsertSink(path, ["id"], SCHEMA, keys_emitted_once=True)
    for b in range(5):       # five appends: five small files
        sink.write_arrow_batch(batch([b * 10 + i for i in range(10)], seq0=b * 10), query_id="q", batch_id=b)
    # a MERGE (a sink without the planner's promise)
    DeltaUpsertSink(path, ["id"], SCHEMA).write_arrow_batch(batch([3, 17], kind=3, seq0=100),
                                                           query_id="q", batch_id=5)
    before = read_table(path)
    assert len(live_files(path)) >= 3

    assert main(["compact", path]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"compacted {path}: ") and "rewritten as 1" in out, out
    assert read_table(path).equals(before)
    assert DeltaUpsertSink(path, ["id"], SCHEMA).last_batch_id("q") == 5
    assert len(live_files(path)) == 1
    assert len(data_files(path)) > 1           # replaced files stay until a vacuum

    assert main(["compact", path, "--vacuum-hours", "0"]) == 0
    assert "unreferenced file(s) older than 0 h deleted" in capsys.readouterr().out
    assert len(data_files(path)) == 1
    assert read_table(path).equals(before)
    assert len(before) == 48


def test_compact_of_a_missing_table_says_so(tmp_path, capsys):
    assert main(["compact", str(tmp_path / "nope")]) == 1
    assert "cannot compact table" in capsys.readouterr().err
