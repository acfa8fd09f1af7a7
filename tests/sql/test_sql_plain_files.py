"""Plain ``json``/``csv``/``parquet`` files are insert-only rows, as Flink
reads them (docs/sql.md, "Connectors"): no kind column, no
``'changelog.mode'``.  The seed-002 clicks as plain files, one-minute tumbling
windows in batch: the four windows Flink 2.3 ends with
(tests/fixtures/flink/windows.json, ``W_seed_tumble_count_distinct`` plus
the late click, which batch does not drop).  Explain shows the source's
changelog mode; a table that names an operation column stays a changelog."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from changelog_data import load_fixture
from sql_inputs import PER_MINUTE, hm
from spark_changelog.connectors.cdc_json import avro_available
from spark_changelog.sinks.delta import read_table
from spark_changelog.sql.errors import SqlError
from spark_changelog.sql.script import parse_script
from spark_changelog.sql.translate import Translator

CASE = {c["name"]: c for c in load_fixture("flink/windows.json")["cases"]}[
    "W_seed_tumble_count_distinct"]
CLICKS = [vals for _, vals in CASE["inputs"]["T"]["rows"]]

SCRIPT = """
CREATE TABLE clicks (
  u STRING, t BIGINT,
  rt AS TO_TIMESTAMP_LTZ(t, 3),
  WATERMARK FOR rt AS rt - INTERVAL '1' MINUTE
) WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = '{fmt}'{extra});
""" + PER_MINUTE + """GROUP BY window_start, window_end;
"""


def write_plain(directory, fmt: str, rows=CLICKS) -> None:
    """The clicks as a plain file: no operation column."""
    directory.mkdir()
    if fmt == "json":
        (directory / "clicks.json").write_text(
            "".join(json.dumps({"u": u, "t": t}) + "\n" for u, t in rows))
    elif fmt == "csv":
        (directory / "clicks.csv").write_text("u,t\n" + "".join(f"{u},{t}\n" for u, t in rows))
    else:
        pq.write_table(pa.table({"u": [u for u, _ in rows], "t": [t for _, t in rows]}),
                       directory / "clicks.parquet")


def planned(spark, tmp_path, fmt: str, extra: str = "", streaming: bool = False):
    script = parse_script(SCRIPT.format(path=tmp_path / "in", fmt=fmt, extra=extra,
                                        out=tmp_path / "out"), "plain.sql")
    (p,), = [p for _, p in Translator(spark, script, streaming=streaming).statements() if p]
    return p


@pytest.mark.parametrize("fmt", ["json", "csv", "parquet"])
def test_plain_file_windows_in_batch_as_flink(spark, tmp_path, fmt):
    write_plain(tmp_path / "in", fmt)
    report = planned(spark, tmp_path, fmt).run()
    table = sorted((hm(r.window_start), hm(r.window_end), int(r.users), int(r.clicks))
                   for r in read_table(str(tmp_path / "out")).itertuples())
    # Flink's streaming run fires 20:44 with User1 only; batch has the late
    # User5 20:44:54 too (the end of input fires every window)
    assert table == [("2021-01-15T20:44:00", "2021-01-15T20:45:00", 2, 2)] + \
        [tuple(v) for _, v in CASE["expected"][1:]]
    assert report.late_rows == 0


def test_explain_shows_the_source_changelog_mode(spark, tmp_path):
    write_plain(tmp_path / "in", "json")
    for streaming in (False, True):
        text = planned(spark, tmp_path, "json", streaming=streaming).explain()
        source = [line for line in text.splitlines() if "Source(name=[clicks]" in line]
        assert len(source) == 1 and "changelogMode=[I]," in source[0], text
    # a table that names its operation column is a changelog (and a window refuses it)
    with pytest.raises(SqlError, match="insert-only"):
        planned(spark, tmp_path, "json", ", 'changelog.kind-column' = 'op'", streaming=True)


def test_avro_without_sparks_avro_package_is_a_clear_error(spark, tmp_path):
    (tmp_path / "in").mkdir()
    if avro_available(spark):   # pragma: no cover - the package is not installed here
        pytest.skip("Spark's avro package is on the classpath")
    with pytest.raises(SqlError, match=r"table clicks: 'format' = 'avro' needs Spark's Avro data "
                                       r"source.*org\.apache\.spark:spark-avro_2\.13:4"):
        planned(spark, tmp_path, "avro")


#: a plain table with an operation column, and what Flink 2.3.0 printed for
#: ``SELECT id, COUNT(*) FROM FROM_CHANGELOG(input => TABLE src) GROUP BY id``
#: (run with PyFlink 2.3.0, streaming, parallelism 1)
OPERATIONS = [(1, "a", "INSERT"), (1, "b", "UPDATE_AFTER"), (2, "c", "INSERT"), (2, "c", "DELETE")]
FLINK_COUNTS = [("+I", 1, 1), ("-U", 1, 1), ("+U", 1, 2), ("+I", 2, 1), ("-D", 2, 1)]

FROM_CHANGELOG = """
CREATE TABLE src (id BIGINT, name STRING, {op} STRING)
  WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'json');
