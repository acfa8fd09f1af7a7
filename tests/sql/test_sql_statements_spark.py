"""SHOW TABLES, SHOW VIEWS, DESCRIBE and a bare SELECT printed as Flink's SQL
client tableau mode (bounded by 'sql-client.display.max-rows'), and the
malformed or unsupported forms with their messages (docs/sql.md, "Statements")."""
from __future__ import annotations

import io

import pytest

from sql_inputs import source_options, write_changelog
from spark_changelog.sql.errors import SqlError, UnsupportedFeature
from spark_changelog.sql.runner import run_script
from spark_changelog.sql.script import parse_script

@pytest.fixture(scope="module")
def src(tmp_path_factory):
    path = tmp_path_factory.mktemp("orders")
    write_changelog(path, ["order_id", "users", "amount"], ["BIGINT", "STRING", "BIGINT"],
                    [[("+I", [1, "ann", 30], 1), ("+I", [2, "bob", None], 2),
                      ("-D", [1, "ann", 30], 3)]])
    return path


def test_show_describe_and_a_bare_select_as_tableau(spark, src):
    script = parse_script(
        f"CREATE TABLE Orders (order_id BIGINT, users STRING, amount BIGINT, PRIMARY KEY "
        f"(order_id) NOT ENFORCED) WITH ({source_options(src)});\n"
        "CREATE VIEW Users AS SELECT users, COUNT(*) AS n FROM Orders GROUP BY users;\n"
        "SHOW TABLES;\nSHOW VIEWS;\nDESCRIBE Orders;\nDESC Users;\n"
        "SET 'sql-client.display.max-rows' = '2';\nSELECT order_id, amount FROM Orders;\n", "s.sql")
    out = io.StringIO()
    assert run_script(spark, script, batch=True, key_groups=2, show_progress=False, out=out) == []
    assert out.getvalue().split("\n\n") == [
        "+------------+\n| table name |\n+------------+\n|     Orders |\n+------------+\n1 row in set",
        "+-----------+\n| view name |\n+-----------+\n|     Users |\n+-----------+\n1 row in set",
        "+----------+--------+-------+---------------+--------+-----------+\n"
        "|     name |   type |  null |           key | extras | watermark |\n"
        "+----------+--------+-------+---------------+--------+-----------+\n"
        "| order_id | BIGINT | FALSE | PRI(order_id) |        |           |\n"
        "|    users | STRING |  TRUE |               |        |           |\n"
        "|   amount | BIGINT |  TRUE |               |        |           |\n"
        "+----------+--------+-------+---------------+--------+-----------+\n3 rows in set",
        "+-------+--------+------+-----+--------+-----------+\n"
        "|  name |   type | null | key | extras | watermark |\n"
        "+-------+--------+------+-----+--------+-----------+\n"
        "| users | STRING | TRUE |     |        |           |\n"
        "|     n | BIGINT | TRUE |     |        |           |\n"
        "+-------+--------+------+-----+--------+-----------+\n2 rows in set",
        "+----+----------+--------+\n| op | order_id | amount |\n+----+----------+--------+\n"
        "| +I |        1 |     30 |\n| +I |        2 | <NULL> |\n+----+----------+--------+\n"
        "Received a total of 3 rows (the first 2 shown; SET 'sql-client.display.max-rows' "
        "shows more)", ""]


BAD = [("SHOW FUNCTIONS;", UnsupportedFeature,
        "SHOW FUNCTIONS is not supported yet (SHOW TABLES and SHOW VIEWS are)", 2, 1),
       ("DESCRIBE Nope;", SqlError, "DESCRIBE: unknown table or view 'Nope' (defined: Orders)", 2, 1),
       ("SET 'sql-client.display.max-rows' = 'many';\nSELECT * FROM Orders;", SqlError,
        "SET 'sql-client.display.max-rows': a positive number of rows, got 'many'", 2, 1)]


@pytest.mark.parametrize("stmt,cls,message,line,col", BAD, ids=["show", "describe", "max-rows"])
def test_malformed_statements(spark, src, stmt, cls, message, line, col):
    sql = (f"CREATE TABLE Orders (order_id BIGINT) WITH ({source_options(src)});\n" + stmt)
    with pytest.raises(cls) as e:
        run_script(spark, parse_script(sql, "b.sql"), batch=True, show_progress=False,
                   out=io.StringIO())
    assert (e.value.message, e.value.line, e.value.col) == (message, line, col)
