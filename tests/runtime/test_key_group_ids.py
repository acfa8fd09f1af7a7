"""The key-group ids a keyed operator's state is stored under (docs/runtime.md,
"Key groups and rescaling"): a new checkpoint stores each key group
``pmod(hash(key), G)`` under its spread id (``model.partitioning.
spread_group_ids``) and records the layout in ``plan-fingerprint.json``; a
checkpoint written before the layout was recorded (the group index as its
id) resumes with those ids and finds every key's state, and
``spark-changelog rescale`` moves it to the spread ids.  A key group's state
records its layout too, and a group that finds state of the other layout
refuses it (where a group finds none, only the fingerprint can tell)."""
from __future__ import annotations

import os
import shutil

import pyarrow as pa
import pytest

from kill_restart import COLS, EXPECTED_CHANGELOG, EXPECTED_TABLE, write_input
from spark_changelog.api import ChangelogStream
from spark_changelog.model.partitioning import PLAIN_IDS, SPREAD_IDS, spread_group_ids
from spark_changelog.operators.normalize import ChangelogNormalize
from spark_changelog.plan import execute
from spark_changelog.plan.fingerprint import read_fingerprint, rescale_fingerprint, write_fingerprint
from spark_changelog.runtime.checkpoint import log_ids
from spark_changelog.runtime.key_group_processor import KeyGroupProcessor
from spark_changelog.runtime.rescale import rescale_checkpoint
from spark_changelog.sinks.changelog import read_changelog
from spark_changelog.sinks.delta import read_table

SCHEMA = "id BIGINT, name STRING, score BIGINT, _kind TINYINT, _seq BIGINT"


@pytest.fixture
def base(tmp_path):
    write_input(tmp_path / "all")
    os.makedirs(tmp_path / "in")
    return tmp_path


def _files(base, upto: int) -> None:
    for name in sorted(os.listdir(base / "all"))[:upto]:
        if not (base / "in" / name).exists():
            shutil.copy(base / "all" / name, base / "in" / name)


def _normalize(spark, base):
    df = spark.readStream.format("parquet").option("maxFilesPerTrigger", 1).schema(SCHEMA).load(str(base / "in"))
    return ChangelogStream.from_dataframe(df, primary_key=["id"]).normalize().write_upsert(
        str(base / "table"), checkpoint=str(base / "ck"), changelog_path=str(base / "log"))


def _stored_groups(spark, base) -> set:
    """The ``_kg`` values the normalize's state is stored under now."""
    q = str(base / "ck" / "main")
    meta = (spark.read.format("statestore").option("operatorId", 0).option("stateVarName", "meta")
            .option("batchId", log_ids(os.path.join(q, "commits"))[-1]).load(q))
    return {r["key"]["_kg"] for r in meta.collect()}


def _indexes(spark, ids, groups: int) -> list:
    """Spark's own ``pmod(hash(id), groups)`` of each BIGINT id."""
    rows = spark.createDataFrame([(i,) for i in ids], "id BIGINT").selectExpr(f"pmod(hash(id), {groups}) AS g")
    return [r.g for r in rows.collect()]


def test_new_checkpoint_stores_spread_ids_and_records_them(spark, base):
    _files(base, 1)
    assert _normalize(spark, base).batches == 1
    assert read_fingerprint(str(base / "ck"))["key_group_ids"] == SPREAD_IDS
    ids = spread_group_ids(32)
    assert _stored_groups(spark, base) == {ids[g] for g in _indexes(spark, [1, 2, 3], 32)}


def test_plain_id_checkpoint_resumes_and_rescales_to_spread_ids(spark, base, monkeypatch):
    # the first two micro-batches as a version before the layout was recorded
    # wrote them: the key-group index is the id, and the fingerprint says nothing
    _files(base, 2)
    with monkeypatch.context() as m:
        m.setattr(execute, "checkpoint_key_group_ids", lambda checkpoint: PLAIN_IDS)
        assert _normalize(spark, base).batches == 2
    fp = read_fingerprint(str(base / "ck"))
    del fp["key_group_ids"]
    write_fingerprint(str(base / "ck"), fp)
    plain = set(_indexes(spark, [1, 2, 3, 4], 32))
    assert _stored_groups(spark, base) == plain
    assert plain != {spread_group_ids(32)[g] for g in plain}

    _files(base, 3)
    # resumed as it was written: the third file's updates find their keys
    resumed = _normalize(spark, base)
    assert (resumed.batches, resumed.replayed_batches) == (1, 0)
    assert read_fingerprint(str(base / "ck"))["key_group_ids"] == PLAIN_IDS
    assert _stored_groups(spark, base) == plain

    # rescaled: the state moves to 8 key groups under their spread ids
    report = rescale_checkpoint(spark, str(base / "ck"), 8, edit=rescale_fingerprint, quiet_seconds=0)
    shutil.rmtree(report.kept)
    fp = read_fingerprint(str(base / "ck"))
    assert (fp["key_groups"], fp["key_group_ids"]) == (8, SPREAD_IDS)
    assert _stored_groups(spark, base) == {spread_group_ids(8)[g] for g in _indexes(spark, [1, 2, 3, 4], 8)}
    _files(base, 4)
    assert _normalize(spark, base).batches == 1
    table = read_table(str(base / "table"))
    assert sorted(map(tuple, table[COLS].astype(object).values.tolist())) == EXPECTED_TABLE
    log = read_changelog(base / "log")
    # every -U/-D needed the key's earlier state, in both layouts
    assert [(r["op"], r["id"], r["name"], r["score"]) for _, r in log.iterrows()] == EXPECTED_CHANGELOG


def test_a_key_groups_state_of_the_other_layout_is_refused():
    schema = pa.schema([("id", pa.int64()), ("v", pa.int64()), ("_kind", pa.int8()), ("_seq", pa.int64())])

    def processor(layout):
        return KeyGroupProcessor(ChangelogNormalize(schema, ["id"]), schema.names, 1.0, 8, "UTC", 32, None, layout)
    spread, plain = processor(SPREAD_IDS), processor(PLAIN_IDS)
    written_plain = {"runs": ["r1"], "key_groups": 32}          # before the layout was kept
    written_spread = {"runs": ["r2"], "key_groups": 32, "key_group_ids": SPREAD_IDS}
    assert plain._run_ids(written_plain) == ["r1"] and spread._run_ids(written_spread) == ["r2"]
    with pytest.raises(RuntimeError, match="written with plain key-group ids and the query now runs with "
                                           "spread ids"):
        spread._run_ids(written_plain)
    with pytest.raises(RuntimeError, match="written with spread key-group ids"):
        plain._run_ids(written_spread)
    # the event-time operators' processors keep no layout: not checked
    assert processor(None)._run_ids(written_spread) == ["r2"]
