"""``spark-changelog check CK`` (runtime/checkpoint.py, docs/runtime.md "A
damaged checkpoint"): a good checkpoint passes; each kind of damage gives one
finding naming the query, the operator and the batch (messages pinned)."""
from __future__ import annotations

import os
import shutil
import time

import pytest

from kill_restart import Crash
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


def test_a_cut_changelog_and_a_damaged_snapshot_are_found_without_spark(good):
    """Checkpoints written now have no Hadoop .crc beside the state files:
    a files-only check reads the files the next run loads themselves (the
    changelog's LZ4 block framing, the snapshot's zip entries against their
    CRCs)."""
    part = good / "main" / "state" / "0" / "1"
    for f in ("2.changelog", "1.zip"):
        os.remove(part / f".{f}.crc")
    changelog = part / "2.changelog"
    changelog.write_bytes(changelog.read_bytes()[:-10])
    snapshot = part / "1.zip"
    data = bytearray(snapshot.read_bytes())
    data[len(data) // 2] ^= 0x55
    snapshot.write_bytes(bytes(data))
    where = f"error: main: state of {OP}, partition 1: the state after batch 1 cannot be loaded: "
    problems = _problems(good)
    assert problems[1] == where + "2.changelog is cut short (its last LZ4 block or the end mark is missing)"
    assert len(problems) == 2 and problems[0].startswith(where + "1.zip is damaged ("), problems


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


def _break_by_a_dropped_replay(d, fixture):
    """The issue's damage, made on purpose in this process: Hadoop's
    FileSystem checkpoint manager (which local sessions used before) keeps
    the first attempt's state file when batch 1 is replayed, and the replay
    computes other runs (its input file was rewritten, as a
    non-deterministic replay would).  Batch 2 touches one key: its run goes
    on top of the replay's merged run, which the run list then names but no
    file on disk holds.  Then the fourth file arrives, for the next run."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from changelog_data import to_frame
    from crash_pipelines import retrying
    from kill_restart import ARROW, COLS as KCOLS, FILES
    from spark_changelog.api import ChangelogStream

    spark = fixture("spark")
    src, out = d / "in", d / "out"
    ck = out / "ck"
    os.makedirs(src)

    def put(i, rows):
        pq.write_table(pa.Table.from_pandas(to_frame(rows, KCOLS), schema=ARROW, preserve_index=False),
                       src / f"part-{i:04d}.parquet")

    def run():
        """tests/crash_pipelines.py's normalize, one key group."""
        df = (spark.readStream.format("parquet").option("maxFilesPerTrigger", 1)
              .schema("id BIGINT, name STRING, score BIGINT, _kind TINYINT, _seq BIGINT").load(str(src)))
        ChangelogStream.from_dataframe(df, primary_key=["id"]).normalize(key_groups=1).write_upsert(
            str(out / "table"), checkpoint=str(ck), changelog_path=str(out / "log"))

    manager = "spark.sql.streaming.checkpointFileManagerClass"
    spark.conf.set(manager, "org.apache.spark.sql.execution.streaming.checkpointing."
                            "FileSystemBasedCheckpointFileManager")
    try:
        put(0, FILES[0])
        put(1, FILES[1])
        retrying(run)
        for name in os.listdir(ck / "main" / "commits"):
            if name.lstrip(".").split(".")[0] == "1":
                os.remove(ck / "main" / "commits" / name)
        put(1, [[k, [v[0], v[1] + "x", v[2]], s] for k, v, s in FILES[1]])
        put(2, FILES[2][2:])
        retrying(run)
    finally:
        spark.conf.unset(manager)
    put(3, FILES[3])
    return [src, out / "table", ck, out / "log", 1]


#: the next run of the damaged checkpoint is a new process (a worker's cache
#: must not hold the run): the shared crash process, run to its failure
CRASHES = {"dropped_replay": Crash("normalize", _break_by_a_dropped_replay, hang_after=None)}


@pytest.mark.shared_crash("dropped_replay")
def test_a_checkpoint_broken_by_a_dropped_replay_is_reported_by_the_query_and_by_check(spark, crashed):
    """The issue's damage (``_break_by_a_dropped_replay``): the next run stops
    with one message naming checkpoint, operator, key group and batch;
    ``check`` names the same run and the dropped write."""
    import re

    run = crashed("dropped_replay")
    ck = run.args[2]
    m = re.search(r"DamagedCheckpoint: (.*\n.*)", run.failure())
    assert m, run.failure()[-3000:]
    message = m.group(1)
    assert re.fullmatch(
        rf"error: checkpoint {ck}/main: the checkpoint is damaged: operator ChangelogNormalize, key "
        r"group 0, batch 3: state run [0-9a-f]{32} is missing; the query cannot resume from it\n"
        rf"  what to do: `spark-changelog check {ck}/main` lists what is wrong; start a new "
        r"--checkpoint DIR \(the query then reads its sources again from the start\)", message), message
    missing = re.search(r"state run ([0-9a-f]{32})", message).group(1)
    problems = _problems(ck, spark)
    assert f"error: main: state of operator 0 (ChangelogNormalize), key group 0, after batch 2: state run " \
           f"{missing} is listed but missing" in problems, problems
    assert any("a later write of 2.changelog was never moved into place" in p for p in problems), problems
