"""What the kill-and-restart tests share: the input changelog (four files, one
micro-batch each), its expected final table, starting / killing a job
process (tests/jobs/*.py) as a whole process group, and the shared crash.

The shared crash (the ``crashed`` fixture, tests/conftest.py): a test marked
``@pytest.mark.shared_crash(NAME)`` whose module's ``CRASHES[NAME]`` says
which pipeline of tests/crash_pipelines.py to run, how to prepare its input
and in which micro-batch to hang.  On the first ``crashed(NAME)`` every
selected test's crash runs at once in one job process
(tests/jobs/crash_job.py), which is SIGKILLed once each pipeline hangs
inside its micro-batch (its sinks written, Spark's commit not); each test
then resumes its pipeline in the test process.  One JVM start for all, and
none for the restarts."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

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


@dataclass
class Crash:
    """A module's crash: ``pipeline`` (a name in tests/crash_pipelines.py),
    ``prepare(directory, fixture) -> args`` (writes the input under the
    directory; ``fixture(name)`` gives a session fixture such as
    ``pg_server`` or ``spark``), and the micro-batch it hangs in (None: it
    runs to its end or its failure)."""
    pipeline: str
    prepare: Callable
    hang_after: Optional[int]


@dataclass
class Crashed:
    """After the kill: the crash's pipeline, directory and arguments, and
    the last line the job printed for it (``committed NAME k``, ``finished
    NAME ...`` or ``failed NAME: <JSON message>``)."""
    name: str
    pipeline: str
    directory: pathlib.Path
    args: list
    status: str = ""

    def resume(self, spark, progress=None):
        """Run the pipeline again in this process, from the checkpoint: its report."""
        from crash_pipelines import PIPELINES
        return PIPELINES[self.pipeline](spark, self.args, progress)

    def failure(self) -> str:
        """The message of a run that failed."""
        assert self.status.startswith(f"failed {self.name}: "), self.status
        return json.loads(self.status.split(": ", 1)[1])


def _selected(item) -> bool:
    """``item`` will run (no skipif marker whose condition holds)."""
    return not any(m.args and m.args[0] is True for m in item.iter_markers("skipif"))


class SharedCrashes:
    """The ``crashed`` fixture (module docstring)."""

    def __init__(self, request, tmp_path_factory):
        self.request, self.tmp = request, tmp_path_factory
        self.done: Optional[dict] = None
        self.error: Optional[BaseException] = None

    def __call__(self, name: str) -> Crashed:
        if self.error is not None:          # one attempt per test run
            raise RuntimeError(f"the shared crash failed: {self.error}") from self.error
        if self.done is None:
            crashes = {}
            for item in self.request.session.items:
                marker = item.get_closest_marker("shared_crash")
                if marker and _selected(item):
                    crashes[marker.args[0]] = item.module.CRASHES[marker.args[0]]
            try:
                self.done = self._crash(crashes)
            except BaseException as e:
                self.error = e
                raise
        run = self.done[name]
        if isinstance(run, Exception):
            raise RuntimeError(f"preparing the crash {name!r} failed: {run}") from run
        return run

    def _crash(self, crashes: dict) -> dict:
        base = self.tmp.mktemp("shared-crash")
        runs, done = [], {}
        for name, c in crashes.items():
            d = base / name
            d.mkdir()
            try:
                args = [str(a) for a in c.prepare(d, self.request.getfixturevalue)]
            except Exception as e:          # that crash's test fails with it, the others run
                done[name] = e
                continue
            runs.append([name, c.pipeline, args, c.hang_after])
            done[name] = Crashed(name, c.pipeline, d, args)
        status = crash_together(runs) if runs else {}
        for name, run in done.items():
            if isinstance(run, Crashed):
                run.status = status.get(name, "")
        return done


def crash_together(runs: list, timeout_s: float = 600) -> dict:
    """Run tests/jobs/crash_job.py with ``runs`` (``[name, pipeline, args,
    hang_after]`` each) until every run hangs in its batch, finished or
    failed, then SIGKILL its process group: each name's last line."""
    job = start_job("crash_job.py", [json.dumps(runs)])
    waiting = {name: hang for name, _, _, hang in runs}
    status: dict = {}
    deadline = time.time() + timeout_s
    try:
        for line in job.stdout:
            line = line.rstrip("\n")
            what, _, rest = line.partition(" ")
            name = rest.split(" ")[0].rstrip(":")
            if what in ("committed", "finished", "failed") and name in waiting:
                status[name] = line
                if what != "committed" or rest.split(" ")[1] == str(waiting[name]):
                    del waiting[name]
            if not waiting or time.time() > deadline:
                break
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=60)
    return status
