"""The benchmark suite's jobs (``benchmarks/suite.py``): each workload as ONE
Flink SQL query, run by ours and by Apache Flink 2.3 on the same files.

Inputs (:func:`ensure_inputs`, cached): the Debezium JSON change files of
``benchmarks/whole_job.py`` (``id BIGINT, g BIGINT, v BIGINT``, about 17%
creates, 74% updates, 8% deletes, each id's history in one file in log
order); for the join two such sets of ``events / 2`` events over the same ids
(seeds 7 and 11); insert-only JSON lines for the deduplication; clicks for
the window.  Only the tables' ``WITH`` options and a few engine settings
differ between the engines:

* ``normalize``: ``INSERT INTO t SELECT id, g, v FROM s``, sink keyed by ``id``
  (keep last per key; Flink: ``table.exec.source.cdc-events-duplicate`` =
  true, which puts ChangelogNormalize on the source's primary key);
* ``materializer``: the same query into a sink keyed by ``(g, id)`` with
  ``table.exec.sink.upsert-materialize`` = 'force' in both (the
  SinkUpsertMaterializer in front of the sink);
* ``join``: ``s1 JOIN s2 ON s1.id = s2.id`` (a regular join of two changelogs),
  sink keyed by ``id``; the rate counts the input rows of both sides;
* ``aggregate``: ``SELECT g, COUNT(*), SUM(v), MIN(v) FROM s GROUP BY g``
  (group aggregation with retraction), sink keyed by ``g``;
* ``dedup``: keep-last deduplication (``ROW_NUMBER() OVER (PARTITION BY id
  ORDER BY pt DESC) = 1``, ``pt AS PROCTIME()``) over insert-only JSON lines
  (``id, g, v`` and an ``op`` column ``+I``) over the same ids, each id's rows
  in one file; sink keyed by ``id``;
* ``windows``: ``TUMBLE`` of one minute, ``COUNT(DISTINCT u)``, over clicks
  with a 10 s watermark bound;
* :func:`scan_job`: a job's sources alone into ``blackhole``, the scan-only
  ceiling.

Each engine runs a job as its own process:

* ours (:func:`run_ours`): what ``spark-changelog run job.sql --batch`` (or
  ``--checkpoint``: streaming, one available-now run from empty state) does,
  into a Delta table or ``blackhole``: the user's path, JVM start and imports
  included.  Like Flink's, the process runs the job twice (the second into
  another table and checkpoint): "whole" is the process start to the end of
  the first job, "warm" the second job alone;
* Flink (:func:`run_flink`): PyFlink's ``TableEnvironment`` (streaming mode,
  parallelism 2, heap state) from the Flink venv, ``filesystem`` source,
  into a ``blackhole`` sink, the job twice likewise (JVM start included in
  "whole", JVM shutdown not).

Check: after its timed jobs, the Flink process runs ``SELECT COUNT(*),
SUM(col)... FROM (query)`` (mini-batch on, collected) and the final row is
compared with the same numbers over our Delta table.  The
SinkUpsertMaterializer sits only in front of a sink, so for ``materializer``
Flink's check covers the query's result, not its materializer.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FLINK_PYTHON = "/work/flink-venv/bin/python"
sys.path.insert(0, HERE)
from whole_job import cached_files  # noqa: E402  (the whole-job benchmark's inputs)
COLS = "id BIGINT, g BIGINT, v BIGINT"


# --------------------------------------------------------------------------- the jobs (engine-neutral)
#
# A job: its sources (table name -> input set), its sink's columns and key, the
# query and settings for each engine.  A source is Debezium JSON with the
# primary key ``id`` unless the job says ``insert_only``: then plain JSON lines
# with a processing-time column ``pt`` (our reader takes them by their ``op``
# kind column, ``+I`` on every line; Flink's ``json`` format ignores it).

def job_normalize(inputs: dict) -> dict:
    return {"sources": {"s": inputs["main"]}, "sink_cols": COLS, "sink_key": "id",
            "query": "SELECT id, g, v FROM s",
            "flink_conf": {"table.exec.source.cdc-events-duplicate": "true"}, "ours_conf": {}}


def job_materializer(inputs: dict) -> dict:
    force = {"table.exec.sink.upsert-materialize": "force"}
    return {"sources": {"s": inputs["main"]}, "sink_cols": COLS, "sink_key": "g, id",
            "query": "SELECT id, g, v FROM s", "flink_conf": force, "ours_conf": force}


def job_join(inputs: dict) -> dict:
    return {"sources": {"s1": inputs["left"], "s2": inputs["right"]},
            "sink_cols": "id BIGINT, g BIGINT, v BIGINT, g2 BIGINT, v2 BIGINT", "sink_key": "id",
            "query": "SELECT s1.id, s1.g, s1.v, s2.g AS g2, s2.v AS v2 FROM s1 JOIN s2 ON s1.id = s2.id",
            "flink_conf": {}, "ours_conf": {}}


def job_aggregate(inputs: dict) -> dict:
    return {"sources": {"s": inputs["main"]},
            "sink_cols": "g BIGINT, c BIGINT, sv BIGINT, mv BIGINT", "sink_key": "g",
            "query": "SELECT g, COUNT(*) AS c, SUM(v) AS sv, MIN(v) AS mv FROM s GROUP BY g",
            "flink_conf": {}, "ours_conf": {}}


def job_dedup(inputs: dict) -> dict:
    return {"sources": {"s": inputs["insert_only"]}, "source_kind": "insert_only", "sink_cols": COLS,
            "sink_key": "id",
            "query": "SELECT id, g, v FROM (SELECT id, g, v, ROW_NUMBER() OVER (PARTITION BY id ORDER BY pt DESC)"
                     " AS rn FROM s) WHERE rn = 1",
            "flink_conf": {}, "ours_conf": {}}


def job_windows(inputs: dict) -> dict:
    """Tumbling one-minute ``COUNT(DISTINCT u)`` over clicks with a 10 s
    bounded-out-of-orderness watermark (``benchmarks/windows.py``'s workload,
    as SQL on JSON lines)."""
    return {"sources": {"clicks": inputs["clicks"]}, "source_kind": "clicks",
            "sink_cols": "window_start TIMESTAMP(3), window_end TIMESTAMP(3), users BIGINT",
            "sink_key": "window_start, window_end", "check_cols": ["users"],
            "check_before": inputs["clicks_closing"],
            "query": "SELECT window_start, window_end, COUNT(DISTINCT u) AS users "
                     "FROM TABLE(TUMBLE(TABLE clicks, DESCRIPTOR(rt), INTERVAL '1' MINUTE)) "
                     "GROUP BY window_start, window_end",
            "flink_conf": {}, "ours_conf": {}}


JOBS = {"normalize": job_normalize, "materializer": job_materializer, "join": job_join,
        "aggregate": job_aggregate, "dedup": job_dedup, "windows": job_windows}


def scan_job(job: dict) -> dict:
    """The scan-only ceiling of ``job``: its sources read and discarded
    (``blackhole``, no key, so no operator is planned on either engine).
    A join's two sources are read by one ``UNION ALL``."""
    cols = "u, t" if job.get("source_kind") == "clicks" else "id, g, v"
    query = " UNION ALL ".join(f"SELECT {cols} FROM {name}" for name in job["sources"])
    sink_cols = "u BIGINT, t BIGINT" if job.get("source_kind") == "clicks" else COLS
    return {**job, "sink_cols": sink_cols, "sink_key": None, "query": query, "check_cols": [],
            "flink_conf": {}, "ours_conf": {}}


