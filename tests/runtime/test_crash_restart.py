"""Kill a streaming normalize job mid-way, restart it from its checkpoint: the
final table and the emitted changelog are exactly those of an uninterrupted run."""
from __future__ import annotations

import pytest

from kill_restart import EXPECTED_TABLE, COLS, kill_when, start_job, write_input
from spark_changelog.sinks.changelog import read_changelog
from spark_changelog.sinks.delta import read_table


def _run(tmp, name, hang_after=None):
    args = [tmp / "in", tmp / name / "table", tmp / name / "ck", tmp / name / "log"]
    return start_job("normalize_job.py", args + ([hang_after] if hang_after is not None else []))


def _changelog(path):
    log = read_changelog(path)
    return [(r["op"], r["id"], r["name"], r["score"]) for _, r in log.iterrows()]


@pytest.mark.slow
def test_kill_mid_batch_and_restart_gives_exact_table_and_changelog(tmp_path):
    write_input(tmp_path / "in")

    # reference: an uninterrupted run
    ref = _run(tmp_path, "ref")
    out, _ = ref.communicate(timeout=900)
    assert ref.returncode == 0, out
    # crash: hang inside batch 1 after its sinks committed, then SIGKILL the whole job
    seen = kill_when(_run(tmp_path, "crash", hang_after=1), "committed 1")
    assert "committed 1" in seen, seen
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
