"""DeltaUpsertSink's Arrow batch path and its appends instead of MERGE
(docs/sinks.md, "Appends instead of MERGE"): the same table as a MERGE every
time, a concurrent commit of another writer included (a real second writer on
the same table, committing between the sink's decision and its commit)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

deltalake = pytest.importorskip("deltalake")

from spark_changelog.sinks.delta import DeltaUpsertSink  # noqa: E402
from tests.delta_scan import scan_delta  # noqa: E402

#: how a batch that is not an append is committed (docs/sinks.md)
UPSERT = "deletion vectors"

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])
KIND = {"+I": 0, "-U": 1, "+U": 2, "-D": 3}


def batch(rows) -> pa.Table:
    """``rows``: (op, seq, id, name) in arrival order, as the runtime hands them over."""
    return pa.table({"id": pa.array([r[2] for r in rows], pa.int64()),
                     "name": pa.array([r[3] for r in rows], pa.string()),
                     "_kind": pa.array([KIND[r[0]] for r in rows], pa.int8()),
                     "_seq": pa.array([r[1] for r in rows], pa.int64())})


def rows_of(path):
    return sorted(tuple(r.values()) for r in scan_delta(path).to_pylist())


def other_writer_merge(path, rows):
    """A second writer (plain deltalake, no query id) upserting ``rows``."""
    dt = deltalake.DeltaTable(path)
    (dt.merge(pa.table({"id": [r[0] for r in rows], "name": [r[1] for r in rows]}, schema=SCHEMA),
              "t.id = s.id", source_alias="s", target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all().execute())


@pytest.fixture
def table(tmp_path):
    return str(tmp_path / "t")


def test_arrow_batch_net_change_into_empty_table_is_appended(table):
    sink = DeltaUpsertSink(table, "id", SCHEMA)
    res = sink.write_arrow_batch(batch([("+I", 1, 1, "a"), ("+U", 3, 1, "a2"), ("-U", 3, 1, "a"),
                                        ("+I", 2, 2, "b"), ("-D", 4, 2, "b"), ("-D", 5, 9, "z"),
                                        ("+I", 6, 3, "c")]), query_id="q", batch_id=0)
    assert res["write"] == "append: empty table" and res["committed"]
    # 2 net additions; key 2 inserted then deleted and key 9 deleted: missing deletes
    assert (res["inserted"], res["deleted"], res["missing_deletes"]) == (2, 0, 2)
    assert rows_of(table) == [(1, "a2"), (3, "c")]
    assert deltalake.DeltaTable(table).transaction_version("q") == 0
    # the next batch on the non-empty table MERGEs (keys may be there)
    res = sink.write_arrow_batch(batch([("-D", 7, 1, "a2"), ("+U", 8, 3, "c2")]), query_id="q",
                                 batch_id=1)
    assert res["write"] == UPSERT and (res["updated"], res["deleted"]) == (1, 1)
    assert rows_of(table) == [(3, "c2")]
    # a replayed batch is skipped on either path
    assert sink.write_arrow_batch(batch([("+I", 9, 5, "e")]), query_id="q", batch_id=1)["skipped_replay"]
    assert rows_of(table) == [(3, "c2")]


def test_arrow_batch_errors_name_batch_row_and_column(table):
    sink = DeltaUpsertSink(table, "id", SCHEMA)
    bad_kind = batch([("+I", 1, 1, "a"), ("+I", 2, 2, "b")])
    bad_kind = bad_kind.set_column(2, "_kind", pa.array([0, 7], pa.int8()))
    with pytest.raises(ValueError, match=r"invalid _kind value 7 in row 1 of batch 3"):
        sink.write_arrow_batch(bad_kind, query_id="q", batch_id=3)
    null_key = batch([("+I", 1, 1, "a"), ("+I", 2, None, "b")])
    with pytest.raises(ValueError, match=r"primary key column 'id' is null in 1 row\(s\) of batch 4 "
                                         r".*row 1 = \{'id': None, 'name': 'b'"):
        sink.write_arrow_batch(null_key, query_id="q", batch_id=4)
    null_seq = batch([("+I", 1, 1, "a")]).set_column(3, "_seq", pa.array([None], pa.int64()))
    with pytest.raises(ValueError, match=r"null _seq in row 0 of batch 5"):
        sink.write_arrow_batch(null_seq, query_id="q", batch_id=5)
    overflow = pa.table({"id": pa.array([2 ** 40]), "name": ["a"], "_kind": pa.array([0], pa.int8()),
                         "_seq": pa.array([1])})
    narrow = DeltaUpsertSink(table + "-narrow", "id", pa.schema([("id", pa.int32()), ("name", pa.string())]))
    with pytest.raises(ValueError, match=r"batch 6 of query 'q' does not convert to the sink schema"):
        narrow.write_arrow_batch(overflow, query_id="q", batch_id=6)
    assert not deltalake.DeltaTable(table).file_uris()       # nothing was written


def test_concurrent_commit_before_an_append_turns_it_into_a_merge(table):
    """Another writer commits key 1 after the sink decided to append into the
    empty table and before its commit: the append must not land on top of it
    (a blind append would leave key 1 twice); the sink decides again and
    MERGEs."""
    sink = DeltaUpsertSink(table, "id", SCHEMA)
    sink._table()                                        # create the table
    real_append = sink._append
    interleaved = []

    def append_after_another_commit(dt, adds, query_id, batch_id):
        if not interleaved:
            interleaved.append(True)
            other_writer_merge(table, [(1, "theirs"), (7, "theirs")])
        return real_append(dt, adds, query_id, batch_id)

    sink._append = append_after_another_commit
    res = sink.write_arrow_batch(batch([("+I", 1, 1, "ours"), ("+I", 2, 2, "ours")]), query_id="q",
                                 batch_id=0)
    assert interleaved and res["write"] == UPSERT and res["committed"]
    assert (res["inserted"], res["updated"]) == (1, 1)
    assert rows_of(table) == [(1, "ours"), (2, "ours"), (7, "theirs")]
    assert deltalake.DeltaTable(table).transaction_version("q") == 0


def test_keys_emitted_once_append_while_only_writer_then_merge(table):
    sink = DeltaUpsertSink(table, "id", SCHEMA, keys_emitted_once=True)
    writes = []
    for b, ids in enumerate(([1, 2], [3, 4])):
        res = sink.write_arrow_batch(batch([("+I", 10 * b + i, i, f"q{b}") for i in ids]),
                                     query_id="q", batch_id=b)
        writes.append(res["write"])
    # an OPTIMIZE (files rewritten, rows unchanged) keeps the query the only writer
    sink.optimize()
    res = sink.write_arrow_batch(batch([("+I", 30, 5, "q2")]), query_id="q", batch_id=2)
    writes.append(res["write"])
    assert writes == ["append: empty table", "append: keys emitted once, only writer",
                      "append: keys emitted once, only writer"]
    # a second writer inserts key 6 (which this query emits later): MERGE from now on
    other_writer_merge(table, [(6, "theirs"), (1, "theirs")])
    for b, ids in ((3, [6, 7]), (4, [8])):
        res = sink.write_arrow_batch(batch([("+I", 10 * b + i, i, f"q{b}") for i in ids]),
                                     query_id="q", batch_id=b)
        writes.append(res["write"])
    assert writes[3:] == [UPSERT, UPSERT]
    assert rows_of(table) == [(1, "theirs"), (2, "q0"), (3, "q1"), (4, "q1"), (5, "q2"),
                              (6, "q3"), (7, "q3"), (8, "q4")]
    # a new sink object (a restart) reads the whole log: still MERGE
    again = DeltaUpsertSink(table, "id", SCHEMA, keys_emitted_once=True)
    assert again.write_arrow_batch(batch([("+I", 90, 9, "q5")]), query_id="q", batch_id=5)["write"] \
        == UPSERT


def test_keys_emitted_once_needs_every_row_commit_to_be_this_query(table):
    """A table first written by another query (e.g. the same job on a new
    checkpoint: its dedup state is empty, it emits the same keys again)."""
    first = DeltaUpsertSink(table, "id", SCHEMA, keys_emitted_once=True)
    first.write_arrow_batch(batch([("+I", 1, 1, "old")]), query_id="old-query", batch_id=0)
    second = DeltaUpsertSink(table, "id", SCHEMA, keys_emitted_once=True)
    res = second.write_arrow_batch(batch([("+I", 1, 1, "new"), ("+I", 2, 2, "new")]),
                                   query_id="new-query", batch_id=0)
    assert res["write"] == UPSERT
    assert rows_of(table) == [(1, "new"), (2, "new")]
    # without the planner's promise a non-empty table is always merged
    plain = DeltaUpsertSink(table, "id", SCHEMA)
    assert plain.write_arrow_batch(batch([("+I", 5, 3, "x")]), query_id="new-query",
                                   batch_id=1)["write"] == UPSERT


def test_pandas_and_arrow_batches_give_the_same_table(tmp_path):
    """``write_batch`` (pandas) converts once and takes the Arrow path."""
    rows = [("+I", 1, 1, "a"), ("+I", 2, 2, "b"), ("-D", 3, 1, "a"), ("+U", 4, 2, "b2")]
    a = DeltaUpsertSink(str(tmp_path / "a"), "id", SCHEMA)
    p = DeltaUpsertSink(str(tmp_path / "p"), "id", SCHEMA)
    ra = a.write_arrow_batch(batch(rows), query_id="q", batch_id=0)
    rp = p.write_batch(batch(rows).to_pandas(), query_id="q", batch_id=0)
    assert {k: ra[k] for k in ("inserted", "missing_deletes", "write")} == \
        {k: rp[k] for k in ("inserted", "missing_deletes", "write")} == \
        {"inserted": 1, "missing_deletes": 1, "write": "append: empty table"}
    assert rows_of(str(tmp_path / "a")) == rows_of(str(tmp_path / "p")) == [(2, "b2")]
    assert np.array_equal(scan_delta(tmp_path / "a")["id"],
                          [2])


@pytest.mark.parametrize("commit_empty", [True, False])
def test_only_deletes_of_absent_keys_into_an_empty_table(table, commit_empty):
    sink = DeltaUpsertSink(table, "id", SCHEMA, commit_empty_batches=commit_empty)
    res = sink.write_arrow_batch(batch([("-D", 1, 1, "a"), ("-U", 2, 2, "b")]), query_id="q",
                                 batch_id=0)
    assert res["write"] == "append: empty table" and res["missing_deletes"] == 2
    assert res["committed"] is commit_empty
    assert rows_of(table) == []
    assert sink.last_batch_id("q") == (0 if commit_empty else -1)
