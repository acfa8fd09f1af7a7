"""Flink's format options and METADATA columns in CREATE TABLE (docs/sql.md,
"Format options"): parsed, checked, and read by a script that runs."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from spark_changelog.sql.errors import SqlError, UnsupportedFeature
from spark_changelog.sql.runner import run_script
from spark_changelog.sql.script import parse_script

CANAL = Path(__file__).parents[1] / "fixtures" / "cdc" / "formats" / "canal"

SOURCE = """CREATE TABLE products (
  origin_db STRING METADATA FROM 'value.database' VIRTUAL,
  origin_table STRING METADATA FROM 'value.table' VIRTUAL,
  pk_names ARRAY<STRING> METADATA FROM 'value.pk-names' VIRTUAL,
  ingested TIMESTAMP(3) METADATA FROM 'value.ingestion-timestamp',
  id BIGINT, name STRING, price DOUBLE,
  PRIMARY KEY (id) NOT ENFORCED
) WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'canal-json',
  'canal-json.database.include' = 'shop', 'canal-json.table.include' = 'products.*',
  'canal-json.ignore-parse-errors' = 'true')"""


def test_metadata_columns_and_format_options_parse():
    t = parse_script(SOURCE.format(path="in") + ";").tables["products"]
    assert [(c.name, c.metadata_key, c.virtual) for c in t.columns if c.metadata_key] == [
        ("origin_db", "value.database", True), ("origin_table", "value.table", True),
        ("pk_names", "value.pk-names", True), ("ingested", "value.ingestion-timestamp", False)]
    o = t.connector.format_options
    assert (o.database_include, o.table_include, o.ignore_parse_errors) == ("shop", "products.*", True)
    assert o.metadata == (("origin_db", "database"), ("origin_table", "table"), ("pk_names", "pk-names"),
                          ("ingested", "ingestion-timestamp"))
    assert t.schema_ddl().startswith("`origin_db` STRING, `origin_table` STRING, `pk_names` ARRAY<STRING>")


@pytest.mark.parametrize("sql, words", [
    ("CREATE TABLE a (t STRING METADATA FROM 'value.tbl', id INT) WITH ('connector' = 'filesystem', "
     "'path' = 'x', 'format' = 'debezium-json')",
     "unknown metadata key 'value.tbl' for format 'debezium-json': expected one of 'value.schema'"),
    ("CREATE TABLE a (t STRING METADATA, id INT) WITH ('connector' = 'filesystem', 'path' = 'x', "
     "'format' = 'csv')", "format 'csv' has no metadata columns"),
    ("CREATE TABLE a (t STRING METADATA FROM 'value.table', id INT) WITH ('connector' = 'print')",
     "connector 'print' has no metadata"),
    ("CREATE TABLE a (id INT) WITH ('connector' = 'filesystem', 'path' = 'x', 'format' = 'canal-json', "
     "'canal-json.ignore-parse-errors' = 'maybe')",
     "option 'canal-json.ignore-parse-errors': expected 'true' or 'false', got 'maybe'"),
    ("CREATE TABLE a (id INT) WITH ('connector' = 'filesystem', 'path' = 'x', 'format' = 'csv', "
     "'canal-json.table.include' = 't')", "unsupported option(s) 'canal-json.table.include'"),
])
def test_metadata_and_option_errors(sql, words):
    with pytest.raises(SqlError) as e:
        parse_script(sql + ";")
    assert words in str(e.value)


def test_metadata_on_a_sink_is_unsupported():
    with pytest.raises(UnsupportedFeature):
        parse_script("CREATE TABLE a (t STRING METADATA VIRTUAL, id INT) WITH ('connector' = 'print');")


def test_script_reads_metadata_filters_and_skips_parse_errors(spark, tmp_path):
    """A Canal source with table filters, metadata columns and
    ignore-parse-errors (the NaN line and the TRUNCATE are counted, the run
    goes on without a dead-letter directory), into a print sink."""
    sql = SOURCE.format(path=CANAL) + """;
CREATE TABLE out_t (id BIGINT, name STRING, origin STRING, pks STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'print', 'print-identifier' = 'o');
INSERT INTO out_t SELECT id, name, concat(origin_db, '.', origin_table), array_join(pk_names, ',') FROM products;"""
    out = io.StringIO()
    runs = run_script(spark, parse_script(sql, "canal.sql"), batch=True, key_groups=2, show_progress=False,
                      out=out)
    lines = [l for l in out.getvalue().splitlines() if l.startswith("o> ")]
    assert lines == ["o> +I[1, apple, shop.products, id]", "o> +I[2, pear, shop.products, id]",
                     "o> -U[1, apple, shop.products, id]", "o> +U[1, apple, shop.products, id]",
                     "o> -D[2, pear, shop.products_2024, id]"]
    assert runs[0].report.invalid == 1             # line 6 (NaN without the option)
    assert runs[0].report.ignored_skipped == 4     # orders x2 (incl. its TRUNCATE), other db, ALTER
