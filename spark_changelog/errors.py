"""One error model for the whole program (docs/errors.md).

Every failure a person can cause or meet becomes one :class:`UserError`: what
failed, where (table, file, line, column, checkpoint), what to do, and an
exit code.  The command line prints its :meth:`~UserError.render` and writes
the traceback to the log file (``$SPARK_CHANGELOG_LOG``), or to the terminal
with ``--verbose``.

Sorting through what the libraries raise (Spark's error classes of
``AnalysisException`` and ``StreamingQueryException``, Py4J's and the Python
workers' errors, deltalake's, psycopg's and the operating system's) happens
here, in :func:`as_user_error`, and nowhere else.  SQL errors
(:class:`~spark_changelog.sql.errors.SqlError`, with line, column and caret)
are one kind of user error and keep their own rendering.
"""
from __future__ import annotations

import errno
import os
import re
import sys
import traceback
from typing import Optional

from .model.errors import (EXIT_CHECKPOINT, EXIT_DONE, EXIT_INTERRUPTED, EXIT_JOB_FAILED,
                           EXIT_UNSUPPORTED, EXIT_USAGE, CheckpointMismatch, Interrupted, PathError,
                           UsageError, UserError, located)

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


# --------------------------------------------------------------------------- sorting


def as_user_error(err: BaseException) -> UserError:
    """The one place that turns whatever was raised into a :class:`UserError`;
    what a failed script had already written (``_written``, from the SQL
    runner) is added to its detail."""
    user = _as_user_error(err)
    written = getattr(err, "_written", None)
    if written and written not in (user.detail or ""):
        user.detail = f"{user.detail}\n{written}" if user.detail else written
        user.args = (user.render(),)
    return user


def _as_user_error(err: BaseException) -> UserError:
    where = getattr(err, "_where", None)
    facts = getattr(err, "_facts", {}) or {}
    if isinstance(err, UserError):
        if err.where is None and where:
            err.where = where
            err.args = (err.render(),)
        return err
    from .sql.errors import SqlError
    if isinstance(err, SqlError):
        return _SqlUserError(err)
    if isinstance(err, KeyboardInterrupt):
        return Interrupted("stopped by Ctrl-C", where=where)
    for sort in (_sort_ours, _sort_file_type, _sort_spark, _sort_py4j, _sort_delta,
                 _sort_postgres, _sort_os):
        found = sort(err, where, facts)
        if found is not None:
            return found
    if isinstance(err, (ValueError, FileNotFoundError)):
        return UserError(_clean(str(err)), where=where)
    return UserError(f"internal error: {type(err).__name__}: {_first_line(str(err))}",
                     where=where, todo="this is a bug in spark-changelog: please report it with "
                                       f"the traceback from {log_path()}")


class _SqlUserError(UserError):
    """A SQL error (file:line:column, the line and a caret) as a user error."""

    def __init__(self, err):
        from .sql.errors import UnsupportedFeature
        self.sql_error = err
        self.exit_code = getattr(err, "exit_code", EXIT_USAGE)
        self.label = "not supported" if isinstance(err, UnsupportedFeature) else "error"
        super().__init__(str(err))

    def render(self) -> str:
        text = f"{self.label}: {self.sql_error}"
        if self.detail:
            text += "".join(f"\n  {line}" for line in self.detail.splitlines())
        return text


def _first_line(text: str) -> str:
    for line in _ANSI.sub("", text).splitlines():
        if line.strip():
            return line.strip()
    return text.strip()


def _clean(text: str) -> str:
    return _ANSI.sub("", text).strip()


def _sort_ours(err, where, facts) -> Optional[UserError]:
    from .connectors.cdc_json import InvalidChangeError
    from .operators.sink_upsert_materializer import PrimaryKeyConstraintViolation
    if isinstance(err, InvalidChangeError):
        return UserError(_first_line(str(err)), where=where,
                         todo="fix the record, or run without --strict and give --dead-letter DIR "
                              "to set invalid rows aside")
    if isinstance(err, PrimaryKeyConstraintViolation):
        return UserError(_first_line(str(err)), where=where,
                         todo="the sink key is not unique in the query's result: use ON CONFLICT "
                              "DO DEDUPLICATE or NOTHING, or key the sink differently")
    from .sinks.delta import DeltaSinkSchemaError
    if isinstance(err, DeltaSinkSchemaError):
        return UserError(_first_line(str(err)), where=where,
                         todo="write to a new table path, or declare the sink as the table is")
    return None


