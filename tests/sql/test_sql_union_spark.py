"""UNION ALL of changelogs through SQL and the Python API (docs/plan.md,
"Union"): Flink's set operations page example run unchanged but for its
tables, with the page's result as data; an aggregate over a union in
streaming over two micro-batches; the errors for what is not supported."""
from __future__ import annotations

import io
from collections import Counter

import pytest

from changelog_data import to_rows
from sql_inputs import source_options, write_changelog
from spark_changelog.sql.errors import SqlError, UnsupportedFeature
from spark_changelog.sql.runner import run_script
from spark_changelog.sql.script import parse_script
from spark_changelog.sql.translate import Translator

#: Flink's page: create view t1(s) as values ('c'), ('a'), ('b'), ('b'), ('c');
#: create view t2(s) as values ('d'), ('e'), ('a'), ('b'), ('b');
T1, T2 = ["c", "a", "b", "b", "c"], ["d", "e", "a", "b", "b"]
#: (SELECT s FROM t1) UNION ALL (SELECT s FROM t2), as the page prints it
FLINK_UNION_ALL = ["c", "a", "b", "b", "c", "d", "e", "a", "b", "b"]


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    base = tmp_path_factory.mktemp("union")
    for name, rows in (("t1", T1), ("t2", T2)):
        write_changelog(base / name, ["s"], ["STRING"],
                        [[("+I", [v], i) for i, v in enumerate(rows)]])
    return base


def ddl(base):
    return "".join(f"CREATE TABLE {t} (s STRING) WITH ({source_options(base / t)}, "
                   "'changelog.mode' = 'insert-only');\n" for t in ("t1", "t2"))


def planned(spark, base, query):
    script = parse_script(ddl(base) + f"EXPLAIN {query};", "u.sql")
    (_, s), = [x for x in Translator(spark, script, streaming=False, key_groups=2).statements()
               if x[1] is not None]
    return s


def test_flink_doc_union_all(spark, src):
    s = planned(spark, src, "(SELECT s FROM t1) UNION ALL (SELECT s FROM t2)")
    rows = to_rows(s.collect(), ["s"])
    assert {k for k, _ in rows} == {"+I"}
    assert Counter(r[0] for _, r in rows) == Counter(FLINK_UNION_ALL)
    assert "Union(all=[true], union=[s]), changelogMode=[I]" in s.explain()


def test_sql_union_all_equals_the_python_api(spark, src):
    from spark_changelog.api import read_changes
    sql = planned(spark, src, "SELECT s FROM t1 UNION ALL SELECT s FROM t2")
    opts = dict(format="changelog", changelog_file_format="parquet", kind_column="op",
                seq_column="seq", schema="`s` STRING", mode="insert-only")
    t1 = read_changes(spark, str(src / "t1"), name="t1", **opts)
    t2 = read_changes(spark, str(src / "t2"), name="t2", **opts)
    api = t1.union_all(t2)
    assert sql.explain() == api.explain()


BAD = [("SELECT s FROM t1 UNION SELECT s FROM t2", UnsupportedFeature,
        "UNION (without ALL: distinct rows) is not supported yet (UNION ALL is)"),
       ("SELECT s FROM t1 INTERSECT SELECT s FROM t2", UnsupportedFeature,
        "INTERSECT is not supported yet (UNION ALL is)"),
       ("SELECT s FROM t1 UNION ALL SELECT s, s FROM t2", SqlError,
        "UNION ALL: the left query has 1 columns, the right one 2")]


@pytest.mark.parametrize("query,cls,message", BAD, ids=["union", "intersect", "widths"])
def test_union_errors(spark, src, query, cls, message):
    with pytest.raises(cls) as e:
        planned(spark, src, query)
    assert e.value.message == message and e.value.line == 3


def test_streaming_aggregate_over_a_union_of_two_changelogs(spark, tmp_path):
    """Two tables of one database log (one sequence space): the second
    micro-batch retracts a row of each; the union keeps each input's order
    and the aggregate's final table is exact."""
    for name, files in (("a", [[("+I", [1, "x", 5], 1), ("+I", [2, "y", 7], 3)],
                               [("-U", [1, "x", 5], 5), ("+U", [1, "x", 6], 6)]]),
                        ("b", [[("+I", [1, "x", 100], 2)], [("-D", [1, "x", 100], 4),
                                                            ("+I", [3, "y", 1], 7)]])):
        write_changelog(tmp_path / name, ["id", "k", "v"], ["BIGINT", "STRING", "BIGINT"], files)
    tables = "".join(
        f"CREATE TABLE {t} (id BIGINT, k STRING, v BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH "
        f"({source_options(tmp_path / t)}, 'source.max-files-per-trigger' = '1');\n"
        for t in ("a", "b"))
    script = parse_script(tables + "CREATE TABLE o (k STRING, total BIGINT, n BIGINT) WITH "
                          "('connector' = 'print');\nINSERT INTO o SELECT k, SUM(v), COUNT(*) FROM "
                          "(SELECT k, v FROM a UNION ALL SELECT k, v FROM b) GROUP BY k;", "s.sql")
    out = io.StringIO()
    run_script(spark, script, batch=False, checkpoint=str(tmp_path / "ck"), key_groups=2,
               show_progress=False, out=out)
    final = {}
    for line in out.getvalue().splitlines():
        kind, vals = line[:2], line[3:-1].split(", ")
        if kind in ("+I", "+U"):
            final[vals[0]] = vals
        elif final.get(vals[0]) == vals:
            del final[vals[0]]
    assert final == {"x": ["x", "6", "1"], "y": ["y", "8", "2"]}
