"""The first seed article's students example as SQL
(tests/fixtures/sql/seed_000_students.sql, unchanged apart from its WITH
options): the view's GROUP BY aggregation with retraction, the CONCAT sink
key that needs a materializer (explain says why), and the same final table
streaming (one file per micro-batch) and batch."""
from __future__ import annotations

import os
import pathlib
import re

import pytest

from sql_inputs import source_options, write_changelog
from spark_changelog.cli import main
from spark_changelog.sinks.delta import read_table

SQL = (pathlib.Path(__file__).parent.parent / "fixtures" / "sql" / "seed_000_students.sql"
       ).read_text()
COLS, TYPES = ["student_id", "student_name", "course_id", "score"], ["BIGINT", "STRING",
                                                                    "BIGINT", "DOUBLE"]
FILES = [
    [("+I", [1, "alice", 10, 80.0], 1), ("+I", [2, "bob", 10, 70.0], 2),
     ("+I", [3, "carol", 11, 60.0], 3)],
    # alice's score changes, carol is deleted
    [("-U", [1, "alice", 10, 80.0], 4), ("+U", [1, "alice", 11, 90.0], 5),
     ("-D", [3, "carol", 11, 60.0], 6)],
    # bob is renamed: his group (2, bob) empties, (2, bobby) appears
    [("-U", [2, "bob", 10, 70.0], 7), ("+U", [2, "bobby", 10, 75.0], 8),
     ("+I", [4, "dan", 12, 50.0], 9)],
]
WANT = [("id:1,name:alice", 90.0), ("id:2,name:bobby", 75.0), ("id:4,name:dan", 50.0)]


def script(tmp_path, mode) -> str:
    text = SQL.replace("'connector' = 'filesystem', 'path' = '{base}/students', 'format' = "
                       "'debezium-json'", source_options(tmp_path / "in")
                       + ", 'source.max-files-per-trigger' = '1'")
    text = text.replace("{base}/performance_report", str(tmp_path / mode / "out"))
    path = tmp_path / f"{mode}.sql"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("mode", ["batch", "stream"])
def test_students_seed_sql_final_table(spark, tmp_path, mode, capsys):
    write_changelog(tmp_path / "in", COLS, TYPES, FILES)
    for i, f in enumerate(sorted((tmp_path / "in").iterdir())):
        os.utime(f, (1_600_000_000 + i, 1_600_000_000 + i))     # read in this order
    args = ["--batch"] if mode == "batch" else ["--checkpoint", str(tmp_path / "ck")]
    path = script(tmp_path, mode)
    assert main(["run", path, "--no-progress", *args]) == 0
    rows = read_table(str(tmp_path / mode / "out"))
    assert sorted(zip(rows["student_info"], rows["avg_score"])) == WANT
    if mode == "batch":
        assert main(["explain", path]) == 0
        text = capsys.readouterr().out
        assert "GroupAggregate(groupBy=[student_id, student_name]" in text
        assert re.search(r"SinkUpsertMaterializer.*", text), text
