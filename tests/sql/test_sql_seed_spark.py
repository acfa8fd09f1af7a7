"""The seed example as SQL (tests/fixtures/sql/seed_000_join.sql, the seed's
statements verbatim apart from WITH options) on Spark, streaming and batch:

    INSERT INTO t1 SELECT s1.*, s2.attr FROM s1 JOIN s2 ON s1.level = s2.id

s2: +I(10,a1) +I(20,b1); s1: +I(1,10), then -U(1,10) +U(1,20) in a second file
(a second micro-batch).  The join shuffles s1 by level, so its output for id 1
loses its order; the planner puts a SinkUpsertMaterializer in front of t1 and
the final table is (1, 20, b1).  The SQL's plan and explain equal the Python
API's for the same pipeline.
"""
from __future__ import annotations

import pathlib

import pytest

from changelog_data import key_groups_separating
from sql_inputs import source_options, write_changelog
from spark_changelog.api import read_changes
from spark_changelog.sinks.delta import read_table
from spark_changelog.sql.runner import explain_script, run_script
from spark_changelog.sql.script import parse_script

SQL = (pathlib.Path(__file__).parent.parent / "fixtures" / "sql" / "seed_000_join.sql").read_text()
WANT = [(1, 20, "b1")]


@pytest.fixture(scope="module")
def seed(tmp_path_factory, spark):
    """Inputs, and the key-group count that puts join keys 10 and 20 in different
    groups (so the join's -U(1,10,a1) and +U(1,20,b1) come from different
    sequence counters: the disorder of docs/semantics.md, section 2)."""
    base = tmp_path_factory.mktemp("sqlseed")
    write_changelog(base / "s2", ["id", "attr"], ["BIGINT", "STRING"],
                    [[("+I", [10, "a1"], 1), ("+I", [20, "b1"], 2)]])
    write_changelog(base / "s1", ["id", "level"], ["BIGINT", "BIGINT"],
                    [[("+I", [1, 10], 1)], [("-U", [1, 10], 2), ("+U", [1, 20], 3)]])
    return base, key_groups_separating(spark, 10, 20)


def script(base, out: str, *, extra_source_options: str = ""):
    sql = SQL.replace("'{base}/t1'", f"'{out}'").replace("{base}", str(base))
    if extra_source_options:
        sql = sql.replace("'changelog.seq-column' = 'seq'",
                          f"'changelog.seq-column' = 'seq', {extra_source_options}")
    return parse_script(sql, "seed_000_join.sql")


def final(path):
    t = read_table(str(path))
    return sorted(map(tuple, t[["id", "level", "attr"]].astype(object).values.tolist()))


def api_pipeline(spark, base, streaming, groups):
    """The same pipeline written with the Python API."""
    opts = dict(format="changelog", changelog_file_format="parquet", kind_column="op",
                seq_column="seq", streaming=streaming)
    s1 = read_changes(spark, str(base / "s1"), schema="`id` BIGINT, `level` BIGINT",
                      primary_key=["id"], name="s1", **opts)
    s2 = read_changes(spark, str(base / "s2"), schema="`id` BIGINT, `attr` STRING",
                      primary_key=["id"], name="s2", **opts)
    return s1.join(s2, left_on=["level"], right_on=["id"], key_groups=groups).select(
        id="id", level="level", attr="attr")


