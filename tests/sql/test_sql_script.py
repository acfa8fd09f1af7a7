"""The Flink SQL front end without Spark: the dialect, the script model, and
errors with line and column (docs/sql.md).

Malformed scripts are data: ``(script, line, column, words of the message)``.
"""
from __future__ import annotations

import pathlib

import pytest
import sqlglot
from sqlglot import exp

from spark_changelog.sql.dialect import Flink, StatementSetBegin
from spark_changelog.sql.errors import SqlError, UnsupportedFeature
from spark_changelog.sql.script import (CreateTableAsDef, ExplainDef, InsertDef, Position,
                                        SetOption, StatementSet, ViewDef, parse_script)
from spark_changelog.sql.translate import Translator

SQL_DIR = pathlib.Path(__file__).parent.parent / "fixtures" / "sql"


def seed(name: str) -> str:
    return (SQL_DIR / name).read_text().replace("{base}", "/data")


# --------------------------------------------------------------------------- seeds

def test_seed_000_join_script_model():
    s = parse_script(seed("seed_000_join.sql"), "seed_000_join.sql")
    kinds = [type(x).__name__ for x in s.statements]
    assert kinds == ["TableDef", "TableDef", "TableDef", "InsertDef"]
    s1, s2, t1 = (s.tables[n] for n in ("s1", "s2", "t1"))
    assert s1.temporary and s1.primary_key == ("id",)
    assert [(c.name, c.flink_type, c.spark_type) for c in s2.columns] == [
        ("id", "BIGINT", "BIGINT"), ("attr", "STRING", "STRING")]
    assert s1.connector.kind == "filesystem" and s1.connector.reader_format == "changelog"
    assert s1.connector.changelog_file_format == "parquet"
    assert s1.connector.option("changelog.kind-column") == "op"
    assert t1.connector.kind == "delta" and t1.connector.path == "/data/t1"
    ins = s.statements[-1]
    assert ins.table == "t1" and ins.conflict is None
    assert ins.position.line == 28 and ins.position.col == 1
    assert ins.query.sql(dialect=Flink) == "SELECT s1.*, s2.attr FROM s1 JOIN s2 ON s1.level = s2.id"


def test_seed_000_students_parses():
    s = parse_script(seed("seed_000_students.sql"), "students.sql")
    assert [type(x).__name__ for x in s.statements] == ["TableDef", "TableDef", "ViewDef",
                                                        "InsertDef"]
    students, report = s.tables["students"], s.tables["performance_report"]
    assert [c.nullable for c in students.columns] == [False] * 4
    assert report.primary_key == ("student_info",)
    assert students.connector.reader_format == "debezium-json"
    assert isinstance(s.views["v"], ViewDef) and s.views["v"].temporary
    assert s.views["v"].query.args["group"] is not None


def test_seed_004_dedup_parses_and_other_ranking_functions_are_not_there_yet():
    s = parse_script(seed("seed_004_dedup.sql"), "dedup.sql")
    t = s.tables["table_name"]
    assert [c.name for c in t.columns] == ["id", "name", "ts", "pt"]
    assert t.columns[3].proctime and t.columns[3].computed
    assert t.watermark.column == "ts" and t.watermark.delay_ms == 1000
    # Flink's ts - INTERVAL '1' SECOND is W = max - 1000 ms; ours adds -1 ms
    assert t.watermark.bound_ms == 999
    assert t.connector.reader_format == "maxwell-json"
    rank = parse_script(seed("seed_004_dedup.sql").replace("ROW_NUMBER()", "DENSE_RANK()"))
    with pytest.raises(UnsupportedFeature) as e:
        list(Translator(None, rank).statements())
    assert (e.value.line, e.value.col) == (23, 10)
    assert "DENSE_RANK() OVER (...) is not supported yet" in str(e.value)


# --------------------------------------------------------------------------- dialect

