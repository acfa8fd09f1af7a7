"""Checks of a script before anything runs (docs/errors.md, "Checks before
running"): the paths its tables name, and whether each query column can be
stored in its sink column.

Paths are checked before the Spark session starts (a missing input path
would otherwise surface as Spark's ``PATH_NOT_FOUND`` from deep inside the
planner, a sink path that is a file only after the whole job ran).  Types
are checked where each ``INSERT`` is planned: a column is stored in a sink
column of another type only where Flink would cast it implicitly (a wider
number, the same kind of time); anything else, e.g. a STRING into a BIGINT,
is an error at the INSERT, as in Flink ("Incompatible types for sink
column"), for ``explain`` and ``run`` alike.
"""
from __future__ import annotations

import re
from typing import Optional

from sqlglot import exp

from ..runtime.paths import input_problem, output_problem
from .errors import ScriptPathError, SqlError
from .script import (CreateTableAsDef, ExplainDef, InsertDef, Position, QueryDef, Script, StatementSet, TableDef,
                     ViewDef)


def referenced_tables(script: Script) -> set:
    """Names of the tables and views the script's INSERTs, EXPLAINs and views
    read or write."""
    names: set = set()

    def add(stmt) -> None:
        if isinstance(stmt, StatementSet):
            for s in stmt.inserts:
                add(s)
        elif isinstance(stmt, CreateTableAsDef):
            add(stmt.insert)
        elif isinstance(stmt, InsertDef):
            names.add(stmt.table)
            names.update(t.name for t in stmt.query.find_all(exp.Table))
        elif isinstance(stmt, (ViewDef, QueryDef)):
            names.update(t.name for t in stmt.query.find_all(exp.Table))
        elif isinstance(stmt, ExplainDef):
            add(stmt.statement)
    for s in script.statements:
        add(s)
    return names


def check_paths(script: Script) -> None:
    """Every filesystem source the script reads must exist; every Delta sink
    it writes (not only explains) must be a directory that can be created or
    written.  Raises a
    :class:`ScriptPathError` at the table's ``'path'``."""
    used = referenced_tables(script)
    sinks = {getattr(s, "table", None) for s in _inserts(script)}
    for t in script.statements:
        t = t.table if isinstance(t, CreateTableAsDef) else t
        if not isinstance(t, TableDef) or t.name not in used:
            continue
        c = t.connector
        if c.kind == "filesystem" and c.path:
            problem = input_problem(c.path)
            if problem:
                raise _at_path(script, t, f"table {t.name}: input path {problem}",
                               "check the table's 'path'")
        elif c.kind == "delta" and c.path and t.name in sinks:
            problem = output_problem(c.path)
            if problem:
                raise _at_path(script, t, f"table {t.name}: sink path {problem}",
                               "give the table a 'path' that can be written")


def _inserts(script: Script):
    for s in script.statements:
        if isinstance(s, InsertDef):
            yield s
        elif isinstance(s, CreateTableAsDef):
            yield s.insert
        elif isinstance(s, StatementSet):
            yield from s.inserts


def _at_path(script: Script, table: TableDef, message: str, todo: str) -> SqlError:
    pos = _path_position(script, table) or table.position
    return script.error(f"{message} ({todo})", pos, ScriptPathError)


def _path_position(script: Script, table: TableDef) -> Optional[Position]:
    """Where the table's path literal is in the script (the caret goes there)."""
    lines = script.sql.splitlines()
    needle = f"'{table.connector.path}'"
    for i in range(table.position.line - 1, len(lines)):
        col = lines[i].find(needle)
        if col >= 0:
            return Position(i + 1, col + 1, len(needle))
    return None


# --------------------------------------------------------------------------- types

_INTEGERS = ("tinyint", "smallint", "int", "bigint")
_FLOATS = ("float", "double")


def _base(t: str) -> str:
    return re.sub(r"\(.*\)$", "", t.strip().lower())


def _decimal(t: str) -> Optional[tuple]:
    m = re.fullmatch(r"decimal\((\d+),(\d+)\)", t.replace(" ", "").lower())
    return (int(m.group(1)), int(m.group(2))) if m else None


_INTEGER_DIGITS = {"tinyint": 3, "smallint": 5, "int": 10, "bigint": 19}


def storable(query_type: str, sink_type: str) -> bool:
    """Whether a value of Spark type ``query_type`` can be stored in a sink
    column of ``sink_type`` without losing or inventing anything: the same
    type, a wider integer, an integer or FLOAT into a DOUBLE, a number into a
    DECIMAL wide enough, a DECIMAL into a wider DECIMAL or a DOUBLE (Flink's
    implicit casts), a TIMESTAMP into a TIMESTAMP, a DATE into a TIMESTAMP,
    and a NULL literal into anything."""
    q, s = query_type.replace(" ", "").lower(), sink_type.replace(" ", "").lower()
    if q == s or _base(q) == "void":
        return True
    qb, sb = _base(q), _base(s)
    if qb in ("string", "varchar", "char") and sb in ("string", "varchar", "char"):
        return True
    if qb in _INTEGERS and sb in _INTEGERS:
        return _INTEGERS.index(qb) <= _INTEGERS.index(sb)
    if (qb in _INTEGERS or qb in _FLOATS or qb == "decimal") and sb == "double":
        return True
    if qb in _INTEGERS and sb == "float":
        return _INTEGERS.index(qb) <= 1
    if sb == "decimal":
        sd = _decimal(s)
        if sd is None:
            return False
        if qb in _INTEGERS:
            return sd[0] - sd[1] >= _INTEGER_DIGITS[qb]
        qd = _decimal(q)
        return qd is not None and sd[1] >= qd[1] and sd[0] - sd[1] >= qd[0] - qd[1]
    if qb in ("timestamp", "timestamp_ntz", "date") and sb in ("timestamp", "timestamp_ntz"):
        return True
    return False


def sink_type_problem(column: str, query_type: str, sink_type: str, table: str) -> Optional[str]:
    """The message for a query column that cannot be stored in its sink column."""
    if storable(query_type, sink_type):
        return None
    return (f"INSERT INTO {table}: column {column} is {query_type.upper()} in the query but "
            f"{sink_type.upper()} in the table, and {query_type.upper()} values cannot be stored "
            f"as {sink_type.upper()} (CAST it in the SELECT, or declare the column "
            f"{query_type.upper()})")


__all__ = ["check_paths", "referenced_tables", "storable", "sink_type_problem"]
