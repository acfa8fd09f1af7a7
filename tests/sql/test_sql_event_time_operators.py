"""Event-time deduplication and ``ON CONFLICT DO NOTHING`` wait for the same
watermark as windows: the one the source generates, per source partition,
with idleness, unchanged by filters (docs/windows.md, "Watermarks from the
source"; docs/runtime.md, "Event time: the sources' watermarks").

The source is a Kafka-shaped stream (no broker here: Spark's Kafka frame is
replaced by the same rows read from JSON files, one file per micro-batch, as
tests/connectors/test_kafka.py does) with two Kafka partitions, no declared
partition column (the hidden one) and ``'scan.watermark.idle-timeout'`` of
1 ms.  Watermark: ``rt - 1 s`` (``max - 1000 ms`` per partition).

====  =========================================  ==========================
batch rows (partition: user, url, seconds)       watermark after the batch
====  =========================================  ==========================
0     p0: u1 /a 10; p1: u2 /a 5                  min(9, 4) = 4
1     p0: u1 /b 7, monitor /heartbeat 20         p1 idle: 19
2     p0: u4 /d 25; p1: u3 /c 2 (late)           p1 behind, left out: 24
3     p1: u5 /e 40                               p0 idle, p1 caught up: 39
====  =========================================  ==========================

Keep first on ``rt``: batch 1 emits u1's earliest row (/b, 7 s) and u2's: the
heartbeat the filter drops moved the watermark (without it: 6, u1 would
wait) and the stalled partition 1 went idle (without idleness: 4, nothing
would fire); u3's row is late (2 s < 19) and dropped; u4 fires in batch 3;
u5 waits.  Batch (end of input) keeps every user's earliest row, as Flink 2.3
does (recorded: tests/fixtures/flink/sql_cases.json).

``ON CONFLICT DO NOTHING`` into a table keyed by user (from a GROUP BY user,
url: two rows of u1 conflict): a change is folded by
the first watermark above the one it arrived under: batch 0's rows (before
any watermark) by 4, batch 1's (4) by 19 (u1 /b conflicts with the stored
/a: nothing), batch 2's (19) by 24, batch 3's (24) by 39."""
from __future__ import annotations

import json

import pytest

from changelog_data import load_fixture
from spark_changelog.connectors import kafka
from spark_changelog.sinks.changelog import read_changelog
from spark_changelog.sql.script import parse_script
from spark_changelog.sql.translate import Translator
from tests.connectors.test_kafka import KAFKA_ROW, write_records

S = 1000
#: per micro-batch: (Kafka partition, user, url, seconds)
FILES = [[(0, "u1", "/a", 10), (1, "u2", "/a", 5)],
         [(0, "u1", "/b", 7), (0, "monitor", "/heartbeat", 20)],
         [(0, "u4", "/d", 25), (1, "u3", "/c", 2)],
         [(1, "u5", "/e", 40)]]

SOURCE = """
CREATE TABLE clicks (
  u STRING, url STRING, t BIGINT,
  rt AS TO_TIMESTAMP_LTZ(t, 3),
  WATERMARK FOR rt AS rt - INTERVAL '1' SECOND
) WITH ('connector' = 'kafka', 'topic' = 'clicks', 'properties.bootstrap.servers' = 'broker:9092',
        'format' = 'json', 'scan.watermark.idle-timeout' = '1 ms');
CREATE TABLE out (u STRING, url STRING, t BIGINT, PRIMARY KEY (u) NOT ENFORCED)
  WITH ('connector' = 'delta', 'path' = '{out}');
"""
DEDUP = SOURCE + """INSERT INTO out
SELECT u, url, t FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY u ORDER BY rt ASC) AS rn
  FROM clicks WHERE url <> '/heartbeat')
WHERE rn = 1;
"""
CONFLICT = SOURCE + """INSERT INTO out
SELECT u, url, MAX(t) AS t FROM clicks WHERE url <> '/heartbeat' GROUP BY u, url
ON CONFLICT DO NOTHING;
"""
WATERMARK = ("watermark=[generated at the source: clicks per partition of __kafka_partition: "
             "rt - 999 ms, the minimum over the source partitions, idle after 1 ms]")


def plan(spark, tmp_path, monkeypatch, script: str, streaming: bool):
    offsets, files = {0: 0, 1: 0}, []
    for rows in FILES:
        records = []
        for p, u, url, sec in rows:
            offsets[p] += 1
            records.append((p, offsets[p], json.dumps({"u": u, "url": url, "t": sec * S})))
        files.append(records)
    write_records(tmp_path / "in", files)

    def frame(session, options, streaming):
        read = session.readStream.option("maxFilesPerTrigger", 1) if streaming else session.read
        return read.schema(KAFKA_ROW).json(str(tmp_path / "in"))

    monkeypatch.setattr(kafka, "kafka_frame", frame)
    parsed = parse_script(script.format(out=tmp_path / "out"), "event_time.sql")
    (p,), = [p for _, p in Translator(spark, parsed, streaming=streaming, key_groups=2)
             .statements() if p]
    return p


def emitted(tmp_path) -> dict:
    """micro-batch -> the changes it wrote, as (kind, user, url, seconds)."""
    log = read_changelog(str(tmp_path / "log"))
    kinds = {0: "+I", 1: "-U", 2: "+U", 3: "-D"}
    return {int(b): sorted((kinds[int(k)], u, url, int(t) // S)
                           for k, u, url, t in zip(part["_kind"], part["u"], part["url"], part["t"]))
            for b, part in log.groupby("_batch")}


def test_event_time_dedup_per_micro_batch_filter_and_idle_partition(spark, tmp_path, monkeypatch):
    p = plan(spark, tmp_path, monkeypatch, DEDUP, streaming=True)
    text = p.explain()
    assert ("Deduplicate(keep=[FirstRow], key=[u], order=[ROWTIME(rt)], " + WATERMARK + ")") in text, text
    report = p.run(checkpoint=str(tmp_path / "ck"), changelog_path=str(tmp_path / "log"))
    assert emitted(tmp_path) == {1: [("+I", "u1", "/b", 7), ("+I", "u2", "/a", 5)],
                                 3: [("+I", "u4", "/d", 25)]}
    assert report.event_time["partitions"] == {"clicks/0": 24 * S, "clicks/1": 39 * S}
    assert report.counters.get("late") == 1


def test_event_time_dedup_batch_is_flinks(spark, tmp_path, monkeypatch):
    case = load_fixture("flink/sql_cases.json")["cases"]["dedup_filter_batch"]
    p = plan(spark, tmp_path, monkeypatch, DEDUP, streaming=False)
    p.run(changelog_path=str(tmp_path / "log"))
    got = sorted(([u, url, t * S] for _, u, url, t in emitted(tmp_path)[0]), key=repr)
    assert got == case["expected"]


def test_on_conflict_do_nothing_per_micro_batch_filter_and_idle_partition(spark, tmp_path,
                                                                          monkeypatch):
    p = plan(spark, tmp_path, monkeypatch, CONFLICT, streaming=True)
    text = p.explain()
    assert ("SinkUpsertMaterializer(key=[u], upsertKey=[u, url], conflictStrategy=[NOTHING], "
            + WATERMARK + ")") in text, text
    p.run(checkpoint=str(tmp_path / "ck"), changelog_path=str(tmp_path / "log"))
    assert emitted(tmp_path) == {0: [("+I", "u1", "/a", 10), ("+I", "u2", "/a", 5)],
                                 2: [("+I", "u3", "/c", 2), ("+I", "u4", "/d", 25)],
                                 3: [("+I", "u5", "/e", 40)]}