@pytest.mark.parametrize("sql, kind", [
    ("CREATE TABLE t (id BIGINT, ts TIMESTAMP(3), c AS id + 1, pt AS PROCTIME(), "
     "WATERMARK FOR ts AS ts - INTERVAL '5' SECOND, PRIMARY KEY (id) NOT ENFORCED) "
     "WITH ('connector' = 'print')", exp.Create),
    ("SET 'table.exec.state.ttl' = '1 h'", exp.Set),
    ("INSERT INTO t SELECT * FROM s ON CONFLICT DO DEDUPLICATE", exp.Insert),
    ("INSERT INTO t SELECT * FROM s ON CONFLICT DO ERROR", exp.Insert),
    ("INSERT INTO t SELECT * FROM s ON CONFLICT DO NOTHING", exp.Insert),
    ("EXECUTE STATEMENT SET BEGIN INSERT INTO t SELECT * FROM s", StatementSetBegin),
    ("BEGIN STATEMENT SET", StatementSetBegin),
    ("END", exp.EndStatement),
    ("SELECT * FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '1' MINUTE))", exp.Select),
    ("SELECT * FROM TABLE(HOP(DATA => TABLE t, TIMECOL => DESCRIPTOR(ts), "
     "SLIDE => INTERVAL '1' MINUTE, SIZE => INTERVAL '5' MINUTE))", exp.Select),
    ("SELECT * FROM TABLE(CUMULATE(TABLE t, DESCRIPTOR(ts), INTERVAL '1' MINUTE, "
     "INTERVAL '1' HOUR))", exp.Select),
    ("SELECT * FROM TABLE(SESSION(TABLE t PARTITION BY k, DESCRIPTOR(ts), INTERVAL '5' MINUTE))",
     exp.Select),
    ("SELECT a, ROW_NUMBER() OVER (PARTITION BY k ORDER BY pt DESC) AS rn FROM t", exp.Select),
    ("SELECT 'it''s', a || b FROM t", exp.Select),
])
def test_dialect_parses_flink_statements(sql, kind):
    node = sqlglot.parse_one(sql, read=Flink)
    assert isinstance(node, kind)


def test_doubled_quote_is_an_escape_not_a_backslash():
    node = sqlglot.parse_one(r"SELECT 'it''s', 'a\b' FROM t", read=Flink)
    assert [e.this for e in node.expressions] == ["it's", "a\\b"]


def test_script_model_of_all_statement_kinds():
    s = parse_script("""
CREATE TABLE src (id BIGINT, v STRING, t BIGINT,
  ts AS TO_TIMESTAMP_LTZ(t, 3),
  WATERMARK FOR ts AS ts - INTERVAL '5' SECOND,
  PRIMARY KEY (id) NOT ENFORCED
) WITH ('connector' = 'filesystem', 'path' = 'in/', 'format' = 'csv',
        'changelog.kind-column' = 'kind', 'csv.field-delimiter' = ';');
CREATE TABLE pg (id BIGINT PRIMARY KEY NOT ENFORCED, v STRING)
  WITH ('connector' = 'jdbc', 'url' = 'jdbc:postgresql://db:5432/app', 'table-name' = 'public.pg',
        'username' = 'u', 'password' = 'p');
SET 'table.exec.sink.upsert-materialize' = 'FORCE';
SET 'table.exec.state.ttl' = '1 h';
EXPLAIN CHANGELOG_MODE INSERT INTO pg SELECT id, v FROM src ON CONFLICT DO ERROR;
BEGIN STATEMENT SET;
INSERT INTO pg SELECT id, v FROM src;
INSERT INTO pg (id, v) SELECT id, UPPER(v) FROM src WHERE id > 10;
END;
""")
    src, pg = s.tables["src"], s.tables["pg"]
    ts = src.columns[3]
    assert ts.computed and ts.expression.sql(dialect=Flink) == "TO_TIMESTAMP_LTZ(t, 3)"
    assert src.schema_ddl() == "`id` BIGINT, `v` STRING, `t` BIGINT"
    assert src.watermark.delay_ms == 5000 and src.watermark.bound_ms == 4999
    assert src.connector.changelog_file_format == "csv"
    assert pg.connector.kind == "postgres" and pg.primary_key == ("id",)
    sets = [x for x in s.statements if isinstance(x, SetOption)]
    assert [(x.key, x.value) for x in sets] == [("table.exec.sink.upsert-materialize", "FORCE"),
                                                ("table.exec.state.ttl", "1 h")]
    explain = next(x for x in s.statements if isinstance(x, ExplainDef))
    assert explain.changelog_mode and isinstance(explain.statement, InsertDef)
    assert explain.statement.conflict == "error"
    sset = s.statements[-1]
    assert isinstance(sset, StatementSet) and len(sset.inserts) == 2
    assert sset.inserts[1].columns == ("id", "v") and sset.position.line == 14