#: Spark error classes -> (what failed, what to do); ``{0}`` is Spark's message
_SPARK_CLASSES = {
    "PATH_NOT_FOUND": ("input path does not exist: {path}",
                       "check the source's 'path' option (or the input argument)"),
    "CAST_INVALID_INPUT": ("a value does not fit its column's type: {msg}",
                           "CAST it in the query to the sink column's type, or declare the "
                           "column with the type the data has"),
    "CAST_OVERFLOW": ("a value overflows its column's type: {msg}",
                      "declare a wider type, or CAST in the query"),
    "DIVIDE_BY_ZERO": ("division by zero: {msg}", "guard the division, e.g. NULLIF(d, 0)"),
    "ARITHMETIC_OVERFLOW": ("arithmetic overflow: {msg}",
                            "use a wider type (DECIMAL or BIGINT) in the query"),
}

_CHECKPOINT_CLASSES = ("STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA",
                       "STATE_STORE_", "STREAMING_STATE_SCHEMA", "STATEFUL_PROCESSOR_",
                       "CANNOT_LOAD_STATE_STORE", "STDS_")


_PARQUET_MISMATCH = re.compile(
    r"reading file (?:file:(?://)?)?(\S+?)\. Data type mismatches when reading Parquet column "
    r"\[([^\]]+)\]\. Expected Spark type (\S+?), actual Parquet type (\S+?)\.")


def _sort_file_type(err, where, facts) -> Optional[UserError]:
    """A Parquet file whose column cannot be read as the declared type (a
    DECIMAL narrower than the file's; integer and FLOAT columns are read
    wide and checked value by value, docs/runtime.md "Typed files")."""
    m = _PARQUET_MISMATCH.search(str(err))
    if m is None:
        return None
    path, column, declared, physical = m.groups()
    return UserError(f"{path}: column '{column}' is stored as {physical} in the file and cannot "
                     f"be read as the table's {declared.upper()} without changing values",
                     where=where, todo="declare the column with the file's type (or a wider "
                                       "one) and CAST in the query if needed")


def _spark_condition(err) -> Optional[str]:
    get = getattr(err, "getCondition", None) or getattr(err, "getErrorClass", None)
    try:
        cls = get() if get else None
    except Exception:       # noqa: BLE001 -- an exception without a class
        cls = None
    if cls:
        return cls
    m = re.search(r"\[([A-Z][A-Z0-9_]+)(?:\.[A-Z0-9_]+)?\]", str(err))
    return m.group(1) if m else None


def _spark_message(err) -> str:
    text = _clean(str(err))
    text = re.sub(r"\s*SQLSTATE: \w+\.?", "", text)
    first = _first_line(text)
    return re.sub(r"^\[[A-Z0-9_.]+\]\s*", "", first)


def _sort_spark(err, where, facts) -> Optional[UserError]:
    from pyspark.errors import PySparkException
    if not isinstance(err, PySparkException):
        return None
    cls = _spark_condition(err) or ""
    msg = _spark_message(err)
    text = str(err)
    if cls == "STREAM_FAILED":      # the streaming query's wrapper: what failed is inside
        inner = re.search(r"terminated with exception: (?:\[([A-Z][A-Z0-9_]+)(?:\.[A-Z0-9_]+)?\]"
                          r"\s*)?([^\n]*)", _clean(text))
        if inner:
            cls = inner.group(1) or ""
            msg = re.sub(r"\s*SQLSTATE: \w+\.?", "", inner.group(2)).strip()
    worker = _python_worker_error(text)
    if worker is not None:
        return worker if worker.where else _with_where(worker, where)
    if cls.startswith(_CHECKPOINT_CLASSES) or "Wrong basePath" in text:
        wrong = re.search(r"Wrong basePath[^\n]*?root path: \S+", text)
        return checkpoint_error(cls, wrong.group(0) if wrong else msg, facts.get("checkpoint"),
                                where)
    if cls in ("CAST_INVALID_INPUT", "CAST_OVERFLOW"):
        cast = _cast_error(cls, text)
        if cast is not None:
            return _with_where(cast, where)
    if cls in _SPARK_CLASSES:
        what, todo = _SPARK_CLASSES[cls]
        path = re.search(r"Path does not exist: (?:file:)?(\S+?)\.?$", msg)
        return UserError(what.format(msg=msg, path=path.group(1) if path else msg), where=where,
                         todo=todo)
    return UserError(f"Spark failed: [{cls}] {msg}" if cls else f"Spark failed: {msg}",
                     where=where, todo=f"the whole error is in {log_path()}")


def _with_where(e: UserError, where) -> UserError:
    e.where = where
    e.args = (e.render(),)
    return e


_CAST_VALUE = re.compile(r'The value (.+?) of the type "([^"]+)" cannot be cast to "([^"]+)"')
#: Spark's query context: the expression's text, then a line of carets under it
_SQL_CONTEXT = re.compile(r"== SQL[^\n]*==\n([^\n]*)\n( *)(\^+)")


