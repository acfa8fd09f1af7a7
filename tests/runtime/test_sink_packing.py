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


# -- the join's output ----------------------------------------------------------------
JOIN_COLS = "id BIGINT, g BIGINT, v BIGINT"
#: (statement's sink, connector, join, projection, (is the sink's frame
#: packed, the last keyed operator)): the inner join's left key is the sink
#: key (into Delta and blackhole), a left join's preserved side too; a full
#: join has no upsert key on ``id`` (the planner's materializer on the sink
#: key packs it), a computed projection is not the join's output: unpacked
JOINS = [
    ("t", "delta", "JOIN", "s1.id, s1.g, s1.v, s2.g AS g2, s2.v AS v2", (True, "RegularJoin")),
    ("b", "blackhole", "JOIN", "s1.id, s1.g, s1.v, s2.g AS g2, s2.v AS v2", (True, "RegularJoin")),
    ("l", "delta", "LEFT JOIN", "s1.id, s1.g, s1.v, s2.g AS g2, s2.v AS v2", (True, "RegularJoin")),
    ("f", "blackhole", "FULL JOIN", "s1.id, s1.g, s1.v, s2.g AS g2, s2.v AS v2", (True, "sink_upsert_materializer")),
    ("c", "blackhole", "JOIN", "s1.id, s1.g, s1.v + 1 AS v, s2.g AS g2, s2.v AS v2", (False, "RegularJoin")),
]


def _join_script(s1: str, s2: str, out: str, joins=JOINS) -> str:
    src = ("CREATE TEMPORARY TABLE {n} ({c}, PRIMARY KEY (id) NOT ENFORCED) WITH ('connector' = 'filesystem', "
           "'path' = '{p}', 'format' = 'debezium-json', 'source.max-files-per-trigger' = '1');\n")
    script = src.format(n="s1", c=JOIN_COLS, p=s1) + src.format(n="s2", c=JOIN_COLS, p=s2)
    for name, connector, _, _, _ in joins:
        path = f", 'path' = '{out}/{name}'" if connector == "delta" else ""
        script += (f"CREATE TEMPORARY TABLE {name} (id BIGINT, g BIGINT, v BIGINT, g2 BIGINT, v2 BIGINT, "
                   f"PRIMARY KEY (id) NOT ENFORCED) WITH ('connector' = '{connector}'{path});\n")
    for name, _, join, projection, _ in joins:
        script += f"INSERT INTO {name} SELECT {projection} FROM s1 {join} s2 ON s1.id = s2.id;\n"
    return script


def _run_joins(spark, s1: str, s2: str, out: str, monkeypatch, packed: bool, joins=JOINS) -> tuple:
    frames = []
    choose = execute._sink_frame

    def recording(low, key):
        frame = choose(low, key) if packed else low.df
        frames.append((PACKED_ROWS_COL in frame.columns, low.operators[-1].name))
        return frame

    with monkeypatch.context() as m:
        m.setattr(execute, "_sink_frame", recording)
        done = run_script(spark, parse_script(_join_script(s1, s2, out, joins), "j.sql"), batch=False,
                          checkpoint=os.path.join(out, "ck"), changelog=os.path.join(out, "changes"),
                          dead_letter=os.path.join(out, "dead"), show_progress=False)
    # each statement's changes in (micro-batch, _seq) order, nulls as None
    # (changes/<nn>-<table>/batch-<id>/...; one statement's: changes/batch-<id>/...)
    changes = {}
    for n, (name, *_rest) in enumerate(joins):
        stmt = f"{n:02d}-{name}" if len(joins) > 1 else ""
        rows = [(int(f.split(os.sep)[-3].split("-")[1]), r["_seq"], r["op"], r["id"], r["g"], r["v"],
                 r["g2"], r["v2"])
                for f in glob.glob(os.path.join(out, "changes", stmt, "batch-*", "*", "*.parquet"))
                for r in pq.read_table(f).to_pylist()]
        changes[name] = sorted(rows, key=repr)
    tables = {name: sorted(map(tuple, scan_delta(os.path.join(out, name)).to_pandas()[
        ["id", "g", "v", "g2", "v2"]].astype(object).where(lambda d: d.notna(), None).itertuples(index=False)),
        key=repr) for name, connector, *_ in joins if connector == "delta"}
    reports = [(r.report.batches, r.report.changes_out, r.report.invalid, r.report.upserted, r.report.deleted)
               for r in done]
    return frames, reports, changes, tables


