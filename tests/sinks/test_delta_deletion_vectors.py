"""Updates and deletes with deletion vectors (docs/sinks.md, "Updates and
deletes: deletion vectors"): partitions write the new rows and find the old
ones, the driver commits the vectors once; the table equals the MERGE
path's for any per-key-order-preserving interleaving, a reader that is not
ours (delta-rs' DataFusion scan) sees it, a replay changes nothing, a
concurrent commit fails the batch whole, compaction, vacuum and log
checkpoints keep it readable."""
from __future__ import annotations

import os

import numpy as np
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from hypothesis import HealthCheck, given, settings, strategies as st

from sink_changes import SCHEMA, changes
from spark_changelog.model import KIND_COL, SEQ_COL
from spark_changelog.sinks.delta import (DeltaUpsertSink, StagedAppend, StagedUpsert, compact_table,
                                         read_table)
from spark_changelog.sinks.delta_log import (TableStore, read_deletion_vector, write_deletion_vectors, z85_decode,
                                            z85_encode)
from tests.delta_scan import scan_delta



def staged_write(sink, rows, batch_id, partitions=3, query_id="q"):
    """One batch the way the sink writers run it: split by key into
    partitions (each key's changes in one, in order), each written, then one
    commit."""
    stage = sink.stage_batch(query_id, batch_id)
    assert stage is not None
    parts = [[r for r in rows if r[2] % partitions == p] for p in range(partitions)]
    written = [stage.write_partition(changes(part), p) for p, part in enumerate(parts)]
    return stage, stage.commit(written)


def table_rows(path):
    return sorted(tuple(r.values()) for r in scan_delta(path).to_pylist())


def test_z85_and_a_deletion_vector_file_round_trip(tmp_path):
    from pyroaring import BitMap
    raw = bytes(range(16))
    assert z85_decode(z85_encode(raw)) == raw
    assert z85_encode(bytes.fromhex("864FD26FB559F75B")) == "HelloWorld"     # the Z85 spec's example
    store = TableStore(str(tmp_path))
    name, descriptors = write_deletion_vectors(store, [BitMap([0, 5, 70000]), BitMap([3])])
    assert [d["cardinality"] for d in descriptors] == [3, 1] and descriptors[0]["offset"] == 1
    assert list(read_deletion_vector(store, descriptors[0])) == [0, 5, 70000]
    assert list(read_deletion_vector(store, descriptors[1])) == [3]
    with open(tmp_path / name, "r+b") as f:     # a damaged vector is an error, never a wrong row set
        f.seek(descriptors[1]["offset"] + 6)
        f.write(b"\xff")
    with pytest.raises(ValueError, match="damaged"):
        read_deletion_vector(store, descriptors[1])


def test_updates_and_deletes_become_deletion_vectors_in_one_commit(tmp_path):
    path = str(tmp_path / "t")
    sink = DeltaUpsertSink(path, ["id"], SCHEMA)
    _, first = staged_write(sink, [(0, i, i, f"a{i}") for i in range(12)], 0)
    assert first["write"] == "append: empty table"
    version = DeltaTable(path).version()
    stage, res = staged_write(sink, [(2, 20, 3, "b3"), (3, 21, 5, None), (0, 22, 50, "new"), (3, 23, 99, None),
                                     (1, 24, 7, "a7"), (2, 24, 7, "c7")], 1)
    assert isinstance(stage, StagedUpsert)
    assert {k: res[k] for k in ("write", "inserted", "updated", "deleted", "missing_deletes", "upserted")} == \
        {"write": "deletion vectors", "inserted": 1, "updated": 2, "deleted": 1, "missing_deletes": 1,
         "upserted": 3}
    dt = DeltaTable(path)
    assert dt.version() == version + 1 and dt.transaction_version("q") == 1
    expected = sorted([(i, f"a{i}") for i in range(12) if i not in (3, 5, 7)] + [(3, "b3"), (7, "c7"),
                                                                                    (50, "new")])
    assert table_rows(path) == expected
    assert [tuple(r) for r in read_table(path)[["id", "name"]].itertuples(index=False)] == expected
    protocol = dt.protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (3, 7)
    assert protocol.reader_features == ["deletionVectors"] and protocol.writer_features == ["deletionVectors"]
    live = DeltaUpsertSink(path, ["id"], SCHEMA).live_files(dt.version())
    vectors = [a["deletionVector"] for a in live.values() if a.get("deletionVector")]
    assert sum(v["cardinality"] for v in vectors) == 3           # the old rows of ids 3, 5 and 7

    # an update of a key whose old row a vector already deletes finds only its live row
    _, res = staged_write(sink, [(2, 30, 3, "d3"), (0, 31, 5, "again")], 2)
    assert (res["updated"], res["inserted"]) == (1, 1)
    assert dict(table_rows(path))[3] == "d3" and dict(table_rows(path))[5] == "again"

    # a replay of batch 2 writes nothing
    before = DeltaTable(path).version()
    replay = sink.stage_batch("q", 2)
    assert isinstance(replay, StagedAppend) and replay.reason is None
    assert replay.commit([replay.write_partition(changes([(3, 40, 1, None)]), 0)])["skipped_replay"]
    assert DeltaTable(path).version() == before and dict(table_rows(path))[1] == "a1"


