"""HAVING, SELECT DISTINCT, Top-N filters (``rn < N``, ``BETWEEN``, ranking
columns the inner SELECT does not list) and window options through SQL, on
Spark in batch: the rows against values worked out by hand, the plan against
the Python API's."""
from __future__ import annotations

from collections import Counter

import pytest

from changelog_data import to_rows
from sql_inputs import source_options, write_changelog
from spark_changelog.api import read_changes
from spark_changelog.sql.script import parse_script
from spark_changelog.sql.translate import Translator

#: (k, v, t ms): an insert-only input
ROWS = [("a", 5, 1000), ("a", 7, 2000), ("b", 1, 3000), ("a", 5, 4000), ("b", 9, 65000),
        ("c", 2, 70000)]


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    path = tmp_path_factory.mktemp("src")
    write_changelog(path, ["k", "v", "t"], ["STRING", "BIGINT", "BIGINT"],
                    [[("+I", list(r), i) for i, r in enumerate(ROWS)]])
    return path


def stream(spark, src, query, settings=""):
    script = parse_script(
        f"CREATE TABLE s (k STRING, v BIGINT, t BIGINT, pt AS PROCTIME(), "
        f"rt AS TO_TIMESTAMP_LTZ(t, 3), WATERMARK FOR rt AS rt - INTERVAL '1' SECOND) "
        f"WITH ({source_options(src)}, 'changelog.mode' = 'insert-only');\n{settings}"
        f"EXPLAIN {query};", "q.sql")
    (_, s), = [x for x in Translator(spark, script, key_groups=2).statements()
               if x[1] is not None]
    return s


def table(s) -> Counter:
    out: Counter = Counter()
    for kind, row in to_rows(s.collect(), list(s.schema.columns)):
        row = tuple(x.tz_convert(None).isoformat() if hasattr(x, "tz_convert") else x
                    for x in row)
        out[row] += 1 if kind in ("+I", "+U") else -1
    return +out


def api_source(spark, src, idle_timeout=None):
    s = read_changes(spark, str(src), format="changelog", changelog_file_format="parquet",
                     kind_column="op", seq_column="seq", schema="`k` STRING, `v` BIGINT, "
                     "`t` BIGINT", name="s", mode="insert-only")
    return s.with_column("pt", "current_timestamp()", deterministic=False).with_column(
        "rt", "TIMESTAMP_MILLIS(`t`)").with_watermark("rt", 999, idle_timeout=idle_timeout)


def test_having_filters_the_aggregate_with_a_hidden_call(spark, src):
    s = stream(spark, src, "SELECT k, SUM(v) AS total FROM s GROUP BY k "
                           "HAVING COUNT(*) > 1 AND SUM(v) > 10")
    assert "Calc(where=[`$having0` > 1 AND `total` > 10])" in s.explain()
    assert table(s) == Counter({("a", 17): 1})


def test_select_distinct_is_a_group_by_every_column(spark, src):
    s = stream(spark, src, "SELECT DISTINCT k, v FROM s")
    assert "GroupAggregate(groupBy=[k, v]" in s.explain()
    assert s.schema.columns == ("k", "v")
    assert table(s) == Counter({("a", 5): 1, ("a", 7): 1, ("b", 1): 1, ("b", 9): 1,
                                ("c", 2): 1})


def test_top_n_with_rn_less_than_and_an_unlisted_order_column(spark, src):
    # ORDER BY t (not selected inside) DESC, rn < 3: the two latest rows per key, with rn
    s = stream(spark, src, "SELECT k, v, rn FROM (SELECT k, v, ROW_NUMBER() OVER "
                           "(PARTITION BY k ORDER BY t DESC) AS rn FROM s) WHERE rn < 3")
    assert "rankRange=[rankStart=1, rankEnd=2], partitionBy=[k], orderBy=[$rank_t DESC]" \
        in s.explain()
    assert table(s) == Counter({("a", 5, 1): 1, ("a", 7, 2): 1, ("b", 9, 1): 1, ("b", 1, 2): 1,
                                ("c", 2, 1): 1})


def test_between_1_and_1_on_proctime_without_rn_is_deduplication_like_the_api(spark, src):
    s = stream(spark, src, "SELECT k, v FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY k "
                           "ORDER BY pt ASC) AS rn FROM s) WHERE rn BETWEEN 1 AND 1")
    api = api_source(spark, src).deduplicate("k", keep="first").select("k", "v")
    assert s.explain() == api.explain()
    assert table(s) == Counter({("a", 5): 1, ("b", 1): 1, ("c", 2): 1})
    # selecting rn makes it a Top-1 (Flink: Rank, not Deduplicate)
    ranked = stream(spark, src, "SELECT k, v, rn FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY"
                                " k ORDER BY pt ASC) AS rn FROM s) WHERE rn = 1")
    assert "Rank(" in ranked.explain() and "Deduplicate(" not in ranked.explain()


