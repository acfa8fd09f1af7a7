"""The interpreter Spark starts for Python on a local master
(``PYSPARK_PYTHON``): this interpreter, after the import-path change of
:mod:`.worker_daemon`, for every process Spark starts with ``-m MODULE``.

The daemon drops PySpark's bundled zip (and the py4j zip, the spark-core
jar) from the path of the workers it forks.  Spark also starts Python
processes without the daemon: ``transformWithStateInPandas`` runs a fresh
``python -m pyspark.sql.streaming.transform_with_state_driver_worker`` on
the driver for every stateful operator of a query while it plans the first
micro-batch, and that process imported PySpark from the zip, compiling it
from source each time (about 1 s of CPU per operator, in the query's
planning, one after the other: docs/runtime.md, "Fixed costs of every
process").  Spark runs ``PYSPARK_PYTHON -m MODULE [ARGS]`` for all of them;
:func:`launcher` writes a small executable that runs :func:`main` with this
interpreter, and :func:`main` drops the bundled copies
(:func:`.worker_daemon.without_bundled_copies`) before it runs the module,
as ``python -m`` would.  Any other command line is handed to the
interpreter unchanged.
"""
from __future__ import annotations

import hashlib
import os
import runpy
import sys
import tempfile

LAUNCHER = """#!{python}
# written by spark_changelog.runtime.worker_launcher (Spark's PYSPARK_PYTHON
# on a local master); runs {python}
import sys
from spark_changelog.runtime.worker_launcher import main
main(sys.argv)
"""


def launcher(python: str = sys.executable, directory: str | None = None) -> str:
    """The path of an executable that runs :func:`main` with ``python``,
    written once per interpreter (by rename: a concurrent writer never
    leaves a half-written file)."""
    text = LAUNCHER.format(python=python)
    digest = hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
    directory = directory or os.path.join(tempfile.gettempdir(), f"spark-changelog-python-{os.getuid()}")
    path = os.path.join(directory, f"python-{digest}")
    if not os.access(path, os.X_OK):
        os.makedirs(directory, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    return path


def main(argv: list) -> None:
    """``argv``: the launcher's command line.  ``-m MODULE ARGS...`` runs the
    module as ``__main__`` after dropping PySpark's bundled copies from the
    path; anything else is the interpreter's command line, run as it is."""
    if len(argv) < 3 or argv[1] != "-m":
        os.execv(sys.executable, [sys.executable] + list(argv[1:]))
    from .worker_daemon import without_bundled_copies
    kept = without_bundled_copies(sys.path)
    for entry in set(sys.path) - set(kept):
        sys.path_importer_cache.pop(entry, None)
    # ``python -m`` puts the working directory first, not the script's
    sys.path[:] = [os.getcwd()] + kept[1:]
    module = argv[2]
    sys.argv = [argv[0]] + list(argv[3:])
    runpy.run_module(module, run_name="__main__", alter_sys=True)
