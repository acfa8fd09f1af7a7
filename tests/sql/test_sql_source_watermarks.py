"""Watermarks are generated at the source and travel with the stream
(docs/windows.md, "Watermarks from the source").

The heartbeat case: ``WHERE url <> '/heartbeat'`` comes after the table's
``WATERMARK``, and the heartbeat rows are the ones that move the watermark
past the last windows.  As in Flink, the rows the filter drops still moved
the watermark: streaming fires every click window once the heartbeat file
arrives (before, the window operator computed its watermark from the rows it
received and never fired the last two).  Batch gives the same four windows
(the end of input fires them).  Then the two-input case: a join of two
watermarked streams windows at the minimum of both sources' watermarks."""
from __future__ import annotations

import json
import os

import pytest

from sql_inputs import PER_MINUTE, hm
from spark_changelog.sinks.changelog import read_changelog
from spark_changelog.sinks.delta import read_table
from spark_changelog.sql.script import parse_script
from spark_changelog.sql.translate import Translator

#: seed 002's nine clicks (User, epoch ms) on pages, then one heartbeat
CLICKS = [("User1", 1610743463000), ("User2", 1610743523000), ("User4", 1610743554000),
          ("User5", 1610743592000), ("User3", 1610743544000), ("User2", 1610743652000),
          ("User3", 1610743664000), ("User1", 1610743580000), ("User5", 1610743494000)]
HEARTBEAT = ("monitor", 1610743770000)      # 20:49:30

SCRIPT = """
CREATE TABLE clicks (
  u STRING, url STRING, t BIGINT,
  rt AS TO_TIMESTAMP_LTZ(t, 3),
  WATERMARK FOR rt AS rt - INTERVAL '1' MINUTE
) WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'json',
        'source.max-files-per-trigger' = '1');
""" + PER_MINUTE + """WHERE url <> '/heartbeat'
GROUP BY window_start, window_end;
"""

#: the four click windows (20:44 has User1 and User5: both arrive in the
#: first micro-batch, before any watermark)
WINDOWS = [("2021-01-15T20:44:00", "2021-01-15T20:45:00", 2, 2),
           ("2021-01-15T20:45:00", "2021-01-15T20:46:00", 3, 3),
           ("2021-01-15T20:46:00", "2021-01-15T20:47:00", 2, 2),
           ("2021-01-15T20:47:00", "2021-01-15T20:48:00", 2, 2)]


def write_files(directory, files) -> None:
    """One plain JSON file per list of (user, url, t), read in this order."""
    directory.mkdir()
    for i, rows in enumerate(files):
        f = directory / f"part-{i:04d}.json"
        f.write_text("".join(json.dumps({"u": u, "url": url, "t": t}) + "\n" for u, url, t in rows))
        os.utime(f, (1_600_000_000 + i, 1_600_000_000 + i))


def run(spark, tmp_path, streaming: bool):
    write_files(tmp_path / "in", [[(u, "/page", t) for u, t in CLICKS],
                                  [(HEARTBEAT[0], "/heartbeat", HEARTBEAT[1])]])
    script = parse_script(SCRIPT.format(path=tmp_path / "in", out=tmp_path / "out"), "hb.sql")
    (p,), = [p for _, p in Translator(spark, script, streaming=streaming, key_groups=2)
             .statements() if p]
    report = p.run(checkpoint=str(tmp_path / "ck") if streaming else None,
                   changelog_path=str(tmp_path / "log"))
    table = sorted((hm(r.window_start), hm(r.window_end), int(r.users), int(r.clicks))
                   for r in read_table(str(tmp_path / "out")).itertuples())
    return p, report, table


