"""Kill a streaming normalize job mid-way, restart it from its checkpoint: the
final table and the emitted changelog are exactly those of an uninterrupted
run (kill_restart's expected table and changelog, spelled out there)."""
from __future__ import annotations

import pytest

from kill_restart import COLS, EXPECTED_CHANGELOG, EXPECTED_TABLE, Crash, write_input
from spark_changelog.sinks.changelog import read_changelog
from spark_changelog.sinks.delta import read_table


def _prepare(d, fixture):
    write_input(d / "in")
    return [d / "in", d / "table", d / "ck", d / "log"]


#: hang inside batch 1 after its sinks committed, then SIGKILL the whole job
CRASHES = {"normalize": Crash("normalize", _prepare, hang_after=1)}


def _changelog(path):
    log = read_changelog(path)
    return [(r["op"], r["id"], r["name"], r["score"]) for _, r in log.iterrows()]


@pytest.mark.slow
@pytest.mark.shared_crash("normalize")
def test_kill_mid_batch_and_restart_gives_exact_table_and_changelog(spark, crashed):
    run = crashed("normalize")
    assert run.status == "committed normalize 1", run.status
    # batches 0 and 1 reached the table before the kill: keys 1, 3 and 4
    assert sorted(read_table(run.directory / "table")["id"].tolist()) == [1, 3, 4]
    report = run.resume(spark)
    # Spark replays batch 1 (its commit was never logged): the Delta sink skips it
    assert (report.batches, report.replayed_batches) == (3, 1)
    table = read_table(run.directory / "table")
    assert sorted(map(tuple, table[COLS].astype(object).values.tolist())) == EXPECTED_TABLE
    assert _changelog(run.directory / "log") == EXPECTED_CHANGELOG
