"""CDC formats over a stream of records (connectors/kafka.py, docs/sql.md "Kafka
and other streams"): no broker runs here, so the records come in Kafka's row
shape (``topic``, ``partition``, ``offset``, ``timestamp``, ``value``) from JSON
files read by Spark's file source: several partitions, offsets out of file
order, one partition stalling.  The SQL ``'connector' = 'kafka'`` is tested by
its option mapping, its error without Spark's Kafka package, and its plan."""
from __future__ import annotations

import json
import os

import pytest

from spark_changelog.api import read_changes as read_stream
from spark_changelog.connectors import kafka
from spark_changelog.connectors.cdc_json import read_changes
from spark_changelog.connectors.format_options import FormatOptions
from spark_changelog.model.rowkind import RowKind
from spark_changelog.sql.errors import SqlError
from spark_changelog.sql.runner import run_script
from spark_changelog.sql.script import parse_script
from tests.changelog_data import set_arrival
from tests.connectors.test_readers import A, B, lsn, seq
from tests.windows_data import IDLE_FILES, IDLE_TIMEOUT_MS, M, S, local_reference, spark_fired

KAFKA_ROW = "topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, value STRING"


def debezium(op, before, after, position):
    return json.dumps({"before": before, "after": after, "op": op, "source": {"lsn": position}})


def write_records(directory, files) -> None:
    """One JSON file per micro-batch of (partition, offset, value) records."""
    os.makedirs(directory, exist_ok=True)
    for i, records in enumerate(files):
        path = os.path.join(directory, f"batch-{i:04d}.json")
        with open(path, "w") as f:
            for partition, offset, value in records:
                f.write(json.dumps({"topic": "inv", "partition": partition, "offset": offset,
                                    "timestamp": "2024-01-01T00:00:00Z", "value": value}) + "\n")
        set_arrival(path, i)


# partition 0 holds ids 1 and 3, partition 1 id 2; offsets out of file order
RECORDS = [[
    (1, 7, debezium("u", {"id": 2, "v": "b"}, {"id": 2, "v": "b2"}, 250)),
    (0, 11, debezium("c", None, {"id": 3, "v": "c"}, 300)),
    (0, 10, debezium("u", {"id": 1, "v": "a"}, {"id": 1, "v": "a2"}, 200)),
    (1, 6, debezium("c", None, {"id": 2, "v": "b"}, 150)),
    (0, 9, debezium("c", None, {"id": 1, "v": "a"}, 100)),
    (1, 8, None),                                               # a tombstone
    (0, 12, '{"op": "c", "after": {"id": "x"}}'),               # bad: id is not a BIGINT
]]


def test_kafka_shaped_records_in_any_order_read_by_the_format_sequence(spark, tmp_path):
    write_records(tmp_path / "in", RECORDS)
    df = spark.read.schema(KAFKA_ROW).json(str(tmp_path / "in"))
    res = read_changes(spark, df, format="debezium-json", schema="id BIGINT, v STRING, p INT, o BIGINT",
                       primary_key="id", options=FormatOptions(metadata=(("p", "partition"), ("o", "offset"))))
    changes = sorted((RowKind(r["_kind"]).short, r["id"], r["v"], r["p"], r["o"], r["_seq"])
                     for r in res.changes.collect())
    assert sorted(changes, key=lambda c: c[-1]) == [
        ("+I", 1, "a", 0, 9, seq(lsn(100), A)),
        ("+I", 2, "b", 1, 6, seq(lsn(150), A)),
        ("-U", 1, "a", 0, 10, seq(lsn(200), B)),
        ("+U", 1, "a2", 0, 10, seq(lsn(200), A)),
        ("-U", 2, "b", 1, 7, seq(lsn(250), B)),
        ("+U", 2, "b2", 1, 7, seq(lsn(250), A)),
        ("+I", 3, "c", 0, 11, seq(lsn(300), A)),
    ]
    # a dead letter names the topic, partition and offset
    assert [(r["file"], r["line"], r["reason"]) for r in res.invalid.collect()] == [
        ("kafka:inv/0", 12, "field 'id': value \"x\" is not a BIGINT (in 'after')")]
    assert [(r["file"], r["line"], r["category"]) for r in res.skipped.collect()] == [
        ("kafka:inv/1", 8, "tombstone")]


def test_a_stalled_partition_goes_idle_and_rejoins(spark, tmp_path):
    """The Kafka partition is the source partition of the window's
    per-partition watermarks: partition 1 stalls after the first micro-batch
    (idle, so partition 0 alone fires the first minute), comes back with a
    late click, then catches up; the same fired rows as the file-partition
    story of tests/runtime/test_windows_spark.py."""
    from spark_changelog.operators.window import tumble
    part = {"A": 0, "B": 1}
    offsets = {0: 0, 1: 0}
    files = []
    for rows in IDLE_FILES:
        records = []
        for p, u, t in rows:
            offsets[part[p]] += 1
            records.append((part[p], offsets[part[p]],
                            json.dumps({"database": "web", "table": "clicks", "type": "insert", "ts": 0,
                                        "data": {"u": u, "t": t}})))
        files.append(records)
    write_records(tmp_path / "in", files)
    df = spark.readStream.option("maxFilesPerTrigger", 1).schema(KAFKA_ROW).json(str(tmp_path / "in"))
    s = (read_stream(spark, df, format="maxwell-json", schema="u STRING, t BIGINT, p INT", mode="insert-only",
                     options=FormatOptions(metadata=(("p", "partition"),)))
         .with_column("rt", "timestamp_millis(t)").with_watermark("rt", 0))
    report = (s.window(tumble("rt", "1 minute"), partition="p", idle_timeout=f"{IDLE_TIMEOUT_MS} ms")
              .aggregate(by="u", n="count(*)", key_groups=2)
              .write_upsert(str(tmp_path / "table"), changelog_path=str(tmp_path / "log"),
                            checkpoint=str(tmp_path / "ck"), late_output=str(tmp_path / "late")))
    want_fired, _ = local_reference(IDLE_FILES)
    assert want_fired == {1: [("+I", "u1", 0, 1), ("+I", "u2", 0, 1)],
                          3: [("+I", "u1", 60, 2), ("+I", "u3", 60, 1)]}
    assert spark_fired(tmp_path / "log") == want_fired
    assert report.late_rows == 1
    assert report.event_time["partitions"] == {"0": 200 * S - 1, "1": 150 * S - 1}


