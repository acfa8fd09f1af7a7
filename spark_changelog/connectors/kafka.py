"""CDC formats over any stream: a DataFrame of records in place of files, and
Flink's ``'connector' = 'kafka'`` lowered to Spark's Kafka source (docs/sql.md,
"Kafka and other streams"; docs/semantics.md, section 2, "Order across Kafka
partitions").

:func:`frame_lines` turns a DataFrame with a ``value`` column (string or
binary: one record, as Spark's Kafka source gives it) and optionally Kafka's
``topic``, ``partition``, ``offset`` and ``timestamp`` into the per-line frame
the format modules read (``cdc_json.read_lines``): ``file`` names the topic
and partition (``kafka:orders/1``), ``line`` is the offset, so a dead letter
names its partition and offset.  A NULL value (a Kafka tombstone) is a blank
line: skipped as a tombstone.  Those four Kafka fields can fill ``METADATA
FROM 'partition'`` (and ``topic``, ``offset``, ``timestamp``) columns, as in
Flink's Kafka connector; the partition column is the source partition of
per-partition watermarks (``ChangelogStream.window(partition=...)``).

Order: within a partition the offset orders the changes; across partitions
only the format's own position does (``source.lsn``, the binlog position,
``ts``), which is what ``_seq`` is built from, with the offset as the
tie-breaker where the format uses the line.  Records of one key must stay in
one partition (Kafka's default: the key is the message key).

The lines of a DataFrame take the VARIANT path (no Arrow line task).
"""
from __future__ import annotations

import json
from typing import Mapping, Optional

from pyspark.sql import DataFrame, SparkSession

__all__ = ["KafkaUnavailable", "KAFKA_METADATA", "frame_lines", "kafka_frame", "kafka_package",
           "spark_kafka_options", "KAFKA_OPTIONS"]

#: Kafka record fields a ``METADATA FROM`` column can read (Flink's Kafka
#: connector keys) -> their Flink type and the frame column they come from
KAFKA_METADATA = {"topic": ("STRING", "_kafka_topic"), "partition": ("INT", "_kafka_partition"),
                  "offset": ("BIGINT", "_kafka_offset"), "timestamp": ("TIMESTAMP_LTZ(3)", "_kafka_timestamp")}
#: the WITH options of ``'connector' = 'kafka'`` besides ``properties.*`` and the formats'
KAFKA_OPTIONS = ("topic", "topic-pattern", "scan.startup.mode", "scan.startup.specific-offsets",
                 "scan.startup.timestamp-millis", "scan.bounded.mode", "value.format", "key.format",
                 "key.fields", "value.fields-include", "source.ordered", "changelog.mode")
_PROVIDER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"


class KafkaUnavailable(RuntimeError):
    """Spark's Kafka source is not on the classpath."""


def frame_lines(df: DataFrame) -> DataFrame:
    """``file``, ``file_no``, ``line``, ``raw`` and the ``_kafka_*`` columns of
    a DataFrame of records (module docstring)."""
    fields = {f.name: f.dataType.typeName() for f in df.schema.fields}
    if "value" not in fields:
        raise ValueError(f"a DataFrame source needs a 'value' column (string or binary: one record "
                         f"each, as Spark's Kafka source gives it); it has {sorted(fields)}")
    if fields["value"] not in ("string", "binary"):
        raise ValueError(f"the 'value' column of a DataFrame source must be a string or binary, not "
                         f"{fields['value']}")
    topic = "CAST(topic AS STRING)" if "topic" in fields else "CAST(NULL AS STRING)"
    partition = "CAST(partition AS INT)" if "partition" in fields else "CAST(0 AS INT)"
    offset = "CAST(offset AS BIGINT)" if "offset" in fields else "CAST(0 AS BIGINT)"
    timestamp = "CAST(timestamp AS TIMESTAMP)" if "timestamp" in fields else "CAST(NULL AS TIMESTAMP)"
    return df.selectExpr(f"{topic} AS _kafka_topic", f"{partition} AS _kafka_partition",
                         f"{offset} AS _kafka_offset", f"{timestamp} AS _kafka_timestamp",
                         "coalesce(CAST(value AS STRING), '') AS raw").selectExpr(
        "concat('kafka:', coalesce(_kafka_topic, 'stream'), '/', _kafka_partition) AS file",
        "CAST(_kafka_partition AS BIGINT) AS file_no", "_kafka_offset AS line", "raw",
        "_kafka_topic", "_kafka_partition", "_kafka_offset", "_kafka_timestamp")


