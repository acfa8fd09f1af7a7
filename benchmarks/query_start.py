"""A query's start, A/B (docs/runtime.md, "Fixed costs of every process",
"Before the query starts").

    scripts/bench query-start [--job join] [--compare forks|session-start|extensions] [--repeats 2] [--events 1000000]

The suite's streaming job (``vs_flink.JOBS``, into ``blackhole``) run twice
in one process, as the suite does (*first*: the process's first query;
*warm*: the second), alternately in two variants, each its own process:
``--compare forks`` without the driver's fork server
(``SPARK_CHANGELOG_DRIVER_FORKS=0``: every stateful operator's pre-init
process a new interpreter) and with it; ``--compare session-start`` the
session built first and then the script read and the runner imported
(*late*), or the session built in its thread while they are (*early*, as
``spark-changelog run`` does: ``SessionStart``); ``--compare extensions``
the session extensions that jars register loaded (Spark's default) or not
(a command's local session, ``COMMAND_LOCAL_CONFIGS``).  Records the time from
the process's first line to the session (*session ready*, the script read
included) and to the first job's end, each job's time before its query
started, Spark's query progress of each query's first micro-batch
(``queryPlanning``, where the pre-init runs, and ``triggerExecution``) and
the jobs' wall time.  Writes ``benchmarks/results/query-start-<time>.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import vs_flink  # noqa: E402
from whole_job import machine_load  # noqa: E402

CACHE = os.path.join(tempfile.gettempdir(), "spark-changelog-bench")
MEASURES = ("session_ready", "first_before_query_start", "session_to_first_job_end", "first_job", "warm_job",
            "first_planning", "warm_planning", "first_trigger", "warm_trigger")


def child(job_name: str, work: str, events: int, session_start: str, configs: dict) -> None:
    """``session_start``: ``early`` as ``spark-changelog run`` (the session
    built while the first script is read and the runner imported), ``late``
    the session first, then those; ``configs``: the session's settings
    beyond ``build_session``'s."""
    job = vs_flink.JOBS[job_name](vs_flink.ensure_inputs(events, 100_000, 4, CACHE))
    scripts = {}
    for run in ("first", "warm"):
        scripts[run] = os.path.join(work, f"{run}.sql")
        with open(scripts[run], "w") as fh:
            fh.write(vs_flink.ours_script(job, os.path.join(work, f"out-{run}"), "blackhole"))
    t0 = time.time()
    from spark_changelog.runtime.session import SessionStart
    with SessionStart("query-start-ab", configs=configs, background=session_start == "early",
                      command=True) as starting:
        if session_start == "late":
            spark = starting.session()
        from spark_changelog.sql.runner import run_script
        from spark_changelog.sql.script import read_script
        first = read_script(scripts["first"])
        spark = starting.session()
    session_ready = time.time() - t0
    from pyspark.sql.streaming import StreamingQueryListener
    first_batches, starts = [], vs_flink.query_starts(spark)

    class FirstBatch(StreamingQueryListener):
        def onQueryStarted(self, event):
            pass

        def onQueryProgress(self, event):
            if event.progress.batchId == 0:
                first_batches.append(dict(event.progress.durationMs))

        def onQueryIdle(self, event):
            pass

        def onQueryTerminated(self, event):
            pass

    spark.streams.addListener(FirstBatch())
    result = {"session_ready": session_ready}
    for run in ("first", "warm"):
        t = time.time()
        run_script(spark, first if run == "first" else read_script(scripts[run]), batch=False,
                   checkpoint=os.path.join(work, f"ck-{run}"), dead_letter=os.path.join(work, f"dl-{run}"),
                   show_progress=False)
        result[f"{run}_job"] = time.time() - t
        result[f"{run}_before_query_start"] = starts[-1] - t
        if run == "first":
            result["session_to_first_job_end"] = time.time() - t0
        deadline = time.time() + 10         # the listener's events arrive asynchronously
        while len(first_batches) < (1 if run == "first" else 2) and time.time() < deadline:
            time.sleep(0.05)
        progress = first_batches[-1]
        result[f"{run}_planning"] = progress["queryPlanning"] / 1000
        result[f"{run}_trigger"] = progress["triggerExecution"] / 1000
    print("RESULT " + json.dumps(result), flush=True)


#: what each comparison runs: (tag, environment, session start, session
#: settings) per variant
COMPARISONS = {
    "forks": (("without", {"SPARK_CHANGELOG_DRIVER_FORKS": "0"}, "early", {}),
              ("with", {"SPARK_CHANGELOG_DRIVER_FORKS": "1"}, "early", {})),
    "session-start": (("late", {}, "late", {}), ("early", {}, "early", {})),
    # the session extensions of the jars' ServiceLoader loaded (Spark's
    # default) or not (a command's local session: COMMAND_LOCAL_CONFIGS)
    "extensions": (("loaded", {}, "early", {"spark.sql.extensions.test.loadFromCp": "true"}),
                   ("skipped", {}, "early", {})),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default="join", choices=sorted(vs_flink.JOBS))
    ap.add_argument("--compare", default="forks", choices=sorted(COMPARISONS),
                    help="forks: without and with the driver's fork server; session-start: the session "
                         "built before the script is read (late) or while it is (early, as the command "
                         "does); extensions: the jars' session extensions loaded (Spark's default) or not "
                         "(as a command's local session does)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], args.child[1], args.events, args.child[2], json.loads(args.child[3]))
    vs_flink.ensure_inputs(args.events, 100_000, 4, CACHE)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    variants = COMPARISONS[args.compare]
    runs = {tag: [] for tag, _, _, _ in variants}
    for _ in range(args.repeats):
        for tag, extra, start, configs in variants:
            with tempfile.TemporaryDirectory(prefix="query-start-") as work:
                load0 = machine_load()
                out = subprocess.run([sys.executable, __file__, "--events", str(args.events), "--child", args.job,
                                      work, start, json.dumps(configs)], env=dict(env, **extra),
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True).stdout
            r = json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1][7:])
            r["load"] = f"{load0}-{machine_load()}"
            runs[tag].append(r)
            print(f"{tag:<8} session ready {r['session_ready']:4.2f} s, first job's query started after "
                  f"{r['first_before_query_start']:4.2f} s, its end {r['session_to_first_job_end']:5.1f} s | "
                  f"queryPlanning first {r['first_planning']:4.2f} s, warm {r['warm_planning']:4.2f} s | jobs first "
                  f"{r['first_job']:5.1f} s, warm {r['warm_job']:5.1f} s | load {r['load']}", flush=True)
    med = {t: {k: round(statistics.median(r[k] for r in rs), 3) for k in MEASURES} for t, rs in runs.items()}
    for tag in runs:
        m = med[tag]
        print(f"median, {tag}: session ready {m['session_ready']:.2f} s, first query started "
              f"{m['first_before_query_start']:.2f} s later, first job's end {m['session_to_first_job_end']:.2f} s; "
              f"queryPlanning first {m['first_planning']:.2f} s, warm {m['warm_planning']:.2f} s")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = os.path.join(HERE, "results", f"query-start-{stamp}.json")
    with open(path, "w") as fh:
        json.dump({"time_utc": stamp, "job": args.job, "compare": args.compare, "events": args.events,
                   "runs": runs, "median": med}, fh, indent=1)
    print(f"written: {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    main()
