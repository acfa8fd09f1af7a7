"""The Delta sink's own WITH options, named as Delta's table properties
(docs/sql.md, "Connectors"; docs/sinks.md): ``'delta.enableDeletionVectors'
= 'false'`` makes a new table a protocol 1/2 table updated by MERGE, without
creating it first; the compaction policy's options reach the sink; a bad
value is an error at the option."""
from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from sql_inputs import source_options, write_changelog
from spark_changelog.sinks.delta import DeltaPath, DeltaUpsertSink, read_table, sink_options
from spark_changelog.sql.errors import SqlError
from spark_changelog.sql.runner import run_script
from spark_changelog.sql.script import parse_script


def script(src, out, options="") -> str:
    return f"""
CREATE TABLE customers (id BIGINT, name STRING, PRIMARY KEY (id) NOT ENFORCED)
WITH ({source_options(src)});
CREATE TABLE t (id BIGINT, name STRING, PRIMARY KEY (id) NOT ENFORCED)
WITH ('connector' = 'delta', 'path' = '{out}'{options});
INSERT INTO t SELECT id, name FROM customers;
"""


def test_a_script_opts_out_of_deletion_vectors_without_creating_the_table_first(spark, tmp_path):
    out = str(tmp_path / "t")
    sql = script(tmp_path / "in", out, ",\n  'delta.enableDeletionVectors' = 'false'")
    write_changelog(tmp_path / "in", ["id", "name"], ["BIGINT", "STRING"],
                    [[("+I", [1, "a"], 1), ("+I", [2, "b"], 2), ("+I", [3, "c"], 3)]])
    first = run_script(spark, parse_script(sql, "t.sql"), batch=True, show_progress=False)
    assert first[0].report.sink_writes == {"append: empty table": 1}
    # the table has no deletionVectors feature: a later batch of updates is a MERGE
    later = DeltaUpsertSink(out, ["id"], pa.schema([("id", pa.int64()), ("name", pa.string())]))
    updates = pa.table({"id": [1, 3], "name": ["x", None], "_kind": pa.array([2, 3], pa.int8()),
                        "_seq": pa.array([4, 5], pa.int64())})
    assert later.write_arrow_batch(updates, query_id="later", batch_id=0)["write"] == "merge"
    protocol = DeltaTable(out).protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)
    assert not protocol.reader_features and not protocol.writer_features
    table = read_table(out)
    assert list(zip(table["id"].tolist(), table["name"].tolist())) == [(1, "x"), (2, "b")]


def test_the_options_reach_the_sink_and_a_bad_value_names_the_option(tmp_path):
    sql = script(tmp_path / "in", tmp_path / "t",
                 ", 'delta.enableDeletionVectors' = 'FALSE', 'delta.autoOptimize.autoCompact' = 'true',"
                 "\n  'delta.autoCompact.minNumFiles' = '8'")
    table = next(s for s in parse_script(sql, "t.sql").statements if getattr(s, "name", None) == "t")
    assert sink_options(dict(table.connector.options)) == {
        "deletion_vectors": False, "auto_compact": True, "compact_min_files": 8}
    assert DeltaPath("out/t", **sink_options({})).options == {}
    for option, value, words in [("delta.enableDeletionVectors", "no", "must be 'true' or 'false'"),
                                 ("delta.autoCompact.minNumFiles", "1", "a whole number of files, 2 or more")]:
        with pytest.raises(SqlError) as e:
            parse_script(script(tmp_path / "in", tmp_path / "t", f",\n  '{option}' = '{value}'"), "bad.sql")
        assert words in e.value.message and option in e.value.message
        assert (e.value.line, e.value.col) == (6, 3)


def test_normalize_no_deletion_vectors_creates_a_version_1_table(spark, tmp_path, capsys):
    import json
    import os

    from spark_changelog.cli import main
    src = tmp_path / "in"
    os.makedirs(src)
    with open(src / "part-0.json", "w") as f:
        for i, (op, before, after) in enumerate([("c", None, {"id": 1, "name": "ann"}),
                                                 ("c", None, {"id": 2, "name": "bob"}),
                                                 ("u", {"id": 1, "name": "ann"}, {"id": 1, "name": "amy"})]):
            f.write(json.dumps({"before": before, "after": after, "op": op, "source": {"lsn": i}}) + "\n")
    out = str(tmp_path / "t")
    assert main(["normalize", str(src), out, "--format", "debezium-json", "--key", "id",
                 "--schema", "id BIGINT, name STRING", "--no-deletion-vectors"]) == 0
    protocol = DeltaTable(out).protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)
    table = read_table(out)
    assert list(zip(table["id"].tolist(), table["name"].tolist())) == [(1, "amy"), (2, "bob")]
