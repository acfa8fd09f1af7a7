"""ChangelogSink: every emitted row kept with its kind and sequence, one committed
directory of part files per batch id (an old output's one file per batch id
still read), in Parquet or Debezium JSON."""
from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import pathlib
import shutil

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_changelog.sinks.changelog import ChangelogSink, committed_batches, read_changelog

SCHEMA = pa.schema([("id", pa.int64()), ("level", pa.int64()), ("attr", pa.string())])
KIND = {"+I": 0, "-U": 1, "+U": 2, "-D": 3}
FORMATS = ["parquet", "debezium-json"]


def changes(rows, columns=("id", "level", "attr")):
    """``rows``: (op, seq, *values) tuples, in arrival order."""
    data = {c: [r[2 + i] for r in rows] for i, c in enumerate(columns)}
    data["_kind"] = np.array([KIND[r[0]] for r in rows], dtype=np.int8)
    data["_seq"] = np.array([r[1] for r in rows], dtype=np.int64)
    return pd.DataFrame(data)


def _events(path):
    """The Debezium events of the only batch under ``path`` (one part)."""
    [(batch_id, [part])] = committed_batches(path)
    assert batch_id == 0 and part.name == "part-00000.json"
    return [json.loads(line) for line in part.read_text().splitlines()]


def as_rows(df, columns=("id", "level", "attr")):
    """read_changelog output as (batch, op, seq, *values) tuples, None for nulls."""
    out = []
    for rec in df.to_dict("records"):
        vals = tuple(None if pd.isna(rec[c]) else rec[c] for c in columns)
        out.append((rec["_batch"], rec["op"], rec["_seq"]) + vals)
    return out


# Seed case 2 (docs/semantics.md, section 2) arriving shuffled, then a delete and a late insert.
BATCH0 = [("+U", 3, 1, 20, "b1"), ("+I", 1, 1, 10, "a1"), ("-U", 3, 1, 10, "a1"), ("+I", 2, 2, 10, "x")]
BATCH1 = [("-D", 4, 2, 10, "x"), ("+I", 5, 3, None, None)]
EXPECTED = [  # batch, op, seq, values: emission order = (_seq, key, retract first, arrival)
    (0, "+I", 1, 1, 10, "a1"),
    (0, "+I", 2, 2, 10, "x"),
    (0, "-U", 3, 1, 10, "a1"),
    (0, "+U", 3, 1, 20, "b1"),
    (1, "-D", 4, 2, 10, "x"),
    (1, "+I", 5, 3, None, None),
]


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip(tmp_path, fmt):
    sink = ChangelogSink(tmp_path, fmt, key="id", schema=SCHEMA)
    sink.write_batch(changes(BATCH0), batch_id=0)
    sink.write_batch(changes(BATCH1), batch_id=1)
    got = read_changelog(tmp_path)
    assert as_rows(got) == EXPECTED
    assert list(got.columns) == ["id", "level", "attr", "op", "_kind", "_seq", "_batch"]
    assert got["_kind"].tolist() == [KIND[r[1]] for r in EXPECTED]
    assert str(got["level"].dtype) == "Int64"  # a bigint with a null stays integer
    assert sink.last_batch_id() == 1


def test_both_formats_read_the_same(tmp_path):
    for fmt in FORMATS:
        sink = ChangelogSink(tmp_path / fmt, fmt, key="id", schema=SCHEMA)
        sink.write_batch(changes(BATCH0), batch_id=0)
        sink.write_batch(changes(BATCH1), batch_id=1)
    pd.testing.assert_frame_equal(read_changelog(tmp_path / "parquet"), read_changelog(tmp_path / "debezium-json"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_replayed_batch_overwrites_its_file(tmp_path, fmt):
    sink = ChangelogSink(tmp_path, fmt, key="id", schema=SCHEMA)
    sink.write_batch(changes(BATCH0), batch_id=0)
    sink.write_batch(changes(BATCH1), batch_id=1)
    res = sink.write_batch(changes(BATCH1), batch_id=1)  # replay after a crash
    assert res["overwrote"] is True
    assert as_rows(read_changelog(tmp_path)) == EXPECTED
    # a replay that recomputes the batch differently replaces it entirely
    sink.write_batch(changes([("+I", 9, 7, 70, "z")]), batch_id=1)
    assert as_rows(read_changelog(tmp_path)) == EXPECTED[:4] + [(1, "+I", 9, 7, 70, "z")]
    # an empty replay removes the file
    sink.write_batch(changes([]), batch_id=1)
    assert as_rows(read_changelog(tmp_path)) == EXPECTED[:4]
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".")]  # no temp files left


