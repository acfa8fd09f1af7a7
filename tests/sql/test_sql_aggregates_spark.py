"""Aggregates as Flink's group aggregation page writes them, through SQL on
Spark in batch (docs/sql.md, "Queries"): aggregates without GROUP BY (one
global group), expressions inside aggregates, FILTER (WHERE ...), WITH common
table expressions; results written out as data; and the malformed or not yet
supported forms with their messages, line and column."""
from __future__ import annotations

import io
from collections import Counter

import pytest

from changelog_data import load_fixture, to_rows
from sql_inputs import source_options, write_changelog
from spark_changelog.sql.errors import SqlError, UnsupportedFeature
from spark_changelog.sql.runner import run_script
from spark_changelog.sql.script import parse_script
from spark_changelog.sql.translate import Translator

#: Flink's Orders table of the group aggregation page: (order_id, users, amount), with one
#: order retracted (the changelog of a CDC source)
ORDERS = [("+I", [1, "ann", 30], 1), ("+I", [2, "bob", 40], 2), ("+I", [3, "ann", 25], 3),
          ("+I", [4, "cid", 70], 4), ("-D", [2, "bob", 40], 5), ("+I", [5, "bob", 15], 6),
          ("+I", [6, "ann", 5], 7)]
DDL = "CREATE TABLE Orders (order_id BIGINT, users STRING, amount BIGINT) WITH ({});\n"


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    path = tmp_path_factory.mktemp("orders")
    write_changelog(path, ["order_id", "users", "amount"], ["BIGINT", "STRING", "BIGINT"], [ORDERS])
    return path


def table(spark, src, query) -> Counter:
    script = parse_script(DDL.format(source_options(src)) + f"EXPLAIN {query};", "q.sql")
    (_, s), = [x for x in Translator(spark, script, streaming=False, key_groups=2).statements()
               if x[1] is not None]
    out: Counter = Counter()
    for kind, row in to_rows(s.collect(), list(s.schema.columns)):
        out[tuple(row)] += 1 if kind in ("+I", "+U") else -1
    return +out


#: Flink's documentation examples (group aggregation), unchanged, and more: query -> final
#: rows (each once unless listed more often)
CASES = {
    "SELECT COUNT(*) FROM Orders": {(5,)},
    "SELECT COUNT(*) FROM Orders GROUP BY order_id": [(1,)] * 5,
    "SELECT COUNT(DISTINCT order_id) FROM Orders": {(5,)},
    "SELECT SUM(amount) FROM Orders GROUP BY users HAVING SUM(amount) > 50": {(60,), (70,)},
    "SELECT users, SUM(amount * 2) AS twice, MAX(CASE WHEN amount > 20 THEN order_id END) AS big "
    "FROM Orders GROUP BY users": {("ann", 120, 3), ("bob", 30, None), ("cid", 140, 4)},
    "SELECT COUNT(DISTINCT CONCAT(users, '-', CAST(amount > 20 AS STRING))) AS kinds FROM Orders":
        {(4,)},
    "SELECT users, COUNT(*) FILTER (WHERE amount >= 25) AS large, SUM(amount) FILTER "
    "(WHERE amount < 25) AS small FROM Orders GROUP BY users":
        {("ann", 2, 5), ("bob", 0, 15), ("cid", 1, None)},
    "SELECT MIN(amount), MAX(amount), AVG(amount) FROM Orders HAVING COUNT(*) > 1": {(5, 70, 29)},
    "WITH a AS (SELECT users, amount FROM Orders WHERE amount > 10), b AS (SELECT users, "
    "SUM(amount) AS total FROM a GROUP BY users) SELECT users, total FROM b WHERE total > 20":
        {("ann", 55), ("cid", 70)},
}


@pytest.mark.parametrize("query", list(CASES))
def test_group_aggregation_queries(spark, src, query):
    got = table(spark, src, query)
    assert got == Counter(CASES[query])


def test_global_aggregate_is_one_group_in_explain(spark, src):
    script = parse_script(DDL.format(source_options(src)) + "EXPLAIN SELECT COUNT(*) FROM Orders;",
                          "q.sql")
    (_, s), = [x for x in Translator(spark, script, key_groups=2).statements() if x[1] is not None]
    assert "GroupAggregate(groupBy=[], select=[COUNT(*) AS EXPR$0])" in s.explain()


