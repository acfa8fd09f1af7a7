"""``INSERT INTO t VALUES`` and ``CREATE TABLE t WITH (...) AS SELECT`` run
end to end (docs/sql.md, "VALUES" and "CREATE TABLE ... AS SELECT"): the
literal rows cast to the sink's declared types, in a batch and in a streaming
run (one micro-batch), into print, blackhole, Delta and PostgreSQL tables;
CTAS tables take the query's columns and types and the declared key.  Expected
rows are written out as data."""
from __future__ import annotations

import decimal
import io
from collections import Counter

import pytest

from changelog_data import load_fixture
from spark_changelog.sql.errors import SqlError, UnsupportedFeature
from spark_changelog.sql.runner import run_script
from spark_changelog.sql.script import parse_script
from tests.delta_scan import scan_delta

D = decimal.Decimal


def run(spark, sql: str, *, batch: bool = True, checkpoint=None):
    out = io.StringIO()
    runs = run_script(spark, parse_script(sql, "v.sql"), batch=batch, checkpoint=checkpoint,
                      show_progress=False, out=out)
    return runs, out.getvalue()


def delta_rows(path) -> list:
    t = scan_delta(path)
    return sorted(tuple(r.values()) for r in t.to_pylist())


def test_insert_values_into_print_casts_literals_to_the_declared_types(spark):
    runs, out = run(spark, """
CREATE TABLE p (id BIGINT, name STRING, price DECIMAL(10, 2), at TIMESTAMP(3))
  WITH ('connector' = 'print', 'print-identifier' = 'p');
INSERT INTO p VALUES (1, 'apple', 1.5, '2026-01-02 03:04:05'),
                     (2, 'pear', '2.25', NULL),
                     (-3, NULL, 3, TIMESTAMP '2026-01-02 00:00:00');
""")
    # (the print sink writes timestamps as Flink's does: Java's LocalDateTime)
    assert out.splitlines() == ["p> +I[1, apple, 1.50, 2026-01-02T03:04:05]",
                                "p> +I[2, pear, 2.25, null]",
                                "p> +I[-3, null, 3.00, 2026-01-02T00:00]"]
    assert "Values" in runs[0].report.plan and "changelogMode=[I]" in runs[0].planned.explain()


def test_try_cast_gives_null_where_cast_fails_naming_the_expression(spark):
    """docs/sql.md, "CAST is strict, TRY_CAST returns NULL"."""
    ddl = """
CREATE TABLE p (n INT, s STRING) WITH ('connector' = 'print');
INSERT INTO p SELECT {}(s AS INT), s FROM (VALUES ('1'), ('x'), ('3000000000')) AS v(s);
"""
    _, out = run(spark, ddl.format("TRY_CAST"))
    assert out.splitlines() == ["+I[1, 1]", "+I[null, x]", "+I[null, 3000000000]"]
    from spark_changelog.errors import as_user_error
    with pytest.raises(Exception) as e:
        run(spark, ddl.format("CAST"))
    assert as_user_error(e.value).what == (
        "CAST(`s` AS INT) failed: the STRING value 'x' is not a valid INT")


def test_insert_values_streaming_into_delta_and_blackhole_is_one_micro_batch(spark, tmp_path):
    runs, _ = run(spark, f"""
CREATE TABLE d (id INT, v DOUBLE, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'delta', 'path' = '{tmp_path / "d"}');
CREATE TABLE b (id INT) WITH ('connector' = 'blackhole');
INSERT INTO d (v, id) VALUES (0.5, 1), (2, 2), (3.25, 1);
INSERT INTO b VALUES (1), (2);
""", batch=False, checkpoint=str(tmp_path / "ck"))
    # the later row of key 1 wins (the rows are one bounded insert-only input, in order)
    assert delta_rows(tmp_path / "d") == [(1, 3.25), (2, 2.0)]
    assert [r.report.batches for r in runs] == [1, 1]
    assert runs[1].report.changes_out == 2


