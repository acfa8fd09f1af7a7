"""``spark-changelog run|explain`` on SQL scripts: exit codes and messages a
person can act on (in-process; the CLI's session is the test session)."""
from __future__ import annotations

import json
import pathlib


from sql_inputs import source_options, write_changelog
from spark_changelog.cli import main

SQL_DIR = pathlib.Path(__file__).parent.parent / "fixtures" / "sql"


def write(tmp_path, text: str) -> str:
    p = tmp_path / "script.sql"
    p.write_text(text)
    return str(p)


def test_sql_error_exits_2_with_file_line_column_and_caret(tmp_path, capsys):
    path = write(tmp_path, "CREATE TABLE a (id INT) WITH ('connector' = 'print');\n"
                           "INSERT INTO a SELECT id FROM b ON CONFLICT DO UPDATE;\n")
    assert main(["explain", path]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (f"error: {path}:2:47: Expected DEDUPLICATE, ERROR or NOTHING after "
                      "ON CONFLICT DO")
    assert err[1].strip() == "2 | INSERT INTO a SELECT id FROM b ON CONFLICT DO UPDATE;"
    assert err[2].endswith("^^^^^^")


def test_run_needs_a_mode_and_a_readable_script(tmp_path, capsys):
    path = write(tmp_path, "CREATE TABLE a (id INT) WITH ('connector' = 'print');")
    assert main(["run", path]) == 2
    assert "give --batch (one batch job) or --checkpoint DIR" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "missing.sql"), "--batch"]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_seed_004_explains_and_an_unsupported_feature_exits_3(spark, tmp_path, capsys):
    text = (SQL_DIR / "seed_004_dedup.sql").read_text().replace("{base}", str(tmp_path))
    (tmp_path / "events").mkdir()
    assert main(["explain", write(tmp_path, text)]) == 0
    assert "Deduplicate(keep=[LastRow], key=[id], order=[PROCTIME])" in capsys.readouterr().out
    assert main(["explain", write(tmp_path, text.replace("ROW_NUMBER()", "RANK()"))]) == 3
    err = capsys.readouterr().err
    assert err.startswith("not supported: ")
    assert ":23:10: RANK() OVER (...) is not supported yet" in err


def test_run_batch_into_a_print_table_and_explain(spark, tmp_path, capsys):
    write_changelog(tmp_path / "src", ["id", "v"], ["BIGINT", "STRING"],
                    [[("+I", [1, "a"], 1), ("+I", [2, "b"], 2), ("-U", [1, "a"], 3),
                      ("+U", [1, "A"], 4), ("-D", [2, "b"], 5)]])
    path = write(tmp_path, f"""
CREATE TABLE src (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ({source_options(tmp_path / 'src')});
CREATE TABLE out (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'print', 'print-identifier' = 'out');
EXPLAIN CHANGELOG_MODE INSERT INTO out SELECT id, UPPER(v) AS v FROM src WHERE id > 1;
INSERT INTO out SELECT id, UPPER(v) AS v FROM src WHERE v = 'a';
""")
    assert main(["run", path, "--batch", "--no-progress"]) == 0
    cap = capsys.readouterr()
    out = cap.out.splitlines()
    assert out[0] == "== EXPLAIN (line 6) =="
    assert any("(where=[`id` > 1])" in line for line in out)
    # id 1 is updated from 'a' to 'A': the update leaves the filter, so only its
    # retraction passes; id 2 never passes
    assert [line for line in out if line.startswith("out> ")] == [
        "out> +I[1, A]", "out> -U[1, A]"]
    assert "== INSERT INTO out ==" in cap.err and "rows in:" in cap.err
    assert main(["explain", path, "--format", "mermaid"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("== EXPLAIN (line 6) ==")
    assert "== INSERT INTO out (line 7) ==\nflowchart BT" in text


def test_spark_analysis_errors_point_at_the_function(spark, tmp_path, capsys):
    write_changelog(tmp_path / "src", ["id", "v"], ["BIGINT", "STRING"],
                    [[("+I", [1, "a"], 1)]])
    head = (f"CREATE TABLE src (id BIGINT, v STRING) WITH ({source_options(tmp_path / 'src')});\n"
            "CREATE TABLE out (id BIGINT, v STRING) WITH ('connector' = 'blackhole');\n")
    path = write(tmp_path, head + "INSERT INTO out SELECT id, FOO(v) FROM src;\n")
    assert main(["explain", path]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}:3:28: Spark cannot evaluate this projection: "
                          "[UNRESOLVED_ROUTINE] Cannot resolve routine `FOO`")
    assert "SQLQueryContextLogger" not in err            # no PySpark log record on the terminal
    path = write(tmp_path, head + "INSERT INTO out SELECT id, v FROM src\n"
                                  "WHERE DATE_ADD(id, 1) > 0;\n")
    assert main(["explain", path]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}:4:7: Spark cannot evaluate this condition: "
                          "[DATATYPE_MISMATCH")


