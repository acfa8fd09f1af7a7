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

Spark also waits a fixed 10 s for such a process to connect back
(``PythonWorkerFactory.createSimpleWorker``, a constant in Spark 4.3) and
otherwise fails the query's start ("Python worker failed to connect back"):
the stateful operators' pre-init process, and under Spark Connect the
``foreachBatch`` process of every streaming query.  Their modules import
PySpark, pandas, pyarrow and gRPC before they connect (0.7 s of CPU for the
``foreachBatch`` one without the zip), more than 10 s on a driver host short
of CPU.  For those modules (:data:`CONNECT_FIRST`) :func:`main` connects
back first, with the standard library only, then imports the module and
runs its ``main`` on the connection, as its ``__main__`` block would; once
connected, Spark waits minutes for the process's first answer.  The
stateful operators' pre-init module does not even import: the launcher
hands the connection to the driver's fork server, which has it imported,
and waits for the forked child (:mod:`.driver_worker_forks`); without a
server it runs the module itself.  So does the executors' worker daemon
when the driver has such a server (a local streaming run starts one).
``spark-changelog-python`` (a console script, :func:`console_main`) is this
launcher for a Spark Connect server's ``PYSPARK_PYTHON`` (docs/deploy.md,
"Starting a streaming query").
"""
from __future__ import annotations

import hashlib
import importlib
import os
import runpy
import socket
import struct
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


#: modules Spark starts on the driver whose ``__main__`` is ``with
#: get_sock_file_to_executor(TIMEOUT) as f: main(f, f)`` (PySpark 4.3) ->
#: that TIMEOUT (-1: PySpark's default, the socket keeps its authentication
#: time-out)
CONNECT_FIRST = {
    "pyspark.sql.connect.streaming.worker.foreach_batch_worker": None,
    "pyspark.sql.connect.streaming.worker.listener_worker": None,
    "pyspark.sql.streaming.transform_with_state_driver_worker": -1,
    "pyspark.sql.streaming.python_streaming_source_runner": None,
}


def _read_utf8(f) -> str:
    (length,) = struct.unpack("!i", f.read(4))
    return f.read(length).decode("utf-8")


def connect_back(timeout):
    """Connect to the JVM that started this process, authenticate and send
    the pid, as PySpark's ``get_sock_file_to_executor(timeout)`` does (its
    ``local_connect_and_auth``: TCP with the secret, or the unix socket)
    -> the connection, as a socket and as a file (nothing read ahead)."""
    buffer_size = int(os.environ.get("SPARK_BUFFER_SIZE", 65536))
    auth_timeout = int(os.environ.get("SPARK_AUTH_SOCKET_TIMEOUT", 15))
    secret = os.environ.get("PYTHON_WORKER_FACTORY_SECRET")
    path = os.environ.get("PYTHON_WORKER_FACTORY_SOCK_PATH")
    if path is not None and secret is None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(auth_timeout)
        sock.connect(path)
        f = sock.makefile("rwb", buffer_size)
    else:
        host = "::1" if os.environ.get("SPARK_PREFER_IPV6", "false").lower() == "true" else "127.0.0.1"
        sock = socket.create_connection((host, int(os.environ["PYTHON_WORKER_FACTORY_PORT"])),
                                        timeout=auth_timeout)
        f = sock.makefile("rwb", buffer_size)
        data = (secret or "").encode("utf-8")
        f.write(struct.pack("!i", len(data)) + data)
        f.flush()
        if _read_utf8(f) != "ok":
            f.close()
            sock.close()
            raise ConnectionError("the JVM refused this Python process's secret")
    if timeout is None or timeout > 0:
        sock.settimeout(timeout)
    f.write(struct.pack("!i", os.getpid()))
    f.flush()
    return sock, f


def main(argv: list) -> None:
    """``argv``: the launcher's command line.  ``-m MODULE ARGS...`` runs the
    module as ``__main__`` after dropping PySpark's bundled copies from the
    path (a :data:`CONNECT_FIRST` module: after connecting back, in a child
    of the driver's fork server when one takes it over); anything else is
    the interpreter's command line, run as it is."""
    if len(argv) < 3 or argv[1] != "-m":
        os.execv(sys.executable, [sys.executable] + list(argv[1:]))
    module = argv[2]
    sock, sock_file = connect_back(CONNECT_FIRST[module]) if module in CONNECT_FIRST and len(argv) == 3 \
        else (None, None)
    from .worker_daemon import without_bundled_copies
    kept = without_bundled_copies(sys.path)
    for entry in set(sys.path) - set(kept):
        sys.path_importer_cache.pop(entry, None)
    # ``python -m`` puts the working directory first, not the script's
    sys.path[:] = [os.getcwd()] + kept[1:]
    if sock_file is not None:
        from .driver_worker_forks import hand_over
        status = hand_over(module, sock, sys.path)
        if status is not None:
            sock_file.close()
            sys.exit(status)
        try:
            importlib.import_module(module).main(sock_file, sock_file)
        finally:
            sock_file.close()
        return
    sys.argv = [argv[0]] + list(argv[3:])
    from .driver_worker_forks import hand_over
    status = hand_over(module, None, sys.path)
    if status is not None:
        sys.exit(status)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def console_main() -> None:
    """``spark-changelog-python``: the launcher as an installed command."""
    main(sys.argv)