def source_ddl(job: dict, name: str, path: str, engine: str) -> str:
    kind = job.get("source_kind", "debezium")
    if kind == "debezium":
        return (f"CREATE TEMPORARY TABLE {name} ({COLS}, PRIMARY KEY (id) NOT ENFORCED)\n"
                f"  WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'debezium-json')")
    mode = ", 'changelog.mode' = 'insert-only'" if engine == "ours" else ""
    cols = (f"{COLS}, pt AS PROCTIME()" if kind == "insert_only" else
            "u BIGINT, t BIGINT, rt AS TO_TIMESTAMP_LTZ(t, 3), WATERMARK FOR rt AS rt - INTERVAL '10' SECOND")
    return (f"CREATE TEMPORARY TABLE {name} ({cols})\n"
            f"  WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'json'{mode})")


def _col_names(cols: str) -> list[str]:
    return [c.strip().split()[0] for c in cols.split(",")]


def check_columns(job: dict) -> list[str]:
    """The columns whose sums fingerprint the final table (every sink column
    unless the job names them: timestamps have no SUM)."""
    return job["check_cols"] if "check_cols" in job else _col_names(job["sink_cols"])


def check_sql(job: dict) -> str:
    """The fingerprint of the final table: row count and the sum of each checked
    column (for windows, of the windows before the closing clicks' one)."""
    sums = "".join(f", SUM({c})" for c in check_columns(job))
    where = f" WHERE window_start < TIMESTAMP '{_utc(job['check_before'])}'" if "check_before" in job else ""
    return f"SELECT COUNT(*){sums} FROM ({job['query']}){where}"