# ----------------------------------------------------------------- SQL: 'connector' = 'kafka'

KAFKA_TABLE = """CREATE TABLE orders (
  id BIGINT, v STRING, part INT METADATA FROM 'partition' VIRTUAL,
  src STRING METADATA FROM 'value.source.table' VIRTUAL,
  PRIMARY KEY (id) NOT ENFORCED
) WITH ('connector' = 'kafka', 'topic' = 'inv', 'properties.bootstrap.servers' = 'broker:9092',
  'properties.group.id' = 'g1', 'scan.startup.mode' = 'earliest-offset', 'value.format' = 'debezium-json',
  'value.debezium-json.ignore-parse-errors' = 'true');
CREATE TABLE out_t (id BIGINT, v STRING, part INT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'print', 'print-identifier' = 'k');
INSERT INTO out_t SELECT id, v, part FROM orders;"""


def test_kafka_table_options_map_to_sparks_kafka_source():
    t = parse_script(KAFKA_TABLE).tables["orders"]
    assert (t.connector.kind, t.connector.format, t.connector.reader_format) == ("kafka", "debezium-json",
                                                                                 "debezium-json")
    assert t.connector.format_options.ignore_parse_errors
    assert t.connector.format_options.metadata == (("part", "partition"), ("src", "source.table"))
    assert t.kafka_partition_column == "part"
    assert kafka.spark_kafka_options(dict(t.connector.options)) == {
        "subscribe": "inv", "kafka.bootstrap.servers": "broker:9092", "kafka.group.id": "g1",
        "startingOffsets": "earliest", "failOnDataLoss": "true"}
    with pytest.raises(ValueError, match="'specific-offsets' needs one 'topic'"):
        kafka.spark_kafka_options({"topic": "a;b", "properties.bootstrap.servers": "h:1",
                                   "scan.startup.mode": "specific-offsets",
                                   "scan.startup.specific-offsets": "partition:0,offset:42"})
    assert json.loads(kafka.spark_kafka_options({
        "topic": "a", "properties.bootstrap.servers": "h:1", "scan.startup.mode": "specific-offsets",
        "scan.startup.specific-offsets": "partition:0,offset:42;partition:1,offset:300"})["startingOffsets"]) == \
        {"a": {"0": 42, "1": 300}}
    with pytest.raises(SqlError, match="unsupported option\\(s\\) 'sink.partitioner' for connector 'kafka'"):
        parse_script(KAFKA_TABLE.replace("'topic' = 'inv',", "'topic' = 'inv', 'sink.partitioner' = 'fixed',"))


def test_kafka_without_the_package_names_it(spark):
    with pytest.raises(SqlError) as e:
        run_script(spark, parse_script(KAFKA_TABLE, "k.sql"), batch=True, show_progress=False)
    assert f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark.version}" in str(e.value)
    assert "spark.jars.packages" in str(e.value)


def test_kafka_table_lowers_to_the_kafka_frame_and_the_format_reader(spark, tmp_path, monkeypatch):
    """The plan of a Kafka table: Spark's Kafka source (here its row shape from
    files, as no broker runs) read by the Debezium reader, with the
    partition as a metadata column."""
    write_records(tmp_path / "in", RECORDS)
    asked = {}

    def frame(session, options, streaming):
        asked.update(options=kafka.spark_kafka_options(options), streaming=streaming)
        return session.read.schema(KAFKA_ROW).json(str(tmp_path / "in"))

    monkeypatch.setattr(kafka, "kafka_frame", frame)
    import io
    out = io.StringIO()
    runs = run_script(spark, parse_script(KAFKA_TABLE, "k.sql"), batch=True, key_groups=2, show_progress=False,
                      out=out)
    assert asked == {"options": {"subscribe": "inv", "kafka.bootstrap.servers": "broker:9092",
                                 "kafka.group.id": "g1", "startingOffsets": "earliest", "failOnDataLoss": "true"},
                     "streaming": False}
    assert "Source(orders" in runs[0].report.plan or "orders" in runs[0].report.plan
    assert sorted(line for line in out.getvalue().splitlines() if line.startswith("k> ")) == sorted([
        "k> +I[1, a, 0]", "k> -U[1, a, 0]", "k> +U[1, a2, 0]", "k> +I[2, b, 1]", "k> -U[2, b, 1]",
        "k> +U[2, b2, 1]", "k> +I[3, c, 0]"])
    assert runs[0].report.invalid == 1          # offset 12, counted (ignore-parse-errors)
