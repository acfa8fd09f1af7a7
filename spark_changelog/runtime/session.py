"""Building a Spark session that works for changelog pipelines.

Local Spark is the embedded default; ``master`` and extra ``configs`` pass
through unchanged, so the same code runs on a cluster (docs/deploy.md).
"""
from __future__ import annotations

import os
import sys
from typing import Mapping, Optional

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

DEFAULT_CONFIGS = {
    # transformWithState needs RocksDB; it is also the provider whose checkpoints
    # are incremental (changelog checkpointing), so state size does not dictate
    # checkpoint cost.
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # one task per core on a laptop-sized machine; the key-group count is ours
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.sql.adaptive.enabled": "false",
    "spark.driver.memory": "4g",
    "spark.python.worker.reuse": "true",
}


def build_session(app_name: str = "spark-changelog", master: Optional[str] = None,
                  configs: Optional[Mapping[str, str]] = None):
    """Create (or get) a SparkSession with the project's defaults.

    Python workers must run this interpreter: otherwise they start the system
    Python and fail with "No module named pandas".
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    master = master or os.environ.get("SPARK_CHANGELOG_MASTER")
    if master:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:
        # not launched by spark-submit (which brings its own master): run locally
        builder = builder.master("local[2]")
    merged = dict(DEFAULT_CONFIGS)
    merged["spark.pyspark.python"] = sys.executable
    merged["spark.pyspark.driver.python"] = sys.executable
    merged.update(configs or {})
    for k, v in merged.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
