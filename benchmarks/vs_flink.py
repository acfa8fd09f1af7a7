"""Benchmark: whole jobs, ours against Apache Flink 2.3 on the same files.

    scripts/bench vs-flink [--events 1000000] [--ids 100000] [--files 4]
                           [--jobs normalize,materializer,join,aggregate,dedup] [--ours-mode batch|streaming]
                           [--no-check] [--flink-python /work/flink-venv/bin/python]

Inputs: the Debezium JSON change files of ``benchmarks/whole_job.py`` (its
generator and its cache directory: ``id BIGINT, g BIGINT, v BIGINT``, about
17% creates, 74% updates, 8% deletes, each id's history in one file in log
order).  The join reads two such file sets of ``--events / 2`` events each over
the same ids (seeds 7 and 11).

Every job is ONE Flink SQL query, the same text for both engines; only the
``WITH`` options of the tables and a few engine settings differ:

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
  ORDER BY pt DESC) = 1``, ``pt AS PROCTIME()``) over ``--events`` insert-only
  JSON lines (``id, g, v`` and an ``op`` column ``+I``) over the same ids,
  each id's rows in one file; sink keyed by ``id``.

Each engine runs each job as its own process, one after the other (never two
at once):

* ours: what ``spark-changelog run job.sql --batch`` (or ``--checkpoint``
  with ``--ours-mode streaming``) does, into a Delta table: the user's path,
  JVM start and imports included.  Like Flink's, the process runs the job
  twice (the second into another table): "whole" is the process start to the
  end of the first job, "warm" the second job alone;
* Flink: PyFlink's ``TableEnvironment`` (streaming mode, parallelism 2, heap
  state) from the Flink venv, ``filesystem`` source with ``format =
  'debezium-json'`` (``dedup``: ``json``), into a ``blackhole`` sink.  The process runs the job
  twice: "whole" is the time from the process start to the end of the first
  job (JVM start included, JVM shutdown not), "warm" is the second job alone
  (the figure issues #9 and #11 quote).

The table gives three ratios of ours' rate to Flink's: whole process to whole
process, warm job to warm job, and ours' whole process to Flink's warm job
(the strictest, the one reported before ours' warm job was measured).

Check (unless ``--no-check``): after its timed jobs, the Flink process runs
``SELECT COUNT(*), SUM(col)... FROM (query)`` (mini-batch on, collected) and
the final row is compared with the same numbers over our Delta table.  The
SinkUpsertMaterializer sits only in front of a sink, so for ``materializer``
Flink's check covers the query's result, not its materializer.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FLINK_PYTHON = "/work/flink-venv/bin/python"
sys.path.insert(0, HERE)
from whole_job import cached_files, input_arguments, machine_load  # noqa: E402  (the whole-job benchmark's inputs)
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
    return {"sources": {"s": inputs["insert_only"]}, "insert_only": True, "sink_cols": COLS, "sink_key": "id",
            "query": "SELECT id, g, v FROM (SELECT id, g, v, ROW_NUMBER() OVER (PARTITION BY id ORDER BY pt DESC)"
                     " AS rn FROM s) WHERE rn = 1",
            "flink_conf": {}, "ours_conf": {}}


JOBS = {"normalize": job_normalize, "materializer": job_materializer, "join": job_join,
        "aggregate": job_aggregate, "dedup": job_dedup}


def source_ddl(job: dict, name: str, path: str, engine: str) -> str:
    if not job.get("insert_only"):
        return (f"CREATE TEMPORARY TABLE {name} ({COLS}, PRIMARY KEY (id) NOT ENFORCED)\n"
                f"  WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'debezium-json')")
    mode = ", 'changelog.mode' = 'insert-only'" if engine == "ours" else ""
    return (f"CREATE TEMPORARY TABLE {name} ({COLS}, pt AS PROCTIME())\n"
            f"  WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'json'{mode})")


def _col_names(cols: str) -> list[str]:
    return [c.strip().split()[0] for c in cols.split(",")]


def check_sql(job: dict) -> str:
    """The fingerprint of the final table: row count and the sum of every column."""
    sums = ", ".join(f"SUM({c})" for c in _col_names(job["sink_cols"]))
    return f"SELECT COUNT(*), {sums} FROM ({job['query']})"


# --------------------------------------------------------------------------- ours


def ours_script(job: dict, out: str) -> str:
    lines = [f"SET '{k}' = '{v}';" for k, v in job["ours_conf"].items()]
    for name, path in job["sources"].items():
        lines.append(source_ddl(job, name, path, "ours") + ";")
    lines.append(f"CREATE TEMPORARY TABLE t ({job['sink_cols']}, PRIMARY KEY ({job['sink_key']}) NOT ENFORCED)\n"
                 f"  WITH ('connector' = 'delta', 'path' = '{out}');")
    lines.append(f"INSERT INTO t {job['query']};")
    return "\n".join(lines) + "\n"


def run_ours(job: dict, work: str, mode: str, log: str) -> dict:
    """Ours as its own process, as ``spark-changelog run job.sql`` runs it
    (:func:`ours_child`), the job twice; the fingerprint of the first run's
    Delta table."""
    out = os.path.join(work, "ours-out")
    script = os.path.join(work, "job.sql")
    with open(script, "w") as fh:
        fh.write(ours_script(job, out))
    with open(os.path.join(work, "job-warm.sql"), "w") as fh:
        fh.write(ours_script(job, out + "-warm"))
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
    explain = [sys.executable, "-m", "spark_changelog.cli", "explain", script] + (["--batch"] if mode == "batch" else [])
    with open(os.path.join(work, "ours-plan.txt"), "w") as fh:
        subprocess.run(explain, env=env, stdout=fh, stderr=subprocess.DEVNULL)
    result["whole"] = result["process_start_to_first_job_end"] + _python_start_overhead(sys.executable)
    result["process_total"] = whole_with_exit
    result["check"] = delta_fingerprint(out, _col_names(job["sink_cols"]))
    return result


def ours_child(spec_path: str) -> None:
    """In our venv: what ``spark-changelog run job.sql`` does (its session,
    its runner, a dead-letter directory), twice in one process like Flink's
    child: "whole" ends with the first job, "warm" is the second job alone
    (the same query into another Delta table; streaming: another checkpoint)."""
    t0 = time.time()
    with open(spec_path) as fh:
        spec = json.load(fh)
    from spark_changelog.runtime.session import build_session
    from spark_changelog.sql.runner import run_script
    from spark_changelog.sql.script import read_script
    work, batch = spec["work"], spec["mode"] == "batch"
    spark = build_session("spark-changelog")
    result = {}
    for run, name in (("first_job", "job.sql"), ("warm_job", "job-warm.sql")):
        t = time.time()
        run_script(spark, read_script(os.path.join(work, name)), batch=batch,
                   checkpoint=None if batch else os.path.join(work, f"ours-ck-{run}"),
                   dead_letter=os.path.join(work, f"ours-dl-{run}"), show_progress=False)
        result[run] = time.time() - t
        if run == "first_job":
            result["process_start_to_first_job_end"] = time.time() - t0
    print("RESULT " + json.dumps(result), flush=True)


def delta_fingerprint(path: str, cols: list[str]) -> list[int]:
    from deltalake import DeltaTable
    df = DeltaTable(path).to_pandas()
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
    te.execute_sql(f"CREATE TEMPORARY TABLE t ({job['sink_cols']}, PRIMARY KEY ({job['sink_key']}) NOT ENFORCED) "
                   f"WITH ('connector' = 'blackhole')")
    insert = f"INSERT INTO t {job['query']}"
    result = {"plan": te.explain_sql(insert).split("== Optimized Execution Plan ==")[-1].strip()}
    t = time.time()
    te.execute_sql(insert).wait()
    result["process_start_to_first_job_end"] = time.time() - t0
    result["first_job"] = time.time() - t
    t = time.time()
    te.execute_sql(insert).wait()
    result["warm_job"] = time.time() - t
    if spec["check"]:
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
    return {"main": cached_files(cache, events, ids, files),
            "left": cached_files(cache, events // 2, ids, files),
            "right": cached_files(cache, events // 2, ids, files, seed=11),
            "insert_only": plain}


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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    input_arguments(ap)
    ap.add_argument("--jobs", default=",".join(JOBS))
    ap.add_argument("--ours-mode", choices=["batch", "streaming"], default="batch")
    ap.add_argument("--no-check", action="store_true", help="skip the result comparison")
    ap.add_argument("--flink-python", default=FLINK_PYTHON)
    ap.add_argument("--flink-child", metavar="SPEC", help=argparse.SUPPRESS)
    ap.add_argument("--ours-child", metavar="SPEC", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.flink_child:
        return flink_child(args.flink_child)
    if args.ours_child:
        return ours_child(args.ours_child)

    inputs = ensure_inputs(args.events, args.ids, args.files, args.cache)
    root = tempfile.mkdtemp(prefix="vs-flink-")
    log = os.path.join(root, "jobs.log")
    print(f"{args.events:,} Debezium events over {args.ids:,} ids in {args.files} files; ours: {args.ours_mode}; "
          f"Flink 2.3: streaming, parallelism 2, blackhole sink; load {machine_load()} at start; logs: {log}")
    rows = []
    for name in args.jobs.split(","):
        job = JOBS[name](inputs)
        work = os.path.join(root, name)
        os.makedirs(work)
        load_before = machine_load()
        ours = run_ours(job, work, args.ours_mode, log)
        flink = run_flink(job, work, not args.no_check, args.flink_python, log)
        agree = "not compared" if args.no_check else ("yes" if ours["check"] == flink["check"] else
                                                       f"NO: ours {ours['check']} Flink {flink['check']}")
        row = {"job": name, "ours": ours["whole"], "ours_warm": ours["warm_job"], "flink_whole": flink["whole"],
               "flink_warm": flink["warm_job"], "agree": agree, "load": f"{load_before}/{machine_load()}"}
        rows.append(row)
        print(f"  {name}: ours whole {row['ours']:.1f} s, warm job {row['ours_warm']:.1f} s; Flink whole "
              f"{row['flink_whole']:.1f} s, warm job {row['flink_warm']:.1f} s; results agree: {agree} "
              f"(load {row['load']})", flush=True)
        with open(os.path.join(work, "flink-plan.txt"), "w") as fh:
            fh.write(flink["plan"] + "\n")
        with open(os.path.join(work, "times.json"), "w") as fh:
            json.dump({"ours": ours, "flink": {k: v for k, v in flink.items() if k != "plan"}}, fh, indent=1)
    n = args.events
    print()
    print("| job | ours whole / warm | Flink whole / warm | ours events/s (whole / warm) | "
          "Flink events/s (whole / warm) | ours/Flink rate: whole/whole, warm/warm, whole/warm | same result | load |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['job']} | {r['ours']:.1f} s / {r['ours_warm']:.1f} s | {r['flink_whole']:.1f} s / "
              f"{r['flink_warm']:.1f} s | {n / r['ours'] / 1e3:.0f}k / {n / r['ours_warm'] / 1e3:.0f}k | "
              f"{n / r['flink_whole'] / 1e3:.0f}k / {n / r['flink_warm'] / 1e3:.0f}k | "
              f"{r['flink_whole'] / r['ours']:.0%}, {r['flink_warm'] / r['ours_warm']:.0%}, "
              f"{r['flink_warm'] / r['ours']:.0%} | {r['agree']} | {r['load']} |")
    print(f"\nload average at end {machine_load()}; plans (ours-plan.txt, flink-plan.txt) and job logs under {root}")


if __name__ == "__main__":
    main()