def _utc(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


# --------------------------------------------------------------------------- ours


def sink_ddl(job: dict, connector: str) -> str:
    """The sink table ``t``: ``connector`` is ``'delta', 'path' = ...`` or ``'blackhole'``."""
    key = f", PRIMARY KEY ({job['sink_key']}) NOT ENFORCED" if job.get("sink_key") else ""
    return f"CREATE TEMPORARY TABLE t ({job['sink_cols']}{key})\n  WITH ('connector' = {connector})"


def ours_script(job: dict, out: str, sink: str = "delta") -> str:
    lines = [f"SET '{k}' = '{v}';" for k, v in job["ours_conf"].items()]
    for name, path in job["sources"].items():
        lines.append(source_ddl(job, name, path, "ours") + ";")
    lines.append(sink_ddl(job, f"'delta', 'path' = '{out}'" if sink == "delta" else "'blackhole'") + ";")
    lines.append(f"INSERT INTO t {job['query']};")
    return "\n".join(lines) + "\n"


def run_ours(job: dict, work: str, mode: str, log: str, sink: str = "delta", explain: bool = False) -> dict:
    """Ours as its own process, as ``spark-changelog run job.sql`` runs it
    (:func:`ours_child`), the job twice; with the ``delta`` sink, the
    fingerprint of the first run's Delta table (``blackhole``: none).
    ``explain``: also write ``ours-plan.txt`` (one more process: a JVM start
    the caller's measurement would count)."""
    out = os.path.join(work, "ours-out")
    script = os.path.join(work, "job.sql")
    with open(script, "w") as fh:
        fh.write(ours_script(job, out, sink))
    with open(os.path.join(work, "job-warm.sql"), "w") as fh:
        fh.write(ours_script(job, out + "-warm", sink))
    spec = os.path.join(work, "ours-job.json")
    with open(spec, "w") as fh:
        json.dump({"work": work, "mode": mode}, fh)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t = time.time()
    with open(log, "a") as fh:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--ours-child", spec],
                              env=env, stdout=subprocess.PIPE, stderr=fh, text=True)
    whole_with_exit = time.time() - t
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"ours failed ({proc.returncode}); see {log}\n{proc.stdout[-2000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    if explain:
        cmd = [sys.executable, "-m", "spark_changelog.cli", "explain", script] + (["--batch"] if mode == "batch" else [])
        with open(os.path.join(work, "ours-plan.txt"), "w") as fh:
            subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.DEVNULL)
    result["whole"] = result["process_start_to_first_job_end"] + _python_start_overhead(sys.executable)
    result["process_total"] = whole_with_exit
    if sink == "delta":
        result["check"] = delta_fingerprint(out, check_columns(job), job.get("check_before"))
    return result