def _cast_error(cls: str, text: str) -> Optional[UserError]:
    """A CAST that met a value it cannot convert (docs/sql.md, "CAST is
    strict"): the value, the types and the expression, in Flink's words."""
    text = _clean(text)
    m = _CAST_VALUE.search(text)
    if m is None:
        return None
    value, source, target = m.groups()
    ctx = _SQL_CONTEXT.search(text)
    expression = "CAST"
    if ctx is not None:
        start = len(ctx.group(2))
        expression = ctx.group(1)[start:start + len(ctx.group(3))]
    why = f"out of {target}'s range" if cls == "CAST_OVERFLOW" else f"not a valid {target}"
    return UserError(f"{expression} failed: the {source} value {value} is {why}",
                     todo=f"fix the input, or write TRY_CAST(... AS {target}) to get NULL "
                          "for values that cannot be cast")


_PY_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception|Violation|Overflow)): (.+)$")


def _python_worker_error(text: str) -> Optional[UserError]:
    """An error raised in a Python worker arrives as Spark's text with the
    worker's traceback inside: its last ``SomeError: message`` line."""
    if "Traceback (most recent call last)" not in text:
        return None
    tail = text[text.rfind("Traceback (most recent call last)"):]
    found = None
    for line in tail.splitlines():
        m = _PY_ERROR_LINE.match(line.strip())
        if m:
            found = m
            break
    if found is None:
        return None
    name, msg = found.group(1), found.group(2).strip()
    if name == "PrimaryKeyConstraintViolation":
        return UserError(msg, todo="the sink key is not unique in the query's result: use ON "
                                   "CONFLICT DO DEDUPLICATE or NOTHING, or key the sink differently")
    if name == "AggregateOverflow":
        return UserError(msg, todo="CAST the argument to a wider type (BIGINT for an INT, "
                                   "DECIMAL(38, 0) for a BIGINT) so the result fits, or filter "
                                   "the rows")
    if name == "InvalidChangeError":
        return UserError(msg, todo="fix the record, or run without --strict and give "
                                   "--dead-letter DIR to set invalid rows aside")
    return UserError(f"a Python worker failed: {name}: {msg}",
                     todo=f"the worker's traceback is in {log_path()}")


def _moved_roots(old_dir: str, new_dir: Optional[str]) -> tuple[str, str]:
    """(where the project was, where it is): the two input directories
    without the path components they end in alike (``/a/in``, ``/b/in`` ->
    ``/a``, ``/b``)."""
    if not new_dir:
        return old_dir, "NEW_DIR"
    old_parts, new_parts = old_dir.rstrip("/").split("/"), new_dir.rstrip("/").split("/")
    while len(old_parts) > 1 and len(new_parts) > 1 and old_parts[-1] == new_parts[-1]:
        old_parts, new_parts = old_parts[:-1], new_parts[:-1]
    return "/".join(old_parts), "/".join(new_parts)


def checkpoint_error(cls: str, msg: str, checkpoint: Optional[str], where) -> CheckpointMismatch:
    ck = checkpoint or "the checkpoint directory"
    if "Wrong basePath" in msg:
        m = re.search(r"root path: (?:file:)?(\S+)", msg)
        read = os.path.dirname(m.group(1)) if m else "another directory"
        now = re.search(r"Wrong basePath (?:file:)?(\S+)", msg)
        old_root, new_root = _moved_roots(read, now.group(1) if now else None)
        return CheckpointMismatch(
            f"the checkpoint lists input files it read at {read}, which is not where the "
            "source is now (the directory was moved or copied)", where=where,
            todo=f"if the project moved, run `spark-changelog relocate {ck} {old_root} "
                 f"{new_root}`, then this command again: it resumes where it stopped; or start "
                 "a new --checkpoint DIR here: the query then reads all input again and upserts "
                 "the same final rows into the table")
    return CheckpointMismatch(
        f"the checkpoint's state does not fit this query ([{cls}] {msg})", where=where,
        todo=f"run the script that wrote {ck}, or start a new --checkpoint DIR (the query then "
             "reads its sources again from the start)")


def _sort_py4j(err, where, facts) -> Optional[UserError]:
    from py4j.protocol import Py4JError, Py4JJavaError, Py4JNetworkError
    if isinstance(err, Py4JNetworkError) or (isinstance(err, Py4JError)
                                             and "Answer from Java side is empty" in str(err)):
        return UserError("Spark's JVM stopped", where=where,
                         todo=f"see {log_path()} (out of memory? raise --conf "
                              "spark.driver.memory=8g)")
    if isinstance(err, Py4JJavaError):
        java = str(err.java_exception) if getattr(err, "java_exception", None) else str(err)
        worker = _python_worker_error(java)
        if worker is not None:
            return _with_where(worker, where) if not worker.where else worker
        return UserError(f"Spark failed: {_first_line(java)}", where=where,
                         todo=f"the whole error is in {log_path()}")
    return None


