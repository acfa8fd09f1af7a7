"""The last keyed operator's output packed for the sink writers
(docs/runtime.md, "Where the time goes"; ``plan/execute.py``,
``_sink_frame``; ``runtime/sink_writers.py``): keep-last dedup into a Delta
table, its changelog output and a blackhole sink, over two micro-batches,
gives the changelog, table and report of the unpacked output, and a
checkpoint whose first micro-batch ran unpacked continues packed."""
from __future__ import annotations

import glob
import os

import pyarrow as pa
import pyarrow.parquet as pq

from spark_changelog.model import PACKED_ROWS_COL
from spark_changelog.plan import execute
from spark_changelog.runtime.sink_writers import pack_output, unpack_output
from spark_changelog.sql.runner import run_script
from spark_changelog.sql.script import parse_script
from tests.changelog_data import set_arrival
from tests.delta_scan import scan_delta

#: two files (one micro-batch each): id 1 updated in the first and repeated
#: (equal: no change) in the second, id 2 updated in the second, a dead letter
FILES = [
    ['{"id":1,"g":1,"v":10}', '{"id":2,"g":1,"v":20}', '{"id":1,"g":1,"v":11}'],
    ['{"id":1,"g":1,"v":11}', "not json", '{"id":2,"g":2,"v":21}'],
]


def _script(inp: str, out: str) -> str:
    return (f"CREATE TABLE s (id BIGINT, g BIGINT, v BIGINT, pt AS PROCTIME()) WITH ("
            f"'connector' = 'filesystem', 'path' = '{inp}', 'format' = 'json', "
            f"'changelog.mode' = 'insert-only', 'source.max-files-per-trigger' = '1');\n"
            f"CREATE TABLE t (id BIGINT, g BIGINT, v BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ("
            f"'connector' = 'delta', 'path' = '{out}/table');\n"
            f"CREATE TABLE b (id BIGINT, g BIGINT, v BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ("
            f"'connector' = 'blackhole');\n"
            "INSERT INTO t SELECT id, g, v FROM (SELECT id, g, v, ROW_NUMBER() OVER "
            "(PARTITION BY id ORDER BY pt DESC) AS rn FROM s) WHERE rn = 1;\n"
            "INSERT INTO b SELECT id, g, v FROM (SELECT id, g, v, ROW_NUMBER() OVER "
            "(PARTITION BY id ORDER BY pt DESC) AS rn FROM s) WHERE rn = 1;\n")


def _write(directory, files) -> None:
    os.makedirs(directory, exist_ok=True)
    for i, lines in files:
        path = os.path.join(directory, f"part-{i}.json")
        with open(path, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        set_arrival(path, i)


def _run(spark, inp: str, out: str, monkeypatch, packed: bool) -> tuple:
    frames = []
    choose = execute._sink_frame

    def recording(low, key):
        frame = choose(low, key) if packed else low.df
        frames.append(PACKED_ROWS_COL in frame.columns)
        return frame

    with monkeypatch.context() as m:
        m.setattr(execute, "_sink_frame", recording)
        done = run_script(spark, parse_script(_script(inp, out), "j.sql"), batch=False,
                          checkpoint=os.path.join(out, "ck"), dead_letter=os.path.join(out, "dead"),
                          changelog=os.path.join(out, "changes"), show_progress=False)
    # each statement's changelog output: changes/<nn>-<table>/batch-<id>/<part>/*.parquet
    changes = {stmt: sorted((int(f.split(os.sep)[-3].split("-")[1]), r["_seq"], "-U+U".find(r["op"]),
                             r["op"], r["id"], r["g"], r["v"])
                            for f in glob.glob(os.path.join(out, "changes", stmt, "batch-*", "*", "*.parquet"))
                            for r in pq.read_table(f).to_pylist())
               for stmt in ("00-t", "01-b")}
    table = scan_delta(os.path.join(out, "table")).to_pandas().sort_values("id")
    reports = [(r.report.batches, r.report.changes_out, r.report.invalid, r.report.upserted, r.report.deleted)
               for r in done]
    return frames, reports, changes, [tuple(r) for r in table[["id", "g", "v"]].itertuples(index=False)]


#: the changelog of FILES: (micro-batch, op, id, g, v); id 1's repeat emits nothing
CHANGES = [(0, "+I", 1, 1, 10), (0, "+I", 2, 1, 20), (0, "-U", 1, 1, 10), (0, "+U", 1, 1, 11),
           (1, "-U", 2, 1, 20), (1, "+U", 2, 2, 21)]


def test_the_sink_reads_the_dedup_output_packed_and_gets_the_unpacked_result(spark, tmp_path, monkeypatch):
    inp = str(tmp_path / "in")
    _write(inp, enumerate(FILES))
    frames, reports, changes, table = _run(spark, inp, str(tmp_path / "packed"), monkeypatch, True)
    assert frames == [True, True], "the sinks did not read packed output"
    plain_frames, plain_reports, plain_changes, plain_table = _run(
        spark, inp, str(tmp_path / "plain"), monkeypatch, False)
    assert plain_frames == [False, False]
    assert table == plain_table == [(1, 1, 11), (2, 2, 21)]
    for stmt in ("00-t", "01-b"):
        assert [(b, op, i, g, v) for b, _, _, op, i, g, v in changes[stmt]] == CHANGES
    assert changes == plain_changes
    # Delta, then blackhole: 2 batches, 6 changes, 1 dead letter
    assert reports == plain_reports
    assert [r[:3] for r in reports] == [(2, 6, 1), (2, 6, 1)]


def test_a_checkpoint_written_unpacked_continues_packed(spark, tmp_path, monkeypatch):
    inp = str(tmp_path / "in")
    out = str(tmp_path / "out")
    _write(inp, [(0, FILES[0])])
    _run(spark, inp, out, monkeypatch, False)
    _write(inp, [(1, FILES[1])])
    frames, reports, changes, table = _run(spark, inp, out, monkeypatch, True)
    assert frames == [True, True]
    assert table == [(1, 1, 11), (2, 2, 21)]
    for stmt in ("00-t", "01-b"):
        assert [(b, op, i, g, v) for b, _, _, op, i, g, v in changes[stmt]] == CHANGES


def test_unpack_output_gives_the_rows_with_the_frames_types():
    """Blobs in order, conformed to the columns beside them (a timestamp's
    zone as Spark gives it); rows without packed columns pass as they are."""
    rows = pa.table({"id": pa.array([1, 2], pa.int64()), "t": pa.array([0, 1000], pa.timestamp("us", "UTC")),
                     "_kind": pa.array([0, 2], pa.int8())})
    more = rows.slice(1)
    (_, blob1), = pack_output(rows)
    (_, blob2), = pack_output(more)
    assert pack_output(rows.slice(0, 0)) == []
    packed = pa.table({"id": pa.nulls(2, pa.int64()), "t": pa.nulls(2, pa.timestamp("us", "Europe/Paris")),
                       "_kind": pa.array([-2, -2], pa.int8()), "_packed_kg": pa.array([0, 0], pa.int32()),
                       PACKED_ROWS_COL: pa.array([blob1, blob2], pa.binary())})
    out = unpack_output(packed)
    assert out.column_names == ["id", "t", "_kind"]
    assert out.schema.field("t").type == pa.timestamp("us", "Europe/Paris")
    assert out.column("id").to_pylist() == [1, 2, 2]
    assert out.column("t").cast(pa.int64()).to_pylist() == [0, 1000, 1000]
    assert unpack_output(rows) is rows
    assert unpack_output(packed.slice(0, 0)).num_rows == 0