def ours_child(spec_path: str) -> None:
    """In our venv: what ``spark-changelog run job.sql`` does (its session,
    its runner, a dead-letter directory), twice in one process like Flink's
    child: "whole" ends with the first job, "warm" is the second job alone
    (the same query into another Delta table; streaming: another checkpoint)."""
    t0 = time.time()
    with open(spec_path) as fh:
        spec = json.load(fh)
    from spark_changelog.runtime.session import SessionStart
    work, batch = spec["work"], spec["mode"] == "batch"
    # as `spark-changelog run` (cli.cmd_run): the session starts first and is
    # built while the script is read and the runner imported
    with SessionStart("spark-changelog", command=True) as starting:
        from spark_changelog.sql.runner import run_script
        from spark_changelog.sql.script import read_script
        scripts = {"job.sql": read_script(os.path.join(work, "job.sql"))}
        spark = starting.session()
    result = {"session_start": time.time() - t0}
    starts = [] if batch else query_starts(spark)
    planning = [] if batch else first_batch_planning(spark)
    for run, name in (("first_job", "job.sql"), ("warm_job", "job-warm.sql")):
        t = time.time()
        script = scripts.pop(name, None) or read_script(os.path.join(work, name))
        run_script(spark, script, batch=batch,
                   checkpoint=None if batch else os.path.join(work, f"ours-ck-{run}"),
                   dead_letter=os.path.join(work, f"ours-dl-{run}"), show_progress=False)
        result[run] = time.time() - t
        if starts:
            # from run_script's call to the query's start (docs/runtime.md,
            # "Before the query starts"): translation, lowering, query start
            result[run + "_before_query_start"] = starts.pop(0) - t
        if run == "first_job":
            result["process_start_to_first_job_end"] = time.time() - t0
    if not batch:
        # after the timed jobs: the listener's events come on Spark's bus
        deadline = time.time() + 5
        while len(planning) < 2 and time.time() < deadline:
            time.sleep(0.05)
        for run, secs in zip(("first_job", "warm_job"), planning):
            result[run + "_query_planning"] = secs
    print("RESULT " + json.dumps(result), flush=True)


def query_starts(spark) -> list:
    """The start times (epoch seconds) of the streaming queries started in
    ``spark`` from now on, appended as they start (Spark's
    ``QueryStartedEvent`` timestamp, taken when the query is started)."""
    from pyspark.sql.streaming import StreamingQueryListener
    starts: list = []

    class Starts(StreamingQueryListener):
        def onQueryStarted(self, event):
            starts.append(datetime.datetime.fromisoformat(event.timestamp.replace("Z", "+00:00")).timestamp())

        def onQueryProgress(self, event):
            pass

        def onQueryIdle(self, event):
            pass

        def onQueryTerminated(self, event):
            pass
    spark.streams.addListener(Starts())
    return starts


def first_batch_planning(spark) -> list:
    """The ``queryPlanning`` seconds of the first micro-batch of each
    streaming query started in ``spark`` from now on, in order (Spark's query
    progress: the plans, and per stateful operator its pre-init process and
    schema files; docs/runtime.md, "Where the time goes")."""
    from pyspark.sql.streaming import StreamingQueryListener
    planning: list = []

    class FirstBatch(StreamingQueryListener):
        def onQueryStarted(self, event):
            pass

        def onQueryProgress(self, event):
            if event.progress.batchId == 0:
                planning.append(event.progress.durationMs.get("queryPlanning", 0) / 1000)

        def onQueryIdle(self, event):
            pass

        def onQueryTerminated(self, event):
            pass
    spark.streams.addListener(FirstBatch())
    return planning


def delta_fingerprint(path: str, cols: list[str], before_ms: int | None = None) -> list[int]:
    """Row count and column sums of the Delta table (only the windows that
    start before ``before_ms``, when given: see :func:`generate_clicks`)."""
    from deltalake import DeltaTable

    from spark_changelog.sinks.delta import read_arrow_table
    if not DeltaTable.is_deltatable(path):      # a job that emitted nothing
        return [0] + [0 for _ in cols]
    df = read_arrow_table(path).to_pandas()
    if before_ms is not None:
        import pandas as pd
        start = df["window_start"]
        if getattr(start.dtype, "tz", None) is not None:
            start = start.dt.tz_convert(None)
        df = df[start < pd.Timestamp(_utc(before_ms))]
    return [len(df)] + [int(df[c].astype("int64").sum()) for c in cols]