def test_execute_statement_set_form():
    s = parse_script("CREATE TABLE p (a INT) WITH ('connector' = 'blackhole');\n"
                     "EXECUTE STATEMENT SET BEGIN\nINSERT INTO p SELECT a FROM q;\n"
                     "INSERT INTO p SELECT a FROM r;\nEND;")
    sset = s.statements[1]
    assert isinstance(sset, StatementSet)
    assert [i.query.sql(dialect=Flink) for i in sset.inserts] == ["SELECT a FROM q",
                                                                  "SELECT a FROM r"]


def test_window_tvf_and_unknown_table_errors_at_translation():
    base = ("CREATE TABLE t (id BIGINT, ts TIMESTAMP(3)) WITH ('connector' = 'filesystem', "
            "'path' = 'x', 'format' = 'json', 'changelog.kind-column' = 'op');\n"
            "CREATE TABLE o (a BIGINT) WITH ('connector' = 'print');\n")
    tvf = parse_script(base + "INSERT INTO o SELECT id FROM\n"
                       "  TABLE(TUMBLE(t, DESCRIPTOR(ts), INTERVAL '1' MINUTE));")
    with pytest.raises(SqlError) as e:
        list(Translator(None, tvf).statements())
    assert (e.value.line, e.value.col, e.value.message) == (
        4, 16, "TUMBLE: the first argument is TABLE name")
    unknown = parse_script(base + "INSERT INTO nowhere SELECT id FROM t;")
    with pytest.raises(SqlError) as e:
        list(Translator(None, unknown).statements())
    assert (e.value.line, e.value.col) == (3, 13)
    assert "unknown table 'nowhere' (defined: t, o)" in e.value.message


# --------------------------------------------------------------------------- malformed scripts

TABLE = "CREATE TABLE a (id INT) WITH ('connector' = 'print');\n"
MALFORMED = [
    ("SELEC 1", 1, 1, "expected a statement (CREATE TABLE"),
    ("CREATE TABLE a (id INT) WITH (...)", 1, 30, "WITH (...) is a placeholder"),
    ("CREATE TABLE a (id INT,\n  x STRING\n WITH ('connector'='print')", 3, 27,
     "unbalanced parentheses"),
    ("INSERT INTO t SELECT\n a, 'abc FROM s", 2, 5, "this string is not closed"),
    ("INSERT INTO t SELECT a FROM `s", 1, 29, "this quoted name is not closed"),
    (TABLE + "INSERT INTO a SELECT id FROM b ON CONFLICT DO UPDATE", 2, 47,
     "Expected DEDUPLICATE, ERROR or NOTHING after ON CONFLICT DO"),
    ("CREATE TABLE a (ts TIMESTAMP(3),\n  WATERMARK ts AS ts) WITH ('connector'='print')", 2, 13,
     "Expected FOR after WATERMARK"),
    ("CREATE TABLE a (id INT, PRIMARY KEY (id)) WITH ('connector'='print')", 1, 38,
     "PRIMARY KEY ... NOT ENFORCED"),
    ("SET 'table.exec.sink.upsert-materialize' = 'sometimes'", 1, 44,
     "expected one of auto, none, force, got 'sometimes'"),
    ("SET 'table.exec.state.ttl' = 'forever'", 1, 30, "is not a duration"),
    ("CREATE TABLE a (id INT) WITH ('connector' = 'rabbitmq')", 1, 31, "unknown connector 'rabbitmq'"),
    ("CREATE TABLE a (id INT) WITH ('connector' = 'kafka', 'topic' = 't')", 1, 31,
     "connector 'kafka' needs 'format' (or 'value.format')"),
    ("CREATE TABLE a (id INT) WITH ('connector' = 'print',\n  'sink.parallelism' = '2')", 2, 3,
     "unsupported option(s) 'sink.parallelism' for connector 'print'"),
    ("CREATE TABLE a (id INT) WITH ('connector' = 'filesystem', 'path' = 'x')", 1, 31,
     "connector 'filesystem' needs 'format'"),
    ("CREATE TABLE a (id INT) WITH ('connector' = 'jdbc', 'url' = 'x',\n  'sink.max-retries' = 'often')", 2, 3,
     "'sink.max-retries' must be a whole number of retries (0 or more), got 'often'"),
    ("CREATE TABLE a (id INT, id STRING) WITH ('connector' = 'print')", 1, 1,
     "duplicate column(s) ['id']"),
    ("CREATE TABLE a (v STRING, WATERMARK FOR v AS v - INTERVAL '1' SECOND) "
     "WITH ('connector' = 'print')", 1, 41, "the event-time column must be a TIMESTAMP(3)"),
    ("CREATE TABLE a (ts TIMESTAMP(3), WATERMARK FOR ts AS ts - INTERVAL '1' MONTH) "
     "WITH ('connector' = 'print')", 1, 54, "unsupported watermark expression"),
    (TABLE + "BEGIN STATEMENT SET;\nINSERT INTO a SELECT 1 FROM b;", 2, 1,
     "STATEMENT SET is not closed: add END;"),
    (TABLE + "END;", 2, 1, "END without BEGIN STATEMENT SET"),
    (TABLE + "EXECUTE STATEMENT SET BEGIN\nINSERT INTO a SELECT 1 FROM b;\nSET 'a' = 'b';\nEND;",
     4, 1,
     "a STATEMENT SET holds INSERT INTO statements only"),
    ("CREATE TABLE a (id INT) WITH ('connector' = 'print');\nINSERT INTO a\n"
     "SELECT id FROM b WHERE", 3, 18, "unexpected 'WHERE'"),
    (TABLE + "INSERT OVERWRITE a SELECT id FROM b", 2, 1, "INSERT OVERWRITE is not supported"),
]


