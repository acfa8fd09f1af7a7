"""Packing in the line task (docs/runtime.md, "Packing in the line task"):
a keyed operator reading a Debezium source directly gets the lines the line
task finishes already packed per key group (and pre-folded); the lines left
to Spark's VARIANT path and the side rows are packed by the packing pass.
The final table and the report are those of the unpacked read, in batch and
streaming, with and without folding, with one key's changes split between
fast lines, slow lines and two micro-batches."""
from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from spark_changelog.api import read_debezium
from spark_changelog.connectors.cdc_json import ReadResult, read_changes
from spark_changelog.model import KIND_COL, PACKED_KIND, PACKED_ROWS_COL
from spark_changelog.operators.normalize import ChangelogNormalize
from spark_changelog.runtime.keyed_rows import arrow_schema_of
from spark_changelog.runtime.spark_keyed import LinePacker
from tests.changelog_data import set_arrival
from tests.delta_scan import scan_delta

SCHEMA = "id BIGINT, v DOUBLE, s STRING"


def change(lsn, op, before=None, after=None):
    return json.dumps({"before": before, "after": after, "op": op, "source": {"lsn": lsn}, "ts_ms": 1000 + lsn})


def row(id_, v, s):
    return {"id": id_, "v": v, "s": s}


# -0.0 sends a line to the VARIANT path (a slow line); "not json" is a dead
# letter, "null" a tombstone; id 1's changes alternate fast and slow lines,
# then its key changes to 5
FILES = [
    [change(1, "c", after=row(1, 1.5, "a")),
     change(2, "c", after=row(2, 2.0, "b")),
     change(3, "u", before=row(1, 1.5, "a"), after=row(1, -0.0, "a2")),
     "not json",
     change(4, "c", after=row(3, 3.5, "c")),
     change(5, "d", before=row(2, 2.0, "b")),
     "null",
     change(6, "u", before=row(1, -0.0, "a2"), after=row(1, 3.0, "a3"))],
    [change(7, "u", before=row(3, 3.5, "c"), after=row(3, 4.0, "c2")),
     change(8, "c", after=row(4, -0.0, "d")),
     change(9, "c", after=row(2, 2.5, "b2")),
     change(10, "u", before=row(1, 3.0, "a3"), after=row(5, 3.0, "a5"))],
]
EXPECTED = [(2, 2.5, "b2"), (3, 4.0, "c2"), (4, 0.0, "d"), (5, 3.0, "a5")]