def test_select_from_values_and_ctas_into_delta_take_the_query_columns(spark, tmp_path):
    runs, out = run(spark, f"""
CREATE TABLE d (PRIMARY KEY (id) NOT ENFORCED) WITH ('connector' = 'delta', 'path' = '{tmp_path / "d"}')
  AS SELECT id, UPPER(b) AS name, CAST(id AS DECIMAL(5, 1)) / 2 AS half
     FROM (VALUES (1, 'x'), (2, 'y'), (1, 'z')) AS v(id, b);
CREATE TABLE p WITH ('connector' = 'print') AS SELECT name, COUNT(*) AS n FROM d_src GROUP BY name;
""".replace("d_src", "(VALUES ('a'), ('b'), ('a')) AS w(name)"))
    # DECIMAL(5, 1) / INT is DECIMAL(16, 12), as Flink types it (statements.json C2)
    assert delta_rows(tmp_path / "d") == [(1, "Z", D("0.500000000000")),
                                          (2, "Y", D("1.000000000000"))]
    schema = scan_delta(tmp_path / "d").schema
    assert [(f.name, str(f.type)) for f in schema] == [
        ("id", "int32"), ("name", "string"), ("half", "decimal128(16, 12)")]
    assert sorted(out.splitlines()) == ["+I[a, 2]", "+I[b, 1]"]    # a batch run: final rows


FLINK = {c["name"]: c for c in load_fixture("flink/statements.json")["cases"]}


def final_rows(lines) -> Counter:
    """Printed changelog lines folded into the rows they leave."""
    rows: Counter = Counter()
    for line in lines:
        kind, row = line.split("[", 1)
        rows[row] += 1 if kind.endswith(("+I", "+U")) else -1
    return +rows


@pytest.mark.parametrize("name", ["V1_insert_values_cast_to_declared_types",
                                  "V4_insert_values_column_list", "C1_ctas_group_by_over_values",
                                  "C2_ctas_expressions_types"])
def test_flinks_values_and_ctas_statements_print_flinks_rows(spark, name):
    """Flink 2.3's statements unchanged (statements.json): the same printed
    lines for INSERT ... VALUES; for CTAS with GROUP BY, a batch run prints the
    final rows where Flink's streaming run printed the changelog to them."""
    case = FLINK[name]
    _, out = run(spark, ";\n".join(case["statements"]) + ";")
    if name.startswith("C1"):
        assert final_rows(out.splitlines()) == final_rows(case["expected_lines"])
    else:
        assert out.splitlines() == case["expected_lines"]


def test_values_where_flink_refuses_a_literal(spark):
    """Flink 2.3 refuses a STRING literal into a DECIMAL or TIMESTAMP column and
    a bare NULL in VALUES (statements.json V2, V1b); we cast them (each cast
    checked before anything runs, docs/sql.md "VALUES and CREATE TABLE AS")."""
    assert FLINK["V2_insert_values_string_into_decimal_and_timestamp"]["expected_error"].endswith(
        "Column types of query result and sink for 'default_catalog.default_database.p' do not "
        "match.")
    assert "Illegal use of 'NULL'" in FLINK["V1b_insert_values_bare_null"]["expected_error"]
    _, out = run(spark, ";\n".join(
        FLINK["V2_insert_values_string_into_decimal_and_timestamp"]["statements"]
        + FLINK["V1b_insert_values_bare_null"]["statements"][1:]).replace(
        "INSERT INTO p VALUES (1, 'a')", "CREATE TABLE q (id BIGINT, name STRING) WITH "
        "('connector' = 'print');\nINSERT INTO q VALUES (1, 'a')") + ";")
    assert out.splitlines() == ["+I[2.25, 2026-01-02T03:04:05]", "+I[1, a]", "+I[2, null]"]


def test_ctas_describe_shows_the_query_schema_and_declared_key(spark, tmp_path):
    _, out = run(spark, """
CREATE TABLE b (PRIMARY KEY (k) NOT ENFORCED) WITH ('connector' = 'blackhole')
  AS SELECT k, k * 10 AS ten FROM (VALUES (CAST(1 AS BIGINT)), (2)) AS v(k);
DESCRIBE b;
""")
    assert "|    k | BIGINT | FALSE | PRI(k) |" in out
    assert "|  ten | BIGINT |  TRUE |        |" in out


