"""Kill -9 aimed at the replay window (issue #26): after a state partition
has written a micro-batch's changelog file and before the batch's commit file.

A job process (tests/jobs/kill_window_job.py) runs every query of a group
at once, each in its own thread of one Spark session: the Debezium group
(normalize, join + materializer, aggregation) or the event-time group
(keep-first deduplication on event time, a tumbling window aggregation,
``ON CONFLICT DO NOTHING`` and ``DO ERROR``), each in streaming SQL and in the
Python API.  Started with ``KILL_WINDOW_LOG=<file>`` it runs
:class:`WindowKiller`: each query, in the first micro-batch it was not
killed in before, stops inside the batch once its sinks are written (its
state partitions have written their changelogs, Spark has not written the
commit file); when one query is left running, a watcher thread SIGKILLs the
job's whole process group (the JVM and the Python workers with it) as soon
as that query's first state partition has written a changelog of a batch
not killed before, so every query is in its replay window at once: the last
one right after its first state partition's write, the others after all of
theirs.  Each killed window is appended to the log (``<query dir> <batch>
early|late``), so the next process replays it and stops one batch further;
:func:`window_hit` then checks on disk that each kill landed in its window.
A query killed ``KILLS`` times runs through.

The queries and their input (two Debezium sources and one insert-only
event-time source of plain JSON rows, one file per micro-batch, one
malformed line each) live here too, shared by the job and the test.
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


#: the event-time source ``ev``: plain JSON rows (an insert-only stream), one
#: file per micro-batch; file i's rows have event times in [10 i, 10 i + 8) s
#: (out of order by more than the watermark's 1 s bound), new users arriving
#: in every file, and one late row in files 3 and 5 (10 s behind)
EV_COLS = ("id", "u", "c", "v", "t")


def _events(n_files: int, per_file: int, seed: int) -> list[list]:
    import random
    rng = random.Random(seed)
    files, n = [], 0
    for i in range(n_files):
        rows = []
        for _ in range(per_file):
            n += 1
            rows.append((n, rng.randrange(1, 4 + 3 * i), n % 3, rng.randrange(100),
                         10_000 * i + rng.randrange(8_000)))
        if i in (3, 5):
            n += 1
            rows.insert(3, (n, 1, n % 3, 7, 10_000 * (i - 1) + 300))
        files.append(rows)
    return files


EV_ROWS = _events(FILES + 1, 8, 3)
#: the malformed line of the event source: file ev-0002.json, line 2
EV_ROWS[2].insert(1, "MALFORMED")


def write_files(base, first: int, last: int) -> None:
    """Files ``first`` .. ``last - 1`` of every source under ``base/s1``,
    ``base/s2`` and ``base/ev``."""
    for name, changes, cols in (("s1", S1_CHANGES, S1_COLS), ("s2", S2_CHANGES, S2_COLS),
                                ("ev", EV_ROWS, EV_COLS)):
        os.makedirs(os.path.join(base, name), exist_ok=True)
        for i in range(first, last):
            if name == "ev":
                lines = ['{"id":99,"u":' if r == "MALFORMED" else json.dumps(dict(zip(cols, r)))
                         for r in changes[i]]
            else:
                lines = [c if c == "MALFORMED" else _event(*c, cols, 100 * i + j)
                         for j, c in enumerate(changes[i])]
                lines = ['{"before":null,"after":{"id":9,"lev' if x == "MALFORMED" else x
                         for x in lines]
            path = os.path.join(base, name, f"{name}-{i:04d}.json")
            with open(path + ".tmp", "w") as fh:
                fh.write("\n".join(lines) + "\n")
            os.replace(path + ".tmp", path)
            # Spark's file source takes the oldest files first by modification
            # time in milliseconds, ties in no fixed order: files written within
            # one millisecond could make two runs' micro-batches differ
            time.sleep(0.002)


# -- the queries -----------------------------------------------------------------
SQL_SOURCES = """
CREATE TEMPORARY TABLE s1 (id BIGINT, level BIGINT, t BIGINT, PRIMARY KEY (id) NOT ENFORCED)
WITH ('connector' = 'filesystem', 'path' = '{base}/s1', 'format' = 'debezium-json',
      'source.max-files-per-trigger' = '1');
