"""Kill -9 aimed at the replay window (issue #26): after a state partition
has written a micro-batch's changelog file and before the batch's commit file.

A job process (tests/jobs/kill_window_job.py) started with
``KILL_WINDOW_LOG=<file>`` runs :func:`start_window_killer`: a thread that
watches the checkpoint and, as soon as a state partition's ``<v>.changelog``
file exists while ``commits/<v-1>`` does not (batch ``v - 1`` is in the
window), appends ``<query dir> <batch>`` to the log and SIGKILLs the job's
whole process group (the JVM and the Python workers with it).  A window it
killed once is skipped in later processes (the replay of that batch goes
through), so each run of the job dies in the next batch's window.
:func:`window_hit` then checks on disk that the kill landed in the window.

The pipelines (one per kind, in SQL and in the Python API) and their input
(two Debezium sources, one file per micro-batch, one malformed line) live
here too, shared by the job and the test.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

JOBS = os.path.join(os.path.dirname(__file__), "jobs")
KEY_GROUPS = 4
#: files per source written before the killed runs; one more arrives before the last run
FILES = 7

def _changes(n_files: int, keys, row, per_file: int, seed: int) -> list[list]:
    """A valid Debezium history per file: creates, updates, deletes and
    re-creates over ``keys``; ``row(key, version)`` gives a row."""
    import random
    rng = random.Random(seed)
    live, version, files = {}, {}, []
    for _ in range(n_files):
        changes = []
        for k in rng.sample(list(keys), per_file):
            version[k] = version.get(k, 0) + 1
            new = row(k, version[k])
            if k not in live:
                changes.append(("c", None, new))
                live[k] = new
            elif rng.random() < 0.2:
                changes.append(("d", live.pop(k), None))
            else:
                changes.append(("u", live[k], new))
                live[k] = new
        files.append(changes)
    return files


LEVELS = [10, 20, 30, 40, 50, 60]
#: s2: dimension rows (id, attr); s1: facts (id, level, t) joined on level = s2.id
S2_CHANGES = _changes(FILES + 1, LEVELS, lambda k, v: (k, f"{k}-{v}"), 4, 2)
S1_CHANGES = _changes(FILES + 1, range(1, 25), lambda k, v: (k, LEVELS[(k + v) % 6], 1000 * v + k), 12, 1)
#: the malformed line: file s1-0002.json, line 2
S1_CHANGES[2].insert(1, "MALFORMED")
S1_COLS, S2_COLS = ("id", "level", "t"), ("id", "attr")
EXPECTED_DEAD = [("s1-0002.json", 2, "malformed JSON: the record does not parse")]


def _event(op, before, after, cols, lsn) -> str:
    as_dict = (lambda r: None if r is None else dict(zip(cols, r)))
    return json.dumps({"before": as_dict(before), "after": as_dict(after), "op": op,
                       "source": {"lsn": lsn}})


def write_files(base, first: int, last: int) -> None:
    """Files ``first`` .. ``last - 1`` of both sources under ``base/s1``, ``base/s2``."""
    for name, changes, cols in (("s1", S1_CHANGES, S1_COLS), ("s2", S2_CHANGES, S2_COLS)):
        os.makedirs(os.path.join(base, name), exist_ok=True)
        for i in range(first, last):
            lines = [c if c == "MALFORMED" else _event(*c, cols, 100 * i + j)
                     for j, c in enumerate(changes[i])]
            lines = ['{"before":null,"after":{"id":9,"lev' if x == "MALFORMED" else x for x in lines]
            path = os.path.join(base, name, f"{name}-{i:04d}.json")
            with open(path + ".tmp", "w") as fh:
                fh.write("\n".join(lines) + "\n")
            os.replace(path + ".tmp", path)
            # Spark's file source takes the oldest files first by modification
            # time in milliseconds, ties in no fixed order: files written within
            # one millisecond could make two runs' micro-batches differ
            time.sleep(0.002)


# -- the pipelines ---------------------------------------------------------------
SQL_SOURCES = """
CREATE TEMPORARY TABLE s1 (id BIGINT, level BIGINT, t BIGINT,{event_time} PRIMARY KEY (id) NOT ENFORCED)
WITH ('connector' = 'filesystem', 'path' = '{base}/s1', 'format' = 'debezium-json',
      'source.max-files-per-trigger' = '1');
CREATE TEMPORARY TABLE s2 (id BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED)
WITH ('connector' = 'filesystem', 'path' = '{base}/s2', 'format' = 'debezium-json',
      'source.max-files-per-trigger' = '1');
"""
SQL = {
    "join": """
CREATE TEMPORARY TABLE out_t (id BIGINT, level BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED)
WITH ('connector' = 'delta', 'path' = '{base}/out');
INSERT INTO out_t SELECT s1.id, s1.level, s2.attr FROM s1 JOIN s2 ON s1.level = s2.id;
""",
    "normalize": """
CREATE TEMPORARY TABLE out_t (id BIGINT, level BIGINT, t BIGINT, PRIMARY KEY (id) NOT ENFORCED)
WITH ('connector' = 'delta', 'path' = '{base}/out');
INSERT INTO out_t SELECT id, level, t FROM s1;
""",
    "aggregation": """