def test_hop_with_window_time_lateness_and_idleness_settings(spark, src):
    s = stream(spark, src, "SELECT k, window_start, window_end, window_time, MAX(v) AS mx "
                           "FROM TABLE(HOP(TABLE s, DESCRIPTOR(rt), INTERVAL '1' MINUTE, "
                           "INTERVAL '2' MINUTE)) GROUP BY k, window_start, window_end",
               "SET 'table.exec.emit.allow-lateness' = '30 s';\n"
               "SET 'table.exec.source.idle-timeout' = '5 s';\n")
    text = s.explain()
    assert "WindowAggregate(groupBy=[k], window=[HOP(slide=1 min, size=2 min)], " \
           "select=[MAX(v) AS mx], allowedLateness=[30000 ms]" in text
    assert "idle after 5 s" in text or "5000 ms" in text, text
    # SET's idle timeout is every source's (the source's watermark carries it)
    api = api_source(spark, src, idle_timeout="5 s").window(
        ("rt", s.node.input.window), idle_timeout="5 s", allowed_lateness="30 s") \
        .aggregate(by=["k"], key_groups=2, window_time=True, mx="max(v)")
    assert text == api.explain()
    assert table(s) == Counter({
        ("a", "1969-12-31T23:59:00", "1970-01-01T00:01:00", "1970-01-01T00:00:59.999000", 7): 1,
        ("a", "1970-01-01T00:00:00", "1970-01-01T00:02:00", "1970-01-01T00:01:59.999000", 7): 1,
        ("b", "1969-12-31T23:59:00", "1970-01-01T00:01:00", "1970-01-01T00:00:59.999000", 1): 1,
        ("b", "1970-01-01T00:00:00", "1970-01-01T00:02:00", "1970-01-01T00:01:59.999000", 9): 1,
        ("b", "1970-01-01T00:01:00", "1970-01-01T00:03:00", "1970-01-01T00:02:59.999000", 9): 1,
        ("c", "1970-01-01T00:00:00", "1970-01-01T00:02:00", "1970-01-01T00:01:59.999000", 2): 1,
        ("c", "1970-01-01T00:01:00", "1970-01-01T00:03:00", "1970-01-01T00:02:59.999000", 2): 1})


def test_session_partitioned_and_named_arguments(spark, src):
    # sessions of 30 s gaps per k: a: 1 s, 2 s, 4 s -> one session [1 s, 34 s);
    # b: 3 s and 65 s -> two sessions; c: one
    s = stream(spark, src, "SELECT k, window_start, window_end, COUNT(*) AS n, SUM(v) AS total "
                           "FROM TABLE(SESSION(DATA => TABLE s PARTITION BY k, TIMECOL => "
                           "DESCRIPTOR(rt), GAP => INTERVAL '30' SECOND)) "
                           "GROUP BY k, window_start, window_end")
    from spark_changelog.model.windows import session
    api = api_source(spark, src).window(session("rt", "30 seconds")).aggregate(
        by=["k"], key_groups=2, n="count(*)", total="sum(v)")
    assert s.explain() == api.explain()
    assert table(s) == Counter({
        ("a", "1970-01-01T00:00:01", "1970-01-01T00:00:34", 3, 17): 1,
        ("b", "1970-01-01T00:00:03", "1970-01-01T00:00:33", 1, 1): 1,
        ("b", "1970-01-01T00:01:05", "1970-01-01T00:01:35", 1, 9): 1,
        ("c", "1970-01-01T00:01:10", "1970-01-01T00:01:40", 1, 2): 1})


def test_an_insert_only_source_with_another_kind_fails_naming_its_sequence(spark, tmp_path):
    write_changelog(tmp_path / "in", ["k", "v", "t"], ["STRING", "BIGINT", "BIGINT"],
                    [[("+I", ["a", 1, 1000], 1), ("-U", ["a", 1, 1000], 2)]])
    s = stream(spark, tmp_path / "in", "SELECT k, v FROM s")
    assert "changelogMode=[I]" in s.explain()
    with pytest.raises(Exception, match="source s is declared insert-only but holds a change of "
                                        r"kind 1 \(0 \+I, 1 -U, 2 \+U, 3 -D\) at sequence number"):
        s.collect()


def test_row_number_in_a_view_filtered_by_the_query_that_reads_it(spark, src):
    ranked = ("SELECT k, v FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY k ORDER BY rt DESC) "
              "AS rn FROM s) WHERE rn = 1")
    via_view = stream(spark, src, "SELECT k, v FROM ranked WHERE rn = 1",
                      "CREATE TEMPORARY VIEW ranked AS SELECT *, ROW_NUMBER() OVER (PARTITION BY"
                      " k ORDER BY rt DESC) AS rn FROM s;\n")
    assert "Deduplicate(keep=[LastRow], key=[k], order=[ROWTIME(rt)])" in via_view.explain()
    assert via_view.explain() == stream(spark, src, ranked).explain()
