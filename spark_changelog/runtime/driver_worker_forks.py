"""A fork server for the Python processes Spark starts on its driver for
the stateful operators (docs/runtime.md, "Fixed costs of every process").

When a query starts, ``transformWithStateInPandas`` runs a fresh ``python
-m pyspark.sql.streaming.transform_with_state_driver_worker`` on the driver
for every stateful operator, one after the other, inside the first
micro-batch's planning (Spark's ``StateSchemaAndOperatorMetadataRule``):
the process unpickles the processor, declares its state variables through a
few round trips to the JVM and exits.  As a new interpreter it first pays
Python's start and PySpark's imports, more than the work itself.  So the
launcher (:mod:`.worker_launcher`), once it has connected back to the JVM,
hands the connection to a server that has those modules imported already,
and the server forks a child that runs the module on it:

* **One server per driver JVM** (and interpreter): an abstract Unix socket
  named by the user id, the JVM's process id and start time and the
  interpreter (:func:`address`).  A local streaming run starts it before its
  query (:func:`prestart`); otherwise the first launcher that finds none
  starts one (:func:`start`) and runs its module itself, as before; so does
  every launcher while the server is still importing, or whenever a
  hand-over is not acknowledged: nothing has touched the JVM's connection
  then.
* **It dies with the JVM**: it waits on a pidfd of the JVM beside its
  socket and exits when the JVM does (a pidfd names the process, not a
  reusable id).  It serves only processes of its own user (the socket's
  peer credentials).
* **The child is the launcher's stand-in**: it gets the connection, the
  launcher's stdout and stderr (Spark logs them) as file descriptors
  (``SCM_RIGHTS``), and its environment, working directory and import path;
  it runs ``module.main(sock_file, sock_file)`` as the launcher would.  The
  launcher waits for the child's exit status and exits with it, so Spark
  sees its process live exactly as long as the work; when Spark ends the
  launcher early (SIGTERM), the launcher ends the child.
* **Spark's 10 s wait for the connect-back is not involved**: the launcher
  connects back first, with the standard library only; the hand-over
  happens after it.
* **The executors' worker daemon too** (a local master's executors share
  the driver's JVM and launcher): Spark starts one or two per query's first
  micro-batch, each importing pandas, pyarrow and PySpark's worker (0.4 CPU
  s, :func:`.worker_daemon.preload`) while the stage waits for it.  The
  server imports those modules too, one at a time while no request waits,
  and hands a daemon request the launcher's stdin, stdout and stderr
  (Spark reads the daemon's port from its stdout and asks it to kill
  workers, or to end, through its stdin).
* **No thread of its own at fork()**: the server is single-threaded;
  pyarrow's allocator starts a background thread, which it makes fork-safe
  itself, as the worker daemon already relies on.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import os
import select
import signal
import socket
import struct
import sys

#: the modules the server runs in its children -> how: ``connection``, the
#: module's ``main(sock_file, sock_file)`` on the launcher's connection to
#: the JVM (the pre-init); ``daemon``, the module's ``main()`` with the
#: launcher's stdin, stdout and stderr (the executors' Python worker daemon
#: of a local master, :mod:`.worker_daemon`: Spark talks to it through those)
SERVED = {"pyspark.sql.streaming.transform_with_state_driver_worker": "connection",
          "spark_changelog.runtime.worker_daemon": "daemon"}
#: imported before the server listens: the served modules and the module of
#: the processors the pre-init unpickles (they import PySpark only)
PRELOADED = tuple(sorted(SERVED)) + ("spark_changelog.runtime.key_group_processor",)
#: how long the server waits for a launcher's request, and a launcher for
#: the server's acknowledgement (a busy machine's scheduling; then the
#: launcher runs its module itself)
HAND_OVER_TIMEOUT = 10.0
_HEADER = struct.Struct("!I")
_INT = struct.Struct("!i")


def address(jvm_pid: int) -> str | None:
    """The server's abstract socket name for the JVM ``jvm_pid`` and this
    interpreter; None when the JVM's start time cannot be read."""
    try:
        with open(f"/proc/{jvm_pid}/stat") as fh:
            started = fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
    tag = hashlib.blake2b(f"{sys.executable}\0{sys.version}".encode(), digest_size=6).hexdigest()
    return f"\0spark-changelog-driver-forks-{os.getuid()}-{jvm_pid}-{started}-{tag}"


