"""spark-changelog: Flink-SQL-grade changelog processing on Apache Spark.

The semantics it implements are in ``docs/semantics.md``; docs/ explain the design.

The names below are imported on first use (PEP 562): Spark's Python workers
import this package to unpickle an operator or a reader task, and importing
the whole API there (the SQL parser, the planner) cost each new worker about
a second (docs/runtime.md, "Fixed costs of every process").
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "ChangelogStream": ".api", "read_changes": ".api", "read_debezium": ".api",
    "read_canal": ".api", "read_maxwell": ".api", "read_snapshots": ".api",
    "create_auto_cdc_flow": ".auto_cdc", "read_postgres_cdc": ".api",
    "ChangelogMode": ".model", "RowKind": ".model", "StreamSchema": ".model",
    "build_session": ".runtime.session",
}

__all__ = ["ChangelogStream", "ChangelogMode", "RowKind", "StreamSchema", "build_session",
           "read_changes", "read_debezium", "read_canal", "read_maxwell", "read_snapshots",
           "create_auto_cdc_flow", "read_postgres_cdc"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'spark_changelog' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
