"""Lowering on Spark (docs/plan.md): what the API builds is one plan, and its
one lowering keeps side rows and every source leaf's dead letters.

Small bounded inputs (batch): each test runs one or two Spark jobs.
"""
from __future__ import annotations

import json
import os

import pytest

from spark_changelog.api import ChangelogStream, read_debezium
from spark_changelog.connectors.dead_letter import read_dead_letter
from spark_changelog.model import ChangelogMode
from spark_changelog.plan.nodes import Filter, Join, Normalize, Project, Source
from spark_changelog.sinks.delta import read_table


def dbz(op, before, after, lsn):
    return json.dumps({"before": before, "after": after, "op": op,
                       "source": {"connector": "postgresql", "lsn": lsn}})


def write_lines(directory, lines):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "part-0.json"), "w") as f:
        f.write("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def two_readers(tmp_path_factory):
    """s1(id, level, name) and s2(id, attr), one truncated JSON line in each."""
    base = tmp_path_factory.mktemp("two")
    write_lines(base / "s1", [dbz("c", None, {"id": 1, "level": 10, "name": "a"}, 100),
                              '{"op": "c", "after": {"id": 2, "level": 1',
                              dbz("u", {"id": 1, "level": 10, "name": "a"},
                                  {"id": 1, "level": 20, "name": "a"}, 200)])
    write_lines(base / "s2", [dbz("c", None, {"id": 10, "attr": "x"}, 10),
                              dbz("c", None, {"id": 20, "attr": "y"}, 11),
                              '{"op": "c", "after": {"id": 3'])
    return base


def seed(spark, base):
    s1 = read_debezium(spark, str(base / "s1"), "id BIGINT, level BIGINT, name STRING", ["id"])
    s2 = read_debezium(spark, str(base / "s2"), "id BIGINT, attr STRING", ["id"])
    return s1, s2


def test_a_joined_stream_keeps_both_readers_dead_letters(spark, two_readers, tmp_path):
    s1, s2 = seed(spark, two_readers)
    q = s1.join(s2, on=[("level", "id")]).select("id", "level", "name", "attr")
    # one plan: the stream is a node over both sources; its readers are both leaves'
    assert isinstance(q.node, Project) and isinstance(q.node.input, Join)
    assert q.sources == (s1.source, s2.source) and q.source is None
    rep = q.write_upsert(str(tmp_path / "t"), key="id", dead_letter=str(tmp_path / "dl"))
    assert rep.invalid == 2
    raws = sorted(r["raw"] for r in read_dead_letter(str(tmp_path / "dl")))
    assert raws == sorted(['{"op": "c", "after": {"id": 2, "level": 1', '{"op": "c", "after": {"id": 3'])
    t = read_table(str(tmp_path / "t"))
    assert t[["id", "level", "name", "attr"]].values.tolist() == [[1, 20, "a", "y"]]


def test_side_rows_pass_join_filter_and_projection(spark, two_readers, tmp_path):
    """Operator metric rows (_kind = -1) of both normalizes reach the report
    through the join, a filter and a projection (contract: side rows are
    never dropped by a lowering step)."""
    s1, s2 = seed(spark, two_readers)
    q = (s1.normalize().join(s2.normalize(), on=[("level", "id")])
         .where("attr <> 'nope'").select("id", "level", "attr"))
    assert isinstance(q.node.input, Filter)
    rep = q.write_upsert(str(tmp_path / "t"), key="id", dead_letter=str(tmp_path / "dl"))
    assert rep.operators["ChangelogNormalize"]["rows_in"] == 3 + 2   # s1: +I -U +U; s2: +I +I
    assert rep.operators["RegularJoin"]["rows_in"] > 0
    assert read_table(str(tmp_path / "t"))[["id", "level", "attr"]].values.tolist() == [[1, 20, "y"]]


def test_filter_retracts_a_row_leaving_it(spark, tmp_path):
    df = spark.createDataFrame(
        [(1, 5, 0, 1), (1, 5, 1, 2), (1, 50, 2, 2), (2, 7, 0, 3)],
        "id BIGINT, v BIGINT, _kind TINYINT, _seq BIGINT")
    s = ChangelogStream.from_dataframe(df, primary_key="id")
    out = s.where("v < 10").collect()
    # the update of id 1 leaves the filter: its -U is kept, its +U dropped
    assert out[["_kind", "id", "v"]].values.tolist() == [[0, 1, 5], [1, 1, 5], [0, 2, 7]]
    assert s.where("v < 10").traits.upsert_key == ("id",)


def test_filter_of_an_upsert_stream_gets_update_before(spark):
    df = spark.createDataFrame([(1, 5, 0, 1), (1, 50, 2, 2)],
                               "id BIGINT, v BIGINT, _kind TINYINT, _seq BIGINT")
    s = ChangelogStream.from_dataframe(df, primary_key="id", mode=ChangelogMode.UPSERT)
    f = s.where("v < 10")
    text = f.explain()
    assert "ChangelogNormalize(key=[id], inserted: upsert input of a filter needs update-before" in text
    # +I(1, 5) then +U(1, 50): the row leaves the filter, so it is retracted
    assert f.collect()[["_kind", "id", "v"]].values.tolist() == [[0, 1, 5], [1, 1, 5]]


def test_columns_are_read_as_trees(spark):
    from pyspark.sql import functions as F
    df = spark.createDataFrame([(1, 2, 0, 1)], "id INT, level BIGINT, _kind TINYINT, _seq BIGINT")
    s = ChangelogStream.from_dataframe(df, primary_key="id", name="s")
    widened = s.select(F.col("id").cast("bigint").alias("id"), "level")
    assert widened.traits.upsert_key == ("id",)
    shifted = s.select((F.col("id") + 1).alias("id"), "level")
    assert shifted.traits.upsert_key is None
    noisy = s.select("id", F.rand(7).alias("r"), F.lit("rand()").alias("text"))
    assert noisy.traits.nondeterministic == {"r"}      # a string literal is not a call
    assert noisy.collect().columns.tolist()[:3] == ["id", "r", "text"]
    # Spark names an unnamed expression; the planner uses that name
    assert s.select("level + 1").traits.columns == ("(level + 1)",)
    # explain shows a Column as Spark SQL generated from its resolved tree
    assert "Project(select=[CAST(id AS BIGINT) AS id, level])" in widened.explain()
    assert "Calc(where=[(level > CAST(1 AS BIGINT))])" in s.where(F.col("level") > 1).explain()


def test_with_watermark_is_a_plan_node_over_the_projection(spark):
    df = spark.createDataFrame([(1, 1000, 0, 1)], "id BIGINT, t BIGINT, _kind TINYINT, _seq BIGINT")
    s = ChangelogStream.from_dataframe(df, primary_key="id", name="s")
    w = s.with_column("rt", "timestamp_millis(t)").with_watermark("rt", 5)
    assert (w.traits.time_attribute, w.traits.watermark.bound_ms) == ("rt", 5)
    assert w.schema.time_attribute == "rt"
    # the explain keeps the history: source, projection, watermark
    lines = w.explain().splitlines()
    assert lines[0].startswith("WatermarkAssigner(rowtime=[rt], watermark=[rt - 5 ms], generated=[")
    assert any("Project(select=[id, t, timestamp_millis(t) AS rt])" in line for line in lines)
    assert any("Source(name=[s]" in line for line in lines)
    n = w.normalize()
    assert isinstance(n.node, Normalize) and isinstance(n.node.input.input.input, Source)
