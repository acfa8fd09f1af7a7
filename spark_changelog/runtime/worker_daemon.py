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

import importlib
import os
import sys

#: modules every Python worker of this package's jobs imports, imported once
#: in the daemon before it forks the workers (:func:`preload`)
PRELOADED = ("numpy", "pyarrow", "pyarrow.compute", "pyarrow.ipc", "pandas",
             "pyspark.worker",
             "spark_changelog.connectors.lines", "spark_changelog.connectors.debezium_arrow",
             "spark_changelog.runtime.spark_keyed", "spark_changelog.runtime.spark_seen_keys",
             "spark_changelog.runtime.spark_event_time")


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


def preload(modules=PRELOADED) -> None:
    """Import ``modules`` in the daemon, so the workers it forks have them.

    PySpark's daemon imports nothing before it forks, because a thread
    running at ``fork()`` is not copied into the child.  Importing these
    starts two: OpenBLAS's worker (numpy) and jemalloc's background thread
    (pyarrow).  Both libraries make ``fork()`` safe themselves
    (``pthread_atfork`` handlers); OpenBLAS is started single-threaded here,
    so it has no worker thread at all (the workers do no BLAS work; the
    variable is restored, so the children's environment is Spark's).  A
    module that fails to import is left to the worker that needs it, which
    then reports the error as usual."""
    saved = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:       # noqa: BLE001 - the worker re-raises it where it matters
                pass
    finally:
        if saved is None:
            os.environ.pop("OPENBLAS_NUM_THREADS", None)
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = saved


def main() -> None:
    kept = without_bundled_copies(sys.path)
    for entry in set(sys.path) - set(kept):
        sys.path_importer_cache.pop(entry, None)
    sys.path[:] = kept
    preload()
    from pyspark.daemon import manager
    manager()


if __name__ == "__main__":
    main()