# --------------------------------------------------------------------------- Flink (runs in the Flink venv)


def flink_child(spec_path: str) -> None:
    """In the Flink venv: run the job twice (cold, warm) into blackhole, then the check."""
    t0 = time.time()
    with open(spec_path) as fh:
        spec = json.load(fh)
    job = spec["job"]
    from pyflink.table import EnvironmentSettings, TableEnvironment

    te = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = te.get_config()
    conf.set("parallelism.default", "2")
    for k, v in job["flink_conf"].items():
        conf.set(k, v)
    for name, path in job["sources"].items():
        te.execute_sql(source_ddl(job, name, path, "flink"))
    te.execute_sql(sink_ddl(job, "'blackhole'"))
    insert = f"INSERT INTO t {job['query']}"
    result = {"plan": te.explain_sql(insert).split("== Optimized Execution Plan ==")[-1].strip()}
    t = time.time()
    te.execute_sql(insert).wait()
    result["process_start_to_first_job_end"] = time.time() - t0
    result["first_job"] = time.time() - t
    t = time.time()
    te.execute_sql(insert).wait()
    result["warm_job"] = time.time() - t
    if spec["check"] and job.get("check_cols") != []:
        conf.set("table.exec.mini-batch.enabled", "true")
        conf.set("table.exec.mini-batch.allow-latency", "1 s")
        conf.set("table.exec.mini-batch.size", "10000")
        with te.execute_sql(check_sql(job)).collect() as rows:
            last = None
            for row in rows:   # a changelog of one row: the last +I/+U is the final value
                if row.get_row_kind().name in ("INSERT", "UPDATE_AFTER"):
                    last = row
        result["check"] = [int(x) if x is not None else 0 for x in last] if last is not None else [0]
    print("RESULT " + json.dumps(result), flush=True)


def run_flink(job: dict, work: str, check: bool, python: str, log: str) -> dict:
    spec = os.path.join(work, "flink-job.json")
    with open(spec, "w") as fh:
        json.dump({"job": job, "check": check}, fh)
    t = time.time()
    with open(log, "a") as fh:
        proc = subprocess.run([python, os.path.abspath(__file__), "--flink-child", spec],
                              stdout=subprocess.PIPE, stderr=fh, text=True)
    whole_with_exit = time.time() - t
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"Flink failed ({proc.returncode}); see {log}\n{proc.stdout[-2000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    # the child measured from its own start; add the interpreter start before it
    result["whole"] = result["process_start_to_first_job_end"] + _python_start_overhead(python)
    result["process_total"] = whole_with_exit
    return result


def _python_start_overhead(python: str, _cache: dict = {}) -> float:  # noqa: B006 (memo)
    """Interpreter start before the child's first line runs (measured once)."""
    if python not in _cache:
        t = time.time()
        subprocess.run([python, "-c", "pass"], check=True)
        _cache[python] = time.time() - t
    return _cache[python]


# --------------------------------------------------------------------------- driver


