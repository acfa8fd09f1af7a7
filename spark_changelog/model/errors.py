"""The error model's vocabulary (docs/errors.md): a failure told in words a
person can act on, with the exit code the command line ends with.  Every layer
raises these; ``spark_changelog.errors`` turns everything else (Spark's,
Py4J's, deltalake's, psycopg's and the operating system's errors) into them."""
from __future__ import annotations

import contextlib
from typing import Optional

#: documented exit codes (README, "Command line"; docs/errors.md)
EXIT_DONE = 0
EXIT_JOB_FAILED = 1        # the job failed on its input, a sink, a path, the disk
EXIT_USAGE = 2             # a wrong command line or SQL script
EXIT_UNSUPPORTED = 3       # valid Flink SQL whose feature is not there (yet)
EXIT_CHECKPOINT = 4        # the checkpoint belongs to another query than the script's
EXIT_INTERRUPTED = 130     # Ctrl-C (128 + SIGINT, as shells report it)

class UserError(Exception):
    """A failure told in words a person can act on.

    ``what``: what failed; ``where``: the table, file, line or checkpoint;
    ``todo``: what to do about it; ``detail``: further lines (e.g. the rows
    involved).  ``str()`` is the whole message."""

    exit_code = EXIT_JOB_FAILED
    label = "error"

    def __init__(self, what: str, *, where: Optional[str] = None, todo: Optional[str] = None,
                 detail: Optional[str] = None, exit_code: Optional[int] = None):
        self.what, self.where, self.todo, self.detail = what, where, todo, detail
        if exit_code is not None:
            self.exit_code = exit_code
        super().__init__(self.render())

    def render(self) -> str:
        first = f"{self.label}: {self.where}: {self.what}" if self.where else \
            f"{self.label}: {self.what}"
        lines = [first]
        if self.detail:
            lines.extend(f"  {line}" for line in self.detail.splitlines())
        if self.todo:
            lines.append(f"  what to do: {self.todo}")
        return "\n".join(lines)


class UsageError(UserError):
    """A wrong command line (missing option, options that exclude each other)."""
    exit_code = EXIT_USAGE


class PathError(UserError):
    """A path that must exist, be a directory or be writable is not."""


class CheckpointMismatch(UserError):
    """The checkpoint holds state of another query than the script's."""
    exit_code = EXIT_CHECKPOINT


class Interrupted(UserError):
    """Ctrl-C: the run stopped; the message says what was kept and how to resume."""
    exit_code = EXIT_INTERRUPTED
    label = "interrupted"


# --------------------------------------------------------------------------- where


@contextlib.contextmanager
def located(where: str, **facts):
    """Errors raised inside get ``where`` (e.g. ``INSERT INTO out (job.sql line
    5)``) unless they already know where they happened; ``facts`` (e.g.
    ``checkpoint=...``) help :func:`as_user_error` say what to do."""
    try:
        yield
    except BaseException as err:
        if getattr(err, "_where", None) is None:
            try:
                err._where = where
                err._facts = facts
            except AttributeError:     # built-in exceptions without a __dict__
                pass
        raise


__all__ = ["UserError", "UsageError", "PathError", "CheckpointMismatch", "Interrupted", "located",
           "EXIT_DONE", "EXIT_JOB_FAILED", "EXIT_USAGE", "EXIT_UNSUPPORTED", "EXIT_CHECKPOINT",
           "EXIT_INTERRUPTED"]