def start(jvm_pid: int, path: list):
    """Start the server for ``jvm_pid`` (it outlives a launcher that starts
    it; it ends with the JVM), importing from ``path`` -> its process, or
    None (then every launcher runs its module itself).  It stays in the
    caller's session and process group, as the processes it forks were
    before: the same terminal signals and the same CPU scheduling group."""
    import subprocess
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
    try:
        return subprocess.Popen([sys.executable, "-m", __name__, str(jvm_pid)], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, close_fds=True)
    except OSError:
        return None


#: the servers this process started: JVM pid -> the server's process
_STARTED: dict = {}
#: ``0`` in the driver's environment (which Spark passes on to the
#: launchers): no server, every launcher runs its module itself, as it did
#: before (``scripts/bench query-start`` compares the two)
SWITCH = "SPARK_CHANGELOG_DRIVER_FORKS"


def enabled() -> bool:
    return os.environ.get(SWITCH, "1") != "0"


def prestart(spark, launcher: str) -> None:
    """Start the server of a classic session's driver JVM before a streaming
    query starts, so that the query's first operator is forked too; only
    when Spark starts this package's launcher (``launcher``, the path
    :func:`.worker_launcher.launcher` gives: a local master's
    ``PYSPARK_PYTHON``, set by ``session``), and not again while the one
    started is running.  The server imports while Spark analyzes and plans
    the query.  (The caller passes the path: the launcher imports this
    module, so this module does not import the launcher.)"""
    if not enabled() or os.environ.get("PYSPARK_PYTHON") != launcher:
        return
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    for pid, server in list(_STARTED.items()):
        if server is None or server.poll() is not None:     # reaped: ended with its JVM
            del _STARTED[pid]
    if jvm_pid not in _STARTED:
        _STARTED[jvm_pid] = start(jvm_pid, sys.path)


def hand_over(module: str, sock: socket.socket | None, path: list) -> int | None:
    """Run ``module`` in a child of the driver's server, on the JVM
    connection ``sock`` (a ``connection`` module) or on this process's
    stdin, stdout and stderr (a ``daemon``) -> the child's exit status; None
    when no server took it over (the caller runs the module itself; the
    connection is untouched).  The first pre-init launcher without a server
    starts one."""
    if module not in SERVED or not enabled():
        return None
    jvm_pid = os.getppid()
    name = address(jvm_pid)
    if name is None:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(HAND_OVER_TIMEOUT)
    try:
        conn.connect(name)
    except OSError:
        conn.close()
        if SERVED[module] == "connection":
            # a daemon does not start one: a batch run starts a daemon or
            # two and no pre-init, and would pay the server's imports for
            # nothing
            start(jvm_pid, path)
        return None
    with conn:
        request = json.dumps({"module": module, "path": path, "env": dict(os.environ), "cwd": os.getcwd(),
                              "argv": sys.argv, "timeout": None if sock is None else sock.gettimeout()}).encode()
        message = _HEADER.pack(len(request)) + request
        fds = [0, 1, 2] if SERVED[module] == "daemon" else [sock.fileno(), 1, 2]
        try:
            sent = socket.send_fds(conn, [message], fds)
            conn.sendall(message[sent:])
            ack = _recv_exactly(conn, 1 + _INT.size)
        except OSError:
            return None
        if len(ack) < 1 + _INT.size or ack[:1] != b"F":
            return None
        # committed: the child runs the module once it reads this byte; a
        # launcher that gave up before the acknowledgement has closed the
        # connection instead, and the child then ends without touching the
        # JVM's connection (so it never has two users)
        child = _INT.unpack(ack[1:])[0]
        previous = signal.signal(signal.SIGTERM, lambda *_: _end(child))
        try:
            conn.settimeout(None)
            conn.sendall(b"G")
            status = _recv_exactly(conn, _INT.size)
        except OSError:
            status = b""
        finally:
            signal.signal(signal.SIGTERM, previous)
        return _INT.unpack(status)[0] if len(status) == _INT.size else 1


