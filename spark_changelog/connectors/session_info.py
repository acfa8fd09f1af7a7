"""What the readers and the runtime ask of a Spark session, answered the same
way for a classic session and a Spark Connect client (which has no
SparkContext and no JVM in its process; docs/deploy.md, "Spark Connect")."""
from __future__ import annotations


def is_connect(spark) -> bool:
    """``spark`` is a Spark Connect client session."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def master_of(spark) -> str:
    """The session's master URL (through Connect: the server's)."""
    if is_connect(spark):
        return spark.conf.get("spark.master", "") or ""
    return spark.sparkContext.master


def default_parallelism(spark) -> int:
    """The session's default number of tasks: Spark's ``defaultParallelism``
    (the cluster's cores); through Connect, which does not expose it, the
    server's ``spark.default.parallelism`` when set, else the shuffle
    partitions."""
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    value = spark.conf.get("spark.default.parallelism", None)
    return int(value or spark.conf.get("spark.sql.shuffle.partitions"))


def data_source_available(spark, name: str) -> bool:
    """Whether the session's Spark finds the data source ``name`` (a
    separately packaged one: ``avro``, ``kafka``).  Classic: the JVM's
    lookup.  Connect: the server analyses a read of it; only "data source
    not found" means absent (a missing path or option is another error)."""
    if not is_connect(spark):
        try:
            spark._jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(
                name, spark._jsparkSession.sessionState().conf())
        except Exception:   # noqa: BLE001 (py4j wraps ClassNotFoundException)
            return False
        return True
    try:
        spark.read.format(name).load("/nonexistent-spark-changelog-probe").schema
    except Exception as err:   # noqa: BLE001 - only the error's class matters
        return "DATA_SOURCE_NOT_FOUND" not in str(err)
    return True
