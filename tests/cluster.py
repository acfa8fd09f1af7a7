"""Real Spark deployments on this machine, started from the PySpark
installation, for the scale-out tests (docs/deploy.md describes the same
steps for a user's cluster):

* :class:`StandaloneCluster`: a standalone master and workers, each its own
  JVM (``spark-class org.apache.spark.deploy.master.Master`` / ``...Worker``),
  each worker launching its own executor JVM and Python workers; a
  ``spark://`` URL.
* :class:`ConnectServer`: a Spark Connect server
  (``org.apache.spark.sql.connect.service.SparkConnectServer`` through
  ``spark-submit``, as ``sbin/start-connect-server.sh`` does); an ``sc://`` URL.

Jobs reach them as users' jobs do: the ``spark-changelog`` CLI in its own
process with ``--master spark://...`` or ``--remote sc://...``.  The package
goes to the executors as a zip on ``spark.submit.pyFiles``
(:func:`package_zip`); the executors' Python is :func:`node_python`, an
interpreter with the pinned dependencies and without this package, standing
for the same requirements installed on every node.

Every process is started in its own process group, with the kernel told to
SIGKILL it when the test process dies (``PR_SET_PDEATHSIG``); ``stop`` kills
the groups (a worker's group holds its executor and Python workers), and the
pytest fixtures call it in ``finally``, so nothing outlives a failed test.
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time

import pandas as pd
import pyspark
import pytest

SPARK_HOME = os.path.dirname(os.path.realpath(pyspark.__file__))
CLI = os.path.join(os.path.dirname(sys.executable), "spark-changelog")
#: the JVMs' heaps: small, the machine has 2 cores and several users
DAEMON_MEMORY = "256m"
WORKER_MEMORY = "1g"
EXECUTOR_MEMORY = "640m"
#: the executors' Python worker daemon: the package's own
#: (runtime/worker_daemon.py), which imports the package's worker modules and
#: their dependencies once per executor, before it forks the Python workers;
#: found on the path Spark gives the daemon, in the shipped zip that each
#: executor fetches into its working directory (docs/deploy.md)
PRELOADING_DAEMON = {"spark.python.daemon.module": "spark_changelog.runtime.worker_daemon",
                     "spark.executorEnv.PYTHONPATH": "spark_changelog.zip"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the test process dies."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _spawn(args, log_path: str, env: dict) -> subprocess.Popen:
    log = open(log_path, "ab")
    try:
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True, preexec_fn=_die_with_parent)
    finally:
        log.close()


def _kill_group(proc: subprocess.Popen, sig=signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def _wait_for_line(path: str, text: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[-1] if proc.args else proc} exited with {proc.returncode}; "
                               f"see {path}")
        try:
            with open(path, errors="replace") as f:
                if text in f.read():
                    return
        except FileNotFoundError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"no {text!r} in {path} after {timeout_s} s")


def spark_env(**extra) -> dict:
    env = dict(os.environ)
    env.update(SPARK_HOME=SPARK_HOME, SPARK_LOCAL_IP="127.0.0.1", SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
               SPARK_NO_DAEMONIZE="1")
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.pop("SPARK_REMOTE", None)
    env.update(extra)
    return env


def package_zip(directory: str) -> str:
    """The package as a zip for ``--py-files`` / ``spark.submit.pyFiles``,
    what ``spark-changelog package`` writes (docs/deploy.md): sources and
    their bytecode."""
    from spark_changelog.runtime.py_files import write_package_zip
    path = os.path.join(directory, "spark_changelog.zip")
    write_package_zip(path)
    return path


def node_python(directory: str) -> str:
    """A Python for the executors: a virtualenv that sees this environment's
    installed dependencies (a path entry to its site-packages; ``.pth`` files
    there, such as the editable install of this package, are not run) but
    not this package, so the executors can only import it from the shipped
    zip."""
    env = os.path.join(directory, "node-env")
    if not os.path.exists(os.path.join(env, "bin", "python")):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", env], check=True)
        site = subprocess.run([os.path.join(env, "bin", "python"), "-c",
                               "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        with open(os.path.join(site, "project-deps.pth"), "w") as f:
            f.write(sysconfig.get_paths()["purelib"] + "\n")
    python = os.path.join(env, "bin", "python")
    check = subprocess.run([python, "-c", "import pyarrow, pandas, pyspark, deltalake\n"
                            "import importlib.util as u; assert u.find_spec('spark_changelog') is None"],
                           capture_output=True, text=True, cwd=directory)
    if check.returncode:
        raise RuntimeError(f"node Python {python} is not as expected: {check.stderr}")
    return python


class StandaloneCluster:
    """A standalone master and ``workers`` workers (one core each) on
    127.0.0.1, their logs and work directories under ``directory``."""

    def __init__(self, directory: str, workers: int = 2, cores: int = 1):
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.master = None
        self.workers: list[subprocess.Popen] = []
        self.n_workers, self.cores = workers, cores
        self.zip = package_zip(directory)
        self.python = node_python(directory)

    def start(self) -> "StandaloneCluster":
        env = spark_env(SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false")
        log = os.path.join(self.directory, "master.log")
        self.master = _spawn([os.path.join(SPARK_HOME, "bin", "spark-class"),
                              "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                              "--port", str(self.port), "--webui-port", str(free_port())], log, env)
        try:
            _wait_for_line(log, "I have been elected leader", self.master, 180)
            for i in range(self.n_workers):
                self.start_worker(i)
        except BaseException:
            self.stop()
            raise
        return self

    def worker_dir(self, i: int) -> str:
        return os.path.join(self.directory, f"worker-{i}")

    def start_worker(self, i: int) -> None:
        os.makedirs(self.worker_dir(i), exist_ok=True)
        log = os.path.join(self.directory, f"worker-{i}.log")
        with open(log, "a") as f:
            f.write(f"--- start {time.time()}\n")
        offset = os.path.getsize(log)
        proc = _spawn([os.path.join(SPARK_HOME, "bin", "spark-class"),
                       "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                       "--cores", str(self.cores), "--memory", WORKER_MEMORY,
                       "--work-dir", self.worker_dir(i), "--webui-port", str(free_port())],
                      log, spark_env())
        if i < len(self.workers):
            self.workers[i] = proc
        else:
            self.workers.append(proc)
        deadline = time.time() + 180
        while True:
            with open(log, errors="replace") as f:
                f.seek(offset)
                if "Successfully registered with master" in f.read():
                    return
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"worker {i} did not register; see {log}")
            time.sleep(0.2)

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``i``'s whole process group: the worker JVM, its
        executor JVM and their Python workers (a machine lost)."""
        os.killpg(self.workers[i].pid, signal.SIGKILL)
        self.workers[i].wait(timeout=30)

    def job_confs(self) -> dict:
        """What a job on this cluster is given (docs/deploy.md): the package
        zip, the nodes' Python, the preloading daemon, small executors."""
        return {"spark.submit.pyFiles": self.zip,
                "spark.pyspark.python": self.python,
                **PRELOADING_DAEMON,
                "spark.executor.memory": EXECUTOR_MEMORY,
                "spark.executor.cores": str(self.cores),
                "spark.driver.memory": "1g",
                "spark.sql.shuffle.partitions": "4"}

    def cli_args(self) -> list[str]:
        args = ["--master", self.url]
        for k, v in self.job_confs().items():
            args += ["--conf", f"{k}={v}"]
        return args

    def executor_logs(self) -> dict:
        """worker index -> the stderr text of every executor it ran."""
        out = {}
        for i in range(self.n_workers):
            text = ""
            for root, _, files in os.walk(self.worker_dir(i)):
                if "stderr" in files:
                    with open(os.path.join(root, "stderr"), errors="replace") as f:
                        text += f.read()
            out[i] = text
        return out

    def stop(self) -> None:
        for proc in self.workers + ([self.master] if self.master else []):
            _kill_group(proc, signal.SIGKILL)
        self.workers, self.master = [], None


