"""Checks of the paths a job reads and writes, made before it runs
(docs/errors.md, "Checks before running"): an input that is not there, an
output that is a file, a directory that cannot be written, a full disk.
Each check returns what is wrong as words (None when all is well), so the
caller can say where the path came from (a table's ``'path'``, an option)."""
from __future__ import annotations

import os
import re
import tempfile
from typing import Optional

#: less free space than this on an output's device is reported before the job
#: starts (a Delta commit, a checkpoint and Spark's shuffle files need a few MB)
MIN_FREE_BYTES = 1 << 20


def input_problem(path: str) -> Optional[str]:
    """What keeps ``path`` (a file or directory of input files) from being read."""
    if "://" in path and not path.startswith("file://"):
        return None         # an object store or HDFS: Spark finds out
    local = path[len("file://"):] if path.startswith("file://") else path
    if any(ch in local for ch in "*?[{"):     # a glob, as Spark reads it
        import glob
        if glob.glob(re.sub(r"\{[^}]*\}", "*", local)):
            return None
        return f"{path} matches no file"
    if not os.path.exists(local):
        parent = _existing_ancestor(local)
        return f"{path} does not exist" + (f" (nearest existing directory: {parent})"
                                           if parent and parent != os.sep else "")
    if not os.access(local, os.R_OK):
        return f"{path} is not readable"
    return None


def output_problem(path: str, *, free_bytes: int = MIN_FREE_BYTES) -> Optional[str]:
    """What keeps a directory at ``path`` from being created or written: a
    file in its place or on its way, no permission, a read-only file system,
    a full disk."""
    if "://" in path and not path.startswith("file://"):
        return None
    local = os.path.abspath(path[len("file://"):] if path.startswith("file://") else path)
    if os.path.exists(local) and not os.path.isdir(local):
        return f"{path} is a file, not a directory"
    base = local if os.path.isdir(local) else _existing_ancestor(local)
    if base is None:
        return f"{path} cannot be created"
    if not os.path.isdir(base):
        return f"{path} cannot be created: {base} is a file, not a directory"
    try:
        fd, probe = tempfile.mkstemp(dir=base, prefix=".spark-changelog-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        reason = {30: "is on a read-only file system", 13: "is not writable (permission denied)",
                  28: "is on a full disk"}.get(e.errno, f"cannot be written ({e.strerror})")
        return f"{path} {reason}" if base == local else \
            f"{path} cannot be created: {base} {reason}"
    try:
        st = os.statvfs(base)
        free = st.f_bavail * st.f_frsize
    except OSError:
        return None
    if free < free_bytes:
        return f"{path} is on a full disk ({free:,} bytes free on the device of {base})"
    return None


def _existing_ancestor(path: str) -> Optional[str]:
    p = os.path.abspath(path)
    while True:
        parent = os.path.dirname(p)
        if os.path.exists(parent):
            return parent
        if parent == p:
            return None
        p = parent


def delta_table_problem(path: str) -> Optional[str]:
    """What keeps ``path`` from being read as a Delta table."""
    problem = input_problem(path)
    if problem:
        return problem
    if "://" in path:
        return None
    if not os.path.isdir(path):
        return f"{path} is a file, not a table directory"
    if not os.path.isdir(os.path.join(path, "_delta_log")):
        return f"{path} is not a Delta table (no _delta_log directory)"
    return None


__all__ = ["input_problem", "output_problem", "delta_table_problem", "MIN_FREE_BYTES"]
