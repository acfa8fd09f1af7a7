"""The fork server of the stateful operators' driver processes
(runtime/driver_worker_forks.py): a query's pre-init process is a child of
the server, the server serves one JVM and ends with it."""
from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time

import cluster as cl
from spark_changelog.demo import generate_debezium
from spark_changelog.runtime.driver_worker_forks import address

PRE_INIT = "pyspark.sql.streaming.transform_with_state_driver_worker"
DAEMON = "spark_changelog.runtime.worker_daemon"
SERVER = [sys.executable, "-m", "spark_changelog.runtime.driver_worker_forks"]

#: records, for every process that runs the ``main`` of the pre-init module
#: or of the worker daemon, the module, its pid, its parent's pid and its
#: parent's command line
RECORDER = """
import importlib.abc, importlib.machinery, os, sys
class Recorder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in {names!r}:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        inner = spec.loader
        class Loader(importlib.abc.Loader):
            def __getattr__(self, attr):        # get_code etc.: runpy's
                return getattr(inner, attr)
            def create_module(self, spec):
                return inner.create_module(spec)
            def exec_module(self, module):
                inner.exec_module(module)
                main = module.main
                def recorded(*args):
                    with open('/proc/%d/cmdline' % os.getppid(), 'rb') as fh:
                        parent = fh.read().replace(b'\\0', b' ').decode()
                    with open({record!r}, 'a') as fh:
                        fh.write('%s %d %d %s\\n' % (name, os.getpid(), os.getppid(), parent))
                    return main(*args)
                module.main = recorded
        spec.loader = Loader()
        return spec
sys.meta_path.insert(0, Recorder())
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait(predicate, seconds: float = 30.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_a_querys_pre_init_process_is_a_child_of_the_server_which_ends_with_the_driver(tmp_path):
    """A streaming run from the CLI: the stateful operator's pre-init and
    the executors' worker daemons run in children of the driver's fork
    server (started before the query), with the launcher's output (and a
    daemon's input); the table is exact; the server ends with the driver's
    JVM."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    record = tmp_path / "pre-init.txt"
    (hooks / "sitecustomize.py").write_text(RECORDER.format(names=(PRE_INIT, DAEMON), record=str(record)))
    expected = generate_debezium(str(tmp_path / "in"), 300, 40, files=1, bad_lines=0)
    log = tmp_path / "spark.log"
    r = cl.run_cli(cl.normalize_args(tmp_path / "in", tmp_path, changelog=False),
                   env={"PYTHONPATH": str(hooks), "SPARK_CHANGELOG_LOG": str(log)})
    assert r.returncode == 0, r.stderr + r.stdout
    cl.assert_table(tmp_path / "table", expected)
    runs = [line.split(" ", 3) for line in record.read_text().splitlines()]
    modules = [module for module, *_ in runs]
    assert modules.count(PRE_INIT) == 1 and modules.count(DAEMON) >= 1, modules
    assert all("spark_changelog.runtime.driver_worker_forks" in parent for *_, parent in runs)
    server = {ppid for _, _, ppid, _ in runs}.pop()
    assert {ppid for _, _, ppid, _ in runs} == {server}
    # the child's stdout went to the launcher's, which Spark logs
    assert "Starting Streaming TransformWithStateInPandas Python worker" in log.read_text(errors="replace")
    assert _wait(lambda: all(_gone(int(pid)) for pid in [server] + [pid for _, pid, _, _ in runs]), 10)


def _request(name: str, module: str) -> bytes:
    """A launcher's hand-over request for ``module`` (this process's output
    as its connection) -> what the server answers."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        conn.connect(name)
        body = json.dumps({"module": module, "path": sys.path, "env": {}, "cwd": "/", "argv": ["x"], "timeout": None}).encode()
        socket.send_fds(conn, [struct.pack("!I", len(body)) + body], [1, 1, 2])
        return conn.recv(16)


def test_the_server_is_one_per_jvm_serves_its_module_only_and_ends_with_the_jvm():
    """A stand-in for the JVM (any process): its server listens once it has
    imported; a second server for it stops at once; a request for another
    module is refused (no acknowledgement: the launcher runs it itself);
    the server exits when the JVM does."""
    jvm = subprocess.Popen(["sleep", "120"])
    server = subprocess.Popen(SERVER + [str(jvm.pid)])
    try:
        name = address(jvm.pid)

        def listening() -> bool:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                try:
                    probe.connect(name)
                    return True
                except OSError:
                    return False

        assert _wait(listening)
        assert subprocess.run(SERVER + [str(jvm.pid)], timeout=60).returncode == 0
        assert server.poll() is None
        assert _request(name, "os") == b""
        assert server.poll() is None
        jvm.kill()
        jvm.wait()
        assert server.wait(timeout=10) == 0
    finally:
        for proc in (jvm, server):
            if proc.poll() is None:
                proc.kill()


def test_switched_off_the_launcher_keeps_its_module(monkeypatch):
    """``SPARK_CHANGELOG_DRIVER_FORKS=0``: no hand-over (the launcher runs
    the module itself) and no server started."""
    from spark_changelog.runtime import driver_worker_forks as forks
    monkeypatch.setenv(forks.SWITCH, "0")
    started = []
    monkeypatch.setattr(forks, "start", lambda *args: started.append(args))
    a, b = socket.socketpair()
    with a, b:
        assert forks.hand_over(PRE_INIT, a, sys.path) is None
    assert started == []
    monkeypatch.setenv(forks.SWITCH, "1")
    assert forks.enabled()


def test_prestart_starts_one_server_per_session_and_forgets_ended_ones(spark):
    """Before a local streaming query: one server for the session's JVM,
    listening once imported, not started again while it runs; a server
    that has ended (its JVM gone) is reaped and forgotten."""
    from spark_changelog.runtime import driver_worker_forks as forks
    ended = subprocess.Popen(["true"])
    ended.wait()
    forks._STARTED[-1] = ended
    from spark_changelog.runtime.worker_launcher import launcher
    forks.prestart(spark, launcher())
    forks.prestart(spark, launcher())
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    assert set(forks._STARTED) == {jvm_pid}
    server = forks._STARTED[jvm_pid]
    assert server.poll() is None

    def listening() -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(address(jvm_pid))
                return True
            except OSError:
                return False

    assert _wait(listening)
