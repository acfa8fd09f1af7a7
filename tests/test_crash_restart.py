"""Kill a streaming normalize job mid-way, restart it from its checkpoint: the
final table and the emitted changelog are exactly those of an uninterrupted run."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from changelog_data import to_frame
from spark_changelog.sinks.changelog import read_changelog
from spark_changelog.sinks.delta import read_table

JOB = os.path.join(os.path.dirname(__file__), "jobs", "normalize_job.py")
COLS = ["id", "name", "score"]
ARROW = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.int64()),
                   ("_kind", pa.int8()), ("_seq", pa.int64())])

FILES = [
    [["+I", [1, "a", 1], 1], ["+I", [2, "b", 1], 2], ["+I", [3, "c", 1], 3]],
    [["+U", [1, "a2", 2], 5], ["-D", [2, "b", 1], 6], ["+I", [4, "d", 1], 7]],
    [["+U", [3, "c2", 2], 9], ["+I", [2, "b2", 3], 10], ["+U", [1, "a3", 3], 11]],
    [["-D", [4, "d", 1], 13], ["+U", [3, "c3", 4], 14], ["+I", [5, "e", 1], 15]],
]
EXPECTED_TABLE = [(1, "a3", 3), (2, "b2", 3), (3, "c3", 4), (5, "e", 1)]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(JOB))] + sys.path)
    return env


def _start(args):
    return subprocess.Popen([sys.executable, JOB, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, start_new_session=True, env=_env())


def _run(tmp, name, hang_after=None):
    args = [str(tmp / "in"), str(tmp / name / "table"), str(tmp / name / "ck"), str(tmp / name / "log")]
    return _start(args + ([str(hang_after)] if hang_after is not None else []))


def _changelog(path):
    log = read_changelog(path)
    return [(r["op"], r["id"], r["name"], r["score"]) for _, r in log.iterrows()]


@pytest.mark.slow
def test_kill_mid_batch_and_restart_gives_exact_table_and_changelog(tmp_path):
    os.makedirs(tmp_path / "in")
    for i, f in enumerate(FILES):
        pq.write_table(pa.Table.from_pandas(to_frame(f, COLS), schema=ARROW, preserve_index=False),
                       tmp_path / "in" / f"part-{i:04d}.parquet")

    # reference: an uninterrupted run
    ref = _run(tmp_path, "ref")
    out, _ = ref.communicate(timeout=900)
    assert ref.returncode == 0, out
    # crash: hang inside batch 1 after its sinks committed, then SIGKILL the whole job
    job = _run(tmp_path, "crash", hang_after=1)
    deadline = time.time() + 600
    for line in job.stdout:
        if line.strip() == "committed 1" or time.time() > deadline:
            break
    os.killpg(job.pid, signal.SIGKILL)
    job.wait(timeout=60)
    partial = read_table(tmp_path / "crash" / "table")
    # batches 0 and 1 reached the table before the kill: keys 1, 3 and 4
    assert sorted(partial["id"].tolist()) == [1, 3, 4]
    restart = _run(tmp_path, "crash")
    out, _ = restart.communicate(timeout=900)
    assert restart.returncode == 0, out
    # Spark replays batch 1 (its commit was never logged): the Delta sink skips it
    assert "replayed=1" in out

    for name in ("ref", "crash"):
        table = read_table(tmp_path / name / "table")
        assert sorted(map(tuple, table[COLS].astype(object).values.tolist())) == EXPECTED_TABLE
    assert _changelog(tmp_path / "crash" / "log") == _changelog(tmp_path / "ref" / "log") == [
        ("+I", 1, "a", 1), ("+I", 2, "b", 1), ("+I", 3, "c", 1),
        ("-U", 1, "a", 1), ("+U", 1, "a2", 2), ("-D", 2, "b", 1), ("+I", 4, "d", 1),
        ("-U", 3, "c", 1), ("+U", 3, "c2", 2), ("+I", 2, "b2", 3), ("-U", 1, "a2", 2), ("+U", 1, "a3", 3),
        ("-D", 4, "d", 1), ("-U", 3, "c2", 2), ("+U", 3, "c3", 4), ("+I", 5, "e", 1),
    ]
