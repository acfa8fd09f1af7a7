"""``spark-changelog-python``: the Python a Spark Connect server starts its
Python processes with (``PYSPARK_PYTHON``; docs/deploy.md, "Spark
Connect").

Spark starts some Python processes on its driver with ``python -m MODULE``
and waits a fixed 10 s (``PythonWorkerFactory.createSimpleWorker``, a
constant in Spark 4.3) for the process to connect back: the ``foreachBatch``
process of every Spark Connect streaming query and transformWithState's
pre-init process of every stateful operator, each time a query starts.
Each of those modules imports PySpark, pandas, pyarrow and gRPC before it
connects (0.7 s of CPU for the ``foreachBatch`` one); on a driver host short
of CPU that took more than 10 s and the query failed to start ("Python
worker failed to connect back").  Once connected, Spark waits minutes for
the process's first answer.

So for those modules this program connects back first, with the standard
library only (PySpark's protocol: ``pyspark.util.local_connect_and_auth``
and ``pyspark.worker_util.get_sock_file_to_executor``), then imports the
module and runs its ``main`` on the connection, as the module's own
``__main__`` block does.  Any other command line (the executors' worker
daemon, ``pyspark.worker``) runs this interpreter unchanged (``exec``).
"""
from __future__ import annotations

import os
import socket
import struct
import sys

#: modules whose ``__main__`` is ``with get_sock_file_to_executor(TIMEOUT) as
#: f: main(f, f)`` (PySpark 4.3) -> that TIMEOUT (-1: PySpark's default, the
#: socket keeps its authentication time-out)
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
    """Connect to the JVM that started this process, authenticate, send the
    pid (what ``get_sock_file_to_executor(timeout)`` does) -> the socket file."""
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
    return f


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    module = argv[1] if len(argv) == 2 and argv[0] == "-m" else None
    if module not in CONNECT_FIRST:
        os.execv(sys.executable, [sys.executable, *argv])
    sock_file = connect_back(CONNECT_FIRST[module])
    import importlib
    worker = importlib.import_module(module)
    try:
        worker.main(sock_file, sock_file)
    finally:
        sock_file.close()


if __name__ == "__main__":
    main()