def test_the_sink_reads_the_join_output_packed_when_its_key_holds_a_join_key(spark, tmp_path, monkeypatch):
    """The join (two normalizes and the join chained) into Delta, its
    changelog output and blackhole, over two micro-batches: packed where
    the sink key is the join key of a side never null-padded, with the
    changelog, tables and reports of the unpacked output; a full join and
    a computed projection keep the rows."""
    from tests.runtime.test_operator_packing import _debezium_files
    s1, s2 = str(tmp_path / "s1"), str(tmp_path / "s2")
    final1 = _debezium_files(s1, seed=21, ids=24, per_file=60)
    final2 = _debezium_files(s2, seed=22, ids=24, per_file=60)
    frames, reports, changes, tables = _run_joins(spark, s1, s2, str(tmp_path / "packed"), monkeypatch, True)
    assert frames == [p for *_, p in JOINS]
    plain_frames, plain_reports, plain_changes, plain_tables = _run_joins(
        spark, s1, s2, str(tmp_path / "plain"), monkeypatch, False)
    assert plain_frames == [(False, op) for *_, (_, op) in JOINS]
    inner = sorted(((i, r["g"], r["v"], final2[i]["g"], final2[i]["v"]) for i, r in final1.items()
                    if i in final2), key=repr)
    left = sorted(((i, r["g"], r["v"]) + ((final2[i]["g"], final2[i]["v"]) if i in final2 else (None, None))
                   for i, r in final1.items()), key=repr)
    assert tables == plain_tables == {"t": inner, "l": left}
    assert len(inner) > 5 and len(left) > len(inner), "the data should have matches and left-only ids"
    assert changes == plain_changes
    assert all(changes[name] for name, *_ in JOINS)
    assert any(r[6] is None for r in changes["l"]), "the left join should emit null-padded rows"
    assert reports == plain_reports
    # the full join's right-only rows have a null sink key: dead letters
    assert reports[3][2] > 0 and not any(r[2] for r in reports[:3] + reports[4:])


def test_the_unchained_join_s_output_is_packed_too(spark, tmp_path, monkeypatch):
    """Each normalize and the join a keyed step of its own (a checkpoint
    written before chains): the join's output into Delta packed, with the
    unpacked run's changelog, table and report."""
    from tests.runtime.test_keyed_chain import _unchained
    from tests.runtime.test_operator_packing import _debezium_files
    s1, s2 = str(tmp_path / "s1"), str(tmp_path / "s2")
    _debezium_files(s1, seed=21, ids=24, per_file=60)
    _debezium_files(s2, seed=22, ids=24, per_file=60)
    runs = []
    for packed in (True, False):
        with monkeypatch.context() as m:
            _unchained(m)
            runs.append(_run_joins(spark, s1, s2, str(tmp_path / str(packed)), monkeypatch, packed, JOINS[:1]))
    assert [r[0] for r in runs] == [[(True, "RegularJoin")], [(False, "RegularJoin")]]
    assert runs[0][1:] == runs[1][1:]
    assert len(runs[0][2]["t"]) > 5 and len(runs[0][3]["t"]) > 5, (runs[0][2], runs[0][3])


def test_a_join_s_output_keys_are_the_keys_of_its_sides_never_null_padded():
    """A full join's keys are null-padded on either side: no output key
    (its output to a sink keyed by ``id`` keeps the rows unless a
    materializer on the sink key comes after)."""
    from spark_changelog.operators.join import JoinInputLayout, RegularJoin
    side = pa.schema([("id", pa.int64()), ("v", pa.int64()), ("_kind", pa.int8()), ("_seq", pa.int64())])
    layout = JoinInputLayout(side, side, ["id"], ["id"])
    keys = {how: RegularJoin(layout, how, ["id"], ["id"]).output_keys for how in ("inner", "left", "right", "full")}
    assert keys == {"inner": (("id",), ("id0",)), "left": (("id",),), "right": (("id0",),), "full": ()}
