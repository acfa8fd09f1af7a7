"""A checkpoint written before run ids were digests (random ids, issue #26)
resumes: tests/fixtures/checkpoints/random_run_ids holds the table, emitted
changelog and checkpoint of the normalize job (now tests/crash_pipelines.py) after the first two
of kill_restart's four files, made by the code of that time in
/tmp/replay-fx (its absolute paths are rewritten here).  Resuming over all
four files gives the table and changelog of one uninterrupted run."""
from __future__ import annotations

import os
import pathlib
import shutil

from kill_restart import COLS, EXPECTED_CHANGELOG, EXPECTED_TABLE, write_input
from spark_changelog.api import ChangelogStream
from spark_changelog.sinks.changelog import read_changelog
from spark_changelog.sinks.delta import read_table

FIXTURE = pathlib.Path(__file__).parent.parent / "fixtures" / "checkpoints" / "random_run_ids"
MADE_IN = "/tmp/replay-fx"


def _copy_fixture(dest: pathlib.Path) -> None:
    shutil.copytree(FIXTURE, dest / "old")
    for path in (dest / "old").rglob("*"):
        if path.is_file() and not path.name.endswith((".crc", ".parquet", ".zip", ".sst", ".changelog",
                                                       ".arrow")):
            text = path.read_bytes()
            if MADE_IN.encode() in text:
                path.write_bytes(text.replace(MADE_IN.encode(), str(dest).encode()))
                # Hadoop checks a file against its .crc sibling when there is one
                crc = path.with_name(f".{path.name}.crc")
                if crc.exists():
                    crc.unlink()


def test_checkpoint_with_random_run_ids_resumes_exactly(spark, tmp_path):
    _copy_fixture(tmp_path)
    write_input(tmp_path / "in")
    old = tmp_path / "old"
    df = (spark.readStream.format("parquet").option("maxFilesPerTrigger", 1)
          .schema("id BIGINT, name STRING, score BIGINT, _kind TINYINT, _seq BIGINT").load(str(tmp_path / "in")))
    report = ChangelogStream.from_dataframe(df, primary_key=["id"]).normalize(key_groups=4).write_upsert(
        str(old / "table"), checkpoint=str(old / "ck"), changelog_path=str(old / "log"))
    # only the two new files were read: the old state was found and used
    assert report.batches == 2 and report.replayed_batches == 0
    table = read_table(str(old / "table"))
    assert sorted(map(tuple, table[COLS].astype(object).values.tolist())) == EXPECTED_TABLE
    log = read_changelog(old / "log")
    assert [(r["op"], r["id"], r["name"], r["score"]) for _, r in log.iterrows()] == EXPECTED_CHANGELOG
    # the changelog of the earlier layout (a file per batch) goes on in committed directories
    assert sorted(os.listdir(old / "log")) == ["_schema.arrow", "batch-00000000000000000000.parquet",
                                               "batch-00000000000000000001.parquet",
                                               "batch-00000000000000000002", "batch-00000000000000000003"]
    assert os.path.exists(old / "ck" / "main" / "commits" / "3")