def _write_files(tmp_path, files=FILES) -> str:
    """``files``' lines as ``in/part-<i>.json``, arriving in that order."""
    d = tmp_path / "in"
    d.mkdir()
    for i, lines in enumerate(files):
        path = str(d / f"part-{i}.json")
        with open(path, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        set_arrival(path, i)
    return str(d)


def _run(spark, inp: str, out: str, streaming: bool, fold: bool):
    s = read_debezium(spark, inp, SCHEMA, ["id"], streaming=streaming,
                      max_files_per_trigger=1 if streaming else None)
    rep = s.with_mini_batch(fold).normalize().write_upsert(
        os.path.join(out, "table"), checkpoint=os.path.join(out, "ck") if streaming else None,
        dead_letter=os.path.join(out, "dead"))
    table = scan_delta(os.path.join(out, "table")).to_pandas().sort_values("id")
    return rep, [tuple(r) for r in table[["id", "v", "s"]].itertuples(index=False)]


#: the report of the unpacked run of FILES (recorded from one; the property
#: test below still runs both): rows in (5 inserts, 3 updates as -U/+U, a key
#: change as -D/+I, a delete), changes out, upserted, deleted, the normalize's
#: counters
UNPACKED_REPORT = {
    (False, True): (14, 4, 4, 0, {"rows_in": 14, "rows_out": 4, "folded": 6, "retract_no_match": 1}),
    (False, False): (14, 14, 4, 0, {"rows_in": 14, "rows_out": 14}),
    (True, True): (14, 8, 6, 1, {"rows_in": 14, "rows_out": 8, "folded": 3, "retract_no_match": 1}),
}


@pytest.mark.parametrize("streaming,fold", [(False, True), (False, False), (True, True)],
                         ids=["batch-folded", "batch-every-version", "streaming-folded"])
def test_a_line_packed_run_gives_the_unpacked_runs_table_and_report(spark, tmp_path, streaming, fold):
    inp = _write_files(tmp_path)
    packed, table = _run(spark, inp, str(tmp_path / "packed"), streaming, fold)
    assert table == EXPECTED
    assert (packed.invalid, packed.tombstones_skipped) == (1, 1)
    assert (packed.rows_in, packed.changes_out, packed.upserted, packed.deleted, packed.counters) == \
        UNPACKED_REPORT[(streaming, fold)]


def test_the_line_task_packs_the_lines_it_finishes(spark, tmp_path):
    """Only the slow lines' change rows and the side rows leave the line task
    unpacked; the finished ones leave as packed rows."""
    inp = _write_files(tmp_path)
    read = read_changes(spark, inp, "debezium-json", SCHEMA, ["id"])
    op = ChangelogNormalize(arrow_schema_of(read.rows.drop("_metrics")), ["id"], fold_batch=True)
    schema = pa.schema([f.with_nullable(True) for f in arrow_schema_of(read.rows)])
    rows = read.packed_rows(LinePacker(op, 8, schema)).collect()
    packed = [r for r in rows if r[KIND_COL] == PACKED_KIND]
    assert packed and all(r[PACKED_ROWS_COL] for r in packed)
    unpacked = sorted((r[KIND_COL], r["id"]) for r in rows if r[KIND_COL] != PACKED_KIND)
    # the dead letter and the tombstone (side rows), id 4's slow insert, and
    # id 1's two updates that hold -0.0 in an image (-U, +U each)
    assert unpacked == [(-1, None), (-1, None), (0, 4), (1, 1), (1, 1), (2, 1), (2, 1)]


def test_a_checkpoint_written_without_line_packing_restarts_with_it(spark, tmp_path, monkeypatch):
    """The line task gives each key the key group Spark gave it, so a
    streaming query whose first micro-batch ran unpacked continues, on the
    same checkpoint, with line packing: the second micro-batch finds every
    key's state (id 3's update retracts its old row, id 1's key change
    deletes it), exactly as a run that never packs (its second micro-batch's
    report, recorded from one, is the data below)."""
    inp, out = tmp_path / "in", str(tmp_path / "out")
    inp.mkdir()
    for i, lines in enumerate(FILES):
        path = str(inp / f"part-{i}.json")
        with open(path, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        set_arrival(path, i)
        with monkeypatch.context() as m:
            if i == 0:
                m.setattr(ReadResult, "packed_rows", lambda self, packer: None)
            restarted, table = _run(spark, str(inp), out, streaming=True, fold=True)
    assert table == EXPECTED
    assert restarted.batches == 1
    # id 3 -U/+U, id 1 -D, id 4, id 2, id 5 +I
    assert (restarted.changes_out, restarted.upserted, restarted.deleted, restarted.counters) == \
        (6, 4, 1, {"rows_in": 6, "rows_out": 6, "folded": 0})


def test_changelog_json_sources_pack_in_the_line_task_too(spark, tmp_path, monkeypatch):
    """A changelog JSON read finishes its plain lines in the line task and
    packs them the same way: same table and report as unpacked."""
    lines = ['{"op":"+I","id":1,"v":1.5,"s":"a"}', '{"op":"+I","id":2,"v":2.0,"s":"b"}',
             '{"op":"-U","id":1,"v":1.5,"s":"a"}', '{"op":"+U","id":1,"v":-0.0,"s":"a2"}', "not json",
             '{"op":"-D","id":2}', '{"op":"-U","id":1,"v":-0.0,"s":"a2"}', '{"op":"+U","id":1,"v":3.0,"s":"a3"}',
             '{"op":"+I","id":3,"v":4.0,"s":"c"}']
    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "log-1.json").write_text("\n".join(lines) + "\n")

    def run(name):
        from spark_changelog.api import read_changes as api_read
        s = api_read(spark, str(inp), format="changelog", schema=SCHEMA, primary_key=["id"])
        out = str(tmp_path / name)
        rep = s.with_mini_batch().normalize().write_upsert(os.path.join(out, "table"),
                                                           dead_letter=os.path.join(out, "dead"))
        table = scan_delta(os.path.join(out, "table")).to_pandas().sort_values("id")
        return rep, [tuple(r) for r in table[["id", "v", "s"]].itertuples(index=False)]

    packed, table = run("packed")
    with monkeypatch.context() as m:
        m.setattr(ReadResult, "packed_rows", lambda self, packer: None)
        plain, plain_table = run("plain")
    assert table == plain_table == [(1, 3.0, "a3"), (3, 4.0, "c")]
    assert (packed.rows_in, packed.changes_out, packed.invalid, packed.counters) == \
        (plain.rows_in, plain.changes_out, plain.invalid, plain.counters)
    assert packed.invalid == 1


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_mix_of_fast_and_slow_lines_gives_the_unpacked_table(spark, tmp_path_factory, monkeypatch, data):
    """Random histories of a few ids (inserts, updates, deletes, key
    changes), each change's line fast or slow (-0.0 sends it to the VARIANT
    path), bad lines mixed in, split over files: the line-packed batch run
    gives the unpacked run's table and report."""
    ids = data.draw(st.integers(1, 6))
    live, lines, lsn = {}, [], 0
    for _ in range(data.draw(st.integers(1, 30))):
        lsn += 1
        i = data.draw(st.integers(0, ids - 1))
        v = data.draw(st.sampled_from([1.0, 2.5, -0.0, 7.0]))
        if data.draw(st.integers(0, 9)) == 0:
            lines.append("not json")
        if i not in live:
            live[i] = (v, f"s{lsn}")
            lines.append(change(lsn, "c", after=row(i, *live[i])))
        elif data.draw(st.booleans()):
            lines.append(change(lsn, "d", before=row(i, *live.pop(i))))
        else:
            j = i if data.draw(st.integers(0, 4)) else data.draw(st.integers(0, ids - 1))
            if j != i and j in live:
                j = i
            before, after = row(i, *live.pop(i)), (v, f"s{lsn}")
            live[j] = after
            lines.append(change(lsn, "u", before=before, after=row(j, *after)))
    cut = data.draw(st.integers(0, len(lines)))
    base = tmp_path_factory.mktemp("mix")
    inp = base / "in"
    inp.mkdir()
    for n, part in enumerate((lines[:cut], lines[cut:])):
        (inp / f"part-{n}.json").write_text("".join(x + "\n" for x in part))
    fold = data.draw(st.booleans())
    packed, table = _run(spark, str(inp), str(base / "packed"), False, fold)
    with monkeypatch.context() as m:
        m.setattr(ReadResult, "packed_rows", lambda self, packer: None)
        plain, plain_table = _run(spark, str(inp), str(base / "plain"), False, fold)
    assert table == plain_table == sorted((i, v, s) for i, (v, s) in live.items())
    assert (packed.rows_in, packed.changes_out, packed.invalid) == (plain.rows_in, plain.changes_out, plain.invalid)


#: keep last on processing time over insert-only JSON lines, two files (one
#: micro-batch each): id 1 repeats its kept row in the second batch, id 2
#: changes; a dead letter rides along
KEEP_LAST_FILES = [
    ['{"id":1,"g":1,"v":10}', '{"id":2,"g":1,"v":20}', '{"id":1,"g":1,"v":11}'],
    ['{"id":1,"g":1,"v":11}', "not json", '{"id":2,"g":2,"v":21}'],
]


def _keep_last_script(inp: str, out: str) -> str:
    return (f"CREATE TABLE s (id BIGINT, g BIGINT, v BIGINT, pt AS PROCTIME()) WITH ("
            f"'connector' = 'filesystem', 'path' = '{inp}', 'format' = 'json', "
            f"'changelog.mode' = 'insert-only', 'source.max-files-per-trigger' = '1');\n"
            f"CREATE TABLE t (id BIGINT, g BIGINT, v BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ("
            f"'connector' = 'delta', 'path' = '{out}');\n"
            "INSERT INTO t SELECT id, g, v FROM (SELECT id, g, v, ROW_NUMBER() OVER "
            "(PARTITION BY id ORDER BY pt DESC) AS rn FROM s) WHERE rn = 1;\n")


def test_keep_last_on_processing_time_packs_in_the_line_task(spark, tmp_path, monkeypatch):
    """The PROCTIME() column of ``ORDER BY pt`` is read by nothing after the
    deduplication, so it is not materialized (null, as Flink's indicator)
    and the reader's line task packs the rows: the changelog, table and
    report equal the unpacked run's.  The changelog is Flink's: id 1's row
    repeated in the second micro-batch equals the kept one and emits
    nothing (Flink 2.3 with its RocksDB state backend compares the rows with
    the processing-time field null; docs/sql.md)."""
    import glob

    import pyarrow.parquet as pq

    from spark_changelog.sql.runner import run_script
    from spark_changelog.sql.script import parse_script
    inp = _write_files(tmp_path, KEEP_LAST_FILES)
    packers = []
    line_packed = ReadResult.packed_rows

    def recording(self, packer):
        packers.append((packer, self))
        return line_packed(self, packer)

    def run(name):
        out = str(tmp_path / name)
        (done,) = run_script(spark, parse_script(_keep_last_script(str(inp), os.path.join(out, "table")), "j.sql"),
                             batch=False, checkpoint=os.path.join(out, "ck"), dead_letter=os.path.join(out, "dead"),
                             changelog=os.path.join(out, "changes"), show_progress=False)
        changes = sorted((int(f.split(os.sep)[-3].split("-")[1]), r["_seq"], "-U+U".find(r["op"]), r["op"],
                          r["id"], r["g"], r["v"])
                         for f in glob.glob(os.path.join(out, "changes", "batch-*", "*", "*.parquet"))
                         for r in pq.read_table(f).to_pylist())
        table = scan_delta(os.path.join(out, "table")).to_pandas().sort_values("id")
        return done.report, changes, [tuple(r) for r in table[["id", "g", "v"]].itertuples(index=False)]

    with monkeypatch.context() as m:
        m.setattr(ReadResult, "packed_rows", recording)
        packed, packed_changes, table = run("packed")
    assert packers, "the line task did not pack"
    # the packed read is the only read plan built: the PROCTIME() projection
    # over the reader's rows is not (docs/runtime.md, "Before the query starts")
    assert not any(reader.built for _, reader in packers)
    with monkeypatch.context() as m:
        m.setattr(ReadResult, "packed_rows", lambda self, packer: None)
        plain, plain_changes, plain_table = run("plain")
    assert table == plain_table == [(1, 1, 11), (2, 2, 21)]
    # (micro-batch, op) and the row; the first batch's -U/+U of id 1, the
    # second batch's of id 2 only
    assert [(b, op, i, g, v) for b, _, _, op, i, g, v in packed_changes] == [
        (0, "+I", 1, 1, 10), (0, "+I", 2, 1, 20), (0, "-U", 1, 1, 10), (0, "+U", 1, 1, 11),
        (1, "-U", 2, 1, 20), (1, "+U", 2, 2, 21)]
    assert packed_changes == plain_changes
    assert (packed.batches, packed.changes_out, packed.invalid) == \
        (plain.batches, plain.changes_out, plain.invalid) == (2, 6, 1)
