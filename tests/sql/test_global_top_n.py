"""Global Top-N: ``ROW_NUMBER() OVER (ORDER BY score DESC) <= 2`` without
PARTITION BY (docs/operators.md, "Top-N"; docs/sql.md).  The whole stream is
one partition: the lowering keys the operator on a constant hidden column
(``operators.keys.GLOBAL_KEY``) and drops it from the output.

Five ids; ``id 1`` is updated into the top (10 -> 40) in the first
micro-batch and out of it (40 -> 0) in the second.  The expected changelogs
are written out from the micro-batch rule: each batch emits the difference
between the top 2 before and after it (per rank with the rank number, per
row without); with one row per batch the operator gives Flink 2.3's recorded
output (tests/fixtures/flink/topn.json, T5).  The same rows run through the operator locally, through the
Python API and SQL on Spark in batch (one batch: the final top only) and
streaming (one file per micro-batch).  Global deduplication (``rn = 1`` on a
time attribute without PARTITION BY) takes the same path."""
from __future__ import annotations

import pyarrow as pa
import pytest

from changelog_data import load_fixture, schema_of, to_frame, to_rows
from sql_inputs import source_options, write_changelog
from spark_changelog.api import read_changes
from spark_changelog.operators.keys import GLOBAL_KEY
from spark_changelog.operators.top_n import RetractableTopN
from spark_changelog.runtime.local import LocalRunner

COLS = ["id", "score"]
BATCHES = [
    [("+I", [1, 10], 0), ("+I", [2, 30], 1), ("+I", [3, 20], 2), ("-U", [1, 10], 3),
     ("+U", [1, 40], 4)],
    [("+I", [4, 5], 5), ("+I", [5, 25], 6), ("-U", [1, 40], 7), ("+U", [1, 0], 8)],
]
#: per micro-batch, with the rank number (changes per rank position)
WITH_RANK = [
    [("+I", [1, 40, 1]), ("+I", [2, 30, 2])],
    [("-U", [1, 40, 1]), ("+U", [2, 30, 1]), ("-U", [2, 30, 2]), ("+U", [5, 25, 2])],
]
#: per micro-batch, without it (rows leave, -D, then enter, +I)
WITHOUT_RANK = [
    [("+I", [1, 40]), ("+I", [2, 30])],
    [("-D", [1, 40]), ("+I", [5, 25])],
]
#: everything in one batch: the final top 2 only
BATCH_WITH_RANK = [("+I", [2, 30, 1]), ("+I", [5, 25, 2])]


def rows(frame, cols):
    return [(k, list(v)) for k, v in to_rows(frame, cols)]


@pytest.mark.parametrize("with_rank", [True, False])
def test_operator_over_one_constant_key_emits_the_top_changes_per_micro_batch(with_rank):
    # what the lowering builds: the operator keyed on the constant hidden column
    schema = schema_of([GLOBAL_KEY] + COLS, [pa.int32(), pa.int64(), pa.int64()])
    op = RetractableTopN(schema, [GLOBAL_KEY], 2, [("score", False)],
                         rank_column="rn" if with_rank else None)
    runner = LocalRunner(op)
    out_cols = COLS + (["rn"] if with_rank else [])
    want = WITH_RANK if with_rank else WITHOUT_RANK
    for i, batch in enumerate(BATCHES):
        frame = to_frame([(k, [0] + v, s) for k, v, s in batch], [GLOBAL_KEY] + COLS)
        frame[GLOBAL_KEY] = frame[GLOBAL_KEY].astype("int32")
        assert rows(runner.run_batch(frame, processing_time_ms=i), out_cols) == want[i], i
    assert sorted(runner.state["id"].tolist()) == [1, 2, 3, 4, 5]


def test_operator_one_row_per_batch_equals_flinks_global_top_2():
    """Flink 2.3's per-row output for the same nine changes (tests/fixtures/
    flink/topn.json, T5: ``partitionBy=[]``, ``Exchange(distribution=[single])``)."""
    case = {c["name"]: c for c in load_fixture("flink/topn.json")["cases"]}[
        "T5_global_top2_with_rank"]
    assert [r for b in BATCHES for r in [[k, v] for k, v, _ in b]] == case["inputs"]["T"]["rows"]
    assert any("partitionBy=[], orderBy=[score DESC]" in line for line in case["plan"])
    schema = schema_of([GLOBAL_KEY] + COLS, [pa.int32(), pa.int64(), pa.int64()])
    runner = LocalRunner(RetractableTopN(schema, [GLOBAL_KEY], 2, [("score", False)],
                                         rank_column="rn"))
    for step, (kind, values) in enumerate(case["inputs"]["T"]["rows"]):
        frame = to_frame([(kind, [0] + values, step)], [GLOBAL_KEY] + COLS)
        got = rows(runner.run_batch(frame, processing_time_ms=step), ["id", "score", "rn"])
        assert [[k, v] for k, v in got] == case["expected_steps"][step], (step, kind, values)


