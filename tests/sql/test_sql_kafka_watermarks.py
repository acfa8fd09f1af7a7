"""A Kafka table's watermark per Kafka partition (docs/sql.md, "Kafka and
other streams"; docs/windows.md, "Watermarks from the source").

As Flink's Kafka source does, each partition of a ``'connector' = 'kafka'``
table with a ``WATERMARK`` generates its own watermark (the column declared
``METADATA FROM 'partition'``), the windows wait for the minimum over the
partitions, and a partition without rows for ``table.exec.source.idle-timeout``
leaves the minimum.  No broker runs here: Spark's Kafka frame is replaced by
the same row shape read from JSON files by Spark's file source, one file per
micro-batch (as tests/connectors/test_kafka.py does)."""
from __future__ import annotations

import json
import re

import pytest

from spark_changelog.connectors import kafka
from spark_changelog.sql.script import parse_script
from spark_changelog.sql.translate import Translator
from tests.connectors.test_kafka import KAFKA_ROW, write_records
from tests.windows_data import IDLE_FILES, S, local_reference, spark_fired, spark_late

SCRIPT = """
SET 'table.exec.source.idle-timeout' = '1 ms';
CREATE TABLE clicks (
  u STRING, t BIGINT,
  p INT METADATA FROM 'partition' VIRTUAL,
  rt AS TO_TIMESTAMP_LTZ(t, 3),
  WATERMARK FOR rt AS rt - INTERVAL '1' MILLISECOND
) WITH ('connector' = 'kafka', 'topic' = 'clicks', 'properties.bootstrap.servers' = 'broker:9092',
        'scan.startup.mode' = 'earliest-offset', 'format' = 'json');
CREATE TABLE per_minute (u STRING, window_start TIMESTAMP(3), n BIGINT,
  PRIMARY KEY (u, window_start) NOT ENFORCED) WITH ('connector' = 'delta', 'path' = '{out}');
INSERT INTO per_minute
SELECT u, window_start, COUNT(*) AS n
FROM TABLE(TUMBLE(TABLE clicks, DESCRIPTOR(rt), INTERVAL '1' MINUTE))
GROUP BY u, window_start, window_end;
"""


def kafka_records(files):
    """IDLE_FILES' clicks as plain JSON records (insert-only, as Flink's
    'json' format): partition A is Kafka partition 0, B is 1, offsets counted
    per partition."""
    part, offsets, out = {"A": 0, "B": 1}, {0: 0, 1: 0}, []
    for rows in files:
        records = []
        for p, u, t in rows:
            offsets[part[p]] += 1
            records.append((part[p], offsets[part[p]], json.dumps({"u": u, "t": t})))
        out.append(records)
    return out


def test_each_kafka_partition_is_a_watermark_partition_and_a_stalled_one_goes_idle(
        spark, tmp_path, monkeypatch):
    """Partition 1 stalls after the first micro-batch: the first minute waits
    for it (micro-batch 0: minimum of both), fires once it is idle (batch 1,
    partition 0 alone at 74.999 s); its click at 20 s comes back late (batch
    2); the second minute fires when it catches up (batch 3: the minimum,
    149.999 s, of 199.999 s and 149.999 s)."""
    write_records(tmp_path / "in", kafka_records(IDLE_FILES))

    def frame(session, options, streaming):
        assert streaming and kafka.spark_kafka_options(options)["subscribe"] == "clicks"
        return (session.readStream.option("maxFilesPerTrigger", 1).schema(KAFKA_ROW)
                .json(str(tmp_path / "in")))

    monkeypatch.setattr(kafka, "kafka_frame", frame)
    script = parse_script(SCRIPT.format(out=tmp_path / "out"), "kafka_wm.sql")
    (p,), = [p for _, p in Translator(spark, script, streaming=True, key_groups=2).statements() if p]
    text = p.explain()
    assert "WatermarkAssigner(rowtime=[rt], watermark=[rt - 0 ms], generated=[at source clicks, " \
           "per partition of p, idle after 1 ms])" in text, text
    assert "watermark=[generated at the source: clicks per partition of p: rt - 0 ms, the minimum " \
           "over the source partitions, idle after 1 ms]" in text, text

    report = p.run(checkpoint=str(tmp_path / "ck"), changelog_path=str(tmp_path / "log"),
                   late_output=str(tmp_path / "late"))
    want_fired, want_late = local_reference(IDLE_FILES)
    assert want_fired == {1: [("+I", "u1", 0, 1), ("+I", "u2", 0, 1)],
                          3: [("+I", "u1", 60, 2), ("+I", "u3", 60, 1)]}
    assert spark_fired(tmp_path / "log") == want_fired
    assert report.late_rows == 1 and spark_late(tmp_path / "late") == [(2, "u2", 20 * S)]
    assert want_late == [(2, "u2", 20 * S)]
    # the partitions' watermarks, named by source and Kafka partition
    assert report.event_time["partitions"] == {"clicks/0": 200 * S - 1, "clicks/1": 150 * S - 1}