def test_a_concurrent_commit_fails_the_batch_whole(tmp_path):
    path = str(tmp_path / "t")
    sink = DeltaUpsertSink(path, ["id"], SCHEMA)
    staged_write(sink, [(0, i, i, f"a{i}") for i in range(6)], 0)
    stage = sink.stage_batch("q", 1)
    written = [stage.write_partition(changes([(2, 10, 1, "mine"), (0, 11, 9, "mine")]), 0)]
    DeltaUpsertSink(path, ["id"], SCHEMA).write_arrow_batch(changes([(2, 1, 2, "theirs")]), query_id="p",
                                                             batch_id=0)
    with pytest.raises(CommitFailedError, match="replays it"):
        stage.commit(written)
    assert dict(table_rows(path)) == {**{i: f"a{i}" for i in range(6)}, 2: "theirs"}
    assert not os.path.exists(os.path.join(path, written[0]["files"][0]["path"]))
    assert DeltaTable(path).transaction_version("q") == 0


def test_compaction_vacuum_and_log_checkpoints_keep_the_rows(tmp_path):
    path = str(tmp_path / "t")
    sink = DeltaUpsertSink(path, ["id"], SCHEMA, configuration={"delta.checkpointInterval": "4"})
    staged_write(sink, [(0, i, i, f"a{i}") for i in range(20)], 0)
    model = {i: f"a{i}" for i in range(20)}
    for b in range(1, 7):
        rows = [(2, 100 * b + i, i, f"b{b}-{i}") for i in range(b, 20, 3)] + [(3, 100 * b + 50, b + 10, None)]
        staged_write(sink, rows, b)
        for _, _, i, name in rows:
            if name is None:
                model.pop(i, None)
            else:
                model[i] = name
    assert os.path.exists(os.path.join(path, "_delta_log", "_last_checkpoint"))
    # a sink started now reads the live files and their vectors from the checkpoint
    fresh = DeltaUpsertSink(path, ["id"], SCHEMA)
    _, res = staged_write(fresh, [(2, 900, 2, "z2")], 7)
    model[2] = "z2"
    assert res["updated"] == 1 and dict(table_rows(path)) == model
    # a vacuum keeps the vectors live files point at
    DeltaTable(path).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    assert dict(table_rows(path)) == model
    stats = compact_table(path, vacuum_hours=0)
    assert stats["files_added"] >= 1 and stats["vacuumed"] >= 1
    assert dict(table_rows(path)) == model
    assert all(os.path.exists(u.replace("file://", "")) for u in DeltaTable(path).file_uris())
    _, res = staged_write(DeltaUpsertSink(path, ["id"], SCHEMA), [(3, 1000, 4, None)], 8)
    model.pop(4)
    assert res["deleted"] == 1 and dict(table_rows(path)) == model


def test_without_deletion_vectors_the_table_stays_reader_1_and_merges(tmp_path):
    path = str(tmp_path / "t")
    sink = DeltaUpsertSink(path, ["id"], SCHEMA, deletion_vectors=False)
    sink.write_arrow_batch(changes([(0, 1, 1, "a"), (0, 2, 2, "b")]), query_id="q", batch_id=0)
    res = sink.write_arrow_batch(changes([(2, 3, 1, "a2")]), query_id="q", batch_id=1)
    assert res["write"] == "merge"
    dt = DeltaTable(path)
    assert (dt.protocol().min_reader_version, dt.protocol().min_writer_version) == (1, 2)
    assert sorted(dt.to_pyarrow_table().to_pylist(), key=lambda r: r["id"]) == \
        [{"id": 1, "name": "a2"}, {"id": 2, "name": "b"}]
    # an existing table keeps its protocol: the sink does not upgrade it
    again = DeltaUpsertSink(path, ["id"], SCHEMA)
    assert again.write_arrow_batch(changes([(3, 4, 2, None)]), query_id="q", batch_id=2)["write"] == "merge"
    assert DeltaTable(path).protocol().min_reader_version == 1


KEYS = st.integers(min_value=0, max_value=11)
#: per key a sequence of changes: +I/+U of a value, or -D
CHANGE = st.tuples(st.sampled_from([0, 2, 3]), st.integers(min_value=0, max_value=3))