def test_batches_ordered_numerically(tmp_path):
    sink = ChangelogSink(tmp_path, key="id", schema=SCHEMA)
    sink.write_batch(changes([("+I", 1, 1, 1, "a")]), batch_id=10)
    sink.write_batch(changes([("+I", 2, 2, 2, "b")]), batch_id=2)
    assert [r[0] for r in as_rows(read_changelog(tmp_path))] == [2, 10]


def test_debezium_events(tmp_path):
    sink = ChangelogSink(tmp_path, "debezium-json", key="id", schema=SCHEMA)
    sink.write_batch(changes(BATCH0 + BATCH1), batch_id=0)
    events = _events(tmp_path)
    assert [(e["op"], e["before"], e["after"], e["source"]["lsn"]) for e in events] == [
        ("c", None, {"id": 1, "level": 10, "attr": "a1"}, 1),
        ("c", None, {"id": 2, "level": 10, "attr": "x"}, 2),
        ("u", {"id": 1, "level": 10, "attr": "a1"}, {"id": 1, "level": 20, "attr": "b1"}, 3),  # -U/+U paired
        ("d", {"id": 2, "level": 10, "attr": "x"}, None, 4),
        ("c", None, {"id": 3, "level": None, "attr": None}, 5),
    ]


def test_debezium_unpaired_updates_without_key(tmp_path):
    # no key: -U and +U cannot be paired, each becomes a half "u" event; reading restores both rows
    sink = ChangelogSink(tmp_path, "debezium-json", schema=SCHEMA)
    rows = [("+U", 3, 1, 20, "b1"), ("-U", 3, 1, 10, "a1"), ("+U", 4, 5, 1, "q")]
    sink.write_batch(changes(rows), batch_id=0)
    events = _events(tmp_path)
    assert [(e["op"], e["before"] is not None, e["after"] is not None) for e in events] == [
        ("u", True, False), ("u", False, True), ("u", False, True)]
    assert as_rows(read_changelog(tmp_path)) == [
        (0, "-U", 3, 1, 10, "a1"), (0, "+U", 3, 1, 20, "b1"), (0, "+U", 4, 5, 1, "q")]