def kafka_package(spark: SparkSession) -> str:
    """The Maven coordinates of Spark's Kafka source for this Spark."""
    scala = "2.13"
    try:
        scala = spark.sparkContext._jvm.scala.util.Properties.versionNumberString().rsplit(".", 1)[0]
    except Exception:   # noqa: BLE001 (py4j: any failure leaves the default)
        pass
    return f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{spark.version}"


def _kafka_on_classpath(spark: SparkSession) -> bool:
    from .session_info import data_source_available, is_connect
    if is_connect(spark):
        return data_source_available(spark, "kafka")
    try:
        loader = spark.sparkContext._jvm.java.lang.Thread.currentThread().getContextClassLoader()
        spark.sparkContext._jvm.java.lang.Class.forName(_PROVIDER, False, loader)
        return True
    except Exception:   # noqa: BLE001 (py4j wraps ClassNotFoundException)
        return False


def spark_kafka_options(options: Mapping[str, str]) -> dict[str, str]:
    """Spark's Kafka source options for Flink's Kafka connector options.
    ValueError for one Spark has no equivalent of."""
    out: dict[str, str] = {}
    if "topic" in options:
        out["subscribe"] = ",".join(t.strip() for t in options["topic"].split(";") if t.strip())
    elif "topic-pattern" in options:
        out["subscribePattern"] = options["topic-pattern"]
    else:
        raise ValueError("connector 'kafka' needs 'topic' (or 'topic-pattern')")
    for key, value in options.items():
        if key.startswith("properties."):
            out["kafka." + key[len("properties."):]] = value
    if "kafka.bootstrap.servers" not in out:
        raise ValueError("connector 'kafka' needs 'properties.bootstrap.servers'")
    mode = options.get("scan.startup.mode", "group-offsets").lower()
    if mode == "earliest-offset":
        out["startingOffsets"] = "earliest"
    elif mode == "latest-offset":
        out["startingOffsets"] = "latest"
    elif mode == "timestamp":
        if "scan.startup.timestamp-millis" not in options:
            raise ValueError("'scan.startup.mode' = 'timestamp' needs 'scan.startup.timestamp-millis'")
        out["startingTimestamp"] = options["scan.startup.timestamp-millis"]
    elif mode == "specific-offsets":
        spec = options.get("scan.startup.specific-offsets")
        if not spec or "topic" not in options or ";" in options["topic"]:
            raise ValueError("'scan.startup.mode' = 'specific-offsets' needs one 'topic' and "
                             "'scan.startup.specific-offsets' ('partition:0,offset:42;partition:1,offset:300')")
        offsets = {}
        for part in spec.split(";"):
            fields = dict(f.split(":", 1) for f in part.split(",") if ":" in f)
            offsets[str(int(fields["partition"]))] = int(fields["offset"])
        out["startingOffsets"] = json.dumps({options["topic"].strip(): offsets})
    elif mode == "group-offsets":
        # Spark keeps its offsets in the checkpoint, not in the consumer group:
        # the first run starts where Flink's default fallback ('earliest') does
        out["startingOffsets"] = "earliest"
    else:
        raise ValueError(f"'scan.startup.mode' = {mode!r}: expected earliest-offset, latest-offset, "
                         "group-offsets, timestamp or specific-offsets")
    out["failOnDataLoss"] = "true"
    return out


def kafka_frame(spark: SparkSession, options: Mapping[str, str], streaming: bool) -> DataFrame:
    """Spark's Kafka source with the table's options (:func:`spark_kafka_options`);
    :class:`KafkaUnavailable` naming the package when it is not on the classpath."""
    spark_options = spark_kafka_options(options)
    if not _kafka_on_classpath(spark):
        package = kafka_package(spark)
        raise KafkaUnavailable(
            f"connector 'kafka' needs Spark's Kafka source, which is not on the classpath: add the "
            f"package {package} (spark-submit --packages {package}, or the Spark setting "
            f"spark.jars.packages={package}; SPARK_CHANGELOG_SPARK_CONF can pass it to "
            "spark-changelog)")
    reader = spark.readStream if streaming else spark.read
    return reader.format("kafka").options(**spark_options).load()


def frame_source(path) -> Optional[DataFrame]:
    """``path`` when it is a DataFrame (a reader given a stream), else None."""
    return path if isinstance(path, DataFrame) else None