def test_group_by_aggregation_into_a_print_table(spark, tmp_path, capsys):
    """GROUP BY over a changelog with retraction (docs/semantics.md, section 7):
    the delete of id 1 is retracted from group a's count and sum; in one batch
    the group's changes fold into one result (as Flink's mini-batch does)."""
    write_changelog(tmp_path / "src", ["id", "k", "v"], ["BIGINT", "STRING", "BIGINT"],
                    [[("+I", [1, "a", 10], 1), ("+I", [2, "a", 5], 2), ("-D", [1, "a", 10], 3)]])
    path = write(tmp_path, f"""
CREATE TABLE src (id BIGINT, k STRING, v BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ({source_options(tmp_path / 'src')});
CREATE TABLE out (n BIGINT, k STRING, total BIGINT, PRIMARY KEY (k) NOT ENFORCED)
  WITH ('connector' = 'print', 'print-identifier' = 'agg');
INSERT INTO out SELECT COUNT(*) AS n, k, SUM(v) AS total FROM src GROUP BY k;
""")
    assert main(["run", path, "--batch", "--no-progress"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("agg> ")]
    assert lines == ["agg> +I[1, a, 5]"]


def test_seed_004_dedup_runs_unchanged_on_maxwell_input(spark, tmp_path, capsys):
    """The deduplication article's query (ORDER BY pt DESC: keep last on
    processing time) over Maxwell changes: each id's latest row."""
    events = tmp_path / "events"
    events.mkdir()
    rows = [("insert", {"id": 1, "name": "a", "ts": "2021-01-15 20:44:23.000"}),
            ("insert", {"id": 2, "name": "b", "ts": "2021-01-15 20:44:24.000"}),
            ("update", {"id": 1, "name": "c", "ts": "2021-01-15 20:44:25.000"})]
    with open(events / "maxwell-000001.json", "w") as f:
        for i, (kind, data) in enumerate(rows):
            old = {"name": "a"} if kind == "update" else None
            rec = {"database": "shop", "table": "t", "type": kind, "ts": 1610743463 + i,
                   "xid": i, "position": f"master.000001:{100 + i}", "data": data}
            if old:
                rec["old"] = old
            f.write(json.dumps(rec) + "\n")
    text = (SQL_DIR / "seed_004_dedup.sql").read_text().replace("{base}", str(tmp_path))
    assert main(["run", write(tmp_path, text), "--batch", "--no-progress"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith(("+", "-"))]
    table = {}
    for line in lines:
        kind, vals = line[:2], line[3:-1].split(", ")
        if kind in ("+I", "+U"):
            table[vals[0]] = vals[1]
        else:
            table.pop(vals[0], None)
    assert table == {"1": "c", "2": "b"}, lines


def test_run_with_a_trigger_reads_files_as_they_arrive_until_ctrl_c(spark, tmp_path, capsys):
    """``run --trigger '0 seconds'`` keeps the streaming query running: a file
    that arrives later is read and upserted without a new run; Ctrl-C while the
    query waits for data stops it at a micro-batch boundary (exit 130, how to
    resume), and a second run resumes with nothing to redo."""
    import os
    import signal
    import threading
    import time

    from spark_changelog.sinks.delta import read_table

    src, staging, out = tmp_path / "src", tmp_path / "staging", tmp_path / "out"
    columns, types = ["id", "v"], ["BIGINT", "STRING"]
    write_changelog(src, columns, types, [[("+I", [1, "a"], 1), ("+I", [2, "b"], 2)]])
    path = write(tmp_path, f"""
CREATE TABLE src (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ({source_options(src)});
CREATE TABLE out (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'delta', 'path' = '{out}');
INSERT INTO out SELECT id, v FROM src;
""")
    seen = []

    def rows():
        try:
            t = read_table(out)
        except Exception:       # the table does not exist yet
            return None
        return sorted(zip(t["id"].tolist(), t["v"].tolist()))

    def wait_for(expected) -> bool:
        deadline = time.time() + 180
        while time.time() < deadline:
            if rows() == expected:
                return True
            time.sleep(0.2)
        return False

    def feed():
        try:
            seen.append(wait_for([(1, "a"), (2, "b")]))
            # a later file, moved in whole (a hidden name is not read)
            write_changelog(staging, columns, types,
                            [[("-U", [1, "a"], 3), ("+U", [1, "A"], 4), ("-D", [2, "b"], 5),
                              ("+I", [3, "c"], 6)]])
            os.rename(staging / "part-0000.parquet", src / "part-0001.parquet")
            seen.append(wait_for([(1, "A"), (3, "c")]))
        finally:
            os.kill(os.getpid(), signal.SIGINT)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    ck = str(tmp_path / "ck")
    code = main(["run", path, "--checkpoint", ck, "--trigger", "0 seconds", "--no-progress"])
    feeder.join(10)
    err = capsys.readouterr().err
    assert seen == [True, True], err
    assert code == 130, err
    assert "stopped by Ctrl-C after" in err and "at a micro-batch boundary" in err
    assert f"run the same command again (same --checkpoint {ck}) to resume" in err
    assert rows() == [(1, "A"), (3, "c")]
    # the second run (the files present, then stop) finds nothing to redo
    assert main(["run", path, "--checkpoint", ck, "--no-progress"]) == 0
    assert rows() == [(1, "A"), (3, "c")]


def test_trigger_needs_a_streaming_run_of_one_insert_and_an_interval(tmp_path, capsys):
    path = write(tmp_path, "CREATE TABLE a (id INT) WITH ('connector' = 'print');")
    assert main(["run", path, "--batch", "--trigger", "1 second"]) == 2
    assert "--trigger keeps a streaming query running" in capsys.readouterr().err
    assert main(["run", path, "--checkpoint", str(tmp_path / "ck"), "--trigger", "soon"]) == 2
    err = capsys.readouterr().err
    assert "--trigger 'soon' is not an interval" in err and "'500 milliseconds'" in err
