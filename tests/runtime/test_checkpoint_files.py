"""Checkpoint files on the local file system (docs/runtime.md, "Checkpoint
files on the local file system"): sessions write them through Hadoop's
``RawLocalFs`` (no ``.crc`` beside the state files), the log files get
checksum files written by us, damage is found with a clear error, and a
checkpoint moves between Hadoop's default (``LocalFs``, a ``.crc`` beside
every file) and the raw file system in both directions, a replayed batch
included.  The kill -9 tests (test_crash_restart.py, test_kill_window.py)
and the byte-identical replay (test_replay_determinism.py) run under the
sessions' settings too."""
from __future__ import annotations

import os
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from changelog_data import to_frame
from kill_restart import ARROW, COLS, EXPECTED_CHANGELOG, EXPECTED_TABLE, FILES
from spark_changelog.api import ChangelogStream
from spark_changelog.runtime.checkpoint import (DamagedCheckpoint, check_checkpoint, checksum_mismatch,
                                                checksum_path, log_files)
from spark_changelog.runtime.session import DEFAULT_CONFIGS, RAW_LOCAL_FS
from spark_changelog.sinks.changelog import read_changelog
from spark_changelog.sinks.delta import read_table

FS_KEY = "fs.AbstractFileSystem.file.impl"
LOCAL_FS = "org.apache.hadoop.fs.local.LocalFs"


def _put(d, i, rows=None):
    pq.write_table(pa.Table.from_pandas(to_frame(rows or FILES[i], COLS), schema=ARROW, preserve_index=False),
                   d / "in" / f"part-{i:04d}.parquet")


def _run(spark, d):
    """tests/crash_pipelines.py's normalize, a micro-batch per input file."""
    df = (spark.readStream.format("parquet").option("maxFilesPerTrigger", 1)
          .schema("id BIGINT, name STRING, score BIGINT, _kind TINYINT, _seq BIGINT").load(str(d / "in")))
    return ChangelogStream.from_dataframe(df, primary_key=["id"]).normalize(key_groups=4).write_upsert(
        str(d / "table"), checkpoint=str(d / "ck"), changelog_path=str(d / "log"))


def _assert_exact(d):
    table = read_table(str(d / "table"))
    assert sorted(map(tuple, table[COLS].astype(object).values.tolist())) == EXPECTED_TABLE
    log = read_changelog(d / "log")
    assert [(r["op"], r["id"], r["name"], r["score"]) for _, r in log.iterrows()] == EXPECTED_CHANGELOG


def _crc_files(q):
    return sorted(os.path.relpath(os.path.join(r, f), q) for r, _, fs in os.walk(q) for f in fs
                  if f.endswith(".crc"))


@pytest.fixture
def two_batches(spark, tmp_path):
    """The normalize after the first two files (batches 0 and 1 committed)."""
    (tmp_path / "in").mkdir()
    _put(tmp_path, 0)
    _put(tmp_path, 1)
    assert _run(spark, tmp_path).batches == 2
    return tmp_path


def test_sessions_write_checkpoints_through_hadoops_raw_local_file_system(spark, two_batches):
    assert DEFAULT_CONFIGS["spark.hadoop." + FS_KEY] == RAW_LOCAL_FS
    q = two_batches / "ck" / "main"
    crcs = _crc_files(q)
    # no .crc beside the state stores' files (RocksDB's tables, copied through
    # Hadoop's FileSystem API, keep theirs)
    assert not [c for c in crcs if re.search(r"\.\d+\.(changelog|zip)\.crc$", c)], crcs
    # every log file has one, written by seal_logs, in Hadoop's format
    logs = sorted(os.path.relpath(p, q) for p in log_files(str(q)))
    assert {"metadata", "offsets/0", "offsets/1", "commits/0", "commits/1", "sources/0/0"} <= set(logs)
    for rel in logs:
        assert os.path.exists(checksum_path(str(q / rel))), rel
        assert checksum_mismatch(str(q / rel)) is None, rel
    for i in (2, 3):
        _put(two_batches, i)
    report = _run(spark, two_batches)
    assert (report.batches, report.replayed_batches) == (2, 0)
    _assert_exact(two_batches)
    assert check_checkpoint(str(two_batches / "ck")).ok


def test_a_damaged_state_file_stops_the_query_with_one_message(spark, two_batches):
    """A changelog file whose bytes changed: its LZ4 block fails its checksum
    when the partition loads it."""
    path = two_batches / "ck" / "main" / "state" / "0" / "0" / "2.changelog"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x5A
    path.write_bytes(bytes(data))
    _put(two_batches, 2)
    with pytest.raises(DamagedCheckpoint) as err:
        _run(spark, two_batches)
    ck = two_batches / "ck" / "main"
    assert re.fullmatch(
        rf"error: checkpoint {ck}: the checkpoint is damaged: a stateful operator's state cannot be loaded "
        r"\(java.io.IOException: Stream is corrupted\); the query cannot resume from it",
        str(err.value).split("\n")[0]), str(err.value)
    problems = [str(f) for f in check_checkpoint(str(two_batches / "ck"), spark).findings if f.problem]
    assert len(problems) == 1 and problems[0].startswith(
        "error: main: state of operator 0 (transformWithStateInPandasExec) after batch 1 cannot be read"), problems