def test_seed_sql_explain_equals_the_python_api(spark, seed, tmp_path):
    base, groups = seed
    text = explain_script(spark, script(base, str(tmp_path / "t1")))
    header, body = text.split("\n", 1)
    body, tail = body.rsplit("\n", 1)
    assert header == "== INSERT INTO t1 (line 28) =="
    # the default is the streaming plan (`run --checkpoint`), equal to the API's
    api = api_pipeline(spark, base, True, groups).explain(key="id", table="t1")
    assert body + "\n" + tail == api
    assert "upsert materializer: inserted: the input has updates" in body
    assert "Source(name=[s1], fields=[id, level], primaryKey=[id])" in body
    assert "left upsert key [id] lost: the input is shuffled by [level]" in body
    assert body.count("ChangelogNormalize(key=[id], inserted: join needs each key's changes") == 2
    assert tail == ("WARNING: the state of ChangelogNormalize, Join, SinkUpsertMaterializer grows "
                    "without bound in a streaming run: per-key rows stay until they are retracted, "
                    "and no state TTL is set (`state_ttl_ms=` in the Python API, SET "
                    "'table.exec.state.ttl' in SQL). A TTL bounds it; a TTL shorter than the time "
                    "between a row and its retraction leaves stale rows (counted and warned about "
                    "at run time)")
    with_ttl = script(base, str(tmp_path / "t1")).sql.replace(
        "-- gabungkan", "SET 'table.exec.state.ttl' = '1 h';\n-- gabungkan")
    assert "WARNING" not in explain_script(spark, parse_script(with_ttl, "ttl.sql"))
    # SET 'table.exec.mini-batch.enabled': the API's with_mini_batch(), folded normalizes
    folded = script(base, str(tmp_path / "t1")).sql.replace(
        "-- gabungkan", "SET 'table.exec.mini-batch.enabled' = 'true';\n-- gabungkan")
    text = explain_script(spark, parse_script(folded, "mini_batch.sql"))
    assert text.split("\n", 1)[1] == api_pipeline(spark, base, True, groups).with_mini_batch(
        ).explain(key="id", table="t1")
    assert text.count("miniBatch=[true]") == 2
    # `explain --batch`: the plan of `run --batch` (ordered input, no state kept across runs)
    batch = explain_script(spark, script(base, str(tmp_path / "t1")), batch=True)
    assert batch.split("\n", 1)[1] == api_pipeline(spark, base, False, groups).explain(
        key="id", table="t1")
    assert "ChangelogNormalize" not in batch and "WARNING" not in batch
    dot = explain_script(spark, script(base, str(tmp_path / "t1")), "dot")
    assert dot.splitlines()[1] == "digraph plan {" and "SinkUpsertMaterializer" in dot
    mermaid = explain_script(spark, script(base, str(tmp_path / "t1")), "mermaid")
    assert mermaid.splitlines()[1] == "flowchart BT" and " --> " in mermaid


def test_seed_sql_streaming_and_batch_end_with_the_moved_row(spark, seed, tmp_path):
    base, groups = seed
    stream_out = tmp_path / "stream_t1"
    sql = script(base, str(stream_out), extra_source_options="'source.max-files-per-trigger' = '1'")
    runs = run_script(spark, sql, batch=False, checkpoint=str(tmp_path / "ck"),
                      key_groups=groups, show_progress=False)
    assert len(runs) == 1
    rep = runs[0].report
    assert rep.batches == 2 and "upsert materializer: inserted" in rep.plan
    assert final(stream_out) == WANT
    # a second run resumes from the checkpoint: no new input, nothing new written
    again = run_script(spark, sql, batch=False, checkpoint=str(tmp_path / "ck"),
                       key_groups=groups, show_progress=False)
    assert again[0].report.changes_out == 0 and final(stream_out) == WANT

    batch_out = tmp_path / "batch_t1"
    runs = run_script(spark, script(base, str(batch_out)), batch=True, key_groups=groups,
                      show_progress=False)
    assert runs[0].report.counters.get("retract_no_match", 0) == 0
    assert final(batch_out) == WANT


def test_seed_sql_with_materializer_off_is_unsafe_and_on_conflict_rejected(spark, seed, tmp_path):
    base, _ = seed
    sql = script(base, str(tmp_path / "t1")).sql
    off = sql.replace("-- gabungkan", "SET 'table.exec.sink.upsert-materialize' = 'none';\n-- gabungkan")
    text = explain_script(spark, parse_script(off, "off.sql"))
    assert "upsertMaterialize=[false]" in text and "UNSAFE" in text
    from spark_changelog.sql.errors import SqlError
    bad = off.replace("ON s1.level = s2.id;", "ON s1.level = s2.id ON CONFLICT DO DEDUPLICATE;")
    with pytest.raises(SqlError, match="FLINK-41007") as e:
        explain_script(spark, parse_script(bad, "bad.sql"))
    assert e.value.line == 29


