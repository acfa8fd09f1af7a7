"""A throw-away PostgreSQL server for the tests (and a session fixture for it).

``PgServer`` runs ``initdb`` + ``pg_ctl start`` in a fresh temporary directory,
listening on a free port of 127.0.0.1 only, with trust authentication,
``wal_level=logical`` (logical replication sources) and ``fsync``/``full_page_writes``
off for speed (``synchronous_commit`` stays on: a killed server loses no commit).  Stopping it
(``pg_ctl stop -m fast``) deletes the directory; this also happens when the
session fails, and from ``atexit`` as a last resort.

PostgreSQL refuses to run as root.  When the tests run as root the server's
processes run as the ``postgres`` system user (``subprocess`` ``user=``/``group=``,
no ``preexec_fn``) in a directory owned by that user; otherwise they run as the
current user.

Binaries: ``$PG_BINDIR`` if set, else ``/usr/lib/postgresql/15/bin`` (Debian's
``postgresql-15`` package), else the newest ``/usr/lib/postgresql/*/bin``, else
``pg_ctl`` on ``PATH``.  Setting ``SPARK_CHANGELOG_PG_CONNINFO`` to a conninfo
string skips all this and uses that server instead (it needs
``wal_level=logical`` for the replication tests).

Use in ``tests/conftest.py``::

    from pgserver import pg_server  # noqa: F401  (session fixture)

A test then asks for ``pg_server`` and uses ``pg_server.conninfo`` (or
``pg_server.create_database(name)`` for a database of its own).
"""
from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Optional

import pytest

PG_VERSION = "15"
DEFAULT_BINDIR = f"/usr/lib/postgresql/{PG_VERSION}/bin"
TEST_USER = "spark_changelog"
TEST_DB = "spark_changelog_test"
INSTALL_HINT = (f"install it with: apt-get install -y --no-install-recommends postgresql-{PG_VERSION} "
                "(or set PG_BINDIR to a directory holding initdb/pg_ctl/postgres, or "
                "SPARK_CHANGELOG_PG_CONNINFO to an existing server)")


class PgServerError(RuntimeError):
    pass


