"""The Python worker daemon Spark starts on each executor
(``spark.python.daemon.module``): PySpark's own daemon, after one change to
the import path.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip``, the py4j zip and the
spark-core jar at the front of every Python worker's path.  For a PySpark
installed with pip, ``$SPARK_HOME`` is that installed package, so the zip
holds the same code as the package directory, but Python imports from a zip
without bytecode caching: each new worker compiled PySpark's worker modules
from source (1.4-1.8 s of CPU per worker, on every worker of a job's first
micro-batch), and re-read the zips' and the jar's directories whenever a
task added a path (docs/runtime.md, "Fixed costs of every process").  So when the
zip and jar entries lie inside the ``pyspark`` package directory that is
also importable from a plain directory on the path, they are dropped; the
forked workers inherit the path.  Any other layout (a cluster's
``$SPARK_HOME`` without a pip-installed PySpark) is left as Spark set it.
"""
from __future__ import annotations

import os
import sys


def installed_pyspark_dir(path: list) -> str | None:
    """The ``pyspark`` package directory importable from a plain directory
    entry of ``path``, or None."""
    for entry in path:
        if entry and os.path.isdir(entry):
            candidate = os.path.join(entry, "pyspark")
            if os.path.isfile(os.path.join(candidate, "__init__.py")):
                return os.path.realpath(candidate)
    return None


def without_bundled_copies(path: list) -> list:
    """``path`` without the archive entries (zip, jar) that lie inside the
    installed ``pyspark`` directory; unchanged when there is none."""
    package = installed_pyspark_dir(path)
    if package is None:
        return list(path)
    prefix = package + os.sep
    return [entry for entry in path
            if not (entry.endswith((".zip", ".jar")) and os.path.realpath(entry).startswith(prefix))]


def main() -> None:
    kept = without_bundled_copies(sys.path)
    for entry in set(sys.path) - set(kept):
        sys.path_importer_cache.pop(entry, None)
    sys.path[:] = kept
    from pyspark.daemon import manager
    manager()


if __name__ == "__main__":
    main()
