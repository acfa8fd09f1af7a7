"""SCD type 2 history on Spark (docs/operators.md, "SCD type 2 history", "Auto CDC"):
the fixtures' micro-batches as files of a streaming source, into Delta (the
history after every micro-batch) and into PostgreSQL across a kill -9 and
restart; the CLI over Debezium files; truncates and deletes by condition
through ``create_auto_cdc_flow``."""
from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import psycopg
import pytest

from changelog_data import load_fixture, set_arrival, to_frame
from kill_restart import Crash
from long_variants import long_only
from spark_changelog.api import ChangelogStream
from spark_changelog.auto_cdc import auto_cdc_stream, create_auto_cdc_flow
from spark_changelog.cli import main
from spark_changelog.sinks.delta import read_table

FIX = load_fixture("scd2/histories.json")
COLS = FIX["columns"]
HISTORY = COLS + ["__START_AT", "__END_AT"]
ARROW = pa.schema([("id", pa.int64()), ("name", pa.string()), ("city", pa.string()),
                   ("_kind", pa.int8()), ("_seq", pa.int64())])
#: the cases without options, each on its own keys (id + 10 * case number)
CASES = [c for c in FIX["cases"] if not c["options"]]
BATCHES = max(len(c["batches"]) for c in CASES)


def _shifted(rows, i):
    return [[r[0], [r[1][0] + 10 * i] + r[1][1:]] + r[2:] for r in rows]


def _expected(batch):
    out = []
    for i, case in enumerate(CASES):
        for r in case["history"][min(batch, len(case["history"]) - 1)]:
            out.append([r[0] + 10 * i] + r[1:])
    return sorted(out, key=lambda r: (r[0], r[3]))


def _write_files(directory):
    os.makedirs(directory)
    for b in range(BATCHES):
        rows = [r for i, c in enumerate(CASES) if b < len(c["batches"])
                for r in _shifted(c["batches"][b], i)]
        path = os.path.join(directory, f"part-{b:04d}.parquet")
        pq.write_table(pa.Table.from_pandas(to_frame(rows, COLS), schema=ARROW,
                                            preserve_index=False), path)
        set_arrival(path, b)


def _rows(table):
    """History rows [id, name, city, __START_AT, __END_AT], nulls as None."""
    vals = table[HISTORY].astype(object).values.tolist()
    return sorted(([None if v is None or v is pd.NA or v != v else
                    int(v) if isinstance(v, (float, np.integer)) else v for v in r]
                   for r in vals), key=lambda r: (r[0], r[3]))


def test_streaming_history_into_delta_after_every_micro_batch(spark, tmp_path):
    _write_files(tmp_path / "in")
    df = (spark.readStream.format("parquet").option("maxFilesPerTrigger", 1)
          .schema("id BIGINT, name STRING, city STRING, _kind TINYINT, _seq BIGINT")
          .load(str(tmp_path / "in")))
    stream = ChangelogStream.from_dataframe(df, primary_key=["id"]).history(key_groups=4)
    table = str(tmp_path / "history")
    seen = []
    report = stream.write_upsert(table, key=["id", "__START_AT"], checkpoint=str(tmp_path / "ck"),
                                 progress=lambda r: seen.append(_rows(read_table(table))))
    assert report.batches == BATCHES
    assert seen == [_expected(b) for b in range(BATCHES)]
    assert report.operators["ScdType2History"]["superseded"] == 1   # the repeated +I


def _prepare_pg(d, fixture):
    _write_files(d / "in")
    return [d / "in", fixture("pg_server").create_database("test_scd2_history"), "history", d / "ck"]


def _prepare_delta(d, fixture):
    _write_files(d / "in")
    return [d / "in", "delta", d / "history", d / "ck"]


#: SIGKILL inside batch 1, its sinks written, Spark's commit not
CRASHES = {"history_pg": Crash("history", _prepare_pg, hang_after=1),
           "history_delta": Crash("history", _prepare_delta, hang_after=1)}


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.shared_crash("history_pg")
def test_kill_and_restart_into_postgres_is_exact(spark, crashed):
    run = crashed("history_pg")
    assert run.status == "committed history_pg 1", run.status
    conninfo = run.args[1]

    def pg_rows():
        with psycopg.connect(conninfo) as c:
            return [list(r) for r in c.execute(
                "SELECT id, name, city, \"__START_AT\", \"__END_AT\" FROM history "
                "ORDER BY id, \"__START_AT\"").fetchall()]
    assert pg_rows() == _expected(1)
    assert run.resume(spark).replayed_batches == 1
    assert pg_rows() == _expected(BATCHES - 1)