#: the Python a Connect server starts its Python processes with: this
#: environment's (which has the package), through ``spark-changelog-python``,
#: which connects a driver-side process back to Spark before its imports
#: (runtime/worker_launcher.py; docs/deploy.md, "Spark Connect")
SERVER_PYTHON = os.path.join(os.path.dirname(sys.executable), "spark-changelog-python")


class ConnectServer:
    """A Spark Connect server on ``master`` (default ``local[2]``) whose Python
    processes run :data:`SERVER_PYTHON`, logging under ``directory``.  A
    local master gets what ``build_session`` gives one (runtime/session.py,
    ``LOCAL_CONFIGS``: the JIT's quick tier, the preloading worker daemon)."""

    def __init__(self, directory: str, master: str = "local[2]", confs: dict | None = None):
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self.port = free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        self.master, self.confs = master, dict(confs or {})
        self.proc = None

    def start(self) -> "ConnectServer":
        from spark_changelog.runtime.session import DEFAULT_CONFIGS, LOCAL_CONFIGS, ROCKSDB_PROVIDER
        if not os.access(SERVER_PYTHON, os.X_OK):
            raise RuntimeError(f"no {SERVER_PYTHON}: run scripts/setup (it installs the package's scripts)")
        confs = {"spark.connect.grpc.binding.port": str(self.port),
                 "spark.connect.grpc.binding.address": "127.0.0.1",
                 "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
                 "spark.pyspark.python": SERVER_PYTHON,
                 "spark.driver.memory": "1g",
                 "spark.sql.shuffle.partitions": "2",
                 "spark.ui.enabled": "false",
                 "spark.sql.session.timeZone": DEFAULT_CONFIGS["spark.sql.session.timeZone"]}
        if self.master.startswith("local"):
            confs.update(LOCAL_CONFIGS)
        confs.update(self.confs)
        args = [os.path.join(SPARK_HOME, "bin", "spark-submit"), "--master", self.master,
                "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
                "--name", "spark-changelog-connect-test"]
        for k, v in confs.items():
            args += ["--conf", f"{k}={v}"]
        log = os.path.join(self.directory, "connect-server.log")
        self.proc = _spawn(args, log, spark_env(PYSPARK_PYTHON=SERVER_PYTHON, SPARK_DAEMON_MEMORY="1g"))
        try:
            _wait_for_line(log, "Spark Connect server started", self.proc, 240)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is not None:
            _kill_group(self.proc, signal.SIGKILL)
            self.proc = None


