"""``spark-changelog check CK`` (runtime/checkpoint.py, docs/runtime.md "A
damaged checkpoint"): a good checkpoint passes; each kind of damage gives one
finding naming the query, the operator and the batch (messages pinned)."""
from __future__ import annotations

import os
import shutil
import time

import pytest

from spark_changelog.cli import main
from spark_changelog.runtime.checkpoint import check_checkpoint
from test_old_checkpoints import _copy_fixture

OP = "operator 0 (transformWithStateInPandasExec)"


@pytest.fixture
def good(tmp_path):
    """The fixture checkpoint: one normalize query, batches 0 and 1 committed."""
    _copy_fixture(tmp_path)
    return tmp_path / "old" / "ck"


def _problems(ck, spark=None):
    return [str(f) for f in check_checkpoint(str(ck), spark).findings if f.problem]


def test_a_good_checkpoint_passes_with_its_state_read_through_spark(spark, good, capsys):
    report = check_checkpoint(str(good), spark)
    assert report.ok and report.queries == ["main"] and report.last_batches == {"main": 1}
    assert report.summary().splitlines()[-2:] == ["main: last committed batch 1", f"checkpoint {good}: ok"]
    assert main(["check", "--files-only", str(good)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"checkpoint {good}: ok"


def test_a_missing_state_changelog_names_operator_partition_and_batch(good, capsys):
    os.remove(good / "main" / "state" / "0" / "1" / "2.changelog")
    assert _problems(good) == [
        f"error: main: state of {OP}, partition 1: the state after batch 1 cannot be loaded: "
        "changelog file(s) [2] missing"]
    assert main(["check", "--files-only", str(good)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == f"checkpoint {good}: 1 problem(s)"


def test_a_dropped_replay_write_is_found(good):
    part = good / "main" / "state" / "0" / "0"
    tmp = part / ".2.changelog.5f3899b4-1c2b-4d16-8674-b9ed1ced50eb.TID7.tmp"
    shutil.copy(part / "2.changelog", tmp)
    later = time.time() + 5
    os.utime(tmp, (later, later))
    assert _problems(good) == [
        "error: main: state/0/0/.2.changelog.5f3899b4-1c2b-4d16-8674-b9ed1ced50eb.TID7.tmp: a later "
        "write of 2.changelog was never moved into place (a replayed micro-batch's file dropped by a "
        "checkpoint manager that does not replace files)"]


def test_a_killed_write_leftover_is_only_a_note(good):
    part = good / "main" / "state" / "0" / "0"
    tmp = part / ".3.changelog.5f3899b4-1c2b-4d16-8674-b9ed1ced50eb.TID9.tmp"
    tmp.write_bytes(b"half")
    report = check_checkpoint(str(good))
    assert report.ok and [str(f) for f in report.findings] == [
        "note: main: state/0/0/.3.changelog.5f3899b4-1c2b-4d16-8674-b9ed1ced50eb.TID9.tmp: temporary "
        "file of a write that was killed before its end (harmless)"]


def test_offsets_and_commits_that_disagree(good):
    os.remove(good / "main" / "offsets" / "1")
    (good / "main" / "commits" / "0").write_text("v1\n{\"nextBatchWatermarkMs\":0")
    assert _problems(good) == [
        f"error: main: {good}/main/commits/0 holds a line that is not JSON (a torn write)",
        "error: main: batch 1 is committed but has no offsets"]


def test_an_uncommitted_batch_is_a_note_and_two_are_a_problem(good):
    q = good / "main"
    os.remove(q / "commits" / "1")
    report = check_checkpoint(str(good))
    assert report.ok and [str(f) for f in report.findings] == [
        "note: main: batch 1 was started and not committed: the next run replays it"]
    os.remove(q / "commits" / "0")
    assert _problems(good) == [
        "error: main: batches [0, 1] have offsets but no commit (Spark starts at most one batch "
        "ahead of its commits)"]


def test_not_a_checkpoint(tmp_path):
    assert _problems(tmp_path) == [
        f"error: {tmp_path}: no streaming query checkpoint here (no offsets and commits directories)"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        check_checkpoint(str(tmp_path / "nope"))