def find_bindir() -> str:
    """Directory holding ``initdb``, ``pg_ctl`` and ``postgres``; a clear error if none."""
    candidates = []
    if os.environ.get("PG_BINDIR"):
        candidates.append(os.environ["PG_BINDIR"])
    candidates.append(DEFAULT_BINDIR)

    def version_key(path: str) -> tuple:
        m = re.search(r"/postgresql/(\d+)/bin$", path)
        return (int(m.group(1)) if m else 0,)

    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version_key, reverse=True)
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(os.path.dirname(on_path))
    for d in candidates:
        if all(os.access(os.path.join(d, exe), os.X_OK) for exe in ("initdb", "pg_ctl", "postgres")):
            return d
    raise PgServerError(
        f"PostgreSQL server binaries (initdb, pg_ctl, postgres) not found in {candidates}; " + INSTALL_HINT)


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """One private PostgreSQL instance.  ``start()``/``stop()``, or use as a context manager."""

    def __init__(self, bindir: Optional[str] = None, *, user: str = TEST_USER, dbname: str = TEST_DB,
                 settings: Optional[dict] = None, start_timeout_s: float = 60.0):
        self.bindir = bindir or find_bindir()
        self.user = user
        self.dbname = dbname
        self.host = "127.0.0.1"
        self.port: Optional[int] = None
        self.base: Optional[str] = None
        self.start_timeout_s = start_timeout_s
        self.settings = {
            "listen_addresses": "'127.0.0.1'",
            "wal_level": "logical",
            "max_wal_senders": "10",
            "max_replication_slots": "10",
            "max_connections": "100",
            # fsync off: commits reach the OS page cache only, which survives any crash of the
            # server's processes (not of the machine).  synchronous_commit stays on, else an
            # immediate shutdown would lose the last commits and break exactly-once tests.
            "fsync": "off",
            "full_page_writes": "off",
            "shared_buffers": "128MB",
            "max_wal_size": "2GB",
            "log_min_messages": "warning",
            "logging_collector": "off",
        }
        self.settings.update(settings or {})
        self._run_as: Optional[pwd.struct_passwd] = None
        if os.geteuid() == 0:
            try:
                self._run_as = pwd.getpwnam("postgres")
            except KeyError:
                raise PgServerError("running as root, but there is no 'postgres' system user to run "
                                    "the server as; " + INSTALL_HINT) from None
        self._started = False

    # -- paths / conninfo --------------------------------------------------
    @property
    def datadir(self) -> str:
        return os.path.join(self.base, "data")

    @property
    def logfile(self) -> str:
        return os.path.join(self.base, "server.log")

    @property
    def conninfo(self) -> str:
        return self.conninfo_for(self.dbname)

    def conninfo_for(self, dbname: str) -> str:
        return f"host={self.host} port={self.port} user={self.user} dbname={dbname}"

    # -- process helpers ---------------------------------------------------
    def _run(self, args: list[str], *, timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess:
        kwargs = {}
        if self._run_as is not None:
            kwargs = dict(user=self._run_as.pw_uid, group=self._run_as.pw_gid, extra_groups=[])
        env = dict(os.environ, LC_ALL="C", LANG="C")
        if self._run_as is not None:
            env.update(HOME=self.base, USER="postgres", LOGNAME="postgres")
        proc = subprocess.run(args, cwd=self.base, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout, **kwargs)
        if check and proc.returncode != 0:
            raise PgServerError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
                                f"{self._log_tail()}")
        return proc

    def _log_tail(self, n: int = 40) -> str:
        try:
            with open(self.logfile, encoding="utf-8", errors="replace") as f:
                return "\nserver log:\n" + "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def _exe(self, name: str) -> str:
        return os.path.join(self.bindir, name)

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> "PgServer":
        self.base = tempfile.mkdtemp(prefix="spark-changelog-pg-")
        try:
            if self._run_as is not None:
                os.chown(self.base, self._run_as.pw_uid, self._run_as.pw_gid)
            os.chmod(self.base, 0o700)
            self._run([self._exe("initdb"), "-D", self.datadir, "-U", self.user, "--auth=trust",
                       "-E", "UTF8", "--no-locale", "--no-sync"])
            with open(os.path.join(self.datadir, "postgresql.conf"), "a", encoding="utf-8") as f:
                f.write("\n# spark-changelog test server\n")
                for k, v in self.settings.items():
                    f.write(f"{k} = {v}\n")
                f.write(f"unix_socket_directories = '{self.base}'\n")
            last_error: Optional[Exception] = None
            for _ in range(5):  # a port picked as free may be taken before the server binds it
                self.port = free_port()
                proc = self._run([self._exe("pg_ctl"), "-D", self.datadir, "-l", self.logfile, "-w",
                                  "-t", str(int(self.start_timeout_s)), "-o", f"-p {self.port}", "start"],
                                 timeout=self.start_timeout_s + 30, check=False)
                if proc.returncode == 0:
                    break
                last_error = PgServerError(f"pg_ctl start failed:\n{proc.stdout}\n{proc.stderr}{self._log_tail()}")
                if "already in use" not in self._log_tail():
                    raise last_error
            else:
                raise last_error  # type: ignore[misc]
            self._started = True
            atexit.register(self.stop)
            self._wait_ready()
            self.create_database(self.dbname)
            return self
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        import psycopg

        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                with psycopg.connect(self.conninfo_for("postgres"), connect_timeout=5) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as e:
                if time.monotonic() > deadline:
                    raise PgServerError(f"server on port {self.port} does not accept connections: {e}"
                                        f"{self._log_tail()}") from e
                time.sleep(0.1)

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete its directory.  Idempotent."""
        base, self.base = self.base, None
        if base is None:
            return
        try:
            if self._started and os.path.exists(os.path.join(base, "data", "postmaster.pid")):
                self.base = base  # for _run's cwd
                try:
                    self._run([self._exe("pg_ctl"), "-D", os.path.join(base, "data"), "-m", "fast", "-w",
                               "-t", "60", "stop"], timeout=90, check=False)
                except Exception:
                    pass
                finally:
                    self.base = None
                self._kill_leftover(os.path.join(base, "data", "postmaster.pid"))
        finally:
            self._started = False
            shutil.rmtree(base, ignore_errors=True)
            with contextlib.suppress(Exception):
                atexit.unregister(self.stop)

    @staticmethod
    def _kill_leftover(pidfile: str) -> None:
        """If pg_ctl could not stop the postmaster, kill it (immediate shutdown, then SIGKILL)."""
        try:
            with open(pidfile, encoding="utf-8") as f:
                pid = int(f.readline().strip())
        except (OSError, ValueError):
            return
        for sig, wait in ((signal.SIGQUIT, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.05)

    # -- server restarts (for tests of connection loss) -----------------------
    def shutdown(self, mode: str = "fast") -> None:
        """Stop the server process but keep its data directory (see :meth:`restart`)."""
        self._run([self._exe("pg_ctl"), "-D", self.datadir, "-m", mode, "-w", "-t", "60", "stop"], timeout=90)

    def restart(self) -> None:
        """Start the server again after :meth:`shutdown`, on the same port."""
        self._run([self._exe("pg_ctl"), "-D", self.datadir, "-l", self.logfile, "-w",
                   "-t", str(int(self.start_timeout_s)), "-o", f"-p {self.port}", "start"],
                  timeout=self.start_timeout_s + 30)
        self._wait_ready()

    # -- conveniences ------------------------------------------------------
    def create_database(self, name: str) -> str:
        """Create a fresh database (dropping one of that name) and return its conninfo."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.conninfo_for("postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.conninfo_for(name)

    def __enter__(self) -> "PgServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ExternalPgServer:
    """``SPARK_CHANGELOG_PG_CONNINFO``: an already running server (nothing to start or stop)."""

    def __init__(self, conninfo: str):
        from psycopg.conninfo import conninfo_to_dict

        self._params = conninfo_to_dict(conninfo)
        self.host = self._params.get("host", "localhost")
        self.port = int(self._params.get("port", 5432))
        self.user = self._params.get("user")
        self.dbname = self._params.get("dbname", "postgres")

    @property
    def conninfo(self) -> str:
        return self.conninfo_for(self.dbname)

    def conninfo_for(self, dbname: str) -> str:
        from psycopg.conninfo import make_conninfo

        return make_conninfo(**dict(self._params, dbname=dbname))

    def create_database(self, name: str) -> str:
        return PgServer.create_database(self, name)  # type: ignore[arg-type]

    def stop(self) -> None:
        pass


@pytest.fixture(scope="session")
def pg_server():
    """A running PostgreSQL 15 server for the whole test session (see module docstring)."""
    external = os.environ.get("SPARK_CHANGELOG_PG_CONNINFO")
    if external:
        yield ExternalPgServer(external)
        return
    try:
        server = PgServer()
    except PgServerError as e:
        pytest.fail(str(e), pytrace=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()
