"""Building a Spark session that works for changelog pipelines.

Local Spark is the embedded default; ``master`` and extra ``configs`` pass
through unchanged, so the same code runs on a cluster (docs/deploy.md).
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
from typing import Callable, Mapping, Optional

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: Hadoop's local file system for FileContext (Spark's checkpoint file
#: manager) without checksum files; Hadoop's default is ``LocalFs``
RAW_LOCAL_FS = "org.apache.hadoop.fs.local.RawLocalFs"

DEFAULT_CONFIGS = {
    # transformWithState needs RocksDB; it is also the provider whose checkpoints
    # are incremental (changelog checkpointing), so state size does not dictate
    # checkpoint cost.
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    # Checkpoint files on the local file system (``file:``) are written by
    # Hadoop's raw local file system, without a ``.crc`` file beside each:
    # without Hadoop's native library every file and rename costs child
    # processes (chmod, readlink) of the JVM, and the .crc doubled them.
    # Crash safety is the rename of a finished temporary file (unchanged);
    # the state files carry their own checksums (LZ4 blocks, zip entries,
    # RocksDB's tables), and the .crc's own rename was a second step a kill
    # could split from the file's (docs/runtime.md, "Checkpoint files on the
    # local file system")
    "spark.hadoop.fs.AbstractFileSystem.file.impl": RAW_LOCAL_FS,
    "spark.sql.session.timeZone": "UTC",
    # CAST fails on a value it cannot convert, as in Flink (TRY_CAST gives
    # NULL); without ANSI mode CAST would silently give NULL (docs/sql.md,
    # "Expressions and functions").  Spark 4's default, set against a
    # cluster's defaults that turn it off
    "spark.sql.ansi.enabled": "true",
    # An integer literal in DECIMAL arithmetic is typed as Flink types it (INT
    # is DECIMAL(10, 0)), not by its digits: CAST(x AS DECIMAL(5, 1)) / 2 is
    # DECIMAL(16, 12) in both (statements.json C2); Spark's default gave (10, 6)
    "spark.sql.legacy.literal.pickMinimumPrecision": "false",
    # A JSON object with a repeated key is read with its last value, as
    # Flink's debezium-json/canal-json/maxwell-json read it; by default the
    # VARIANT path (parse_json, which reads this when the query is planned)
    # makes such a line a dead letter, while the line task's Arrow parse
    # takes it when the repeat is in a field it skips (docs/sql.md,
    # "Repeated keys")
    "spark.sql.variant.allowDuplicateKeys": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # a cluster's defaults; a local master gets one per core (build_session)
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.sql.adaptive.enabled": "false",
    "spark.driver.memory": "4g",
    "spark.python.worker.reuse": "true",
    # The JIT leaves methods over 8000 bytecode bytes interpreted; Spark's
    # whole-stage code for the readers' validation is larger, and interpreted
    # it cost ~25% more CPU (docs/runtime.md, "Fixed costs of every process")
    "spark.driver.extraJavaOptions": "-XX:-DontCompileHugeMethods",
    "spark.executor.extraJavaOptions": "-XX:-DontCompileHugeMethods",
}

#: The driver JVM's options when it runs the job itself (a ``local`` master):
#: only the JIT's quick tier.  Its optimizing tier spent 16-24 CPU seconds
#: compiling Spark's code in every process, while a whole 1M-event job took
#: 45 CPU seconds; without it the same job takes 30, and the 2M-event job
#: 46 instead of 58 (docs/runtime.md, "Fixed costs of every process").
#: Executors of a cluster live longer and keep the default.
LOCAL_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:-DontCompileHugeMethods"

#: Local runs only (their workers see this interpreter's packages; a
#: cluster's executors may get the package later, with ``--py-files``):
#: PySpark's daemon, importing PySpark from the installed package rather
#: than its zip (runtime/worker_daemon.py): ~1.5 s less per new worker.
#: Checkpoint files keep Spark's default manager (FileContext renames with
#: OVERWRITE): a micro-batch replayed after a crash must replace the state
#: files its killed attempt wrote.  Hadoop's FileSystem-based manager, faster
#: locally, silently keeps the old file instead (docs/runtime.md, "The
#: checkpoint file manager replaces files").
LOCAL_CONFIGS = {"spark.driver.extraJavaOptions": LOCAL_JAVA_OPTIONS,
                 "spark.python.daemon.module": "spark_changelog.runtime.worker_daemon"}

#: A command's local session (``SessionStart(command=True)``: the CLI, the
#: demo, which run only our jobs) does not load the session extensions that
#: jars register through Java's ``ServiceLoader``
#: (``SparkSessionExtensionsProvider``).  PySpark's only one is MLlib's
#: ``InternalFunctionRegistration``, which registers ``vector_to_array``,
#: ``array_to_vector`` and ``aggregate_metrics``, resolving their types
#: through Scala reflection while the JVM's ``SparkSession`` is created, on
#: the serial path of every process (docs/runtime.md, "Fixed costs of every
#: process").  Extensions named in ``spark.sql.extensions`` still load.
#: MLlib's own functions of those names (Python's ``pyspark.ml.functions``
#: too) call them by name, so they fail in such a session: a session built
#: by ``build_session`` (the Python API, a notebook that may run MLlib) and a
#: Spark Connect server (its ML clients call them) keep Spark's default.
COMMAND_LOCAL_CONFIGS = {"spark.sql.extensions.test.loadFromCp": "false"}


def local_cores(master: str) -> Optional[int]:
    """The worker threads of a ``local``, ``local[N]``, ``local[*]`` or
    ``local[N,F]`` master; None for anything else (``local-cluster[...]``)."""
    m = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master.strip())
    if not m:
        return None
    if not m.group(1):
        return 1
    return (os.cpu_count() or 1) if m.group(1) == "*" else int(m.group(1))


def spark_log_path() -> str:
    """Where the JVM's and its Python workers' own output goes:
    ``$SPARK_CHANGELOG_LOG``, else ``<tmp>/spark-changelog.log``."""
    return os.environ.get("SPARK_CHANGELOG_LOG") or os.path.join(tempfile.gettempdir(),
                                                                 "spark-changelog.log")


@contextlib.contextmanager
def native_stderr_to_log():
    """While a sink writes, file descriptor 2 points at the log file: a
    native library's own lines (deltalake's Rust runtime prints a panic line
    when the disk fills up mid-write, before its error reaches us) go there,
    not on the user's terminal; the error itself is reported as one message
    (docs/errors.md).  Python's ``sys.stderr`` is flushed first, so nothing
    written before moves."""
    try:
        fd = os.open(spark_log_path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def build_session(app_name: str = "spark-changelog", master: Optional[str] = None,
                  configs: Optional[Mapping[str, str]] = None, remote: Optional[str] = None):
    """Create (or get) a SparkSession with the project's defaults.

    ``remote`` (or ``$SPARK_REMOTE`` when no master is given): a Spark
    Connect URL (``sc://host:port``); the session is a Connect client
    (:func:`build_connect_session`, docs/deploy.md "Spark Connect").
    Otherwise a classic session on ``master``.  Python workers must run this
    interpreter: otherwise they start the system Python and fail with "No
    module named pandas".  The JVM's and the workers' own output goes to
    :func:`spark_log_path`, not the terminal.
    """
    return SessionStart(app_name, master, configs, remote, background=False).session()


class SessionStart:
    """A session being built while its caller does other work: the JVM's
    start and Spark's context take 2-3 s in which the driver's Python would
    idle, and a command has 1 s or more of its own Python to do before it
    needs the session (its imports, the script's parse; docs/runtime.md,
    "Before the query starts").

    The constructor does what :func:`build_session` does before Spark
    starts (the master, the configs, the workers' interpreter; a usage error
    is raised here), then, for a classic session whose JVM this process
    starts, starts the JVM and builds the session in a thread of its own.
    The modules that thread would import once the JVM is up (pandas among
    them: py4j's converters import it at the first call) are imported here,
    in the caller's thread, while the JVM starts, and the thread waits for
    them: two threads importing one package by different modules can see it
    half initialised.  :meth:`session` returns the session (or raises the
    error of its start).  :meth:`cancel` (the caller failed before it took
    the session: a bad script, Ctrl-C) ends the JVM being started, so a
    failed command leaves no JVM behind; as a context manager, an error
    inside the block cancels.  A Spark Connect session, or a process
    started by ``spark-submit`` (its JVM exists), is built by
    :meth:`session`, in the caller's thread, as before.  ``command``: the
    session of one of our commands, which runs only our jobs (a local one
    gets :data:`COMMAND_LOCAL_CONFIGS` under ``configs``)."""

    def __init__(self, app_name: str = "spark-changelog", master: Optional[str] = None,
                 configs: Optional[Mapping[str, str]] = None, remote: Optional[str] = None,
                 background: bool = True, command: bool = False):
        master = master or os.environ.get("SPARK_CHANGELOG_MASTER")
        remote = remote or (None if master else os.environ.get("SPARK_REMOTE"))
        self._spark = self._error = self._thread = self._proc = None
        self._done, self._cancelled, self._handed = threading.Event(), False, False
        if remote:
            if master:
                from ..model.errors import UsageError
                raise UsageError(f"both a master ({master}) and a Spark Connect URL ({remote}) given",
                                 todo="give one: --master URL for a classic session, --remote "
                                      "sc://... (or SPARK_REMOTE) for Spark Connect")
            self._build = lambda before_context: build_connect_session(remote, app_name, configs)
            return
        options = _classic_options(app_name, master, configs, command)
        self._build = lambda before_context: _classic_session(options, before_context, self._launched)
        from pyspark import SparkContext
        if not background or SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
            return
        # what the thread imports before its JVM is up, imported here first
        import pyspark.java_gateway  # noqa: F401
        import pyspark.sql  # noqa: F401
        imported = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(imported.wait,), daemon=True,
                                        name="spark-changelog-session")
        self._thread.start()
        try:
            _import_session_modules()
        except BaseException:       # Ctrl-C: not yet in the caller's ``with``
            self.cancel()
            raise
        finally:
            imported.set()

    def _run(self, before_context: Callable[[], None]) -> None:
        try:
            self._spark = self._build(before_context)
        except BaseException as err:    # noqa: BLE001 - raised again by session()
            self._error = err
        finally:
            self._done.set()

    def _launched(self, proc) -> None:
        """The JVM runs (``proc``): a cancelled start ends it here."""
        self._proc = proc
        if self._cancelled:
            _end_processes([proc.pid])
            raise _Cancelled()

    def session(self):
        """The session, once built (the caller waits for it here)."""
        if self._thread is None:
            if self._spark is None:
                self._spark = self._build(None)
            return self._spark
        self._done.wait()
        self._handed = True
        if self._error is not None:
            raise self._error
        if threading.current_thread() is threading.main_thread():
            _cancel_jobs_on_ctrl_c(self._spark)
        return self._spark

    def cancel(self) -> None:
        """The caller failed before it took the session: end the JVM being
        started (and the session, if it is up already)."""
        if self._thread is None or self._cancelled or self._handed:
            return
        self._cancelled = True
        if not self._done.is_set():
            # the JVM is a child of the session's thread from its launch on
            _end_processes(_thread_children(self._thread.native_id))
        self._thread.join(timeout=30)
        if self._spark is not None:
            self._spark.stop()
        if self._proc is not None:
            if self._proc.poll() is None:
                _end_processes([self._proc.pid])
            from pyspark import SparkContext
            gateway = SparkContext._gateway
            if gateway is not None and getattr(gateway, "proc", None) is self._proc:
                # a later session of this process starts its own JVM
                with SparkContext._lock:
                    SparkContext._gateway = SparkContext._jvm = SparkContext._active_spark_context = None
                with contextlib.suppress(Exception):
                    gateway.close()

    def __enter__(self) -> "SessionStart":
        return self

    def __exit__(self, kind, err, tb) -> None:
        if kind is not None:
            self.cancel()


class _Cancelled(Exception):
    """The session's start was cancelled (:meth:`SessionStart.cancel`)."""


def _classic_options(app_name: str, master: Optional[str],
                     configs: Optional[Mapping[str, str]], command: bool = False) -> dict:
    """A classic session's settings (``spark.app.name``, ``spark.master``
    and the rest), for ``master`` (None: ``local[2]``, unless
    ``spark-submit`` started this process and brings its own); ``command``:
    a command's session (:class:`SessionStart`)."""
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if not master and "PYSPARK_GATEWAY_PORT" not in os.environ:
        # not launched by spark-submit (which brings its own master): run locally
        master = "local[2]"
    _set_worker_python(bool(master and master.startswith("local")))
    merged = dict(DEFAULT_CONFIGS)
    if master and master.startswith("local"):
        merged.update(LOCAL_CONFIGS)
        if command:
            merged.update(COMMAND_LOCAL_CONFIGS)
        # Spark's classes mapped from the environment's class archive, when
        # scripts/setup built one (runtime/class_archive.py)
        from .class_archive import driver_class_path, java_option
        merged["spark.driver.extraJavaOptions"] = f"{LOCAL_JAVA_OPTIONS} {java_option()}".strip()
        if driver_class_path():
            # unsigned copies of PySpark's signed jars, first: their classes
            # archived, not digested at every load (runtime/class_archive.py)
            merged["spark.driver.extraClassPath"] = driver_class_path()
        # one task per core: fewer tasks per stage, each with its fixed cost
        # (a stateful task's state-store load and commit, a Python worker's
        # round trips); the demo's job 14.6-16.8 s with 4 on 2 cores, 12.2-13.7 s
        # with 2 (docs/runtime.md, "Fixed costs of every process")
        cores = local_cores(master)
        if cores:
            merged["spark.sql.shuffle.partitions"] = merged["spark.default.parallelism"] = str(cores)
    merged["spark.pyspark.python"] = sys.executable
    merged["spark.pyspark.driver.python"] = sys.executable
    merged.update(configs or {})
    return {"spark.app.name": app_name, **({"spark.master": master} if master else {}), **merged}


def _classic_session(options: Mapping[str, str], before_context: Optional[Callable[[], None]] = None,
                     launched: Optional[Callable] = None):
    """The classic session with ``options``; its JVM started here unless it
    runs already.  ``before_context()`` runs once the JVM is up, before
    Spark's context is created; ``launched(proc)`` with the JVM's process."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    # pyspark itself turns any session into a Connect client while SPARK_REMOTE is set
    saved_remote = os.environ.pop("SPARK_REMOTE", None)
    try:
        if SparkContext._gateway is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
            _launch_jvm(options, launched)
        if before_context is not None:
            before_context()
        spark = SparkSession.builder.config(map=dict(options)).getOrCreate()
    finally:
        if saved_remote is not None:
            os.environ["SPARK_REMOTE"] = saved_remote
    spark.sparkContext.setLogLevel("ERROR")
    quiet_pyspark_loggers()
    return spark


def _launch_jvm(options: Mapping[str, str], launched: Optional[Callable] = None) -> None:
    """Start the driver JVM (PySpark's ``launch_gateway``: ``spark-submit``
    with ``options`` as its ``--conf``s, what ``getOrCreate`` would start)
    with its output, and so that of every Python worker it spawns, in
    :func:`spark_log_path`, not on the user's terminal (log4j's start-up
    lines, transformWithState's workers' progress lines).  ``launched(proc)``
    sees its process first; then the gateway becomes the one ``getOrCreate``
    uses."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    try:
        log = open(spark_log_path(), "ab")
    except OSError:
        log = None
    try:
        output = {"stdout": log, "stderr": log} if log is not None else {}
        gateway = launch_gateway(SparkConf().setAll(list(options.items())), popen_kwargs=output)
    finally:
        if log is not None:
            log.close()
    if launched is not None:
        launched(gateway.proc)
    SparkContext._ensure_initialized(gateway=gateway)


def _import_session_modules() -> None:
    """What the session's thread would import once its JVM is up: PySpark's
    SQL session and py4j's converters (``NumpyArrayConverter`` imports
    ``pyspark.testing.utils``, and with it pandas), the loggers' class."""
    import pyspark.logger.worker_io  # noqa: F401
    import pyspark.sql.session  # noqa: F401
    import pyspark.testing.utils  # noqa: F401


def _cancel_jobs_on_ctrl_c(spark) -> None:
    """What PySpark's context does when it is created in the main thread
    (only there may a signal handler be set): Ctrl-C cancels the running
    jobs, then raises KeyboardInterrupt."""
    def on_sigint(signum, frame):
        try:
            spark.sparkContext.cancelAllJobs()
        finally:
            raise KeyboardInterrupt()
    signal.signal(signal.SIGINT, on_sigint)


def _thread_children(native_id: Optional[int]) -> list:
    """The processes a thread of this process started, and theirs (Linux)."""
    return [] if native_id is None else _descendants(f"/proc/self/task/{native_id}/children")


def _descendants(children_file: str) -> list:
    """The processes a ``/proc/.../children`` file lists, and theirs."""
    try:
        with open(children_file) as fh:
            pids = [int(p) for p in fh.read().split()]
    except OSError:
        return []
    return pids + [d for p in pids for d in _children(p)]


def _children(pid: int) -> list:
    """The processes the main thread of ``pid`` started, and theirs (Linux)."""
    return _descendants(f"/proc/{pid}/task/{pid}/children")


def _end_processes(pids: list, wait: float = 5.0) -> None:
    """SIGTERM ``pids`` (a JVM runs its shutdown hooks: Spark removes its
    temporary directories), SIGKILL those still running after ``wait`` s."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + wait
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _running(p)]
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _running(pid: int) -> bool:
    """``pid`` runs: it exists and has not ended (a child that ended stays
    a zombie until its ``Popen`` reaps it)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _set_worker_python(local: bool) -> None:
    """``PYSPARK_PYTHON``, the interpreter of the Python processes Spark
    starts, unless the user set one: on a local master the launcher of
    :mod:`.worker_launcher` (this interpreter, PySpark imported from the
    package, not its zip), otherwise this interpreter."""
    from .worker_launcher import launcher
    current = os.environ.get("PYSPARK_PYTHON")
    ours = launcher() if local else sys.executable
    if current is None or current in (sys.executable, launcher()):
        os.environ["PYSPARK_PYTHON"] = ours


#: what a Connect client sets on its server session: the SQL settings of
#: DEFAULT_CONFIGS that a session may change.  The rest (the state store
#: provider, memory, the Python workers' interpreter, JVM options) belongs
#: to the server's own configuration (docs/deploy.md, "Spark Connect").
CONNECT_SESSION_CONFIGS = {k: v for k, v in DEFAULT_CONFIGS.items()
                           if k.startswith("spark.sql.") and k != "spark.sql.streaming.stateStore.providerClass"}


def build_connect_session(remote: str, app_name: str = "spark-changelog",
                          configs: Optional[Mapping[str, str]] = None):
    """A Spark Connect client session on ``remote`` (``sc://host:port``) with
    :data:`CONNECT_SESSION_CONFIGS` and ``configs`` set as session settings.

    The server must run RocksDB state stores (``transformWithState`` needs
    them; a server's static setting): checked here, so a run does not fail
    later inside its first stateful micro-batch."""
    from pyspark.sql import SparkSession
    from ..model.errors import UsageError

    try:
        # pyspark's own builder (not the Connect module's): it also switches
        # pyspark's functions (types from DDL, column functions) to Connect
        spark = SparkSession.builder.remote(remote).getOrCreate()
    except Exception as err:    # noqa: BLE001 - a bad URL or unreachable server: one clear message
        raise UsageError(f"cannot connect to Spark Connect at {remote}: {str(err).splitlines()[0]}",
                         todo="give the URL of a running Spark Connect server (sc://host:15002)") from err
    provider = spark.conf.get("spark.sql.streaming.stateStore.providerClass", None)
    if provider != ROCKSDB_PROVIDER:
        raise UsageError(f"the Spark Connect server at {remote} runs the state store {provider}",
                         todo=f"start it with --conf spark.sql.streaming.stateStore.providerClass="
                              f"{ROCKSDB_PROVIDER}")
    settings = dict(CONNECT_SESSION_CONFIGS)
    settings.update(configs or {})
    for k, v in settings.items():
        spark.conf.set(k, v)
    quiet_pyspark_loggers()
    return spark


#: Spark's message when a Python process it started on the driver did not
#: connect back in time: ``PythonWorkerFactory.createSimpleWorker`` waits a
#: fixed 10 s (a constant in Spark 4.3, no setting) for the foreachBatch
#: process of a Spark Connect query and for transformWithState's pre-init
#: process of each stateful operator, both started when a query starts
PYTHON_START_TIMEOUT = "Python worker failed to connect back"
#: how many times a streaming query is started when its start fails that way
QUERY_START_ATTEMPTS = 3


def python_start_timed_out(err: BaseException) -> bool:
    """``err`` (or an error it wraps) is Spark's :data:`PYTHON_START_TIMEOUT`."""
    seen = 0
    while err is not None and seen < 10:
        if PYTHON_START_TIMEOUT in str(err):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


class QueryStarts:
    """Starting a streaming query again when Spark's Python process did not
    connect back within Spark's fixed 10 s: the process imports PySpark and
    its dependencies before it connects (0.7 s of CPU for the foreachBatch
    process of a Spark Connect query), and a driver host short of CPU takes
    longer than that (docs/deploy.md, "Spark Connect").  The query resumes
    from its checkpoint, so a start again is exactly a restart; at most
    :data:`QUERY_START_ATTEMPTS` starts in all."""

    def __init__(self, attempts: int = QUERY_START_ATTEMPTS):
        self.left = attempts - 1

    def start(self, start: Callable):
        """``start()``, again while it fails with the time-out and starts are left."""
        while True:
            try:
                return start()
            except Exception as err:
                if not self.again(err):
                    raise

    def again(self, err: BaseException) -> bool:
        """The query failed with ``err``: may it be started again (counted)?"""
        if self.left <= 0 or not python_start_timed_out(err):
            return False
        self.left -= 1
        logging.getLogger("spark_changelog").warning(
            "a Python process Spark started did not connect back within Spark's fixed 10 s "
            "(the driver's host is short of CPU); starting the query again from its checkpoint")
        return True


def quiet_pyspark_loggers() -> list:
    """PySpark logs every analysis exception it converts, on the terminal,
    with extra fields only its own logger class accepts: create those loggers
    as that class (a plain ``logging.Logger`` of the same name fails with
    ``Logger._log() got an unexpected keyword argument 'errorClass'``) and send
    them to the log file instead of the terminal."""
    from pyspark.logger import PySparkLogger
    loggers = []
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        existing = logging.Logger.manager.loggerDict.get(name)
        if isinstance(existing, logging.Logger) and not isinstance(existing, PySparkLogger):
            del logging.Logger.manager.loggerDict[name]
        lg = PySparkLogger.getLogger(name)
        for h in list(lg.handlers):
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                lg.removeHandler(h)
        if not any(isinstance(h, logging.FileHandler) for h in lg.handlers):
            try:
                lg.addHandler(logging.FileHandler(spark_log_path(), delay=True))
            except OSError:
                lg.disabled = True
        lg.propagate = False
        loggers.append(lg)
    return loggers