GLOBAL = {c["name"]: c for c in load_fixture("flink/aggregate.json")["cases"]}[
    "A6_global_aggregate_last_row_retracted"]


def test_global_aggregate_deletes_its_row_when_the_last_row_is_retracted(spark, tmp_path):
    """Flink 2.3 (A6) emits ``-D`` for the global group when its last row is
    retracted, then ``+I`` for a new row.  Streaming, one micro-batch per file
    (the two files of the first four rows): Flink's steps folded per batch;
    batch: the final table, empty after four rows and Flink's after five."""
    rows = [(kind, vals, i) for i, (kind, vals) in enumerate(GLOBAL["inputs"]["T"]["rows"])]
    cols, types = GLOBAL["inputs"]["T"]["columns"], GLOBAL["inputs"]["T"]["types"]
    write_changelog(tmp_path / "steps", cols, types, [rows[:2], rows[2:4]])
    write_changelog(tmp_path / "all", cols, types, [rows])
    ddl = "CREATE TABLE T (k STRING, v BIGINT) WITH ({});\n"
    out = io.StringIO()
    run_script(spark, parse_script(
        ddl.format(source_options(tmp_path / "steps") + ", 'source.max-files-per-trigger' = '1'")
        + "CREATE TABLE p (c BIGINT, s BIGINT, mx BIGINT) WITH ('connector' = 'print');\n"
        + f"INSERT INTO p {GLOBAL['sql']};", "g.sql"),
        batch=False, checkpoint=str(tmp_path / "ck"), show_progress=False, out=out)
    steps = GLOBAL["expected_steps"]
    assert steps[3] == [["-D", [1, 2, 2]]]
    assert out.getvalue().splitlines() == ["+I[2, 3, 2]", "-D[2, 3, 2]"]  # steps 0-1, 2-3 folded

    def batch(path):
        script = parse_script(ddl.format(source_options(path)) + f"EXPLAIN {GLOBAL['sql']};", "g.sql")
        (_, s), = [x for x in Translator(spark, script, streaming=False).statements()
                   if x[1] is not None]
        return to_rows(s.collect(), list(s.schema.columns))
    write_changelog(tmp_path / "four", cols, types, [rows[:4]])
    assert batch(tmp_path / "four") == []
    assert batch(tmp_path / "all") == [["+I", [1, 5, 5]]] == GLOBAL["expected"][-1:]


#: not supported yet (exit 3) or wrong: (query, error class, message start, line, column)
BAD = [
    ("SELECT users, SUM(amount) FROM Orders GROUP BY ROLLUP (users)", UnsupportedFeature,
     "GROUP BY ROLLUP is not supported yet", 2, 56),
    ("SELECT users, SUM(amount) FROM Orders GROUP BY CUBE (users)", UnsupportedFeature,
     "GROUP BY CUBE is not supported yet", 2, 56),
    ("SELECT users, SUM(amount) FROM Orders GROUP BY GROUPING SETS ((users), ())",
     UnsupportedFeature, "GROUP BY GROUPING SETS is not supported yet", 2, None),
    ("WITH RECURSIVE a AS (SELECT users FROM Orders) SELECT users FROM a", UnsupportedFeature,
     "WITH RECURSIVE is not supported yet", 2, None),
    ("SELECT COUNT(DISTINCT users, amount) FROM Orders", UnsupportedFeature,
     "COUNT(DISTINCT ...) of several expressions is not supported yet", 2, None),
    ("SELECT users, SUM(amount) + 1 FROM Orders GROUP BY users", UnsupportedFeature,
     "in a GROUP BY query, a select item is a group column or one aggregate call", 2, None),
    ("SELECT users, COUNT(*) FROM Orders", SqlError,
     "column 'users' is neither grouped nor aggregated", 2, 16),
]


@pytest.mark.parametrize("query,cls,message,line,column", BAD, ids=[b[2][:30] for b in BAD])
def test_malformed_and_unsupported_aggregates(spark, src, query, cls, message, line, column):
    with pytest.raises(cls) as e:
        table(spark, src, query)
    assert e.value.message.startswith(message), str(e.value)
    assert e.value.line == line
    if column is not None:
        assert e.value.col == column
