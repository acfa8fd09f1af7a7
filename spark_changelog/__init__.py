"""spark-changelog: Flink-SQL-grade changelog processing on Apache Spark.

The semantics it implements are in ``docs/semantics.md``; docs/ explain the design.
"""
from .api import ChangelogStream, read_canal, read_changes, read_debezium, read_maxwell
from .model import ChangelogMode, RowKind, StreamSchema
from .runtime.session import build_session

__version__ = "0.1.0"

__all__ = ["ChangelogStream", "ChangelogMode", "RowKind", "StreamSchema", "build_session",
           "read_changes", "read_debezium", "read_canal", "read_maxwell"]