@st.composite
def batches_and_interleaving(draw):
    """Per key its ordered changes, cut into batches; within a batch the
    keys' changes are interleaved in any order that keeps each key's own."""
    per_key = draw(st.dictionaries(KEYS, st.lists(CHANGE, min_size=1, max_size=5), min_size=1, max_size=8))
    n_batches = draw(st.integers(min_value=1, max_value=4))
    seq = 0
    stream = []
    for k, chs in per_key.items():
        cuts = sorted(draw(st.lists(st.integers(0, n_batches - 1), min_size=len(chs), max_size=len(chs))))
        for (kind, v), b in zip(chs, cuts):
            stream.append((b, k, kind, v))
    batches = []
    for b in range(n_batches):
        mine = [x for x in stream if x[0] == b]
        order = draw(st.permutations(range(len(mine))))
        # restore each key's own order among the positions it got
        by_key: dict = {}
        for x in mine:
            by_key.setdefault(x[1], []).append(x)
        taken: dict = {}
        rows = []
        for i in order:
            k = mine[i][1]
            x = by_key[k][taken.get(k, 0)]
            taken[k] = taken.get(k, 0) + 1
            seq += 1
            rows.append((x[2], seq, k, None if x[2] == 3 else f"v{x[3]}"))
        batches.append(rows)
    return batches


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=batches_and_interleaving(), partitions=st.integers(min_value=1, max_value=3))
def test_any_per_key_order_preserving_interleaving_gives_the_merge_tables_rows(tmp_path_factory, batches,
                                                                               partitions):
    base = tmp_path_factory.mktemp("dv")
    dv = DeltaUpsertSink(str(base / "dv"), ["id"], SCHEMA)
    merged = DeltaUpsertSink(str(base / "merge"), ["id"], SCHEMA, deletion_vectors=False)
    seed = [(0, 0, k, "seed") for k in range(0, 12, 2)]
    staged_write(dv, seed, 0, partitions)
    merged.write_arrow_batch(changes(seed), query_id="q", batch_id=0)
    model = {k: "seed" for k in range(0, 12, 2)}
    for b, rows in enumerate(batches, start=1):
        staged_write(dv, rows, b, partitions)
        merged.write_arrow_batch(changes(rows), query_id="q", batch_id=b)
        for kind, _, k, name in rows:
            if kind == 3:
                model.pop(k, None)
            else:
                model[k] = name
    assert dict(table_rows(base / "dv")) == model
    assert sorted((r["id"], r["name"]) for r in DeltaTable(str(base / "merge")).to_pyarrow_table().to_pylist()) \
        == sorted(model.items())


def test_a_spark_batch_of_updates_is_written_by_the_executors(spark, tmp_path):
    from spark_changelog.api import ChangelogStream
    path = str(tmp_path / "t")
    DeltaUpsertSink(path, ["id"], SCHEMA).write_arrow_batch(
        changes([(0, i, i, f"a{i}") for i in range(1, 31)]), query_id="setup", batch_id=0)
    df = spark.createDataFrame(
        [(i, f"b{i}", 2, 100 + i) for i in range(1, 31, 2)] + [(4, None, 3, 200), (40, "new", 0, 201),
                                                               (6, "x", 2, 202), (6, None, 3, 203)],
        f"id BIGINT, name STRING, {KIND_COL} TINYINT, {SEQ_COL} BIGINT")
    report = ChangelogStream.from_dataframe(df, primary_key=["id"]).write_upsert(path)
    assert report.sink_writes == {"deletion vectors": 1}
    assert (report.upserted, report.deleted) == (16, 2)
    expected = {i: (f"b{i}" if i % 2 else f"a{i}") for i in range(1, 31) if i not in (4, 6)}
    expected[40] = "new"
    assert dict(table_rows(path)) == expected
    adds = DeltaUpsertSink(path, ["id"], SCHEMA).live_files(DeltaTable(path).version())
    assert sum(1 for a in adds.values() if a.get("deletionVector")) == 1
    assert np.array_equal(read_table(path)["id"].to_numpy(), sorted(expected))


def test_the_versions_of_a_table_with_deletion_vectors_read_as_snapshots(spark, tmp_path):
    from spark_changelog.api import read_snapshots
    from spark_changelog.runtime.pipeline import collect_changes
    path = str(tmp_path / "t")
    sink = DeltaUpsertSink(path, ["id"], SCHEMA)
    staged_write(sink, [(0, 1, 1, "a"), (0, 2, 2, "b"), (0, 3, 3, "c")], 0, partitions=1)
    first = DeltaTable(path).version()
    staged_write(sink, [(2, 4, 2, "b2"), (3, 5, 3, None)], 1, partitions=1)
    out = collect_changes(read_snapshots(spark, path, ["id"], format="delta",
                                         versions=[first, first + 1]).df)
    got = [(int(k), int(i), n) for k, i, n in zip(out[KIND_COL], out["id"], out["name"])]
    # the second snapshot: 2 updated, 3 deleted (rows its deletion vector removes are not read)
    assert sorted(got[3:]) == [(1, 2, "b"), (2, 2, "b2"), (3, 3, "c")]
