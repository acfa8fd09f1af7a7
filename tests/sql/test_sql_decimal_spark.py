"""DECIMAL columns through every operator on Spark (docs/operators.md,
"DECIMAL"): a join and its materializer keyed on a DECIMAL, Top-N ordered by
one, group aggregation by one, deduplication and a window aggregate, in
streaming over two micro-batches (state through the state store) and batch;
the Delta table, ``cat`` and the print sink keep every digit."""
from __future__ import annotations

import io
import subprocess
import sys
from decimal import Decimal as D

import pytest

from sql_inputs import source_options, write_changelog
from spark_changelog.sinks.delta import read_table
from spark_changelog.sql.runner import run_script
from spark_changelog.sql.script import parse_script

BIG = D("12345678.91")


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    base = tmp_path_factory.mktemp("decimal")
    # s1 (id, cat, price): the second file moves id 2 to another price and deletes id 3
    write_changelog(base / "s1", ["id", "cat", "price"], ["BIGINT", "STRING", "DECIMAL(10, 2)"],
                    [[("+I", [1, "x", D("1.10")], 1), ("+I", [2, "x", D("2.20")], 2),
                      ("+I", [3, "y", BIG], 3)],
                     [("-U", [2, "x", D("2.20")], 4), ("+U", [2, "x", D("1.10")], 5),
                      ("-D", [3, "y", BIG], 6), ("+I", [4, "y", D("0.01")], 7)]])
    write_changelog(base / "s2", ["price", "label"], ["DECIMAL(10, 2)", "STRING"],
                    [[("+I", [D("1.10"), "cheap"], 1), ("+I", [D("2.20"), "dear"], 2),
                      ("+I", [BIG, "big"], 3), ("+I", [D("0.01"), "tiny"], 4)]])
    return base


def script(base, out):
    src = lambda t: source_options(base / t) + ", 'source.max-files-per-trigger' = '1'"  # noqa: E731
    return parse_script(f"""
CREATE TABLE s1 (id BIGINT, cat STRING, price DECIMAL(10, 2), PRIMARY KEY (id) NOT ENFORCED)
  WITH ({src('s1')});
CREATE TABLE s2 (price DECIMAL(10, 2), label STRING, PRIMARY KEY (price) NOT ENFORCED)
  WITH ({src('s2')});
CREATE TABLE joined (id BIGINT, price DECIMAL(10, 2), label STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'delta', 'path' = '{out}/joined');
CREATE TABLE by_price (price DECIMAL(10, 2), n BIGINT, total DECIMAL(38, 2), avg_price DECIMAL(38, 6),
  PRIMARY KEY (price) NOT ENFORCED) WITH ('connector' = 'delta', 'path' = '{out}/by_price');
CREATE TABLE top1 (cat STRING, id BIGINT, price DECIMAL(10, 2)) WITH ('connector' = 'print');
EXECUTE STATEMENT SET BEGIN
INSERT INTO joined SELECT s1.id, s1.price, s2.label FROM s1 JOIN s2 ON s1.price = s2.price;
INSERT INTO by_price SELECT price, COUNT(*), SUM(price), AVG(price) FROM s1 GROUP BY price;
INSERT INTO top1 SELECT cat, id, price FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY cat
  ORDER BY price DESC) AS rn FROM s1) WHERE rn = 1;
END;
""", "decimal.sql")


WANT_JOINED = [(1, D("1.10"), "cheap"), (2, D("1.10"), "cheap"), (4, D("0.01"), "tiny")]
WANT_BY_PRICE = [(D("0.01"), 1, D("0.01"), D("0.010000")), (D("1.10"), 2, D("2.20"), D("1.100000"))]


def rows(path, cols):
    return sorted(map(tuple, read_table(str(path))[cols].astype(object).values.tolist()))


#: batch is the long variant (SPARK_CHANGELOG_LONG_TESTS=1): streaming covers the
#: same operators plus their state; the cat test runs on whichever ran
from long_variants import LONG


@pytest.fixture(scope="module", params=[False, True] if LONG else [False],
                ids=["streaming", "batch"] if LONG else ["streaming"])
def ran(request, spark, src, tmp_path_factory):
    """(batch, output directory, what the print sink wrote) of one run."""
    batch, tmp_path, out = request.param, tmp_path_factory.mktemp("out"), io.StringIO()
    run_script(spark, script(src, tmp_path), batch=batch, checkpoint=None if batch else
               str(tmp_path / "ck"), key_groups=2, show_progress=False, out=out)
    return batch, tmp_path, out


def test_decimal_keys_and_values_through_join_aggregate_top_n(ran):
    batch, tmp_path, out = ran
    assert rows(tmp_path / "joined", ["id", "price", "label"]) == WANT_JOINED
    got = rows(tmp_path / "by_price", ["price", "n", "total", "avg_price"])
    assert got == WANT_BY_PRICE
    # the scale of each type, as the sink stores it
    assert [str(v) for v in got[1]] == ["1.10", "2", "2.20", "1.100000"]
    # the print sink's final top row per category, printed exactly
    lines = out.getvalue().splitlines()
    final = {}
    for line in lines:
        kind, vals = line[:2], line[3:-1].split(", ")
        if kind in ("+I", "+U"):
            final[vals[0]] = vals
        elif final.get(vals[0]) == vals:
            del final[vals[0]]
    assert final == {"x": ["x", "1", "1.10"], "y": ["y", "4", "0.01"]}
    if not batch:
        assert "+I[y, 3, 12345678.91]" in lines


def test_cat_prints_decimals_exactly(ran):
    _, tmp_path, _ = ran
    cmd = [sys.executable, "-m", "spark_changelog.cli", "cat", str(tmp_path / "by_price")]
    csv = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert csv.splitlines() == ["price,n,total,avg_price", "0.01,1,0.01,0.010000",
                                "1.10,2,2.20,1.100000"]
    js = subprocess.run(cmd + ["--format", "json"], capture_output=True, text=True,
                        check=True).stdout
    assert js.splitlines()[0] == '{"price":0.01,"n":1,"total":0.01,"avg_price":0.010000}'
