"""kill -9 aimed at the replay window (issue #26, docs/runtime.md "Replay is
deterministic"): a job is killed five times, each time right after a state
partition wrote a micro-batch's changelog and before the batch's commit file
(tests/kill_window.py counts the kills that landed there), then run to the end
twice, new input arriving before the second run.  Every table, dead-letter
output and emitted changelog equals an uninterrupted run's, and the second
run starts and ends cleanly (no replay, exit 0).  The reference is the same
job run without kills, its input arriving the same way, so its micro-batches
are the same: the changelog must be the same batch by batch, each key's
changes in the same order, and the same multiset of rows per batch
(docs/runtime.md, "Replay is deterministic").

Every case is a long variant (``SPARK_CHANGELOG_LONG_TESTS=1``, README, "The
two commands"): nine job processes each, the SQL join alone 4.4 min on a quiet
machine, a fifth of the default suite.  The default run keeps the cheaper
checks of the same window: the byte-identical replay
(tests/runtime/test_replay_determinism.py) and the kill-and-restart tests.
"""
from __future__ import annotations

import os

import pytest

import kill_window as kw
from long_variants import long_only
from spark_changelog.connectors.dead_letter import read_dead_letter
from spark_changelog.sinks.changelog import read_changelog
from spark_changelog.sinks.delta import read_table

KILLS = 5
CASES = [(f, k) for k in kw.SQL for f in ("sql", "api")]

pytestmark = long_only("nine job processes per case, minutes each")


def _table(path, kind):
    t = read_table(str(path))
    return sorted(map(tuple, t[list(kw.OUT_COLS[kind])].astype(object).values.tolist()))


def _dead(path):
    return sorted((os.path.basename(r["file"]), r["line"], r["reason"]) for r in read_dead_letter(str(path)))


def _changelog(path, kind):
    """(per key: its changes in order; per batch: the multiset of changes)."""
    log = read_changelog(str(path))
    cols = list(kw.OUT_COLS[kind])
    key = kw.SINK_KEY[kind]
    rows = [tuple(r) for r in log[["_batch", "op", "_seq"] + cols].astype(object).values.tolist()]
    per_key: dict = {}
    for r in rows:                                   # read_changelog: batch, then emission order
        per_key.setdefault(tuple(r[3 + cols.index(k)] for k in key), []).append(r)
    return per_key, sorted(rows, key=repr)


def _reference(front, kind, base):
    """The same job uninterrupted, its input arriving as in the killed one
    (so its micro-batches, hence its emitted changelog, are the same)."""
    kw.write_files(base, 0, kw.FILES)
    for files in (kw.FILES, kw.FILES + 1):
        kw.write_files(base, files - 1, files)
        code, out = kw.run_job(front, kind, base, base / "ck")
        assert code == 0, out


@pytest.mark.slow
@pytest.mark.parametrize("front,kind", CASES)
def test_kill_in_the_replay_window_then_run_to_the_end_twice(tmp_path, front, kind):
    base, ck, kills = tmp_path / "job", tmp_path / "job" / "ck", tmp_path / "kills"
    kw.write_files(base, 0, kw.FILES)
    hits = 0
    for i in range(KILLS):
        code, out = kw.run_job(front, kind, base, ck, kill_log=kills)
        windows = kw.killed_windows(kills)
        assert code == -9 and len(windows) == i + 1, (code, out)
        hits += kw.window_hit(*windows[-1])
    print(f"{front} {kind}: {hits} of {KILLS} kills in the replay window, batches "
          f"{[b for _, b in kw.killed_windows(kills)]}")
    assert hits == KILLS

    code, out = kw.run_job(front, kind, base, ck)
    assert code == 0, out
    kw.write_files(base, kw.FILES, kw.FILES + 1)
    code, out = kw.run_job(front, kind, base, ck)
    # the second run starts cleanly (nothing to replay) and ends cleanly
    assert code == 0 and "replayed=0" in out, out

    ref = tmp_path / "ref"
    _reference(front, kind, ref)
    assert _table(base / "out", kind) == _table(ref / "out", kind)
    assert _table(base / "out", kind) == kw.expected_table(kind, kw.FILES + 1)
    assert _dead(base / "dead") == _dead(ref / "dead") == kw.EXPECTED_DEAD
    got, want = _changelog(base / "log", kind), _changelog(ref / "log", kind)
    assert len(want[1]) > 0
    assert got[0] == want[0]            # each key's changes, in order
    assert got[1] == want[1]            # every change, with its batch
