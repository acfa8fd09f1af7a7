"""ChangelogSink: every emitted row kept with its kind and sequence, one file per
batch id, in Parquet or Debezium JSON."""
from __future__ import annotations

import datetime as dt
import decimal
import json
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from spark_changelog.sinks.changelog import ChangelogSink, read_changelog

SCHEMA = pa.schema([("id", pa.int64()), ("level", pa.int64()), ("attr", pa.string())])
KIND = {"+I": 0, "-U": 1, "+U": 2, "-D": 3}
FORMATS = ["parquet", "debezium-json"]


def changes(rows, columns=("id", "level", "attr")):
    """``rows``: (op, seq, *values) tuples, in arrival order."""
    data = {c: [r[2 + i] for r in rows] for i, c in enumerate(columns)}
    data["_kind"] = np.array([KIND[r[0]] for r in rows], dtype=np.int8)
    data["_seq"] = np.array([r[1] for r in rows], dtype=np.int64)
    return pd.DataFrame(data)


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
    events = [json.loads(line) for line in (tmp_path / "batch-00000000000000000000.json").read_text().splitlines()]
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
    events = [json.loads(line) for line in (tmp_path / "batch-00000000000000000000.json").read_text().splitlines()]
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
