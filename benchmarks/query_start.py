"""A query's start with and without the pre-init fork server, A/B
(docs/runtime.md, "Fixed costs of every process").

    scripts/bench query-start [--job join] [--repeats 2] [--events 1000000]

The suite's streaming job (``vs_flink.JOBS``, into ``blackhole``) run twice
in one process, as the suite does (*first*: the process's first query;
*warm*: the second), alternately without the driver's fork server
(``SPARK_CHANGELOG_DRIVER_FORKS=0``: every stateful operator's pre-init
process a new interpreter) and with it, each its own process.  Records
Spark's query progress of each query's first micro-batch (``queryPlanning``,
where the pre-init runs, and ``triggerExecution``) and the jobs' wall time.
Writes ``benchmarks/results/query-start-<time>.json``.
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
MEASURES = ("first_job", "warm_job", "first_planning", "warm_planning", "first_trigger", "warm_trigger")


def child(job_name: str, work: str, events: int) -> None:
    job = vs_flink.JOBS[job_name](vs_flink.ensure_inputs(events, 100_000, 4, CACHE))
    from pyspark.sql.streaming import StreamingQueryListener

    from spark_changelog.runtime.session import build_session
    from spark_changelog.sql.runner import run_script
    from spark_changelog.sql.script import read_script
    spark = build_session("query-start-ab")
    first_batches = []

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
    result = {}
    for run in ("first", "warm"):
        script = os.path.join(work, f"{run}.sql")
        with open(script, "w") as fh:
            fh.write(vs_flink.ours_script(job, os.path.join(work, f"out-{run}"), "blackhole"))
        t = time.time()
        run_script(spark, read_script(script), batch=False, checkpoint=os.path.join(work, f"ck-{run}"),
                   dead_letter=os.path.join(work, f"dl-{run}"), show_progress=False)
        result[f"{run}_job"] = time.time() - t
        deadline = time.time() + 10         # the listener's events arrive asynchronously
        while len(first_batches) < (1 if run == "first" else 2) and time.time() < deadline:
            time.sleep(0.05)
        progress = first_batches[-1]
        result[f"{run}_planning"] = progress["queryPlanning"] / 1000
        result[f"{run}_trigger"] = progress["triggerExecution"] / 1000
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default="join", choices=sorted(vs_flink.JOBS))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], args.child[1], args.events)
    vs_flink.ensure_inputs(args.events, 100_000, 4, CACHE)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    runs = {"without": [], "with": []}
    for _ in range(args.repeats):
        for tag, switch in (("without", "0"), ("with", "1")):
            with tempfile.TemporaryDirectory(prefix="query-start-") as work:
                load0 = machine_load()
                out = subprocess.run([sys.executable, __file__, "--events", str(args.events), "--child", args.job,
                                      work], env=dict(env, SPARK_CHANGELOG_DRIVER_FORKS=switch),
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True).stdout
            r = json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1][7:])
            r["load"] = f"{load0}-{machine_load()}"
            runs[tag].append(r)
            print(f"{tag:<8} fork server: queryPlanning first {r['first_planning']:4.2f} s, warm "
                  f"{r['warm_planning']:4.2f} s | jobs first {r['first_job']:5.1f} s, warm {r['warm_job']:5.1f} s "
                  f"| load {r['load']}", flush=True)
    med = {t: {k: round(statistics.median(r[k] for r in rs), 3) for k in MEASURES} for t, rs in runs.items()}
    print(f"median queryPlanning: first query {med['without']['first_planning']:.2f} s without, "
          f"{med['with']['first_planning']:.2f} s with the fork server; warm {med['without']['warm_planning']:.2f} s, "
          f"{med['with']['warm_planning']:.2f} s")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = os.path.join(HERE, "results", f"query-start-{stamp}.json")
    with open(path, "w") as fh:
        json.dump({"time_utc": stamp, "job": args.job, "events": args.events, "runs": runs, "median": med},
                  fh, indent=1)
    print(f"written: {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    main()
