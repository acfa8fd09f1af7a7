"""DeltaUpsertSink (delta-rs): net change per key, one MERGE commit per batch,
replays skipped through the Delta application transaction."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

deltalake = pytest.importorskip("deltalake")

from spark_changelog.sinks.delta import (PRIMARY_KEY_PROPERTY, DeltaSinkSchemaError,  # noqa: E402
                                         DeltaUpsertSink, read_table, table_key)
from tests.delta_scan import scan_delta  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.int64())])
KIND = {"+I": 0, "-U": 1, "+U": 2, "-D": 3}


def changes(rows, columns=("id", "name", "amount")):
    """``rows``: (op, seq, *values) tuples, in arrival order."""
    data = {c: [r[2 + i] for r in rows] for i, c in enumerate(columns)}
    data["_kind"] = np.array([KIND[r[0]] for r in rows], dtype=np.int8)
    data["_seq"] = np.array([r[1] for r in rows], dtype=np.int64)
    return pd.DataFrame(data)


def rows_of(path):
    """Current table as sorted tuples, read with plain deltalake (not our reader)."""
    df = scan_delta(path).to_pandas()
    out = []
    for rec in df.to_dict("records"):
        out.append(tuple(None if (v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA)
                         else v for v in rec.values()))
    return sorted(out, key=lambda r: tuple((x is None, x) for x in r))


@pytest.fixture
def table(tmp_path):
    return str(tmp_path / "t")


# ---------------------------------------------------------------- scenarios as data
# each step: (batch id, rows of the batch, expected table after it)
SCENARIO = [
    (0, [("+I", 1, 1, "a", 10), ("+I", 2, 2, "b", 20), ("+I", 3, 3, "c", None)],
     [(1, "a", 10), (2, "b", 20), (3, "c", None)]),
    # update (retract stream -U/+U), delete, insert
    (1, [("-U", 4, 1, "a", 10), ("+U", 4, 1, "a2", 11), ("-D", 5, 2, "b", 20), ("+I", 6, 4, "d", 40)],
     [(1, "a2", 11), (3, "c", None), (4, "d", 40)]),
    # upsert stream (no -U), a key deleted then re-inserted in the same batch, a key inserted then deleted
    (2, [("+U", 7, 3, "c2", 33), ("-D", 8, 1, "a2", 11), ("+I", 9, 1, "a3", 12),
         ("+I", 10, 5, "e", 50), ("-D", 11, 5, "e", 50)],
     [(1, "a3", 12), (3, "c2", 33), (4, "d", 40)]),
    # arrival order is irrelevant, _seq decides (seed case 2: +U arrives first)
    (3, [("+U", 14, 4, "d3", 43), ("+I", 12, 6, "f", 60), ("+U", 13, 4, "d2", 42), ("-U", 13, 4, "d", 40)],
     [(1, "a3", 12), (3, "c2", 33), (4, "d3", 43), (6, "f", 60)]),
    # at equal _seq the retraction comes first even if it arrives last
    (4, [("+U", 15, 6, "f2", 61), ("-U", 15, 6, "f", 60)],
     [(1, "a3", 12), (3, "c2", 33), (4, "d3", 43), (6, "f2", 61)]),
]


def test_scenario_across_batches(table):
    sink = DeltaUpsertSink(table, ["id"], SCHEMA)
    for batch_id, rows, expected in SCENARIO:
        before = deltalake.DeltaTable(table).version() if batch_id else None
        res = sink.write_batch(changes(rows), query_id="q1", batch_id=batch_id)
        assert not res["skipped_replay"] and res["committed"]
        assert rows_of(table) == expected, f"after batch {batch_id}"
        if before is not None:
            assert deltalake.DeltaTable(table).version() == before + 1  # one commit per batch
        assert sink.last_batch_id("q1") == batch_id
    # our reader: sorted by key, exact nullable integer types
    got = read_table(table)
    assert list(got.columns) == ["id", "name", "amount"]
    assert str(got["id"].dtype) == "Int64" and str(got["amount"].dtype) == "Int64"
    assert got["id"].tolist() == [1, 3, 4, 6]


def test_counts_reported(table):
    sink = DeltaUpsertSink(table, "id", SCHEMA)
    sink.write_batch(changes(SCENARIO[0][1]), query_id="q", batch_id=0)
    res = sink.write_batch(changes(SCENARIO[1][1]), query_id="q", batch_id=1)
    assert {k: res[k] for k in ("inserted", "updated", "deleted", "upserted", "missing_deletes")} == \
        {"inserted": 1, "updated": 1, "deleted": 1, "upserted": 2, "missing_deletes": 0}


def test_merge_is_single_commit_with_app_transaction(table):
    sink = DeltaUpsertSink(table, ["id"], SCHEMA)
    res = sink.write_batch(changes(SCENARIO[0][1]), query_id="query-A", batch_id=7)
    dt = deltalake.DeltaTable(table)
    assert dt.transaction_version("query-A") == 7
    # into the empty table the net additions are appended (the same as a MERGE there)
    assert res["write"] == "append: empty table"
    assert dt.history(1)[0]["operation"] == "WRITE"
    assert dt.version() == 2  # create, the deletion-vector feature, one append
    res = sink.write_batch(changes(SCENARIO[1][1]), query_id="query-A", batch_id=8)
    dt.update_incremental()
    assert res["write"] == "deletion vectors" and dt.history(1)[0]["operation"] == "MERGE"
    assert dt.transaction_version("query-A") == 8
    assert dt.version() == 3  # one commit per batch


def test_replayed_batch_is_skipped(table):
    sink = DeltaUpsertSink(table, ["id"], SCHEMA)
    sink.write_batch(changes(SCENARIO[0][1]), query_id="q", batch_id=0)
    sink.write_batch(changes(SCENARIO[1][1]), query_id="q", batch_id=1)
    version = deltalake.DeltaTable(table).version()
    # replay of batch 1 (after a crash the batch may even be recomputed differently)
    res = sink.write_batch(changes([("+I", 99, 9, "zz", 9)]), query_id="q", batch_id=1)
    assert res["skipped_replay"] is True and res["upserted"] == 0
    res = sink.write_batch(changes(SCENARIO[1][1]), query_id="q", batch_id=0)  # older batch too
    assert res["skipped_replay"] is True
    assert deltalake.DeltaTable(table).version() == version
    assert rows_of(table) == SCENARIO[1][2]
    # a fresh sink object (restarted process) sees the same progress
    sink2 = DeltaUpsertSink(table, ["id"], SCHEMA)
    assert sink2.last_batch_id("q") == 1
    assert sink2.write_batch(changes(SCENARIO[1][1]), query_id="q", batch_id=1)["skipped_replay"]
    # another query id has its own progress
    assert sink2.last_batch_id("other") == -1
    res = sink2.write_batch(changes([("+I", 1, 9, "zz", 9)]), query_id="other", batch_id=0)
    assert not res["skipped_replay"]
    assert rows_of(table) == SCENARIO[1][2] + [(9, "zz", 9)]
    assert sink2.last_batch_id("q") == 1 and sink2.last_batch_id("other") == 0


def test_delete_of_missing_key_is_harmless(table):
    sink = DeltaUpsertSink(table, ["id"], SCHEMA)
    sink.write_batch(changes([("+I", 1, 1, "a", 1)]), query_id="q", batch_id=0)
    res = sink.write_batch(changes([("-D", 2, 42, "x", 0), ("-U", 3, 43, "y", 0)]),
                           query_id="q", batch_id=1)
    assert res["deleted"] == 0 and res["missing_deletes"] == 2 and res["committed"]
    assert rows_of(table) == [(1, "a", 1)]
    # the no-op MERGE is not committed by delta-rs; the sink records the batch anyway
    assert sink.last_batch_id("q") == 1
    assert sink.write_batch(changes([("-D", 2, 42, "x", 0)]), query_id="q", batch_id=1)["skipped_replay"]


def test_empty_batch_records_progress(table):
    sink = DeltaUpsertSink(table, ["id"], SCHEMA)
    sink.write_batch(changes([("+I", 1, 1, "a", 1)]), query_id="q", batch_id=0)
    v = deltalake.DeltaTable(table).version()
    res = sink.write_batch(changes([]), query_id="q", batch_id=1)
    assert res["committed"] and not res["skipped_replay"]
    dt = deltalake.DeltaTable(table)
    assert dt.version() == v + 1 and dt.transaction_version("q") == 1
    assert len(dt.file_uris()) == 1  # no data file for it
    assert rows_of(table) == [(1, "a", 1)]
    # a frame with no columns at all (what an empty Spark batch may give) is fine too
    assert sink.write_batch(pd.DataFrame(), query_id="q", batch_id=2)["committed"]
    assert sink.last_batch_id("q") == 2


def test_empty_batch_not_committed_when_disabled(table):
    sink = DeltaUpsertSink(table, ["id"], SCHEMA, commit_empty_batches=False)
    sink.write_batch(changes([("+I", 1, 1, "a", 1)]), query_id="q", batch_id=0)
    v = deltalake.DeltaTable(table).version()
    assert not sink.write_batch(changes([]), query_id="q", batch_id=1)["committed"]
    assert not sink.write_batch(changes([("-D", 5, 7, "x", 0)]), query_id="q", batch_id=2)["committed"]
    assert deltalake.DeltaTable(table).version() == v
    assert sink.last_batch_id("q") == 0


def test_null_key_raises_naming_column_and_row(table):
    sink = DeltaUpsertSink(table, ["id"], SCHEMA)
    bad = changes([("+I", 1, 1, "a", 1), ("+I", 2, None, "ghost", 2)])
    with pytest.raises(ValueError, match=r"primary key column 'id' is null in 1 row\(s\).*ghost.*dead-letter"):
        sink.write_batch(bad, query_id="q", batch_id=0)
    assert sink.last_batch_id("q") == -1  # nothing applied
    assert rows_of(table) == []


def test_composite_key_null_part(table):
    schema = pa.schema([("Tenant", pa.string()), ("id", pa.int64()), ("v", pa.float64())])
    sink = DeltaUpsertSink(table, ["Tenant", "id"], schema)
    with pytest.raises(ValueError, match="'Tenant'"):
        sink.write_batch(changes([("+I", 1, None, 1, 1.0)], ("Tenant", "id", "v")), query_id="q", batch_id=0)


def test_composite_mixed_case_key(table):
    cols = ("Tenant", "id", "v")
    schema = pa.schema([("Tenant", pa.string()), ("id", pa.int64()), ("v", pa.float64())])
    sink = DeltaUpsertSink(table, ["Tenant", "id"], schema)
    sink.write_batch(changes([("+I", 1, "x", 1, 1.0), ("+I", 2, "y", 1, 2.0), ("+I", 3, "x", 2, 3.0)], cols),
                     query_id="q", batch_id=0)
    sink.write_batch(changes([("+U", 4, "y", 1, 2.5), ("-D", 5, "x", 1, 1.0)], cols), query_id="q", batch_id=1)
    assert rows_of(table) == [("x", 2, 3.0), ("y", 1, 2.5)]
    assert table_key(table) == ("Tenant", "id")
    assert read_table(table)[["Tenant", "id"]].values.tolist() == [["x", 2], ["y", 1]]


def test_bigint_stays_int64_with_nulls(table):
    sink = DeltaUpsertSink(table, ["id"], SCHEMA)
    big = 2**62 + 1  # not representable as float64
    df = pd.DataFrame({"id": pd.array([1, 2], dtype="Int64"), "name": ["a", None],
                       "amount": pd.array([big, None], dtype="Int64"), "_kind": [0, 0], "_seq": [1, 2]})
    sink.write_batch(df, query_id="q", batch_id=0)
    # a float64 column with NaN (what pandas makes of a nullable bigint) converts back exactly
    df2 = pd.DataFrame({"id": [3.0], "name": ["c"], "amount": [np.nan], "_kind": [0], "_seq": [3]})
    sink.write_batch(df2, query_id="q", batch_id=1)
    arrow = scan_delta(table)
    assert arrow.schema.field("amount").type == pa.int64()
    assert arrow.schema.field("id").type == pa.int64()
    got = read_table(table)
    assert got["amount"].tolist()[0] == big and got["amount"].isna().tolist() == [False, True, True]
    # the key column is NOT NULL in the Delta schema
    fields = {f["name"]: f for f in json.loads(deltalake.DeltaTable(table).schema().to_json())["fields"]}
    assert fields["id"]["nullable"] is False and fields["amount"]["nullable"] is True
    # never truncated silently
    df3 = pd.DataFrame({"id": [4], "name": ["d"], "amount": [1.5], "_kind": [0], "_seq": [4]})
    with pytest.raises(ValueError, match="does not convert"):
        sink.write_batch(df3, query_id="q", batch_id=2)


def test_schema_mismatch_errors(table):
    DeltaUpsertSink(table, ["id"], SCHEMA).write_batch(changes([("+I", 1, 1, "a", 1)]), query_id="q", batch_id=0)
    wrong_type = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])
    with pytest.raises(DeltaSinkSchemaError, match=r"column 'amount' is long in the table, double"):
        DeltaUpsertSink(table, ["id"], wrong_type).last_batch_id("q")
    extra = SCHEMA.append(pa.field("note", pa.string()))
    with pytest.raises(DeltaSinkSchemaError, match="column 'note'.*missing from the table"):
        DeltaUpsertSink(table, ["id"], extra).write_batch(changes([]), query_id="q", batch_id=5)
    fewer = pa.schema([("id", pa.int64()), ("name", pa.string())])
    with pytest.raises(DeltaSinkSchemaError, match="table column 'amount'.*not in the sink schema"):
        DeltaUpsertSink(table, ["id"], fewer).last_batch_id("q")
    with pytest.raises(DeltaSinkSchemaError, match=r"primary key \['id'\].*declares \['name'\]"):
        DeltaUpsertSink(table, ["name"], SCHEMA).last_batch_id("q")
    with pytest.raises(DeltaSinkSchemaError, match="partitioned by"):
        DeltaUpsertSink(table, ["id"], SCHEMA, partition_by=["name"]).last_batch_id("q")
    assert DeltaUpsertSink(table, ["id"], SCHEMA).last_batch_id("q") == 0  # the right one still works


def test_invalid_definitions(table):
    with pytest.raises(ValueError, match="primary key column"):
        DeltaUpsertSink(table, ["nope"], SCHEMA)
    with pytest.raises(ValueError, match="reserved"):
        DeltaUpsertSink(table, ["id"], SCHEMA.append(pa.field("_seq", pa.int64())))
    with pytest.raises(ValueError, match="needs a primary key"):
        DeltaUpsertSink(table, [], SCHEMA)
    sink = DeltaUpsertSink(table, ["id"], SCHEMA)
    with pytest.raises(ValueError, match="lacks column"):
        sink.write_batch(changes([("+I", 1, 1, "a", 1)]).drop(columns=["_seq"]), query_id="q", batch_id=0)
    with pytest.raises(ValueError, match="not in the sink schema"):
        sink.write_batch(changes([("+I", 1, 1, "a", 1)]).assign(extra=1), query_id="q", batch_id=0)
    with pytest.raises(ValueError, match="invalid _kind"):
        sink.write_batch(changes([("+I", 1, 1, "a", 1)]).assign(_kind=7), query_id="q", batch_id=0)
    with pytest.raises(ValueError, match="batch_id"):
        sink.write_batch(changes([]), query_id="q", batch_id=-1)


def test_foreign_table_without_key(table):
    deltalake.write_deltalake(table, pa.table({"id": [1, 2], "name": ["a", "b"], "amount": [1, 2]}))
    with pytest.raises(DeltaSinkSchemaError, match="no primary key recorded"):
        DeltaUpsertSink(table, ["id"], SCHEMA).last_batch_id("q")
    assert table_key(table) == ()
    sink = DeltaUpsertSink(table, ["id"], SCHEMA, adopt_existing=True)
    sink.write_batch(changes([("+U", 1, 2, "b2", 3)]), query_id="q", batch_id=0)
    assert table_key(table) == ("id",)
    assert deltalake.DeltaTable(table).metadata().configuration[PRIMARY_KEY_PROPERTY] == '["id"]'
    assert rows_of(table) == [(1, "a", 1), (2, "b2", 3)]


def test_partitioned_table_key_moves_partition(table):
    schema = pa.schema([("id", pa.int64()), ("region", pa.string()), ("amount", pa.int64())])
    cols = ("id", "region", "amount")
    sink = DeltaUpsertSink(table, ["id"], schema, partition_by=["region"])
    sink.write_batch(changes([("+I", 1, 1, "eu", 1), ("+I", 2, 2, "us", 2)], cols), query_id="q", batch_id=0)
    sink.write_batch(changes([("-U", 3, 1, "eu", 1), ("+U", 3, 1, "us", 5)], cols), query_id="q", batch_id=1)
    sink.write_batch(changes([], cols), query_id="q", batch_id=2)
    assert rows_of(table) == [(1, "us", 5), (2, "us", 2)]
    dt = deltalake.DeltaTable(table)
    assert dt.metadata().partition_columns == ["region"] and dt.transaction_version("q") == 2


def test_many_keys_vectorized(table):
    n = 20_000
    rng = np.random.default_rng(3)
    sink = DeltaUpsertSink(table, ["id"], SCHEMA)
    ids = np.arange(n)
    sink.write_batch(pd.DataFrame({"id": ids, "name": "x", "amount": ids, "_kind": 0, "_seq": ids}),
                     query_id="q", batch_id=0)
    # every key: -U old, +U new (shuffled); every 4th key then deleted
    upd = pd.DataFrame({"id": np.concatenate([ids, ids]), "name": ["x"] * n + ["y"] * n,
                        "amount": np.concatenate([ids, ids * 10]),
                        "_kind": np.repeat(np.array([1, 2], np.int8), n), "_seq": np.concatenate([ids, ids]) + n})
    dele = pd.DataFrame({"id": ids[::4], "name": "y", "amount": ids[::4] * 10, "_kind": 3,
                         "_seq": ids[::4] + 3 * n})
    batch = pd.concat([upd, dele]).iloc[rng.permutation(len(upd) + len(dele))]
    res = sink.write_batch(batch, query_id="q", batch_id=1)
    assert res["updated"] == n - len(ids[::4]) and res["deleted"] == len(ids[::4])
    got = read_table(table)
    keep = ids[ids % 4 != 0]
    assert got["id"].tolist() == keep.tolist()
    assert got["amount"].tolist() == (keep * 10).tolist() and set(got["name"]) == {"y"}


def test_optimize_keeps_rows_and_progress(table):
    sink = DeltaUpsertSink(table, ["id"], SCHEMA)
    for b in range(3):
        sink.write_batch(changes([("+I", b, b, f"n{b}", b)]), query_id="q", batch_id=b)
    assert len(deltalake.DeltaTable(table).file_uris()) == 3
    before = rows_of(table)
    sink.optimize()
    dt = deltalake.DeltaTable(table)
    assert len(dt.file_uris()) == 1 and rows_of(table) == before
    assert sink.last_batch_id("q") == 2
    assert dt.metadata().configuration["delta.targetFileSize"] == str(32 * 1024 * 1024)