def test_a_damaged_offset_file_is_found_before_the_query_starts(spark, two_batches):
    """A digit changed inside a log file still parses: only its checksum
    finds it, before Spark reads it."""
    path = two_batches / "ck" / "main" / "offsets" / "1"
    text = path.read_text()
    changed = text.replace('"logOffset":1', '"logOffset":7')
    assert changed != text
    path.write_text(changed)
    _put(two_batches, 2)
    with pytest.raises(DamagedCheckpoint, match=re.escape(
            "the checkpoint is damaged: offsets/1: it does not match its checksum file .1.crc (the file was "
            "damaged or changed after it was written); the query cannot resume from it")):
        _run(spark, two_batches)
    assert [str(f) for f in check_checkpoint(str(two_batches / "ck")).findings if f.problem] == [
        "error: main: offsets/1: it does not match its checksum file .1.crc (the file was damaged or changed "
        "after it was written)"]


def test_a_checkpoint_moves_between_hadoops_default_and_the_raw_file_system(spark, tmp_path):
    """Batches 0-1 with Hadoop's default (a .crc beside every file); then
    the raw file system replays batch 1 (its commit removed, as a kill
    leaves it) and runs batch 2; then the default again for batch 3.  The
    table and changelog are exact, and every .crc still matches its file."""
    (tmp_path / "in").mkdir()
    q = tmp_path / "ck" / "main"
    _put(tmp_path, 0)
    _put(tmp_path, 1)
    spark.conf.set(FS_KEY, LOCAL_FS)
    try:
        assert _run(spark, tmp_path).batches == 2
    finally:
        spark.conf.unset(FS_KEY)
    assert "state/0/0/.2.changelog.crc" in _crc_files(q)
    os.remove(q / "commits" / "1")
    os.remove(q / "commits" / ".1.crc")
    _put(tmp_path, 2)
    report = _run(spark, tmp_path)
    assert (report.batches, report.replayed_batches) == (2, 1)
    _put(tmp_path, 3)
    spark.conf.set(FS_KEY, LOCAL_FS)
    try:
        report = _run(spark, tmp_path)
    finally:
        spark.conf.unset(FS_KEY)
    assert (report.batches, report.replayed_batches) == (1, 0)
    _assert_exact(tmp_path)
    report = check_checkpoint(str(tmp_path / "ck"), spark)
    assert report.ok, report.summary()


def test_our_checksum_files_are_hadoops():
    """Every .crc Hadoop wrote in the fixture checkpoint is byte for byte
    what hadoop_checksum writes for its file."""
    from spark_changelog.runtime.checkpoint import hadoop_checksum
    from test_old_checkpoints import FIXTURE
    crcs = list(FIXTURE.rglob(".*.crc"))
    assert len(crcs) > 10
    for crc in crcs:
        data = (crc.parent / crc.name[1:-4]).read_bytes()
        assert hadoop_checksum(data) == crc.read_bytes(), crc


def test_seal_writes_missing_checksums_and_drops_those_of_purged_logs(tmp_path):
    from spark_changelog.runtime.checkpoint import seal_logs, verify_logs
    q = tmp_path / "main"
    (q / "offsets").mkdir(parents=True)
    (q / "commits").mkdir()
    for i in (0, 1):
        (q / "offsets" / str(i)).write_text('v1\n{"batchWatermarkMs":0}\n{"logOffset":%d}' % i)
        (q / "commits" / str(i)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    (q / "offsets" / ".2.5f3899b4-1c2b-4d16-8674-b9ed1ced50eb.tmp").write_text("half")
    seal_logs(str(q))
    assert _crc_files(q) == ["commits/.0.crc", "commits/.1.crc", "offsets/.0.crc", "offsets/.1.crc"]
    verify_logs(str(q), "ck")
    os.remove(q / "offsets" / "0")             # Spark purged batch 0
    seal_logs(str(q))
    assert _crc_files(q) == ["commits/.0.crc", "commits/.1.crc", "offsets/.1.crc"]
    (q / "commits" / "1").write_text('v1\n{"nextBatchWatermarkMs":9}')
    with pytest.raises(DamagedCheckpoint, match="commits/1: it does not match its checksum file .1.crc"):
        verify_logs(str(q), "ck")
