"""What the kill-and-restart tests share: the input changelog (four files, one
micro-batch each), its expected final table, and starting / killing a job
process (tests/jobs/*.py) as a whole process group."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq

from changelog_data import to_frame

JOBS = os.path.join(os.path.dirname(__file__), "jobs")
COLS = ["id", "name", "score"]
ARROW = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.int64()),
                   ("_kind", pa.int8()), ("_seq", pa.int64())])
FILES = [
    [["+I", [1, "a", 1], 1], ["+I", [2, "b", 1], 2], ["+I", [3, "c", 1], 3]],
    [["+U", [1, "a2", 2], 5], ["-D", [2, "b", 1], 6], ["+I", [4, "d", 1], 7]],
    [["+U", [3, "c2", 2], 9], ["+I", [2, "b2", 3], 10], ["+U", [1, "a3", 3], 11]],
    [["-D", [4, "d", 1], 13], ["+U", [3, "c3", 4], 14], ["+I", [5, "e", 1], 15]],
]
AFTER_BATCH_1 = [(1, "a2", 2), (3, "c", 1), (4, "d", 1)]
EXPECTED_TABLE = [(1, "a3", 3), (2, "b2", 3), (3, "c3", 4), (5, "e", 1)]
#: the emitted changelog of a normalize over the four files, (kind, id, name, score)
EXPECTED_CHANGELOG = [
    ("+I", 1, "a", 1), ("+I", 2, "b", 1), ("+I", 3, "c", 1),
    ("-U", 1, "a", 1), ("+U", 1, "a2", 2), ("-D", 2, "b", 1), ("+I", 4, "d", 1),
    ("-U", 3, "c", 1), ("+U", 3, "c2", 2), ("+I", 2, "b2", 3), ("-U", 1, "a2", 2), ("+U", 1, "a3", 3),
    ("-D", 4, "d", 1), ("-U", 3, "c2", 2), ("+U", 3, "c3", 4), ("+I", 5, "e", 1),
]


def write_input(directory) -> None:
    os.makedirs(directory)
    for i, f in enumerate(FILES):
        pq.write_table(pa.Table.from_pandas(to_frame(f, COLS), schema=ARROW, preserve_index=False),
                       os.path.join(directory, f"part-{i:04d}.parquet"))


def start_job(job: str, args) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(JOBS)] + sys.path)
    return subprocess.Popen([sys.executable, os.path.join(JOBS, job), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True, env=env)


def kill_when(job: subprocess.Popen, line: str, timeout_s: float = 600) -> list[str]:
    """Read the job's output until ``line``, then SIGKILL its process group."""
    deadline = time.time() + timeout_s
    seen = []
    try:
        for out in job.stdout:
            seen.append(out.strip())
            if out.strip() == line or time.time() > deadline:
                break
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=60)
    return seen


def crash_in_batch(job: str, args, batch: int) -> None:
    """Run ``job`` told to hang inside micro-batch ``batch`` (after its sinks
    were written, before Spark logged it) and SIGKILL it there."""
    seen = kill_when(start_job(job, list(args) + [batch]), f"committed {batch}")
    assert f"committed {batch}" in seen, seen


def restart(job: str, args) -> str:
    """Run ``job`` again on the same checkpoint to the end; its output."""
    proc = start_job(job, args)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out
    return out