def source(spark, path, streaming: bool):
    kw = dict(streaming=True, max_files_per_trigger=1) if streaming else {}
    return read_changes(spark, str(path), format="changelog", changelog_file_format="parquet",
                        kind_column="op", seq_column="seq", schema="id BIGINT, score BIGINT",
                        primary_key=["id"], name="scores", **kw)


def test_api_global_top_n_batch_explain_and_columns(spark, tmp_path):
    write_changelog(tmp_path / "in", COLS, ["BIGINT", "BIGINT"], BATCHES)
    top = source(spark, tmp_path / "in", False).top_n(2, (), "score DESC", with_rank=True,
                                                      key_groups=2)
    assert "partitionBy=[], orderBy=[score DESC]" in top.explain()
    assert list(top.schema.columns) == ["id", "score", "rn"]
    assert GLOBAL_KEY not in top.df.columns
    assert rows(top.collect(), ["id", "score", "rn"]) == BATCH_WITH_RANK
    plain = source(spark, tmp_path / "in", False).top_n(2, None, "score DESC", key_groups=2)
    assert rows(plain.collect(), COLS) == [(k, v[:2]) for k, v in BATCH_WITH_RANK]


def test_api_global_top_n_streaming_two_micro_batches(spark, tmp_path):
    write_changelog(tmp_path / "in", COLS, ["BIGINT", "BIGINT"], BATCHES)
    top = source(spark, tmp_path / "in", True).top_n(2, (), "score DESC", with_rank=True,
                                                     key_groups=2)
    from spark_changelog.runtime.pipeline import collect_changes
    batches = []
    query = (top.df.writeStream.foreachBatch(lambda b, _: batches.append(collect_changes(b)))
             .trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "ck")).start())
    query.awaitTermination()
    got = [rows(b, ["id", "score", "rn"]) for b in batches]
    assert [b for b in got if b] == WITH_RANK


def test_sql_global_top_n_explains_partition_by_empty_and_emits_the_top(spark, tmp_path):
    from spark_changelog.sql.script import parse_script
    from spark_changelog.sql.translate import Translator
    write_changelog(tmp_path / "in", COLS, ["BIGINT", "BIGINT"], BATCHES)
    script = parse_script(
        f"CREATE TABLE scores (id BIGINT, score BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH "
        f"({source_options(tmp_path / 'in')});\n"
        "EXPLAIN SELECT id, score, rn FROM (SELECT *, ROW_NUMBER() OVER (ORDER BY score DESC) "
        "AS rn FROM scores) WHERE rn <= 2;", "top.sql")
    (_, stream), = [x for x in Translator(spark, script, key_groups=2).statements()
                    if x[1] is not None]
    assert "partitionBy=[], orderBy=[score DESC], select=[*, rn]" in stream.explain()
    assert list(stream.schema.columns) == ["id", "score", "rn"]
    assert rows(stream.collect(), ["id", "score", "rn"]) == BATCH_WITH_RANK


def test_sql_global_deduplication_keeps_one_row_of_the_whole_stream(spark, tmp_path):
    """``rn = 1`` over a time attribute without PARTITION BY: the deduplicate
    operators over the one hidden key (Flink's global deduplication)."""
    from spark_changelog.sql.script import parse_script
    from spark_changelog.sql.translate import Translator
    write_changelog(tmp_path / "in", ["id", "score", "t"], ["BIGINT", "BIGINT", "BIGINT"],
                    [[("+I", [1, 10, 5000], 0), ("+I", [2, 30, 3000], 1),
                      ("+I", [3, 20, 4000], 2)]])
    inner = "SELECT *, ROW_NUMBER() OVER (ORDER BY {}) AS rn FROM ev"
    script = parse_script(
        "CREATE TABLE ev (id BIGINT, score BIGINT, t BIGINT, pt AS PROCTIME(), "
        "rt AS TO_TIMESTAMP_LTZ(t, 3), WATERMARK FOR rt AS rt - INTERVAL '1' SECOND) WITH "
        f"({source_options(tmp_path / 'in')}, 'changelog.mode' = 'insert-only');\n"
        f"EXPLAIN SELECT id, score FROM ({inner.format('pt')}) WHERE rn = 1;\n"
        f"EXPLAIN SELECT id, score FROM ({inner.format('rt')}) WHERE rn = 1;", "dedup.sql")
    (_, first_arrival), (_, earliest) = [x for x in Translator(spark, script, key_groups=2)
                                         .statements() if x[1] is not None]
    assert "Deduplicate(keep=[FirstRow], key=[], order=[PROCTIME])" in first_arrival.explain()
    assert "Deduplicate(keep=[FirstRow], key=[], order=[ROWTIME(rt)], watermark=[" in earliest.explain()
    assert rows(first_arrival.collect(), ["id", "score"]) == [("+I", [1, 10])]
    assert rows(earliest.collect(), ["id", "score"]) == [("+I", [2, 30])]