def _sort_delta(err, where, facts) -> Optional[UserError]:
    from deltalake.exceptions import DeltaError
    if not isinstance(err, DeltaError):
        return None
    name = type(err).__name__
    msg = _first_line(str(err))
    os_error = re.search(r"os error (\d+)", msg)
    if os_error:        # the file system's error inside deltalake's text
        return _sort_os(OSError(msg), where, facts)
    if name == "TableNotFoundError":
        return UserError(f"no Delta table there: {msg}", where=where,
                         todo="check the path (a table directory holds _delta_log/)")
    if name == "CommitFailedError":
        return UserError(f"the Delta commit failed: {msg}", where=where,
                         todo="another writer may have changed the table; run again to resume")
    return UserError(f"Delta Lake: {name}: {msg}", where=where,
                     todo=f"the whole error is in {log_path()}")


def _sort_postgres(err, where, facts) -> Optional[UserError]:
    mod = type(err).__module__ or ""
    if not mod.startswith("psycopg"):
        return None
    import psycopg
    msg = _first_line(str(err))
    if isinstance(err, psycopg.OperationalError):
        return UserError(f"cannot reach PostgreSQL: {msg}", where=where,
                         todo="check the sink's 'url', 'username' and 'password' and that the "
                              "server runs")
    state = getattr(err, "sqlstate", None)
    return UserError(f"PostgreSQL refused a write: {msg}" + (f" (SQLSTATE {state})" if state else ""),
                     where=where, todo="check the target table's columns, types and privileges")


_OS_WHAT = {
    errno.ENOSPC: ("no space left on the device", "free space or write elsewhere, then run again "
                                                  "(nothing of the failed batch was committed)"),
    errno.EDQUOT: ("disk quota exceeded", "free space or write elsewhere, then run again"),
    errno.EACCES: ("permission denied", "write somewhere you may write, or fix the permissions"),
    errno.EPERM: ("operation not permitted", "fix the permissions"),
    errno.EROFS: ("the file system is read-only", "write somewhere else"),
    errno.ENOTDIR: ("a path component is a file, not a directory", "give a directory path"),
    errno.ENOENT: ("no such file or directory", "check the path"),
    errno.EISDIR: ("is a directory, not a file", "give a file path"),
}


def _sort_os(err, where, facts) -> Optional[UserError]:
    if not isinstance(err, OSError):
        # deltalake and pyarrow raise OSError subclasses or wrap the OS's text
        return None
    code = err.errno
    text = _clean(str(err))
    if code is None:        # deltalake's "Generic LocalFileSystem error ... (os error 20)"
        m = re.search(r"os error (\d+)", text)
        code = int(m.group(1)) if m else None
    what, todo = _OS_WHAT.get(code, (None, None))
    path = err.filename or _path_in(text)
    if what is None:
        return UserError(_first_line(text), where=where)
    return PathError(f"{what}" + (f": {path}" if path else ""), where=where, todo=todo)


def _path_in(text: str) -> Optional[str]:
    m = re.search(r"(?:operation on|path|at) (/[^\s:]+)", text)
    return m.group(1) if m else None


# --------------------------------------------------------------------------- reporting


def log_path() -> str:
    from .runtime.session import spark_log_path
    return spark_log_path()


def write_traceback(err: BaseException, argv=None) -> Optional[str]:
    """Append the traceback of ``err`` to the log file; returns its path
    (None when the log cannot be written)."""
    import datetime
    path = log_path()
    try:
        with open(path, "a", encoding="utf-8") as f:
            stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            f.write(f"\n==== spark-changelog {' '.join(argv or sys.argv[1:])} failed at {stamp}\n")
            f.write("".join(traceback.format_exception(err)))
        return path
    except OSError:
        return None


def report(err: BaseException, *, verbose: bool = False, argv=None, out=None) -> int:
    """Print ``err`` as one message (traceback to the log, or here with
    ``verbose``); returns the exit code."""
    out = out or sys.stderr
    user = as_user_error(err)
    if verbose:
        traceback.print_exception(err, file=out)
    else:
        write_traceback(err, argv)
    print(user.render(), file=out)
    return user.exit_code


__all__ = ["UserError", "UsageError", "PathError", "CheckpointMismatch", "Interrupted",
           "as_user_error", "located", "report", "write_traceback",
           "checkpoint_error", "log_path", "EXIT_DONE", "EXIT_JOB_FAILED", "EXIT_USAGE",
           "EXIT_UNSUPPORTED", "EXIT_CHECKPOINT", "EXIT_INTERRUPTED"]