@pytest.mark.parametrize("fmt", FORMATS)
def test_rich_types_round_trip(tmp_path, fmt):
    schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")), ("ntz", pa.timestamp("us")),
                        ("d", pa.date32()), ("price", pa.decimal128(10, 2)), ("blob", pa.binary()),
                        ("flag", pa.bool_()), ("x", pa.float64()), ("small", pa.int8())])
    cols = tuple(schema.names)
    ts = pd.Timestamp("2024-05-06 07:08:09.123456", tz="UTC")
    rows = [("+I", 1, 1, ts, dt.datetime(2024, 1, 2, 3, 4, 5), dt.date(2024, 1, 2), decimal.Decimal("12.34"),
             b"\x00\xff", True, 1.5, 7),
            ("-D", 2, 2, None, None, None, None, None, None, None, None)]
    sink = ChangelogSink(tmp_path, fmt, key="id", schema=schema)
    sink.write_batch(changes(rows, cols), batch_id=0)
    got = read_changelog(tmp_path)
    assert got["ts"].iloc[0] == ts and pd.isna(got["ts"].iloc[1])
    assert got["ntz"].iloc[0] == pd.Timestamp("2024-01-02 03:04:05")
    assert got["d"].iloc[0] == dt.date(2024, 1, 2)
    assert got["price"].iloc[0] == decimal.Decimal("12.34")
    assert got["blob"].iloc[0] == b"\x00\xff"
    assert bool(got["flag"].iloc[0]) is True and pd.isna(got["flag"].iloc[1])
    assert str(got["small"].dtype) == "Int8"
    assert got["op"].tolist() == ["+I", "-D"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_schema_inferred_from_first_batch_and_kept(tmp_path, fmt):
    sink = ChangelogSink(tmp_path, fmt, key="id")
    sink.write_batch(changes([("+I", 1, 1, 10, "a")]), batch_id=0)
    # pandas made the bigint a float because of a null: written back as int64
    later = changes([("+I", 2, 2, None, "b")]).astype({"level": "float64"})
    sink.write_batch(later, batch_id=1)
    reopened = ChangelogSink(tmp_path, fmt)
    assert reopened.schema.field("level").type == pa.int64()
    got = read_changelog(tmp_path)
    assert str(got["level"].dtype) == "Int64" and got["level"].isna().tolist() == [False, True]


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown changelog format"):
        ChangelogSink(tmp_path / "a", "avro")
    ChangelogSink(tmp_path / "b", "parquet", schema=SCHEMA).write_batch(changes(BATCH1), batch_id=0)
    with pytest.raises(ValueError, match="another format"):
        ChangelogSink(tmp_path / "b", "debezium-json")
    with pytest.raises(ValueError, match="differs"):
        ChangelogSink(tmp_path / "b", "parquet", schema=pa.schema([("id", pa.int32())]))
    sink = ChangelogSink(tmp_path / "c", schema=SCHEMA)
    with pytest.raises(ValueError, match="missing"):
        sink.write_batch(changes(BATCH1).drop(columns=["attr"]), batch_id=0)
    with pytest.raises(ValueError, match="invalid _kind"):
        sink.write_batch(changes(BATCH1).assign(_kind=9), batch_id=0)
    with pytest.raises(ValueError, match="reserved"):
        ChangelogSink(tmp_path / "d", schema=pa.schema([("op", pa.string())]))


def test_read_empty(tmp_path):
    got = read_changelog(tmp_path)
    assert got.empty and list(got.columns) == ["op", "_kind", "_seq", "_batch"]
    ChangelogSink(tmp_path / "s", schema=SCHEMA)
    got = read_changelog(tmp_path / "s")
    assert got.empty and list(got.columns) == ["id", "level", "attr", "op", "_kind", "_seq", "_batch"]


# ------------------------------------------------- part files, commit, old layout
FIXTURES = pathlib.Path(__file__).parent.parent / "fixtures" / "changelog_outputs"


def _staged(sink, batch_id, parts, query_id="q"):
    """A batch written as the executors do: ``parts`` (partition -> rows in
    arrival order), each partition's file, then the driver's commit."""
    stage = sink.stage_batch(query_id, batch_id)
    written = [stage.write_partition(_arrow(rows), p) for p, rows in parts.items()]
    return stage, written


def _arrow(rows):
    return pa.Table.from_pandas(changes(rows), preserve_index=False)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_batch_is_a_committed_directory_of_part_files(tmp_path, fmt):
    sink = ChangelogSink(tmp_path, fmt, key="id", schema=SCHEMA)
    ext = "parquet" if fmt == "parquet" else "json"
    # keys 1 and 3 in partition 0, key 2 in partition 4 (an empty partition 2 writes no file)
    stage, written = _staged(sink, 0, {0: [r for r in BATCH0 + BATCH1 if r[2] != 2], 2: [],
                                       4: [r for r in BATCH0 + BATCH1 if r[2] == 2]})
    assert [w["file"] for w in written] == [f"{stage.attempt}/part-00000.{ext}", None,
                                            f"{stage.attempt}/part-00004.{ext}"]
    assert read_changelog(tmp_path)["op"].tolist() == []          # written, not committed: no batch
    assert sink.last_batch_id() == -1
    result = stage.commit(written)
    assert (result["rows"], result["parts"], result["overwrote"]) == (6, 2, False)
    batch_dir = tmp_path / "batch-00000000000000000000"
    commit = json.loads((batch_dir / "_commit.json").read_text())
    assert (commit["key"], commit["rows"], [p["partition"] for p in commit["parts"]]) == (["id"], 6, [0, 4])
    assert sorted(os.listdir(tmp_path)) == ["_schema.arrow", "batch-00000000000000000000"]
    # the parts merge into the batch's emission order
    assert as_rows(read_changelog(tmp_path)) == [(0,) + r[1:] for r in EXPECTED]
    assert committed_batches(tmp_path) == [(0, [batch_dir / p["file"] for p in commit["parts"]])]
    assert sink.last_batch_id() == 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_replay_replaces_the_batch_whole_and_a_failed_attempt_is_never_read(tmp_path, fmt):
    sink = ChangelogSink(tmp_path, fmt, key="id", schema=SCHEMA)
    first, written = _staged(sink, 0, {0: BATCH0})
    first.commit(written)
    # a replay with another partitioning (a rescaled checkpoint): the old batch
    # stays readable until the new commit, then only the new one is
    replay, written = _staged(sink, 0, {1: [r for r in BATCH0 if r[2] == 1], 3: [r for r in BATCH0 if r[2] == 2]})
    ext = "parquet" if fmt == "parquet" else "json"
    # a task killed while it wrote its file (the retry wrote the final one)
    (tmp_path / "batch-00000000000000000000" / replay.attempt / f".tmp-part-00003.{ext}-x").write_bytes(b"half")
    assert as_rows(read_changelog(tmp_path)) == EXPECTED[:4]
    assert replay.commit(written)["overwrote"] is True
    assert as_rows(read_changelog(tmp_path)) == EXPECTED[:4]
    batch_dir = tmp_path / "batch-00000000000000000000"
    assert sorted(p.name for p in batch_dir.iterdir()) == sorted(["_commit.json", replay.attempt])
    assert sorted(p.name for p in (batch_dir / replay.attempt).iterdir()) == [f"part-00001.{ext}",
                                                                              f"part-00003.{ext}"]
    # an attempt that fails before its commit leaves nothing behind
    failed, written = _staged(sink, 1, {0: BATCH1})
    failed.drop(written)
    assert not (tmp_path / "batch-00000000000000000001").exists()
    assert as_rows(read_changelog(tmp_path)) == EXPECTED[:4]
    # a task killed before its commit: its files are in an attempt no commit names
    _staged(sink, 0, {0: [("+I", 1, 9, 9, "never")]})
    assert as_rows(read_changelog(tmp_path)) == EXPECTED[:4]
    # an empty replay removes the batch
    sink.write_batch(changes([]), batch_id=0)
    assert read_changelog(tmp_path).empty and not batch_dir.exists()


def test_a_reader_rereads_a_batch_replaced_while_it_reads(tmp_path, monkeypatch):
    import spark_changelog.sinks.changelog as mod
    sink = ChangelogSink(tmp_path, key="id", schema=SCHEMA)
    sink.write_batch(changes(BATCH0), batch_id=0)
    read_file, replays = mod._read_file, []

    def replayed_first(f, schema):
        if not replays:     # the replay commits between the reader's commit and its files
            replays.append(sink.write_batch(changes([("+I", 9, 7, 70, "z")]), batch_id=0))
        return read_file(f, schema)

    monkeypatch.setattr(mod, "_read_file", replayed_first)
    assert as_rows(read_changelog(tmp_path)) == [(0, "+I", 9, 7, 70, "z")]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["+I", "-U", "+U", "-D"]), st.integers(0, 6), st.integers(0, 5),
                          st.integers(0, 3)), max_size=30),
       st.integers(1, 4), st.sampled_from(FORMATS))