def test_a_kafka_table_without_a_partition_column_still_has_a_watermark_per_partition(
        spark, tmp_path, monkeypatch):
    """Without ``METADATA FROM 'partition'`` the partition is read anyway, as a
    hidden column (Flink's Kafka source is per partition by default), and
    the table's own ``'scan.watermark.idle-timeout'`` idles a stalled one:
    the same fired windows, late row and per-partition watermarks as with a
    declared partition column and ``SET 'table.exec.source.idle-timeout'``."""
    write_records(tmp_path / "in", kafka_records(IDLE_FILES))
    monkeypatch.setattr(kafka, "kafka_frame", lambda session, options, streaming: (
        session.readStream.option("maxFilesPerTrigger", 1).schema(KAFKA_ROW)
        .json(str(tmp_path / "in"))))
    text = (SCRIPT.replace("SET 'table.exec.source.idle-timeout' = '1 ms';\n", "")
            .replace("  p INT METADATA FROM 'partition' VIRTUAL,\n", "")
            .replace("'format' = 'json'", "'format' = 'json', 'scan.watermark.idle-timeout' = '1 ms'"))
    script = parse_script(text.format(out=tmp_path / "out"), "kafka_wm.sql")
    assert script.tables["clicks"].kafka_partition_column is None
    assert script.tables["clicks"].connector.idle_timeout_ms == 1
    (p,), = [p for _, p in Translator(spark, script, streaming=True, key_groups=2).statements()
             if p]
    plan = p.explain()
    assert ("generated=[at source clicks, per partition of __kafka_partition, idle after 1 ms])"
            in plan), plan
    assert "Project(select=[u, t, rt])" in plan, plan   # the hidden column leaves after it
    report = p.run(checkpoint=str(tmp_path / "ck"), changelog_path=str(tmp_path / "log"),
                   late_output=str(tmp_path / "late"))
    want_fired, want_late = local_reference(IDLE_FILES)
    assert spark_fired(tmp_path / "log") == want_fired
    assert report.late_rows == 1 and spark_late(tmp_path / "late") == want_late
    assert report.event_time["partitions"] == {"clicks/0": 200 * S - 1, "clicks/1": 150 * S - 1}


def test_flink_watermark_table_options(spark, tmp_path):
    """FLIP-296's table options: 'scan.watermark.idle-timeout' is the table's
    idle timeout (over SET's), 'scan.watermark.emit.strategy' = 'on-periodic'
    is what runs; 'on-event' and watermark alignment are clear errors at the
    option."""
    from spark_changelog.sql.errors import SqlError, UnsupportedFeature
    base = SCRIPT.format(out=tmp_path / "out")
    with_opt = base.replace("'format' = 'json'", "'format' = 'json', {}")
    script = parse_script(with_opt.format("'scan.watermark.idle-timeout' = '5 s', "
                                          "'scan.watermark.emit.strategy' = 'on-periodic'"), "k.sql")
    assert script.tables["clicks"].connector.idle_timeout_ms == 5000
    for option, message in [
            ("'scan.watermark.alignment.group' = 'g1'",
             "'scan.watermark.alignment.group': watermark alignment (pausing a source that runs "
             "ahead) is not supported"),
            ("'scan.watermark.alignment.max-drift' = '1 min'", "watermark alignment"),
            ("'scan.watermark.emit.strategy' = 'on-event'", "only 'on-periodic' is supported"),
            ("'scan.watermark.idle-timeout' = 'soon'", "is not a duration")]:
        with pytest.raises(SqlError, match=re.escape(message)) as err:
            parse_script(with_opt.format(option), "k.sql")
        assert ("alignment" in option or "on-event" in option) == \
            isinstance(err.value, UnsupportedFeature), option
        assert "k.sql:9:69:" in str(err.value), str(err.value)   # at the option
