"""ROW_NUMBER, window table functions, HAVING and set operations that Flink
accepts but we do not (yet), or that are wrong: each error names the line and
column of the construct and says what is expected (docs/sql.md)."""
from __future__ import annotations

import pytest

from sql_inputs import source_options
from spark_changelog.sql.errors import SqlError, UnsupportedFeature
from spark_changelog.sql.script import parse_script
from spark_changelog.sql.translate import Translator

DDL = ("CREATE TABLE s (k BIGINT, v BIGINT, t BIGINT, pt AS PROCTIME(), rt AS TO_TIMESTAMP_LTZ(t, "
       "3), WATERMARK FOR rt AS rt - INTERVAL '1' SECOND) WITH ({src}, 'changelog.mode' = "
       "'insert-only');\n"
       "CREATE TABLE o (a BIGINT, b BIGINT) WITH ('connector' = 'print');\n")
RANKED = "(SELECT k, v, ROW_NUMBER() OVER (PARTITION BY k ORDER BY v DESC) AS rn FROM s)"
TVF = "TABLE(TUMBLE(TABLE s, DESCRIPTOR(rt), INTERVAL '1' MINUTE))"

#: (query on line 3, the text the caret points at, words of the message, unsupported?)
CASES = [
    (f"INSERT INTO o SELECT k, v FROM {RANKED}", "ROW_NUMBER", "needs a filter on rn", True),
    ("INSERT INTO o SELECT k, ROW_NUMBER() OVER (PARTITION BY k ORDER BY v) AS rn FROM s",
     "ROW_NUMBER", "needs a filter on rn", True),
    (f"INSERT INTO o SELECT k, v FROM {RANKED} WHERE rn > 3", "rn > 3", "has no upper bound",
     True),
    (f"INSERT INTO o SELECT k, v FROM {RANKED} WHERE rn = 2", "rn = 2",
     "a rank range starting at 2 is not supported yet", True),
    (f"INSERT INTO o SELECT k, v FROM {RANKED} WHERE rn <> 1", "rn <> 1",
     "a filter on the row number takes rn = 1, rn <= N", True),
    ("INSERT INTO o SELECT k, v FROM (SELECT k, v, ROW_NUMBER() OVER (PARTITION BY k) AS rn "
     "FROM s) WHERE rn = 1", "ROW_NUMBER", "needs ORDER BY", False),
    ("INSERT INTO o SELECT k, v FROM (SELECT k, v, RANK() OVER (PARTITION BY k ORDER BY v) AS rn "
     "FROM s) WHERE rn <= 3", "RANK", "RANK() OVER (...) is not supported yet", True),
    ("INSERT INTO o SELECT k, v FROM (SELECT k, v, ROW_NUMBER() OVER (PARTITION BY k ORDER BY v) "
     "+ 1 AS rn FROM s) WHERE rn <= 3", "ROW_NUMBER", "must be a select item of its own", True),
    ("INSERT INTO o SELECT COUNT(*), COUNT(*) FROM TABLE(TUMBLE(TABLE s, DESCRIPTOR(t), "
     "INTERVAL '1' MINUTE)) GROUP BY window_start, window_end", "t), INTERVAL",
     "DESCRIPTOR(t) must be the event-time attribute", False),
    ("INSERT INTO o SELECT COUNT(*), COUNT(*) FROM TABLE(TUMBLE(TABLE s, DESCRIPTOR(rt), 5)) "
     "GROUP BY window_start, window_end", "5)", "SIZE is a positive INTERVAL", False),
    ("INSERT INTO o SELECT COUNT(*), COUNT(*) FROM TABLE(HOP(TABLE s, DESCRIPTOR(rt), "
     "INTERVAL '1' MINUTE)) GROUP BY window_start, window_end", "HOP", "HOP(...) lacks SIZE",
     False),
    (f"INSERT INTO o SELECT COUNT(*), COUNT(*) FROM {TVF} GROUP BY window_start", "GROUP",
     "groups by window_start and window_end", True),
    ("INSERT INTO o SELECT k, COUNT(*) FROM TABLE(SESSION(TABLE s, DESCRIPTOR(rt), "
     "INTERVAL '1' MINUTE)) GROUP BY window_start, window_end, k", "GROUP",
     "must be the PARTITION BY columns", True),
    (f"INSERT INTO o SELECT COUNT(*), FIRST_VALUE(v) FROM {TVF} GROUP BY window_start, "
     "window_end", "FIRST_VALUE", "is not a window aggregate", True),
    (f"INSERT INTO o SELECT k, v FROM {TVF} WHERE window_start > TIMESTAMP '2021-01-01 00:00:00'",
     "window_start >", "a WHERE on window_start is not supported yet", True),
    (f"INSERT INTO o SELECT s.k, s.v FROM s JOIN {TVF} AS w ON s.k = w.k", "TUMBLE",
     "joining it (a window join) is not supported yet", True),
    ("INSERT INTO o SELECT k, v FROM s HAVING COUNT(*) > 1", "HAVING", "HAVING needs GROUP BY",
     False),
    ("INSERT INTO o SELECT k, v FROM s INTERSECT SELECT k, v FROM s", "INTERSECT",
     "INTERSECT is not supported yet (UNION ALL is)", True),
]


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    path = tmp_path_factory.mktemp("src")
    return source_options(path).replace("'format' = 'parquet'", "'format' = 'json'")


@pytest.mark.parametrize("query, anchor, words, unsupported", CASES,
                         ids=[f"{i:02d}" for i in range(len(CASES))])
def test_error_names_line_and_column(spark, src, query, anchor, words, unsupported):
    script = parse_script(DDL.format(src=src) + query + ";", "bad.sql")
    with pytest.raises(SqlError) as e:
        list(Translator(spark, script).statements())
    err = e.value
    assert words in err.message, str(err)
    assert (err.line, err.col) == (3, query.index(anchor) + 1), str(err)
    assert isinstance(err, UnsupportedFeature) == unsupported, str(err)
    assert str(err).startswith(f"bad.sql:3:{err.col}: ")