def test_parts_read_as_the_batch_written_whole(rows, n_parts, fmt):
    """Any split of a batch by key into partitions (each keeping the arrival
    order) reads back as the batch written as one file: the emission order."""
    import tempfile
    rows = [(op, seq, key, level, f"v{level}") for op, seq, key, level in rows]
    with tempfile.TemporaryDirectory() as d:
        whole = ChangelogSink(pathlib.Path(d) / "whole", fmt, key="id", schema=SCHEMA)
        whole.write_batch(changes(rows), batch_id=0)
        split = ChangelogSink(pathlib.Path(d) / "split", fmt, key="id", schema=SCHEMA)
        stage, written = _staged(split, 0, {p: [r for r in rows if r[2] % n_parts == p] for p in range(n_parts)})
        stage.commit(written)
        pd.testing.assert_frame_equal(read_changelog(pathlib.Path(d) / "split"),
                                      read_changelog(pathlib.Path(d) / "whole"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_output_of_the_old_layout_is_read_and_written_on(tmp_path, fmt):
    """tests/fixtures/changelog_outputs/v1-*: BATCH0 and BATCH1 written by the
    sink before part files (one file per batch id)."""
    shutil.copytree(FIXTURES / f"v1-{fmt}", tmp_path / "log")
    log = tmp_path / "log"
    assert as_rows(read_changelog(log)) == EXPECTED
    sink = ChangelogSink(log, fmt, key="id", schema=SCHEMA)
    assert sink.last_batch_id() == 1
    with pytest.raises(ValueError, match="another format"):
        ChangelogSink(log, "debezium-json" if fmt == "parquet" else "parquet")
    # a new batch is a directory; a replay of an old batch replaces its file
    stage, written = _staged(sink, 2, {0: [("+I", 6, 4, 1, "n")]})
    stage.commit(written)
    stage, written = _staged(sink, 1, {0: BATCH1[:1], 1: BATCH1[1:]})
    stage.commit(written)
    assert as_rows(read_changelog(log)) == EXPECTED + [(2, "+I", 6, 4, 1, "n")]
    ext = "parquet" if fmt == "parquet" else "json"
    assert sorted(os.listdir(log)) == ["_schema.arrow", f"batch-00000000000000000000.{ext}",
                                       "batch-00000000000000000001", "batch-00000000000000000002"]
    with pytest.raises(ValueError, match="another format"):
        ChangelogSink(log, "debezium-json" if fmt == "parquet" else "parquet")


@pytest.mark.parametrize("fmt", FORMATS)
def test_cat_prints_the_changes_of_an_output(tmp_path, fmt, capsys):
    """``spark-changelog cat DIR`` of a changelog output: batch, op, _seq and
    the values, by batch then emission order, from parts and old-layout files."""
    from spark_changelog.cli import main
    shutil.copytree(FIXTURES / f"v1-{fmt}", tmp_path / "log")
    sink = ChangelogSink(tmp_path / "log", fmt, key="id", schema=SCHEMA)
    stage, written = _staged(sink, 2, {1: [("+I", 7, 5, 1, "p")], 0: [("+I", 6, 4, None, "n,m")]})
    stage.commit(written)
    assert main(["cat", str(tmp_path / "log")]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "_batch,op,_seq,id,level,attr",
        "0,+I,1,1,10,a1", "0,+I,2,2,10,x", "0,-U,3,1,10,a1", "0,+U,3,1,20,b1",
        "1,-D,4,2,10,x", "1,+I,5,3,,",
        '2,+I,6,4,,"n,m"', "2,+I,7,5,1,p"]
    assert main(["cat", str(tmp_path / "log"), "--format", "json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[-2:] == [{"_batch": 2, "op": "+I", "_seq": 6, "id": 4, "level": None, "attr": "n,m"},
                          {"_batch": 2, "op": "+I", "_seq": 7, "id": 5, "level": 1, "attr": "p"}]
    assert len(lines) == 8