def test_heartbeat_filtered_after_the_watermark_still_fires_the_windows_streaming(spark, tmp_path):
    p, report, table = run(spark, tmp_path, streaming=True)
    assert table == WINDOWS
    log = read_changelog(str(tmp_path / "log"))
    fired = {int(b): sorted(hm(w) for w in part["window_start"]) for b, part in log.groupby("_batch")}
    # the clicks' batch: watermark 20:46:43.999 fires 20:44 and 20:45; the
    # heartbeat's batch (its row filtered out): 20:48:29.999 fires the rest
    assert fired == {0: ["2021-01-15T20:44:00", "2021-01-15T20:45:00"],
                     1: ["2021-01-15T20:46:00", "2021-01-15T20:47:00"]}
    assert report.late_rows == 0
    text = p.explain()
    assert "WatermarkAssigner(rowtime=[rt], watermark=[rt - 59999 ms], generated=[at source " \
           "clicks, one partition])" in text
    assert "watermark=[generated at the source: clicks: rt - 59999 ms, the minimum over the " \
           "source partitions, no idleness]" in text


def test_heartbeat_filtered_after_the_watermark_batch(spark, tmp_path):
    _, report, table = run(spark, tmp_path, streaming=False)
    assert table == WINDOWS and report.late_rows == 0


TWO_INPUTS = """
CREATE TABLE a (k STRING, t BIGINT, rt AS TO_TIMESTAMP_LTZ(t, 3),
  WATERMARK FOR rt AS rt - INTERVAL '1' SECOND
) WITH ('connector' = 'filesystem', 'path' = '{base}/a', 'format' = 'json',
        'source.max-files-per-trigger' = '1');
CREATE TABLE b (k STRING, s BIGINT, rs AS TO_TIMESTAMP_LTZ(s, 3),
  WATERMARK FOR rs AS rs - INTERVAL '1' SECOND
) WITH ('connector' = 'filesystem', 'path' = '{base}/b', 'format' = 'json',
        'source.max-files-per-trigger' = '1');
CREATE TABLE per_minute (window_start TIMESTAMP(3), n BIGINT, PRIMARY KEY (window_start) NOT ENFORCED)
  WITH ('connector' = 'delta', 'path' = '{base}/out');
CREATE VIEW joined AS SELECT a.k, a.rt FROM a JOIN b ON a.k = b.k;
INSERT INTO per_minute
SELECT window_start, COUNT(*) AS n
FROM TABLE(TUMBLE(TABLE joined, DESCRIPTOR(rt), INTERVAL '1' MINUTE))
GROUP BY window_start, window_end;
"""
T0 = 1610740800000          # 2021-01-15T20:00:00


def test_two_inputs_window_at_the_minimum_of_both_sources_watermarks(spark, tmp_path):
    """Micro-batch 0 reads a's only file (k1 at 20:00:10 and 20:05:00: a's
    watermark 20:04:59) and b's first (k1 at 20:00:20: 20:00:19); the
    minimum fires nothing (the maximum would fire 20:00).  Batch 1 reads b's
    second file, a row that joins nothing at 20:03:00: b's watermark rows
    still pass the join, the minimum is 20:02:59 and 20:00 fires; 20:05
    waits for b."""
    def write(directory, files):
        directory.mkdir(parents=True)
        for i, rows in enumerate(files):
            f = directory / f"part-{i}.json"
            f.write_text("".join(json.dumps(r) + "\n" for r in rows))
            os.utime(f, (1_600_000_000 + i, 1_600_000_000 + i))

    write(tmp_path / "a", [[{"k": "k1", "t": T0 + 10_000}, {"k": "k1", "t": T0 + 300_000}]])
    write(tmp_path / "b", [[{"k": "k1", "s": T0 + 20_000}], [{"k": "k9", "s": T0 + 180_000}]])
    script = parse_script(TWO_INPUTS.format(base=tmp_path), "two.sql")
    (p,), = [p for _, p in Translator(spark, script, streaming=True, key_groups=2)
             .statements() if p]
    assert "watermark=[generated at the sources: a: rt - 999 ms; b: rs - 999 ms" in p.explain()
    p.run(checkpoint=str(tmp_path / "ck"), changelog_path=str(tmp_path / "log"))
    log = read_changelog(str(tmp_path / "log"))
    fired = {int(b): sorted(hm(w) for w in part["window_start"]) for b, part in log.groupby("_batch")}
    assert fired == {1: ["2021-01-15T20:00:00"]}
    assert [(hm(r.window_start), int(r.n)) for r in read_table(str(tmp_path / "out")).itertuples()] \
        == [("2021-01-15T20:00:00", 1)]