@pytest.mark.parametrize("sql, line, col, words", MALFORMED,
                         ids=[f"{i:02d}" for i in range(len(MALFORMED))])
def test_malformed_script_error_names_line_and_column(sql, line, col, words):
    with pytest.raises(SqlError) as e:
        parse_script(sql, "bad.sql")
    err = e.value
    assert (err.line, err.col) == (line, col), str(err)
    assert words in err.message
    text = str(err)
    assert text.startswith(f"bad.sql:{line}:{col}: ")
    # the offending line and a caret under the column
    src_line = sql.splitlines()[line - 1]
    assert f"{line} | {src_line}" in text
    caret_line = text.splitlines()[-1]
    assert caret_line.index("^") - caret_line.index("|") - 2 == col - 1


def test_unsupported_features_are_a_subclass_with_position():
    with pytest.raises(UnsupportedFeature) as e:
        parse_script("CREATE FUNCTION f AS 'com.x.F'")
    assert e.value.line == 1 and "not supported" in e.value.message


def test_progress_display_shows_operators_state_and_watermark():
    import io
    import types

    from rich.console import Console

    from spark_changelog.runtime.pipeline import RunReport
    from spark_changelog.sql.runner import _Progress
    planned = types.SimpleNamespace(table=types.SimpleNamespace(name="t1"))
    progress = _Progress(planned, enabled=False)
    report = RunReport(streaming=True, batches=3, changes_out=1200, watermark_ms=1337)
    # state rows: the latest count of each (operator, instance, key group), summed
    report.add_metrics([
        {"operator": "RegularJoin", "instance": 1, "key_group": 0, "state_rows": 10,
         "counters": {"rows_in": 3000, "rows_out": 2000}},
        {"operator": "RegularJoin", "instance": 1, "key_group": 1, "state_rows": 20,
         "counters": {"rows_in": 2000, "rows_out": 2100}},
        {"operator": "normalize", "instance": 7, "key_group": 0, "state_rows": 5, "counters": {}},
        {"operator": "normalize", "instance": 8, "key_group": 0, "state_rows": 4, "counters": {}}])
    report.add_metrics([                 # a later batch touches key group 1 only
        {"operator": "RegularJoin", "instance": 1, "key_group": 1, "state_rows": 3,
         "counters": {}},
        {"operator": "sink_upsert_materializer", "counters": {"rows_in": 4100, "rows_out": 1200}}])
    assert report.operators["RegularJoin"] == {"rows_in": 5000, "rows_out": 4100, "state_rows": 13}
    assert report.operators["normalize"]["state_rows"] == 9       # both sides' normalizes
    assert report.state_rows == 22
    progress.update(report)
    buf = io.StringIO()
    Console(file=buf, width=120).print(progress._render())
    text = buf.getvalue()
    assert "INSERT INTO t1" in text and "state rows" in text
    row = next(line for line in text.splitlines() if "RegularJoin" in line)
    assert [c.strip() for c in row.split("│")[1:5]] == ["RegularJoin", "5,000", "4,100", "13"]
    assert "batches 3" in text and "changes out 1,200" in text and "state rows 22" in text
    assert "watermark 1970-01-01T00:00:01.337+00:00" in text
    assert "late" not in text                 # no window: no late column or line
    # a window query: its late rows per operator, the window watermark and its lag
    report.operators = {"WindowAggregate": {"rows_in": 9, "rows_out": 2, "late_rows": 1}}
    report.late_rows = 1
    report.event_time = {"watermark_ms": 60_000, "newest_event_ms": 120_000,
                         "idle_partitions": ["p1"]}
    buf = io.StringIO()
    Console(file=buf, width=120).print(progress._render())
    text = buf.getvalue()
    assert "WindowAggregate" in text and "late" in text
    assert ("window watermark 1970-01-01T00:01:00.000+00:00 (60.0 s behind)   late rows 1   "
            "idle partitions 1") in text