def run_cli(args, timeout_s: float = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    """The ``spark-changelog`` CLI as its own process (its own session, so
    several deployments can be tried from one test process)."""
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout_s,
                          env=spark_env(**(env or {})), start_new_session=True)


def start_cli(args, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([CLI, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=spark_env(**(env or {})), start_new_session=True,
                            preexec_fn=_die_with_parent)


# -- the job the tests run on each deployment ------------------------------------
#: the Debezium input of ``spark_changelog.demo.generate_debezium``: one file per micro-batch
ROWS, KEYS, FILES = 6_000, 800, 4


@pytest.fixture(scope="session")
def cdc(tmp_path_factory):
    """The Debezium input of the deployment tests (imported by their modules):
    ``FILES`` files, three bad lines and a tombstone in the last, and its
    expected final table."""
    from spark_changelog.demo import generate_debezium
    directory = str(tmp_path_factory.mktemp("cdc") / "in")
    return directory, generate_debezium(directory, ROWS, KEYS, files=FILES)


def normalize_args(src, out, *, streaming=True, changelog=True) -> list:
    """``spark-changelog normalize`` of the demo's input into ``out``."""
    from spark_changelog.demo import SCHEMA
    args = ["normalize", src, f"{out}/table", "--format", "debezium-json", "--key", "id",
            "--schema", SCHEMA, "--dead-letter", f"{out}/dead"]
    if streaming:
        args += ["--streaming", "--checkpoint", f"{out}/ck", "--max-files-per-trigger", "1"]
    if changelog:
        args += ["--changelog", f"{out}/log"]
    return args


def assert_table(path, expected: pd.DataFrame) -> None:
    """The Delta table at ``path`` holds exactly ``expected``."""
    from spark_changelog.sinks.delta import read_table
    got = read_table(str(path))[list(expected.columns)].sort_values("id").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected.astype(got.dtypes.to_dict()), check_exact=True)


def assert_summary(out: str, batches: int) -> None:
    """The run report's counts as the summary prints them (3 bad lines and a
    tombstone in the input)."""
    assert f"batches: {batches}" in out, out
    assert "invalid rows (dead letter): 3   tombstones skipped: 1" in out, out
    rows_in = int(out.split("changelog rows in: ")[1].split()[0])
    assert rows_in > ROWS, out       # an update is a -U/+U pair