CREATE TEMPORARY TABLE s2 (id BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED)
WITH ('connector' = 'filesystem', 'path' = '{base}/s2', 'format' = 'debezium-json',
      'source.max-files-per-trigger' = '1');
"""
#: plain JSON files: insert-only, the watermark generated at the source
SQL_EVENTS = """
CREATE TEMPORARY TABLE ev (id BIGINT, u BIGINT, c BIGINT, v BIGINT, t BIGINT,
  rt AS TO_TIMESTAMP_LTZ(t, 3), WATERMARK FOR rt AS rt - INTERVAL '1' SECOND)
WITH ('connector' = 'filesystem', 'path' = '{base}/ev', 'format' = 'json',
      'source.max-files-per-trigger' = '1');
"""
#: per kind: the sink table's columns (DDL), its primary key, the SELECT
KINDS = {
    "join": ("id BIGINT, level BIGINT, attr STRING", ("id",),
             "SELECT s1.id, s1.level, s2.attr FROM s1 JOIN s2 ON s1.level = s2.id"),
    "normalize": ("id BIGINT, level BIGINT, t BIGINT", ("id",), "SELECT id, level, t FROM s1"),
    "aggregation": ("level BIGINT, n BIGINT, total BIGINT", ("level",),
                    "SELECT level, COUNT(*) AS n, SUM(t) AS total FROM s1 GROUP BY level"),
    "dedup": ("u BIGINT, id BIGINT, v BIGINT, t BIGINT", ("u",),
              "SELECT u, id, v, t FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY u ORDER BY rt ASC) "
              "AS rn FROM ev) WHERE rn = 1"),
    "window": ("window_start TIMESTAMP(3), window_end TIMESTAMP(3), u BIGINT, n BIGINT, total BIGINT",
               ("window_start", "window_end", "u"),
               "SELECT window_start, window_end, u, COUNT(*) AS n, SUM(v) AS total "
               "FROM TABLE(TUMBLE(TABLE ev, DESCRIPTOR(rt), INTERVAL '5' SECOND)) "
               "GROUP BY window_start, window_end, u"),
    # the materializer's event-time conflict strategies: (u, c) and (u, us)
    # are the upsert keys, u the sink key; c varies per u (conflicts, the
    # first kept), us does not (no conflict, DO ERROR never fails)
    "conflict_nothing": ("u BIGINT, c BIGINT, v BIGINT", ("u",),
                         "SELECT u, c, MAX(v) AS v FROM ev GROUP BY u, c ON CONFLICT DO NOTHING"),
    "conflict_error": ("u BIGINT, us STRING, v BIGINT", ("u",),
                       "SELECT u, us, MAX(v) AS v FROM (SELECT u, CAST(u AS STRING) AS us, v, rt FROM ev) "
                       "GROUP BY u, us ON CONFLICT DO ERROR"),
}
GROUPS = {"debezium": ("normalize", "join", "aggregation"),
          "event_time": ("dedup", "window", "conflict_nothing", "conflict_error")}
#: the columns of each kind's output table (tests/runtime/test_cluster.py, test_connect.py)
OUT_COLS = {k: tuple(c.split()[0] for c in cols.split(", ")) for k, (cols, _, _) in KINDS.items()}
SINK_KEY = {k: key for k, (_, key, _) in KINDS.items()}


def sql_script(kind: str, base: str, table=None) -> str:
    """``kind`` as a SQL script reading under ``base``, its table at
    ``table`` (default ``base/out``)."""
    cols, key, select = KINDS[kind]
    sources = SQL_EVENTS if kind in GROUPS["event_time"] else SQL_SOURCES
    return (sources.replace("{base}", str(base)) +
            f"CREATE TEMPORARY TABLE out_t ({cols}, PRIMARY KEY ({', '.join(key)}) NOT ENFORCED)\n"
            f"WITH ('connector' = 'delta', 'path' = '{table or f'{base}/out'}');\n"
            f"INSERT INTO out_t {select};\n")


def api_pipeline(spark, kind: str, base: str):
    """(stream, write_upsert keywords) of ``kind`` in the Python API, reading under ``base``."""
    from spark_changelog.api import read_changes, read_debezium
    from spark_changelog.model.windows import tumble
    kw = dict(streaming=True, max_files_per_trigger=1)
    key = list(SINK_KEY[kind])
    if kind in GROUPS["event_time"]:
        ev = (read_changes(spark, f"{base}/ev", format="changelog", changelog_file_format="json",
                           kind_column=None, schema="id BIGINT, u BIGINT, c BIGINT, v BIGINT, t BIGINT",
                           name="ev", **kw)
              .with_column("rt", "timestamp_millis(t)").with_watermark("rt", 1000))
        if kind == "dedup":
            return ev.deduplicate("u", order_by="rt", keep="first", key_groups=KEY_GROUPS).select(
                "u", "id", "v", "t"), {"key": key}
        if kind == "window":
            return ev.window(tumble("rt", "5 seconds")).aggregate(
                by=["u"], n="COUNT(*)", total="SUM(v)").select(*OUT_COLS[kind]), {"key": key}
        if kind == "conflict_nothing":
            return ev.group_by("u", "c").agg(v="MAX(v)", key_groups=KEY_GROUPS), {
                "key": key, "conflict": "nothing"}
        if kind == "conflict_error":
            return ev.with_column("us", "CAST(u AS STRING)").group_by("u", "us").agg(
                v="MAX(v)", key_groups=KEY_GROUPS), {"key": key, "conflict": "error"}
    s1 = read_debezium(spark, f"{base}/s1", "id BIGINT, level BIGINT, t BIGINT", ["id"], **kw)
    s2 = read_debezium(spark, f"{base}/s2", "id BIGINT, attr STRING", ["id"], **kw)
    if kind == "join":
        return s1.join(s2, left_on=["level"], right_on=["id"], key_groups=KEY_GROUPS).select(
            id="id", level="level", attr="attr"), {"key": key}
    if kind == "normalize":
        return s1.normalize(key_groups=KEY_GROUPS), {}
    if kind == "aggregation":
        return s1.group_by("level").agg(n="COUNT(*)", total="SUM(t)", key_groups=KEY_GROUPS), {"key": key}
    raise ValueError(kind)


class Query:
    """One query of a group: ``kind`` in ``front`` (``sql`` or ``api``), named
    ``<front>-<kind>``; under a job's output directory its table, emitted
    changelog, dead letters and late rows, under the job's checkpoint its own."""

    def __init__(self, front: str, kind: str):
        self.front, self.kind, self.name = front, kind, f"{front}-{kind}"
        self.cols, self.key = OUT_COLS[kind], SINK_KEY[kind]

    def path(self, base, what: str = "") -> str:
        return os.path.join(str(base), self.name, what) if what else os.path.join(str(base), self.name)

    def run(self, spark, inputs: str, out: str, ck: str, on_batch=None):
        """Run the query to its end (or its kill): its report."""
        if self.front == "sql":
            from spark_changelog.sql.runner import run_script
            from spark_changelog.sql.script import parse_script
            (r,) = run_script(spark, parse_script(sql_script(self.kind, inputs, self.path(out, "table")),
                                                  f"{self.kind}.sql"),
                              batch=False, checkpoint=self.path(ck), dead_letter=self.path(out, "dead"),
                              changelog=self.path(out, "log"), late_output=self.path(out, "late"),
                              key_groups=KEY_GROUPS, show_progress=False, on_batch=on_batch)
            return r.report
        stream, options = api_pipeline(spark, self.kind, inputs)
        return stream.write_upsert(self.path(out, "table"), checkpoint=self.path(ck),
                                   changelog_path=self.path(out, "log"), dead_letter=self.path(out, "dead"),
                                   late_output=self.path(out, "late"), key_groups=KEY_GROUPS,
                                   progress=on_batch, **options)