def _end(child: int) -> None:
    try:
        os.kill(child, signal.SIGTERM)
    finally:
        os._exit(143)


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def serve(jvm_pid: int) -> None:
    """The server: import :data:`PRELOADED`, then fork a child for every
    request until the JVM ``jvm_pid`` exits.  Returns at once when another
    server holds the name or the JVM is gone."""
    from .worker_daemon import without_bundled_copies
    sys.path[:] = without_bundled_copies(sys.path)
    name = address(jvm_pid)
    if name is None:
        return
    try:
        pidfd = os.pidfd_open(jvm_pid)
    except OSError:
        return
    if address(jvm_pid) != name:        # the id was reused before the pidfd held it
        return
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # the name first: a launcher that comes while this one imports is
        # refused (and runs its module itself), a second server stops here
        listener.bind(name)
    except OSError:
        return
    for module in PRELOADED:
        importlib.import_module(module)
    listener.listen(16)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)     # the kernel reaps the children
    # the worker daemon's own imports (pandas, pyarrow, ...: 0.4 CPU s) one
    # at a time while no request waits, so a daemon forked later has them;
    # one forked earlier imports what is missing itself
    from .worker_daemon import PRELOADED as DAEMON_MODULES, preload
    pending = list(DAEMON_MODULES)
    while True:
        ready, _, _ = select.select([listener, pidfd], [], [], 0 if pending else None)
        if pidfd in ready:
            return
        if not ready:
            preload((pending.pop(0),))
            continue
        try:
            conn, _ = listener.accept()
        except OSError:
            continue
        with conn:
            _serve_one(conn, listener, pidfd)


def _serve_one(conn: socket.socket, listener: socket.socket, pidfd: int) -> None:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    if struct.unpack("3i", creds)[1] != os.getuid():
        return
    conn.settimeout(HAND_OVER_TIMEOUT)
    fds: list = []
    try:
        data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        if len(fds) != 3 or len(data) < _HEADER.size:
            return
        (length,) = _HEADER.unpack(data[:_HEADER.size])
        data = data[_HEADER.size:]
        if len(data) < length:
            data += _recv_exactly(conn, length - len(data))
        request = json.loads(data)
        if request.get("module") not in SERVED:
            return
        if os.fork() == 0:
            _child(conn, fds, request, listener, pidfd)
    except (OSError, ValueError):
        return
    finally:
        for fd in fds:
            os.close(fd)


def _child(conn: socket.socket, fds: list, request: dict, listener: socket.socket, pidfd: int) -> None:
    """The forked child: take on the launcher's connection, output,
    environment and path, acknowledge, run the module, report its status."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        listener.close()
        os.close(pidfd)
        first_fd, out_fd, err_fd = fds
        daemon = SERVED[request["module"]] == "daemon"
        if daemon:
            os.dup2(first_fd, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = request["path"]
        sys.argv[:] = request.get("argv") or [sys.argv[0]]
        sys.path_importer_cache.clear()
        importlib.invalidate_caches()
        conn.settimeout(None)
        conn.sendall(b"F" + _INT.pack(os.getpid()))
        if _recv_exactly(conn, 1) != b"G":
            return      # the launcher gave up waiting and runs the module itself
        if daemon:
            try:
                importlib.import_module(request["module"]).main()
                code = 0
            except SystemExit as stop:      # PySpark's daemon ends with sys.exit(code)
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
        else:
            sock = socket.socket(fileno=os.dup(first_fd))
            sock.settimeout(request["timeout"])
            sock_file = sock.makefile("rwb", int(os.environ.get("SPARK_BUFFER_SIZE", 65536)))
            try:
                importlib.import_module(request["module"]).main(sock_file, sock_file)
                code = 0
            finally:
                sock_file.close()
                sock.close()
                sys.stdout.flush()
                sys.stderr.flush()
        conn.sendall(_INT.pack(code))
    except BaseException:       # noqa: BLE001 - reported on the launcher's stderr, as its own failure would be
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(code)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
