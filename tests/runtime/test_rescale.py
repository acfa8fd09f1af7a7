"""Rescaling a checkpoint to another key-group count (docs/runtime.md, "Key
groups and rescaling"; ``spark-changelog rescale``): stop, rescale (up and
down, and to another number of state partitions), resume, and the table and emitted changelog are those of one
uninterrupted run; a damaged or running checkpoint is refused and left as it
was; a checkpoint written before the count was recorded resumes with its 32.
The join pipeline's rescale is a long variant:
``SPARK_CHANGELOG_LONG_TESTS=1 .venv/bin/python -m pytest tests/runtime/test_rescale.py``."""
from __future__ import annotations

import json
import os
import shutil

import pytest

import kill_window as kw
from kill_restart import COLS, EXPECTED_CHANGELOG, EXPECTED_TABLE, write_input
from long_variants import long_only
from spark_changelog import cli
from spark_changelog.api import ChangelogStream, read_debezium
from spark_changelog.plan.fingerprint import read_fingerprint, rescale_fingerprint
from spark_changelog.runtime.checkpoint import check_checkpoint
from spark_changelog.runtime.rescale import RescaleRefused, rescale_checkpoint
from spark_changelog.sinks.changelog import read_changelog
from spark_changelog.sinks.delta import read_table

SCHEMA = "id BIGINT, name STRING, score BIGINT, _kind TINYINT, _seq BIGINT"


def _files(base, upto: int) -> None:
    """Make the first ``upto`` of kill_restart's four files visible to the stream."""
    for name in sorted(os.listdir(base / "all"))[:upto]:
        if not (base / "in" / name).exists():
            shutil.copy(base / "all" / name, base / "in" / name)


def _normalize(spark, base, key_groups):
    df = spark.readStream.format("parquet").option("maxFilesPerTrigger", 1).schema(SCHEMA).load(str(base / "in"))
    return ChangelogStream.from_dataframe(df, primary_key=["id"]).normalize(key_groups=key_groups).write_upsert(
        str(base / "table"), checkpoint=str(base / "ck"), changelog_path=str(base / "log"))


def _rescale(spark, ck, groups, partitions=None):
    report = rescale_checkpoint(spark, str(ck), groups, partitions, edit=rescale_fingerprint, quiet_seconds=0)
    shutil.rmtree(report.kept)
    return report


def _table(base):
    return sorted(map(tuple, read_table(str(base / "table"))[COLS].astype(object).values.tolist()))


@pytest.fixture
def base(tmp_path):
    write_input(tmp_path / "all")
    os.makedirs(tmp_path / "in")
    return tmp_path


def test_normalize_rescaled_up_then_down_resumes_exactly(spark, base):
    _files(base, 2)
    assert _normalize(spark, base, 4).batches == 2
    report = _rescale(spark, base / "ck", 16)
    assert [(o.name, o.key, o.groups_before, o.keys) for o in report.operators] == \
        [("ChangelogNormalize", ["id"], 4, 4)]
    assert read_fingerprint(str(base / "ck"))["key_groups"] == 16
    _files(base, 3)
    # the script sets no count now: the checkpoint's 16
    first = _normalize(spark, base, None)
    assert (first.batches, first.replayed_batches) == (1, 0)
    # down, and the state partitions from 2 to 3 (Spark's repartitioning)
    report = _rescale(spark, base / "ck", 3, partitions=3)
    assert [o.groups_before for o in report.operators] == [16] and report.repartitioned == ["main"]
    assert sorted(p.name for p in (base / "ck" / "main" / "state" / "0").iterdir() if p.name.isdigit()) == \
        ["0", "1", "2"]
    assert check_checkpoint(str(base / "ck"), spark).ok
    _files(base, 4)
    # the script sets the new count itself: the same state
    assert _normalize(spark, base, 3).batches == 1
    assert _table(base) == EXPECTED_TABLE
    log = read_changelog(base / "log")
    # -U/-D rows after each rescale need the moved state: none went missing
    assert [(r["op"], r["id"], r["name"], r["score"]) for _, r in log.iterrows()] == EXPECTED_CHANGELOG


