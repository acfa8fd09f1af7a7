"""Replay is deterministic (docs/runtime.md, "Replay is deterministic"): a
micro-batch processed twice from the same state writes byte-identical state.
The join pipeline of tests/kill_window.py (two normalizes, the join, the
upsert materializer) runs four micro-batches; then the last batch's commit
and every state file it wrote are removed, so the next run replays it from
the same state: each state partition's changelog file of that version is
written again, byte for byte the same."""
from __future__ import annotations

import glob
import os

import kill_window as kw
from spark_changelog.sinks.delta import read_table

BATCHES = 4


def _run(spark, base):
    stream, options = kw.api_pipeline(spark, "join", str(base))
    return stream.write_upsert(str(base / "out"), checkpoint=str(base / "ck"), changelog_path=str(base / "log"),
                               dead_letter=str(base / "dead"), key_groups=kw.KEY_GROUPS, **options)


def _remove(directory, stem: str) -> None:
    """The files named ``stem.*`` or ``stem`` and their hidden ``.crc`` siblings."""
    for name in os.listdir(directory):
        if name.lstrip(".").split(".")[0] == stem:
            os.remove(os.path.join(directory, name))


def test_a_replayed_batch_writes_byte_identical_state(spark, tmp_path):
    kw.write_files(tmp_path, 0, BATCHES)
    assert _run(spark, tmp_path).batches == BATCHES
    query = tmp_path / "ck" / "main"
    last = BATCHES - 1
    version = f"{last + 1}"
    state = sorted(glob.glob(str(query / "state" / "*" / "*" / f"{version}.changelog")))
    first = {p: open(p, "rb").read() for p in state}
    # every operator's state partitions, and at least one wrote more than an empty file
    assert len(first) >= 8 and max(len(b) for b in first.values()) > 200
    for part in glob.glob(str(query / "state" / "*" / "*")):
        _remove(part, version)
    _remove(query / "commits", str(last))
    table = read_table(str(tmp_path / "out"))

    report = _run(spark, tmp_path)
    assert report.batches == 1 and report.replayed_batches == 1
    again = {p: open(p, "rb").read() for p in state}
    # every operator, the upsert materializer behind the join included (its
    # input comes through a shuffle whose arrival order Spark does not fix;
    # the key-group sort breaks ties on key and _seq by the other columns)
    assert again == first
    assert read_table(str(tmp_path / "out")).sort_values("id").reset_index(drop=True).equals(
        table.sort_values("id").reset_index(drop=True))