CREATE TEMPORARY TABLE out_t (level BIGINT, n BIGINT, total BIGINT, PRIMARY KEY (level) NOT ENFORCED)
WITH ('connector' = 'delta', 'path' = '{base}/out');
INSERT INTO out_t SELECT level, COUNT(*) AS n, SUM(t) AS total FROM s1 GROUP BY level;
""",
}
#: the event-time attribute of s1, for the kinds that wait for a watermark
EVENT_TIME = " rt AS TO_TIMESTAMP_LTZ(t, 3), WATERMARK FOR rt AS rt,"
TIMED = set()


def sql_script(kind: str, base: str) -> str:
    return ((SQL_SOURCES + SQL[kind]).replace("{event_time}", EVENT_TIME if kind in TIMED else "")
            .replace("{base}", str(base)))


#: the columns of each kind's output table
OUT_COLS = {"join": ("id", "level", "attr"), "normalize": ("id", "level", "t"),
            "aggregation": ("level", "n", "total")}
#: the sink key of each kind's output table
SINK_KEY = {"join": ("id",), "normalize": ("id",), "aggregation": ("level",)}


def api_pipeline(spark, kind: str, base: str):
    """(stream, write_upsert keywords) of ``kind`` in the Python API."""
    from spark_changelog.api import read_debezium
    kw = dict(streaming=True, max_files_per_trigger=1)
    s1 = read_debezium(spark, f"{base}/s1", "id BIGINT, level BIGINT, t BIGINT", ["id"], **kw)
    s2 = read_debezium(spark, f"{base}/s2", "id BIGINT, attr STRING", ["id"], **kw)
    if kind == "join":
        return s1.join(s2, left_on=["level"], right_on=["id"], key_groups=KEY_GROUPS).select(
            id="id", level="level", attr="attr"), {"key": "id"}
    if kind == "normalize":
        return s1.normalize(key_groups=KEY_GROUPS), {}
    if kind == "aggregation":
        return s1.group_by("level").agg(n="COUNT(*)", total="SUM(t)", key_groups=KEY_GROUPS), {"key": "level"}
    raise ValueError(kind)


def expected_table(kind: str, files: int) -> list[tuple]:
    """The final table after ``files`` files of each source, from the sources'
    final rows (independent of the operators)."""
    s1, s2 = _final(S1_CHANGES[:files]), _final(S2_CHANGES[:files])
    if kind == "join":
        return sorted((i, lvl, s2[lvl][1]) for i, (_, lvl, _) in s1.items() if lvl in s2)
    if kind == "normalize":
        return sorted(s1.values())
    if kind == "aggregation":
        groups: dict = {}
        for _, lvl, t in s1.values():
            n, total = groups.get(lvl, (0, 0))
            groups[lvl] = (n + 1, total + t)
        return sorted((lvl, n, total) for lvl, (n, total) in groups.items())
    raise ValueError(kind)


def _final(files) -> dict:
    rows = {}
    for f in files:
        for c in f:
            if c == "MALFORMED":
                continue
            op, before, after = c
            if op == "d":
                del rows[before[0]]
            else:
                rows[after[0]] = after
    return rows


# -- the killer ------------------------------------------------------------------
def _query_dirs(ck: str) -> list[str]:
    """Every streaming query checkpoint (a directory with ``commits``) under ``ck``."""
    found = []
    for root, dirs, _ in os.walk(ck):
        if "commits" in dirs and "offsets" in dirs:
            found.append(root)
            dirs.clear()
        elif os.path.basename(root) in ("state", "sources", "offsets"):
            dirs.clear()
    return found


def _in_window(query: str):
    """(batch, changelog file) of a batch whose state changelog a partition has
    written while its commit file is absent, else None."""
    state = os.path.join(query, "state")
    try:
        ops = os.listdir(state)
    except FileNotFoundError:
        return None
    for op in ops:
        try:
            parts = [p for p in os.listdir(os.path.join(state, op)) if p.isdigit()]
        except (FileNotFoundError, NotADirectoryError):
            continue
        for part in parts:
            d = os.path.join(state, op, part)
            try:
                names = os.listdir(d)
            except FileNotFoundError:
                continue
            for n in names:
                if n.endswith(".changelog") and n[0] != "." and n.split(".")[0].isdigit():
                    batch = int(n.split(".")[0]) - 1
                    if not os.path.exists(os.path.join(query, "commits", str(batch))):
                        yield batch, os.path.join(d, n)


def killed_windows(log: str) -> list[tuple[str, int]]:
    try:
        with open(log) as fh:
            return [(q, int(b)) for q, b in (line.rsplit(" ", 1) for line in fh.read().split("\n") if line)]
    except FileNotFoundError:
        return []


def start_window_killer(ck: str, log: str) -> None:
    """The watcher thread (module docstring)."""
    done = set(killed_windows(log))

    def watch():
        queries, listed = [], 0.0
        while True:
            if time.monotonic() - listed > 0.2:
                queries, listed = _query_dirs(ck), time.monotonic()
            for q in queries:
                for batch, _ in _in_window(q):
                    if (q, batch) in done:
                        continue
                    with open(log, "a") as fh:
                        fh.write(f"{q} {batch}\n")
                        fh.flush()
                        os.fsync(fh.fileno())
                    os.killpg(os.getpgid(0), signal.SIGKILL)
            time.sleep(0.003)

    threading.Thread(target=watch, daemon=True).start()


def window_hit(query: str, batch: int) -> bool:
    """After a kill: batch ``batch``'s state changelog is on disk and its commit is not."""
    return any(b == batch for b, _ in _in_window(query))


def run_job(front: str, kind: str, base, ck, kill_log=None, timeout_s: float = 600):
    """Run tests/jobs/kill_window_job.py to its end or its kill: (returncode, output)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(JOBS)] + sys.path)
    env.pop("KILL_WINDOW_LOG", None)
    if kill_log:
        env["KILL_WINDOW_LOG"] = str(kill_log)
    proc = subprocess.Popen([sys.executable, os.path.join(JOBS, "kill_window_job.py"), front, kind,
                             str(base), str(ck)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, out