def queries(group: str) -> list[Query]:
    return [Query(front, kind) for kind in GROUPS[group] for front in ("sql", "api")]


def expected_table(kind: str, files: int) -> list[tuple]:
    """The final table of a Debezium kind after ``files`` files of each
    source, from the sources' final rows (independent of the operators)."""
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
KILLS = 5


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
    """(batch, changelog file) of each batch whose state changelog a partition
    has written while its commit file is absent."""
    state = os.path.join(query, "state")
    try:
        ops = os.listdir(state)
    except FileNotFoundError:
        return
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


def _running_batch(query: str) -> int:
    """The batch a query is running: its newest offsets file."""
    return max(int(n) for n in os.listdir(os.path.join(query, "offsets")) if n.isdigit())


def killed_windows(log: str) -> list[tuple[str, int, str]]:
    """The log: (query dir, batch, ``early`` or ``late``) per killed window."""
    try:
        with open(log) as fh:
            return [(q, int(b), how) for q, b, how in (line.rsplit(" ", 2) for line in fh.read().split("\n")
                                                       if line)]
    except FileNotFoundError:
        return []


class WindowKiller:
    """In the job process: the queries' stops and the watcher thread (module
    docstring).  ``on_batch(query)`` is the query's per-batch callback."""

    def __init__(self, log: str, ck: str, names: list[str]):
        self.log, self.ck = log, ck
        self.done = {(q, b) for q, b, _ in killed_windows(log)}
        self.kills: dict = {}
        for q, _ in self.done:
            self.kills[q] = self.kills.get(q, 0) + 1
        self.names = names
        self.dirs: dict = {}
        self.hung: dict = {}            # name -> (query dir, batch)
        self.ended: set = set()
        self.lock = threading.Lock()

    def _dir(self, name: str):
        """The query's checkpoint (None before it made one)."""
        if name not in self.dirs:
            found = _query_dirs(os.path.join(self.ck, name))
            if not found:
                return None
            self.dirs[name] = found[0]
        return self.dirs[name]

    def order(self, queries: list) -> list:
        """The queries in the order to start them: turned by one per process
        so far, so that another query is the last one (the early kill)."""
        turn = len(self.done) // len(queries) % len(queries)
        return queries[turn:] + queries[:turn]

    def _killing(self, name: str) -> bool:
        q = self._dir(name)
        return q is None or self.kills.get(q, 0) < KILLS

    def on_batch(self, name: str):
        def stop_here(_report):
            q = self._dir(name)
            batch = _running_batch(q)
            if self.kills.get(q, 0) < KILLS and (q, batch) not in self.done:
                with self.lock:
                    self.hung[name] = (q, batch)
                time.sleep(3600)
        return stop_here

    def end(self, name: str) -> None:
        with self.lock:
            self.ended.add(name)

    def start(self) -> None:
        threading.Thread(target=self._watch, daemon=True).start()

    def _kill(self, windows: list) -> None:
        with open(self.log, "a") as fh:
            fh.write("".join(f"{q} {b} {how}\n" for q, b, how in windows))
            fh.flush()
            os.fsync(fh.fileno())
        os.killpg(os.getpgid(0), signal.SIGKILL)

    def _watch(self) -> None:
        while True:
            with self.lock:
                hung = dict(self.hung)
                running = [n for n in self.names if n not in hung and n not in self.ended]
            late = [(q, b, "late") for q, b in hung.values()]
            killing = [n for n in running if self._killing(n)]
            if hung and not killing:
                self._kill(late)
            if len(killing) == 1 and self._dir(killing[0]):
                q = self._dir(killing[0])
                for batch, _ in _in_window(q):
                    if (q, batch) not in self.done:
                        self._kill(late + [(q, batch, "early")])
            time.sleep(0.003)


def window_hit(query: str, batch: int) -> bool:
    """After a kill: batch ``batch``'s state changelog is on disk and its commit is not."""
    return any(b == batch for b, _ in _in_window(query))


def run_job(group: str, base, ck, kill_log=None, reference=None, timeout_s: float = 1800):
    """Run tests/jobs/kill_window_job.py (inputs and outputs under ``base``)
    to its end or its kill: (returncode, output).  ``kill_log``: kill in the
    next windows.  ``reference``: after the queries, run them again
    uninterrupted into ``reference`` (its checkpoint ``reference/ck``) in the
    same process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(JOBS)] + sys.path)
    env.pop("KILL_WINDOW_LOG", None)
    if kill_log:
        env["KILL_WINDOW_LOG"] = str(kill_log)
    ref = [str(reference), os.path.join(str(reference), "ck")] if reference else []
    proc = subprocess.Popen([sys.executable, os.path.join(JOBS, "kill_window_job.py"), group,
                             str(base), str(base), str(ck), *ref],
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
