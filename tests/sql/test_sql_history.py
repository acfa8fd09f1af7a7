"""A sink table holding the SCD type 2 history of an INSERT (docs/sql.md,
"History tables"): the same fixture case as the operator's, as a SQL script."""
from __future__ import annotations

import pandas as pd
import pytest

from sql_inputs import source_options, write_changelog
from spark_changelog.sinks.delta import read_table
from spark_changelog.sql.errors import SqlError
from spark_changelog.sql.runner import explain_script, run_script
from spark_changelog.sql.script import parse_script

# out of order across files: the late change at 20 falls between 10 and 30
FILES = [
    [("+I", [1, "a", "x"], 10), ("+U", [1, "c", "x"], 30), ("+I", [2, "p", "q"], 11)],
    [("+U", [1, "b", "y"], 20), ("-D", [2, "p", "q"], 40)],
]


def script(src, out, options="") -> str:
    return f"""
CREATE TABLE customers (id BIGINT, name STRING, city STRING, PRIMARY KEY (id) NOT ENFORCED)
WITH ({source_options(src)});
CREATE TABLE customers_history (
  id BIGINT, name STRING, city STRING, __START_AT BIGINT, __END_AT BIGINT,
  PRIMARY KEY (id, __START_AT) NOT ENFORCED
) WITH ('connector' = 'delta', 'path' = '{out}', 'spark-changelog.scd-type' = '2'{options});
INSERT INTO customers_history SELECT id, name, city FROM customers;
"""


def test_history_table_from_sql(spark, tmp_path):
    write_changelog(tmp_path / "in", ["id", "name", "city"], ["BIGINT", "STRING", "STRING"], FILES)
    out = str(tmp_path / "h")
    sql = script(tmp_path / "in", out, ", 'spark-changelog.track-history' = 'name'")
    plan = explain_script(spark, parse_script(sql, "h.sql"), batch=True)
    assert "ScdType2History(key=[id], historyKey=[id, __START_AT], sequenceBy=[_seq], " \
           "trackHistory=[name])" in plan
    run_script(spark, parse_script(sql, "h.sql"), batch=True, show_progress=False)
    h = read_table(out).sort_values(["id", "__START_AT"])
    rows = [[int(r[0]), r[1], r[2], int(r[3]), None if pd.isna(r[4]) else int(r[4])]
            for r in h[["id", "name", "city", "__START_AT", "__END_AT"]].astype(object)
            .values.tolist()]
    assert rows == [[1, "a", "x", 10, 20], [1, "b", "y", 20, 30], [1, "c", "x", 30, None],
                    [2, "p", "q", 11, 40]]


def test_history_table_needs_its_columns_and_key(spark, tmp_path):
    bad = script(tmp_path / "in", tmp_path / "h").replace(
        "PRIMARY KEY (id, __START_AT)", "PRIMARY KEY (id)")
    with pytest.raises(SqlError, match=r"declares the columns __START_AT, __END_AT and has "
                                       r"PRIMARY KEY \(key..., __START_AT\)"):
        explain_script(spark, parse_script(bad, "bad.sql"), batch=True)