@pytest.mark.slow
@long_only("a kill -9 and restart into Delta")
@pytest.mark.shared_crash("history_delta")
def test_kill_and_restart_into_delta_is_exact(spark, crashed):
    """The same crash with a Delta history table (the default suite has the
    PostgreSQL one; both sinks skip a replayed batch the same way)."""
    run = crashed("history_delta")
    assert run.status == "committed history_delta 1", run.status
    assert _rows(read_table(run.args[2])) == _expected(1)
    assert run.resume(spark).replayed_batches == 1
    assert _rows(read_table(run.args[2])) == _expected(BATCHES - 1)


def _dbz(op, before, after, lsn):
    return json.dumps({"before": before, "after": after, "op": op,
                       "source": {"connector": "postgresql", "lsn": lsn}})


def test_cli_normalize_scd_type_2_over_debezium(tmp_path, capsys):
    """Debezium files whose log order differs from the file order; tracked
    column ``name``, partial updates (a null city keeps the previous one)."""
    (tmp_path / "in").mkdir()
    files = [
        [_dbz("u", {"id": 1, "name": "a", "city": "y"}, {"id": 1, "name": "b", "city": None},
              300),                                                     # late file first
         _dbz("c", None, {"id": 2, "name": "p", "city": "q"}, 150)],
        [_dbz("c", None, {"id": 1, "name": "a", "city": "x"}, 100),
         _dbz("u", {"id": 1, "name": "a", "city": "x"}, {"id": 1, "name": "a", "city": "y"},
              200),                                                     # untracked: in place
         _dbz("d", {"id": 2, "name": "p", "city": "q"}, None, 400)],
    ]
    for i, lines in enumerate(files):
        (tmp_path / "in" / f"f{i}.json").write_text("\n".join(lines) + "\n")
    out = str(tmp_path / "out")
    assert main(["normalize", str(tmp_path / "in"), out, "--format", "debezium-json",
                 "--key", "id", "--schema", "id BIGINT, name STRING, city STRING",
                 "--scd-type", "2", "--track-history", "name", "--ignore-null-updates"]) == 0
    assert "table: 3 upserted, 0 deleted" in capsys.readouterr().out   # 3 versions
    got = _rows(read_table(out))
    # the sequence is the source's (lsn-based): check the chain, not the numbers
    assert [r[:3] for r in got] == [[1, "a", "y"], [1, "b", "y"], [2, "p", "q"]]
    assert got[0][4] == got[1][3] and got[1][4] is None and got[2][4] is not None
    assert got[0][3] < got[1][3] and got[2][3] < got[2][4]


EVENTS = [  # id, name, ts, op  (T: truncate, D: delete)
    (3, "d", 15, "U"), (1, "c", 30, "U"), (None, None, 20, "T"), (1, "a", 10, "U"),
    (2, "b", 11, "U"), (2, None, 25, "D"), (2, "e", 40, "U"), (1, None, 35, "U"),
]


def test_create_auto_cdc_flow_deletes_and_truncates(spark, tmp_path):
    df = spark.createDataFrame(EVENTS, "id BIGINT, name STRING, ts BIGINT, op STRING")
    opts = dict(keys=["id"], sequence_by="ts", apply_as_deletes="op = 'D'",
                apply_as_truncates="op = 'T'", except_column_list=["op"])
    plan = auto_cdc_stream(df, stored_as_scd_type=2, **opts).explain(key=["id", "__START_AT"])
    assert "ScdType2History(key=[id], historyKey=[id, __START_AT], sequenceBy=[ts], " \
           "trackHistory=[name, ts])" in plan
    assert "ApplyAs(applyAsDeletes=[op = 'D'], applyAsTruncates=[op = 'T'])" in plan

    create_auto_cdc_flow(str(tmp_path / "h"), df, stored_as_scd_type=2, **opts)
    h = read_table(str(tmp_path / "h")).rename(columns={"ts": "city"})
    assert _rows(h) == [[1, "a", 10, 10, 20], [1, "c", 30, 30, 35], [1, None, 35, 35, None],
                        [2, "b", 11, 11, 20], [2, "e", 40, 40, None],
                        [3, "d", 15, 15, 20]]     # id, name, ts, start, end

    def table(name, **more):
        create_auto_cdc_flow(str(tmp_path / name), df, stored_as_scd_type=1, **opts, **more)
        t = read_table(str(tmp_path / name)).sort_values("id")
        return t[["id", "name", "ts"]].astype(object).where(t[["id", "name", "ts"]].notna(),
                                                            None).values.tolist()
    assert table("t") == [[1, None, 35], [2, "e", 40]]
    # partial updates: the null name keeps "c" (ScdType1Table)
    assert table("t_partial", ignore_null_updates=True) == [[1, "c", 35], [2, "e", 40]]