@long_only("two join runs and a rescale of four operators, about a minute on a quiet machine")
def test_join_pipeline_rescaled_resumes_exactly(spark, tmp_path):
    """Two normalizes, the join and the upsert materializer: every keyed
    operator's state moves (kill_window's join pipeline, whole batches)."""
    kw.write_files(tmp_path, 0, 3)

    def run(groups):
        opts = dict(streaming=True)
        s1 = read_debezium(spark, f"{tmp_path}/s1", "id BIGINT, level BIGINT, t BIGINT", ["id"], **opts)
        s2 = read_debezium(spark, f"{tmp_path}/s2", "id BIGINT, attr STRING", ["id"], **opts)
        joined = s1.join(s2, left_on=["level"], right_on=["id"], key_groups=groups).select(
            id="id", level="level", attr="attr")
        return joined.write_upsert(str(tmp_path / "out"), checkpoint=str(tmp_path / "ck"), key="id",
                                   dead_letter=str(tmp_path / "dead"), key_groups=groups)

    assert run(None).batches == 1
    report = _rescale(spark, tmp_path / "ck", 7)
    assert len(report.operators) >= 3 and all(o.groups_before == 32 for o in report.operators)
    assert sum(o.keys for o in report.operators) > 10
    kw.write_files(tmp_path, 3, kw.FILES)
    assert run(None).batches == 1
    table = read_table(str(tmp_path / "out"))
    assert sorted(map(tuple, table[list(kw.OUT_COLS["join"])].astype(object).values.tolist())) == \
        kw.expected_table("join", kw.FILES)
    assert check_checkpoint(str(tmp_path / "ck"), spark).ok


def _siblings(path) -> list:
    return sorted(n for n in os.listdir(path.parent) if n.startswith(path.name) or n.startswith("." + path.name))


def test_refuses_a_running_or_damaged_checkpoint_and_leaves_it(spark, base, capsys):
    _files(base, 2)
    _normalize(spark, base, 4)
    ck = base / "ck"
    before = _siblings(ck)
    # just written: its query may still be running
    code = cli.main(["rescale", str(ck), "--key-groups", "8"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(f"error: checkpoint {ck}: the checkpoint was written to ")
    assert "its query may be running" in err and "what to do: stop the query" in err
    # a batch started and not committed (a running query, or one killed in a batch)
    os.rename(ck / "main" / "commits" / "1", base / "commit-1")
    with pytest.raises(RescaleRefused, match="batch 1 was started and not committed"):
        rescale_checkpoint(spark, str(ck), 8, quiet_seconds=0)
    os.rename(base / "commit-1", ck / "main" / "commits" / "1")
    # damaged: a state file the next batch needs is gone
    part = next(p for p in sorted((ck / "main" / "state" / "0").iterdir())
                if p.name.isdigit() and (p / "2.changelog").exists())
    os.rename(part / "2.changelog", base / "2.changelog")
    with pytest.raises(RescaleRefused, match="the checkpoint is damaged: .*changelog file"):
        rescale_checkpoint(spark, str(ck), 8, quiet_seconds=0)
    assert _siblings(ck) == before      # nothing written beside it
    assert read_fingerprint(str(ck)).get("key_groups") == 32


def test_a_checkpoint_without_a_recorded_count_resumes_with_32(spark, base):
    """Written when the default was 32 and not recorded (the Python API put
    ``key groups=32`` in the plan's lines): resumed with no count set, on a
    session whose default would be 64, it runs with 32."""
    _files(base, 2)
    _normalize(spark, base, 32)
    path = base / "ck" / "plan-fingerprint.json"
    old = json.loads(path.read_text())
    del old["key_groups"]
    path.write_text(json.dumps(old))
    _files(base, 4)
    spark.conf.set("spark.sql.shuffle.partitions", "40")
    try:
        report = _normalize(spark, base, None)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "2")
    assert report.batches == 2 and not any("query changed" in w for w in report.warnings)
    assert _table(base) == EXPECTED_TABLE
    assert json.loads(path.read_text())["key_groups"] == 32
