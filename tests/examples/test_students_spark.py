"""The first seed article's students example, end to end through the Python API:

    CREATE VIEW v AS SELECT student_id, student_name, AVG(score) AS avg_score
                     FROM students GROUP BY student_id, student_name;
    INSERT INTO performance_report  -- PRIMARY KEY student_info
    SELECT CONCAT('id:', student_id, ',name:', student_name) AS student_info, avg_score FROM v;

The group key (student_id, student_name) is the view's upsert key; the
CONCAT hides it, so the sink keyed by student_info needs a materializer
(explain says why).  A sink keyed by the group key needs none.  Streaming
(one file per micro-batch) and batch give the same final table.
"""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from changelog_data import schema_of, to_frame
from spark_changelog.api import ChangelogStream
from spark_changelog.sinks.delta import read_table

COLS = ["student_id", "student_name", "course_id", "score"]
ARROW = schema_of(COLS, [pa.int64(), pa.string(), pa.int64(), pa.float64()])
FILES = [
    [["+I", [1, "alice", 10, 80.0], 1], ["+I", [2, "bob", 10, 70.0], 2],
     ["+I", [3, "carol", 11, 60.0], 3]],
    # alice's score changes, carol is deleted
    [["-U", [1, "alice", 10, 80.0], 4], ["+U", [1, "alice", 11, 90.0], 5],
     ["-D", [3, "carol", 11, 60.0], 6]],
    # bob is renamed: his group (2, bob) empties, (2, bobby) appears
    [["-U", [2, "bob", 10, 70.0], 7], ["+U", [2, "bobby", 10, 75.0], 8],
     ["+I", [4, "dan", 12, 50.0], 9]],
]
WANT = [("id:1,name:alice", 90.0), ("id:2,name:bobby", 75.0), ("id:4,name:dan", 50.0)]


def report_query(spark, directory, streaming):
    from pyspark.sql.pandas.types import from_arrow_schema
    st = from_arrow_schema(ARROW)
    df = (spark.readStream.schema(st).option("maxFilesPerTrigger", 1).parquet(directory)
          if streaming else spark.read.schema(st).parquet(directory))
    students = ChangelogStream.from_dataframe(df, primary_key="student_id", name="students")
    v = students.group_by("student_id", "student_name").agg("AVG(score) AS avg_score")
    return v, v.select(student_info="concat('id:', student_id, ',name:', student_name)",
                       avg_score="avg_score")


@pytest.fixture(scope="module")
def students_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("students")
    os.makedirs(d / "in")
    for i, rows in enumerate(FILES):
        pq.write_table(pa.Table.from_pandas(to_frame(rows, COLS), schema=ARROW,
                                            preserve_index=False), d / "in" / f"part-{i:04d}.parquet")
    return d


def test_explain_says_why_the_report_sink_needs_a_materializer(spark, students_dir):
    v, report = report_query(spark, str(students_dir / "in"), streaming=True)
    text = report.explain(key="student_info")
    assert "GroupAggregate(groupBy=[student_id, student_name], select=[student_id, " \
           "student_name, AVG(score) AS avg_score])" in text
    assert "SinkUpsertMaterializer(key=[student_info]" in text
    assert "upsertMaterialize=[true]" in text
    assert "it has no upsert key" in text
    # keyed by the group key, the aggregate's changes keep their order: no materializer
    assert "upsertMaterialize=[false]" in v.explain(key=["student_id", "student_name"])


@pytest.mark.parametrize("streaming", [True, False])
def test_students_report_final_table(spark, students_dir, streaming):
    _, report = report_query(spark, str(students_dir / "in"), streaming)
    table = students_dir / f"report_{streaming}"
    rep = report.write_upsert(str(table), key="student_info",
                              checkpoint=str(students_dir / f"ck_{streaming}") if streaming else None)
    if streaming:
        assert rep.batches >= len(FILES)
    got = sorted(map(tuple, read_table(table)[["student_info", "avg_score"]].values.tolist()))
    assert got == WANT