SNAPSHOTS = [
    [(1, "a"), (2, "b")],
    [(1, "a2"), (3, "c")],
    [(1, "a2"), (2, "b3"), (3, "c")],
]


def test_cdc_from_snapshots_files_and_delta_versions(spark, tmp_path):
    """Successive full snapshots -> changelog (key-wise, in Spark) -> history;
    as Parquet directories, and as the versions of a Delta table."""
    from deltalake import write_deltalake
    from spark_changelog.api import read_snapshots
    paths = []
    for i, rows in enumerate(SNAPSHOTS):
        paths.append(str(tmp_path / f"snap{i}"))
        spark.createDataFrame(rows, "id BIGINT, name STRING").write.parquet(paths[-1])
        write_deltalake(str(tmp_path / "delta"), pa.table({"id": pa.array([r[0] for r in rows],
                                                                          pa.int64()),
                                                           "name": [r[1] for r in rows]}),
                        mode="overwrite")
    stream = read_snapshots(spark, paths, ["id"], sequence=[10, 20, 30])
    log = stream.collect()
    got = [[int(k), int(i), n, int(s)] for k, i, n, s in
           log[["_kind", "id", "name", "_seq"]].values.tolist()]
    got = sorted(got, key=lambda r: (r[3], r[1], r[0]))
    assert got == [[0, 1, "a", 10], [0, 2, "b", 10],
                   [1, 1, "a", 20], [2, 1, "a2", 20], [3, 2, "b", 20], [0, 3, "c", 20],
                   [0, 2, "b3", 30]]
    expected = [[1, "a", 0, 1], [1, "a2", 1, None], [2, "b", 0, 1], [2, "b3", 2, None],
                [3, "c", 1, None]]
    # the Delta table's versions 0, 1, 2 are the sequence
    source = read_snapshots(spark, str(tmp_path / "delta"), ["id"], format="delta")
    source.history().write_upsert(str(tmp_path / "h"), key=["id", "__START_AT"])
    h = read_table(str(tmp_path / "h")).assign(city=None)
    assert [[r[0], r[1], r[3], r[4]] for r in _rows(h)] == expected


#: change events as files (id, name, ts, op), one micro-batch each; T: truncate
TRUNCATE_FILES = [
    [(1, "a", 10, "U"), (2, "b", 11, "U")],
    [(None, None, 20, "T"), (3, "c", 15, "U")],
    [(1, "z", 5, "U"), (4, "d", 30, "U")],           # a late change of 1, a key after the truncate
]
#: the history after each micro-batch: id, name, ts, __START_AT, __END_AT
TRUNCATE_HISTORY = [
    [[1, "a", 10, 10, None], [2, "b", 11, 11, None]],
    [[1, "a", 10, 10, 20], [2, "b", 11, 11, 20], [3, "c", 15, 15, 20]],
    [[1, "z", 5, 5, 10], [1, "a", 10, 10, 20], [2, "b", 11, 11, 20], [3, "c", 15, 15, 20],
     [4, "d", 30, 30, None]],
]


def test_streaming_truncates_close_every_key_seen_before_and_after(spark, tmp_path):
    """A truncate in micro-batch 2 closes the versions of keys of batch 1 (held
    in the join's state) and of its own batch; a key first seen later gets a
    delete before its first change (nothing), a late change before the
    truncate is placed and closed by it."""
    for i, rows in enumerate(TRUNCATE_FILES):
        path = tmp_path / "in" / f"p{i}.parquet"
        path.parent.mkdir(exist_ok=True)
        pq.write_table(pa.table({"id": pa.array([r[0] for r in rows], pa.int64()),
                                 "name": [r[1] for r in rows],
                                 "ts": pa.array([r[2] for r in rows], pa.int64()),
                                 "op": [r[3] for r in rows]}), str(path))
        set_arrival(path, i)
    df = (spark.readStream.schema("id BIGINT, name STRING, ts BIGINT, op STRING")
          .option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "in")))
    stream = auto_cdc_stream(df, ["id"], "ts", apply_as_truncates="op = 'T'",
                             except_column_list=["op"], stored_as_scd_type=2)
    table, seen = str(tmp_path / "h"), []
    stream.write_upsert(table, key=["id", "__START_AT"], checkpoint=str(tmp_path / "ck"),
                        progress=lambda r: seen.append(
                            _rows(read_table(table).rename(columns={"ts": "city"}))))
    assert seen == TRUNCATE_HISTORY
