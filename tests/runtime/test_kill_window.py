"""kill -9 aimed at the replay window (issue #26, docs/runtime.md "Replay is
deterministic"): every query of a group is killed five times, each time
after its state partitions wrote a micro-batch's changelog and before the
batch's commit file, then the job runs to the end twice, new input arriving
before the second run.  Every table, dead-letter output, late-row output
and emitted changelog equals an uninterrupted run's, and the second run
starts and ends cleanly (no replay, exit 0).

The groups (tests/kill_window.py): ``debezium``, normalize, join +
materializer and aggregation over two Debezium sources; ``event_time``,
over a plain JSON (insert-only) source whose watermark is generated at the
source, keep-first deduplication on event time, a tumbling window
aggregation, and ``ON CONFLICT DO NOTHING`` / ``DO ERROR`` (the
materializer's event-time forms).  Each kind in streaming SQL and in the
Python API; a group's queries run at once in one job process, and each kill
catches all of them in their windows (one right after its first state
partition's write, the others after all of theirs): seven job processes per
group.  The test prints, per query, the batches its kills hit.

The reference is the same queries run without kills, in the processes that
run the killed job to the end (after it, from their own checkpoints), their
input arriving the same way, so their micro-batches are the same: the
changelog must be the same batch by batch, each key's changes in the same
order, and the same multiset of rows per batch.  The Debezium kinds' final
tables are also computed from the sources' final rows.

Both groups are long variants (``SPARK_CHANGELOG_LONG_TESTS=1``, README,
"The two commands").  The default run keeps the cheaper checks of the same
window: the byte-identical replay (tests/runtime/test_replay_determinism.py)
and the kill-and-restart tests.
"""
from __future__ import annotations

import os
import re

import pytest

import kill_window as kw
from long_variants import long_only
from spark_changelog.connectors.dead_letter import read_dead_letter
from spark_changelog.runtime.late_output import read_late_rows
from spark_changelog.sinks.changelog import read_changelog
from spark_changelog.sinks.delta import read_table

pytestmark = long_only("seven job processes per group, each with six or eight queries")


def _values(frame, cols):
    """The rows of ``cols``, timestamps as ISO text."""
    return [tuple(v.isoformat() if hasattr(v, "isoformat") else v for v in r)
            for r in frame[list(cols)].astype(object).values.tolist()]


def _dead(path):
    return sorted((os.path.basename(r["file"]), r["line"], r["reason"]) for r in read_dead_letter(str(path)))


def _late(path):
    late = read_late_rows(str(path))
    return sorted(map(repr, late.astype(object).values.tolist())) if len(late) else []


def _changelog(path, q):
    """(per key: its changes in order; per batch: the multiset of changes)."""
    rows = _values(read_changelog(str(path)), ("_batch", "op", "_seq") + q.cols)
    per_key: dict = {}
    for r in rows:                                   # read_changelog: batch, then emission order
        per_key.setdefault(tuple(r[3 + q.cols.index(k)] for k in q.key), []).append(r)
    return per_key, sorted(rows, key=repr)


@pytest.mark.slow
@pytest.mark.parametrize("group", sorted(kw.GROUPS))
def test_kill_in_the_replay_window_then_run_to_the_end_twice(tmp_path, group):
    base, log, ref = tmp_path / "job", tmp_path / "kills", tmp_path / "job" / "ref"
    ck = base / "ck"
    queries = kw.queries(group)
    kw.write_files(base, 0, kw.FILES)
    for i in range(kw.KILLS):
        code, out = kw.run_job(group, base, ck, kill_log=log)
        assert code == -9, out
        windows = kw.killed_windows(log)
        assert len(windows) == len(queries) * (i + 1), (windows, out)
        # every kill of this process landed in its query's replay window
        assert all(kw.window_hit(q, b) for q, b, _ in windows[-len(queries):]), windows
    hits: dict = {}
    for q, b, how in kw.killed_windows(log):
        hits.setdefault(os.path.relpath(q, ck).split(os.sep)[0], []).append(f"{b}{how[0]}")
    print(f"{group}: {len(kw.killed_windows(log))} kills, each in its query's replay window "
          f"(batch, e = right after the first state partition's write, l = after all): {hits}")
    assert sorted(hits) == sorted(q.name for q in queries)
    assert all(len(b) == kw.KILLS for b in hits.values()), hits

    code, out = kw.run_job(group, base, ck, reference=ref)
    assert code == 0 and "failed" not in out, out
    kw.write_files(base, kw.FILES, kw.FILES + 1)
    code, out = kw.run_job(group, base, ck, reference=ref)
    # the second run starts cleanly (nothing to replay) and ends cleanly
    finished = sorted(re.findall(r"^finished (\S+) batches=(\d+) replayed=(\d+)$", out, re.M))
    assert code == 0 and finished == sorted((q.name, "1", "0") for q in queries), out

    for q in queries:
        got = sorted(_values(read_table(q.path(base, "table")), q.cols))
        assert got == sorted(_values(read_table(q.path(ref, "table")), q.cols)) and got, q.name
        dead = _dead(q.path(base, "dead"))
        assert dead == _dead(q.path(ref, "dead")), q.name
        if group == "debezium":
            assert got == kw.expected_table(q.kind, kw.FILES + 1), q.name
            assert dead == kw.EXPECTED_DEAD, q.name
        else:
            assert [d[:2] for d in dead] == [("ev-0002.json", 2)], (q.name, dead)
        assert _late(q.path(base, "late")) == _late(q.path(ref, "late")), q.name
        got, want = _changelog(q.path(base, "log"), q), _changelog(q.path(ref, "log"), q)
        assert len(want[1]) > 0, q.name
        assert got[0] == want[0], q.name          # each key's changes, in order
        assert got[1] == want[1], q.name          # every change, with its batch
    if group == "event_time":
        # the window queries' late rows (files 3 and 5) went to their late output
        assert [len(_late(q.path(ref, "late"))) for q in queries if q.kind == "window"] == [2, 2]
