"""The automatic compaction of the Delta upsert sink (docs/sinks.md,
"Compaction: automatic"): after enough batches the small and mostly deleted
files are rewritten key-sorted in a commit that changes no row; the table
stays exact after every batch, its file count bounded, the old files
vacuumable."""
from __future__ import annotations

import json
import os
import random

import pytest
from deltalake import DeltaTable

from sink_changes import SCHEMA, changes
from spark_changelog.sinks.delta import DeltaUpsertSink, read_table
from tests.delta_scan import scan_delta

MIN_FILES = 4


def random_batch(rng: random.Random, seq0: int, lo: int = 0, keys: int = 60, size: int = 12):
    """Inserts, updates and deletes of keys in lo..lo+keys-1, each key's changes in order."""
    rows = []
    for i, k in enumerate(rng.sample(range(lo, lo + keys), size)):
        if rng.random() < 0.25:
            rows.append((3, seq0 + i, k, None))                      # -D (maybe of an absent key)
        else:
            rows.append((2, seq0 + i, k, f"v{seq0 + i}"))           # +U: an upsert
    return rows


def apply(model: dict, rows) -> None:
    for kind, _, k, name in rows:
        if kind == 3:
            model.pop(k, None)
        else:
            model[k] = name


def staged(sink, rows, batch_id, partitions=2):
    """One batch as the sink writers run it: partitions by key, one commit."""
    stage = sink.stage_batch("q", batch_id)
    written = [stage.write_partition(changes([r for r in rows if r[2] % partitions == p]), p)
               for p in range(partitions)]
    return stage.commit(written)


def live_files(path) -> list[str]:
    return DeltaTable(path).file_uris()


@pytest.mark.parametrize("deletion_vectors", [True, False], ids=["deletion-vectors", "merge"])
def test_small_files_are_compacted_by_the_policy_the_table_stays_exact_and_the_old_files_vacuumable(
        tmp_path, deletion_vectors):
    path = str(tmp_path / "t")
    sink = DeltaUpsertSink(path, ["id"], SCHEMA, deletion_vectors=deletion_vectors,
                           compact_min_files=MIN_FILES)
    rng, model, compactions = random.Random(5), {}, []
    for b in range(16):
        # new keys, and updates and deletes of recent ones; a MERGE rewrites
        # the files its key range overlaps into one: there, new keys only
        rows = random_batch(rng, 100 * b, lo=(8 if deletion_vectors else 24) * b, keys=24)
        # the batches of a running query: staged by partitions where the sink
        # stages (deletion vectors), else merged from the driver
        if deletion_vectors and b % 2:
            result = staged(sink, rows, b)
        else:
            result = sink.write_arrow_batch(changes(rows), query_id="q", batch_id=b)
        apply(model, rows)
        assert result["committed"] and sink.last_batch_id("q") == b
        if "compaction" in result:
            compactions.append(result["compaction"])
        table = read_table(path)
        assert dict(zip(table["id"].tolist(), table["name"].tolist())) == model, f"after batch {b}"
        # the bound: fewer than MIN_FILES small files survive a batch, plus what one batch adds
        assert len(live_files(path)) < MIN_FILES + 2, f"after batch {b}"
    assert len(compactions) >= 3
    assert all(c["files_removed"] >= 2 and c["files_added"] == 1 for c in compactions)

    dt = DeltaTable(path)
    ops = [json.loads(line)["commitInfo"] for v in range(dt.version() + 1)
           for line in open(os.path.join(path, "_delta_log", f"{v:020d}.json"))
           if '"commitInfo"' in line]
    auto = [c for c in ops if c.get("operationParameters", {}).get("policy") == "auto-compact"]
    assert len(auto) == len(compactions)
    # the compaction changes no row: every add and remove of its commits says so
    for v in range(dt.version() + 1):
        actions = [json.loads(line) for line in open(os.path.join(path, "_delta_log", f"{v:020d}.json"))]
        if any(a.get("commitInfo", {}).get("operationParameters", {}).get("policy") == "auto-compact"
               for a in actions):
            assert all(not a[k]["dataChange"] for a in actions for k in ("add", "remove") if k in a)
            assert not any("txn" in a for a in actions)

    # the compacted files are sorted by the key (later batches search them)
    # and the files they replaced go with a vacuum; the table stays exact
    import pyarrow.parquet as pq
    compacted = [a["path"] for a in sink.live_files(dt.version()).values()
                 if json.loads(a["stats"])["numRecords"] > 12]           # more rows than one batch
    assert compacted
    for name in compacted:
        ids = pq.read_table(os.path.join(path, name), columns=["id"])["id"].to_pylist()
        assert ids == sorted(ids)
    before = {f for f in os.listdir(path) if f.endswith(".parquet")}
    dt.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)
    after = {f for f in os.listdir(path) if f.endswith(".parquet")}
    assert after < before and after == {os.path.basename(u) for u in live_files(path)}
    assert sorted((r["id"], r["name"]) for r in scan_delta(path).to_pylist()) == sorted(model.items())


def test_auto_compaction_can_be_turned_off_and_needs_a_sensible_threshold(tmp_path):
    path = str(tmp_path / "t")
    sink = DeltaUpsertSink(path, ["id"], SCHEMA, auto_compact=False, compact_min_files=2)
    rng = random.Random(1)
    for b in range(6):
        result = sink.write_arrow_batch(changes(random_batch(rng, 100 * b)), query_id="q", batch_id=b)
        assert "compaction" not in result
    assert len(live_files(path)) == 6
    assert sink.compact_if_due()["files_removed"] == 6          # by hand, the same step
    assert len(live_files(path)) == 1
    with pytest.raises(ValueError, match="compact_min_files"):
        DeltaUpsertSink(path, ["id"], SCHEMA, compact_min_files=1)