def test_join_condition_uses_three_valued_logic():
    """The non-equi part of ON over candidate pairs: NULL compares as unknown,
    unknown OR true is true, unknown AND false is false, only true keeps a pair."""
    import pandas as pd

    from spark_changelog.sql.predicate import JoinCondition, UnsupportedCondition
    left = pd.DataFrame({"v": [5, None, 5, 1, 7]})
    right = pd.DataFrame({"w": [3, 3, None, 9, 7]})
    cols = {"v": ("left", "v"), "w": ("right", "w")}

    def run(sql):
        return JoinCondition(sqlglot.parse_one(sql, read=Flink), cols)(left, right).tolist()
    assert run("v > w") == [True, False, False, False, False]
    assert run("v > w OR v = 7") == [True, False, False, False, True]
    assert run("NOT (v > w)") == [False, False, False, True, True]
    assert run("w IS NULL OR v + 1 BETWEEN w AND 10") == [True, False, True, False, True]
    assert run("v IN (1, 7)") == [False, False, False, True, True]
    with pytest.raises(UnsupportedCondition):
        JoinCondition(sqlglot.parse_one("UPPER(v) = w", read=Flink), cols)



def test_join_condition_compares_bigints_beyond_2_53_exactly():
    """A BIGINT column with nulls and values beyond 2**53, as the join holds it
    (object: Python ints and None), compares and adds exactly: 2**53 + 1 is
    greater than 2**53 (float64 would round it to 2**53)."""
    import numpy as np
    import pandas as pd

    from spark_changelog.sql.predicate import JoinCondition
    big = 2**53
    left = pd.DataFrame({"v": np.array([big + 1, None, big + 1, -(2**62) - 3], dtype=object)})
    right = pd.DataFrame({"w": [big, big, big + 1, -(2**62) - 4]})
    cols = {"v": ("left", "v"), "w": ("right", "w")}

    def run(sql):
        return JoinCondition(sqlglot.parse_one(sql, read=Flink), cols)(left, right).tolist()
    assert run("v > w") == [True, False, False, True]
    assert run("v = w + 1") == [True, False, False, True]
    assert run("v - 1 = w") == [True, False, False, True]

# -- statements that sqlglot would keep as opaque commands ------------------------

SRC = ("CREATE TABLE s (k STRING) WITH ('connector' = 'filesystem', 'path' = 'in', "
       "'format' = 'debezium-json')")


def test_a_missing_semicolon_names_the_statement_that_runs_in(caplog):
    """No sqlglot fallback text ("Falling back to parsing as a 'Command'")
    reaches the user: a missing ';' is named with the line where the next
    statement starts."""
    with pytest.raises(SqlError) as e:
        parse_script(SRC + "\nCREATE TABLE p (k STRING) WITH ('connector' = 'print');\n", "m.sql")
    assert (e.value.message, e.value.line, e.value.col) == (
        "missing ';' before line 2: a new statement (CREATE ...) starts here inside the "
        "statement of line 1", 2, 1)
    assert not isinstance(e.value, UnsupportedFeature)
    assert "Falling back" not in caplog.text


