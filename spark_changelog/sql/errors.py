"""SQL errors a person can act on: file, line, column, what was expected, and
the offending line with a caret under the place (docs/sql.md, "Errors")."""
from __future__ import annotations

from typing import Optional


class SqlError(ValueError):
    """An error in a SQL script at ``line``/``col`` (1-based).

    ``str(error)`` is the full report::

        script.sql:4:38: Expected DEDUPLICATE, ERROR or NOTHING after ON CONFLICT DO
            4 | INSERT INTO t1 SELECT * FROM s ON CONFLICT DO UPDATE
              |                                               ^^^^^^
    """

    exit_code = 2       # spark_changelog.model.errors.EXIT_USAGE

    def __init__(self, message: str, line: int, col: int, *, sql: Optional[str] = None,
                 path: Optional[str] = None, length: int = 1):
        self.message, self.line, self.col = message, int(line), int(col)
        self.path, self.length = path, max(1, int(length))
        self.source_line = None
        if sql is not None:
            lines = sql.splitlines()
            if 1 <= self.line <= len(lines):
                self.source_line = lines[self.line - 1]
        super().__init__(self.render())

    def render(self) -> str:
        where = f"{self.path or '<sql>'}:{self.line}:{self.col}"
        out = f"{where}: {self.message}"
        if self.source_line is not None:
            num = str(self.line)
            text = self.source_line.replace("\t", " ")
            width = max(1, min(self.length, len(text) - self.col + 1))
            out += (f"\n  {num} | {text}"
                    f"\n  {' ' * len(num)} | {' ' * (self.col - 1)}{'^' * width}")
        return out

    def with_source(self, sql: str, path: Optional[str]) -> "SqlError":
        """The same error, located in ``path`` with its source line."""
        return type(self)(self.message, self.line, self.col, sql=sql, path=path,
                          length=self.length)


class UnsupportedFeature(SqlError):
    """Valid Flink SQL whose operator is not there yet (or never will be);
    the message names the feature."""

    exit_code = 3       # EXIT_UNSUPPORTED


class ScriptPathError(SqlError):
    """A path the script names (a source's or sink's ``'path'``) that does not
    exist, is not a directory or cannot be written: a job failure (exit 1),
    shown at the table that names it."""

    exit_code = 1       # EXIT_JOB_FAILED


__all__ = ["SqlError", "UnsupportedFeature", "ScriptPathError"]