@pytest.mark.postgres
def test_values_and_ctas_into_postgres(spark, pg_server):
    import psycopg
    from psycopg.conninfo import conninfo_to_dict
    conninfo = pg_server.create_database("test_sql_values")
    p = conninfo_to_dict(conninfo)
    url = f"jdbc:postgresql://{p.get('host', 'localhost')}:{p.get('port', 5432)}/{p['dbname']}"
    opts = f"'connector' = 'jdbc', 'url' = '{url}', 'username' = '{p['user']}'"
    run(spark, f"""
CREATE TABLE t (id BIGINT, price DECIMAL(10, 2), PRIMARY KEY (id) NOT ENFORCED)
  WITH ({opts}, 'table-name' = 'public.t');
INSERT INTO t VALUES (1, 9.99), (2, '10');
CREATE TABLE c (PRIMARY KEY (id) NOT ENFORCED) WITH ({opts}, 'table-name' = 'public.c')
  AS SELECT id, price * 2 AS doubled FROM (VALUES (1, 9.99), (2, 0.5)) AS v(id, price);
""")
    with psycopg.connect(conninfo) as conn:
        assert conn.execute("SELECT id, price FROM public.t ORDER BY id").fetchall() == [
            (1, D("9.99")), (2, D("10.00"))]
        assert conn.execute("SELECT id, doubled FROM public.c ORDER BY id").fetchall() == [
            (1, D("19.98")), (2, D("1.00"))]
        key = conn.execute("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON "
                           "a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                           "WHERE i.indrelid = 'public.c'::regclass AND i.indisprimary").fetchall()
    assert key == [("id",)]


PRINT = "CREATE TABLE p (id BIGINT, name STRING) WITH ('connector' = 'print');\n"


@pytest.mark.parametrize("sql,line,col,words,cls", [
    (PRINT + "INSERT INTO p VALUES (1, 'a'),\n  ('two', 'b');", 3, 4,
     "VALUES: 'two' cannot be cast to BIGINT (column id)", SqlError),
    (PRINT + "INSERT INTO p VALUES (1, 'a'), (2);", 2, 33,
     "VALUES: every row needs the same number of values: this one has 1, the first 2",
     SqlError),
    (PRINT + "INSERT INTO p VALUES (1);", 2, 23,
     "VALUES: the rows have 1 value(s), the table takes 2 (id, name)", SqlError),
    (PRINT + "INSERT INTO p VALUES (id, 'a');", 2, 23,
     "VALUES takes constant expressions, not columns (id)", UnsupportedFeature),
    (PRINT + "INSERT INTO p SELECT * FROM (VALUES (1, 'a')) AS v(a);", 2, 50,
     "VALUES AS v(a): 1 column name(s) for 2 value(s) per row", SqlError),
    ("CREATE TABLE d (PRIMARY KEY (k) NOT ENFORCED) WITH ('connector' = 'blackhole')\n"
     "  AS SELECT 1 AS j FROM (VALUES (1)) AS v(x);", 1, 1,
     "CREATE TABLE d: primary key column 'k' is not a column of the query (j)", SqlError),
    ("CREATE TABLE d WITH ('connector' = 'delta', 'path' = '/tmp/never')\n"
     "  AS SELECT x FROM (VALUES (1)) AS v(x);", 1, 14,
     "table d (connector 'delta') is an upsert table and needs PRIMARY KEY", SqlError),
], ids=["cast", "ragged", "width", "column", "alias", "ctas-key", "ctas-delta-no-key"])
def test_malformed_values_and_ctas_scripts(spark, sql, line, col, words, cls):
    with pytest.raises(cls) as e:
        run(spark, sql)
    assert words in e.value.message
    assert (e.value.line, e.value.col) == (line, col)


def test_values_with_a_streaming_table_in_a_streaming_run_is_not_supported_yet(spark, tmp_path):
    from spark_changelog.sql.translate import Translator
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text('{"id": 5}\n')
    script = parse_script(f"""
CREATE TABLE s (id INT) WITH ('connector' = 'filesystem', 'path' = '{tmp_path / "in"}',
  'format' = 'json');
CREATE TABLE p (id INT) WITH ('connector' = 'print');
INSERT INTO p SELECT id FROM s UNION ALL SELECT * FROM (VALUES (1)) AS v(id);
""", "v.sql")
    with pytest.raises(UnsupportedFeature) as e:
        list(Translator(spark, script, streaming=True).statements())
    assert e.value.message == ("UNION ALL of VALUES rows with a streaming table is not supported "
                               "yet in a streaming run (run it with --batch)")
    assert (e.value.line, e.value.col) == (5, 32)       # at UNION
    runs, out = run(spark, script.sql)          # --batch: both bounded
    assert sorted(out.splitlines()) == ["+I[1]", "+I[5]"]