def test_declared_types_row_parses_time_is_not_supported_yet():
    script = parse_script("CREATE TABLE s (r ROW<a INT, b STRING>, m MAP<STRING, INT>, "
                          "a ARRAY<BIGINT>, b BYTES) WITH ('connector' = 'filesystem', "
                          "'path' = 'in', 'format' = 'debezium-json');", "t.sql")
    cols = script.statements[0].columns
    assert [c.spark_type for c in cols] == ["STRUCT<a: INT, b: STRING>", "MAP<STRING, INT>",
                                            "ARRAY<BIGINT>", "BINARY"]
    with pytest.raises(UnsupportedFeature) as e:
        parse_script("CREATE TABLE s (k BIGINT,\n  t TIME(0)) WITH ('connector' = 'filesystem', "
                     "'path' = 'in', 'format' = 'debezium-json');", "t.sql")
    assert (e.value.line, e.value.col) == (2, 3)
    assert e.value.message.startswith("column 't': type TIME is not supported (Spark's TIME needs "
                                      "'spark.sql.timeType.enabled' and Delta tables have no TIME")
    assert "BIGINT" in e.value.message


def test_insert_values_and_ctas_parse():
    s = parse_script("CREATE TABLE p (k BIGINT) WITH ('connector' = 'print');\n"
                     "INSERT INTO p VALUES (1), (2);\n"
                     "CREATE TABLE c (PRIMARY KEY (k) NOT ENFORCED)\n"
                     "  WITH ('connector' = 'jdbc', 'url' = 'postgresql://h/db')\n"
                     "  AS SELECT k FROM p;", "v.sql")
    ins, ctas = s.statements[1:]
    assert isinstance(ins, InsertDef) and isinstance(ins.query, exp.Values)
    assert isinstance(ctas, CreateTableAsDef)
    assert (ctas.table.name, ctas.table.columns, ctas.table.primary_key) == ("c", (), ("k",))
    assert ctas.table.connector.kind == "postgres" and ctas.position == Position(3, 1, 6)
    assert ctas.insert.table == "c" and ctas.insert.query.sql(dialect=Flink) == "SELECT k FROM p"


@pytest.mark.parametrize("stmt,line,col,message", [
    ("CREATE TABLE t (a INT) WITH ('connector' = 'print') AS SELECT * FROM p;", 2, 17,
     "CREATE TABLE ... AS SELECT takes its columns from the query: declaring them ('a INT') "
     "is not supported yet; only PRIMARY KEY (...) NOT ENFORCED may be given"),
    ("CREATE TABLE t WITH ('connector' = 'filesystem', 'path' = 'o', 'format' = 'json')\n"
     "  AS SELECT * FROM p;", 2, 22,
     "CREATE TABLE t ... AS SELECT: connector 'filesystem' cannot create a table here (it is a "
     "source); CREATE TABLE AS writes to 'delta', 'jdbc'/'postgres', 'print' or 'blackhole'"),
], ids=["ctas-columns", "ctas-source-connector"])
def test_malformed_ctas_is_an_error_at_its_line_and_column(stmt, line, col, message):
    with pytest.raises(UnsupportedFeature) as e:
        parse_script("CREATE TABLE p (k BIGINT) WITH ('connector' = 'print');\n" + stmt, "v.sql")
    assert (e.value.message, e.value.line, e.value.col) == (message, line, col)


def test_jdbc_sink_max_retries_is_the_sinks_retry_count():
    """``'sink.max-retries'`` (Flink's JDBC option) reaches the PostgreSQL
    sink as its retry count; without it the sink keeps its default."""
    from spark_changelog.sql.insert import postgres_sink_retries
    ddl = ("CREATE TABLE o (id INT, PRIMARY KEY (id) NOT ENFORCED) WITH ('connector' = 'jdbc', "
           "'url' = 'jdbc:postgresql://h/db'{});")
    with_option = parse_script(ddl.format(", 'sink.max-retries' = '2'")).statements[0]
    assert postgres_sink_retries(with_option.connector) == {"max_retries": 2}
    assert postgres_sink_retries(parse_script(ddl.format("")).statements[0].connector) == {}