def ensure_inputs(events: int, ids: int, files: int, cache: str) -> dict:
    """The whole_job.py file sets (same cache names), generated if absent."""

    plain = os.path.join(cache, f"inserts-{events}-{ids}-{files}")
    if not os.path.isdir(plain):
        generate_insert_only(plain + ".tmp", events, ids, files)
        os.replace(plain + ".tmp", plain)
    # two files, one per reader of either engine (parallelism 2): a reader
    # that read a closing click and then another file would find that file's
    # clicks late (Flink's watermark is per reader, not per file)
    clicks = os.path.join(cache, f"clicks-closing-{events}-{ids}-{CLICK_FILES}")
    if not os.path.isdir(clicks):
        generate_clicks(clicks + ".tmp", events, max(ids // 10, 100), CLICK_FILES)
        os.replace(clicks + ".tmp", clicks)
    return {"main": cached_files(cache, events, ids, files),
            "left": cached_files(cache, events // 2, ids, files),
            "right": cached_files(cache, events // 2, ids, files, seed=11),
            "insert_only": plain, "clicks": clicks, "clicks_closing": closing_window_bound(events)}


def generate_insert_only(directory: str, events: int, ids: int, files: int, seed: int = 7) -> None:
    """JSON lines ``{"id", "g", "v", "op": "+I"}``, ``events`` rows over ``ids`` ids,
    each id's rows in one file (ids ``f, f + files, ...`` in file ``f``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    os.makedirs(directory)
    per_file = events // files
    for f in range(files):
        ks = np.arange(f, ids, files)[rng.integers(0, len(range(f, ids, files)), per_file)]
        gs = rng.integers(0, 100, per_file)
        vs = rng.integers(0, 1_000_000_000, per_file)
        with open(os.path.join(directory, f"part-{f}.json"), "w") as fh:
            fh.writelines(f'{{"id":{k},"g":{g},"v":{v},"op":"+I"}}\n' for k, g, v in zip(ks, gs, vs))


CLICKS_START_MS = 1_600_000_000_000
CLICK_FILES = 2
CLOSING_GAP_MS = 10 * 86_400_000


def closing_window_bound(events: int) -> int:
    """A time (ms) between the last real click and the closing clicks: the
    check compares the windows that start before it.  Five days from either
    side, so a time zone's offset cannot move a window across it."""
    return CLICKS_START_MS + events * 60 + CLOSING_GAP_MS // 2


def generate_clicks(directory: str, events: int, users: int, files: int, seed: int = 7) -> None:
    """JSON lines ``{"u", "t", "op": "+I"}``: ``events`` clicks over ``users``
    users, event time ``t`` (ms) advancing 60 ms per click (1000 per minute),
    5% of them up to 9.9 s behind (within the watermark's 10 s bound, so no
    row is late on either engine); the files split the run in time order.

    Each file ends with one closing click ten days after the last real one.
    Flink's bounded source closes every window at the end of input; a
    streaming run of ours ends when the input is read, with the windows its
    watermark has not passed still open (they close when later input comes,
    as in a stream that goes on).  The closing clicks move every partition's
    watermark past all real windows on both engines, so the tables agree on
    them; only the closing window itself differs, and the check leaves it
    out (:func:`closing_window_bound`).  A reader must read nothing after a
    closing click (its watermark would make the rest late), hence as many
    files as readers (:data:`CLICK_FILES`)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    os.makedirs(directory)
    t = CLICKS_START_MS + np.arange(events, dtype=np.int64) * 60
    behind = rng.random(events) < 0.05
    t[behind] -= rng.integers(0, 9_900, int(behind.sum()))
    us = rng.integers(0, users, events)
    for f, part in enumerate(np.array_split(np.arange(events), files)):
        with open(os.path.join(directory, f"part-{f}.json"), "w") as fh:
            fh.writelines(f'{{"u":{us[i]},"t":{t[i]},"op":"+I"}}\n' for i in part)
            fh.write(f'{{"u":0,"t":{CLICKS_START_MS + events * 60 + CLOSING_GAP_MS},"op":"+I"}}\n')


def main(argv=None) -> None:
    """The child processes of :func:`run_ours` and :func:`run_flink`."""
    ap = argparse.ArgumentParser(description="a child process of the benchmark suite (benchmarks/suite.py)")
    ap.add_argument("--flink-child", metavar="SPEC")
    ap.add_argument("--ours-child", metavar="SPEC")
    args = ap.parse_args(argv)
    if args.flink_child:
        return flink_child(args.flink_child)
    if args.ours_child:
        return ours_child(args.ours_child)
    ap.error("run the suite instead: scripts/bench suite [--only normalize,...]")


if __name__ == "__main__":
    main()