def test_watermark_computed_column_and_on_conflict_do_nothing(spark, seed, tmp_path):
    """DO NOTHING needs a watermark: refused without one (with the INSERT's
    line), planned with one declared on a computed event-time column; a
    USING join and a WHERE on the way."""
    base, _ = seed
    head = f"""
CREATE TABLE s1 (id BIGINT, level BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ({source_options(base / 's1')});
CREATE TABLE s1w (id BIGINT, level BIGINT, t AS CAST(level AS BIGINT) * 10000 / 10,
  ts AS TO_TIMESTAMP_LTZ(t, 3), WATERMARK FOR ts AS ts - INTERVAL '5' SECOND,
  PRIMARY KEY (id) NOT ENFORCED) WITH ({source_options(base / 's1')});
CREATE TABLE s2w (id BIGINT, attr STRING, ts AS TO_TIMESTAMP_LTZ(id, 0),
  WATERMARK FOR ts AS ts - INTERVAL '1' MINUTE) WITH ({source_options(base / 's2')});
CREATE TABLE lv (level BIGINT, PRIMARY KEY (level) NOT ENFORCED)
  WITH ('connector' = 'delta', 'path' = '{tmp_path / "lv"}');
"""
    from spark_changelog.sql.errors import SqlError
    with pytest.raises(SqlError, match="requires all sources to define watermarks") as e:
        explain_script(spark, parse_script(
            head + "INSERT INTO lv SELECT level FROM s1 ON CONFLICT DO NOTHING;", "c.sql"))
    assert e.value.line == 11
    text = explain_script(spark, parse_script(
        head + "INSERT INTO lv SELECT a.level FROM s1w AS a JOIN s2w AS b USING (id)\n"
               "WHERE a.level > 0 ON CONFLICT DO NOTHING;", "c.sql"))
    assert "WatermarkAssigner(rowtime=[ts], watermark=[ts - 4999 ms], generated=[at source s1w, "\
           "one partition])" in text
    # Flink divides integers as integers: / between integers becomes Spark's DIV
    assert "Project(select=[id, level, CAST(`level` AS BIGINT) * 10000 DIV 10 AS t])" in text
    assert "TIMESTAMP_MILLIS(`t`) AS ts" in text
    assert "conflictStrategy=[NOTHING]" in text and "(where=[`level` > 0])" in text
    assert "where=[id = id0]" in text and "watermark=[ts - 59999 ms]" in text


def test_streaming_sources_get_their_order_restored_unless_declared_ordered(spark, seed, tmp_path):
    """A streaming CDC source may bring a key's changes out of order across
    files: the planner puts a ChangelogNormalize before the join (docs/semantics.md,
    section 10); 'source.ordered' = 'true' declares the order and removes it."""
    from spark_changelog.sql.translate import Translator
    base, _ = seed

    def plan(extra):
        s = script(base, str(tmp_path / "t1"), extra_source_options=extra)
        (_, planned), = [x for x in Translator(spark, s, streaming=True).statements() if x[1]]
        return planned[0].explain()
    default = plan("")
    assert default.count("ChangelogNormalize(key=[id], inserted: join needs each key's changes "
                         "in source-sequence order") == 2
    declared = plan("'source.ordered' = 'true'")
    assert "ChangelogNormalize" not in declared and "ordered=[declared]" in declared


@pytest.mark.postgres
def test_seed_sql_into_postgres_through_a_jdbc_url(spark, seed, pg_server):
    """The seed's t1 as a 'jdbc' table (Flink's JDBC options): the final rows in
    PostgreSQL are (1, 20, b1)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict
    base, groups = seed
    conninfo = pg_server.create_database("test_sql_seed")
    p = conninfo_to_dict(conninfo)
    url = f"jdbc:postgresql://{p.get('host', 'localhost')}:{p.get('port', 5432)}/{p['dbname']}"
    sql = SQL.replace("'connector' = 'delta', 'path' = '{base}/t1'",
                      f"'connector' = 'jdbc', 'url' = '{url}', 'table-name' = 'public.t1', "
                      f"'username' = '{p['user']}'").replace("{base}", str(base))
    runs = run_script(spark, parse_script(sql, "pg.sql"), batch=True, key_groups=groups,
                      show_progress=False)
    assert "upsert materializer: inserted" in runs[0].report.plan
    with psycopg.connect(conninfo) as conn:
        rows = conn.execute("SELECT id, level, attr FROM public.t1 ORDER BY id").fetchall()
    assert rows == WANT