CREATE TABLE counts (id BIGINT, n BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'delta', 'path' = '{out}');
INSERT INTO counts SELECT id, COUNT(*) FROM FROM_CHANGELOG({args}) GROUP BY id;
"""


def from_changelog(spark, tmp_path, op: str = "op", args: str = "input => TABLE src",
                   streaming: bool = False):
    (tmp_path / "ops").mkdir(exist_ok=True)
    (tmp_path / "ops" / "ops.json").write_text("".join(
        json.dumps({"id": i, "name": n, op: o}) + "\n" for i, n, o in OPERATIONS))
    script = parse_script(FROM_CHANGELOG.format(op=op, path=tmp_path / "ops", args=args,
                                                out=tmp_path / "counts"), "fc.sql")
    (p,), = [p for _, p in Translator(spark, script, streaming=streaming).statements() if p]
    return p


def test_from_changelog_reads_the_operation_column_as_flink_2_3(spark, tmp_path):
    p = from_changelog(spark, tmp_path, "kind", "input => TABLE src, op => DESCRIPTOR(kind)")
    source = [line for line in p.explain().splitlines() if "Source(name=[src]" in line]
    assert "fields=[id, name]" in source[0] and "changelogMode=[I,UB,UA,D]" in source[0]
    p.run()
    final = {}
    for kind, i, n in FLINK_COUNTS:
        if kind in ("+I", "+U"):
            final[i] = n
        elif kind == "-D":
            del final[i]
    table = read_table(str(tmp_path / "counts"))
    assert sorted(zip(table["id"].tolist(), table["n"].tolist())) == sorted(final.items()) \
        == [(1, 2)]


@pytest.mark.parametrize("args, message", [
    ("input => TABLE src PARTITION BY id", "row semantics"),
    # op_mapping validated as Flink 2.3 validates it
    ("input => TABLE src, op_mapping => MAP['c', 'INSERT']", "must map a code to UPDATE_BEFORE"),
    ("input => TABLE src, op_mapping => MAP['c', 'INSERT', 'r', 'INSERT']",
     "duplicate change operation 'INSERT'"),
    ("input => TABLE src, op_mapping => MAP['c', 'insert']", "unknown change operation 'insert'"),
    ("input => TABLE src, op_mapping => 'c'", "must be a constant MAP literal"),
    ("input => TABLE counts", "must be a filesystem table of plain rows"),
    ("TABLE src, DESCRIPTOR(kind)", "no column 'kind'"),
])
def test_from_changelog_errors(spark, tmp_path, args, message):
    with pytest.raises(SqlError, match=message):
        from_changelog(spark, tmp_path, args=args)


def test_from_changelog_op_mapping_gives_flinks_changelog(spark, tmp_path):
    """``op_mapping`` (codes, several per operation in one key) gives the
    changes Flink 2.3 emitted, kinds in order; a code outside the map is a
    dead letter naming it (Flink fails the job)."""
    case = load_fixture("flink/sql_cases.json")["cases"]["from_changelog_op_mapping"]
    (tmp_path / "ops").mkdir()
    rows = case["rows"] + [{"id": 3, "name": "x", "__op": "INSERT"}]
    (tmp_path / "ops" / "ops.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    script = parse_script(case["ddl"].format(path=tmp_path / "ops") + ";\nEXPLAIN " +
                          case["query"] + ";", "fc.sql")
    (_, s), = [x for x in Translator(spark, script).statements() if x[1] is not None]
    changes = s.collect().sort_values("_seq")
    names = {0: "INSERT", 1: "UPDATE_BEFORE", 2: "UPDATE_AFTER", 3: "DELETE"}
    got = [[names[int(k)], [int(i), n]] for k, i, n in zip(changes["_kind"], changes["id"],
                                                           changes["name"])]
    assert got == case["expected"]
    with pytest.raises(Exception, match=r"ops\.json line 6: field '__op': unknown row kind "
                                        r"\"INSERT\" \(expected one of the op_mapping codes c, "
                                        r"d, r, u, ub\)"):
        (_, strict), = [x for x in Translator(spark, script, strict=True).statements()
                        if x[1] is not None]
        strict.collect()
