"""The keyed stages' tasks, from Spark's event log: how evenly a stateful
stage's work falls on its tasks (docs/runtime.md, "Key groups over the state
partitions").

Run the processes to look at with Spark's event log on, e.g. the suite's
streaming jobs::

    mkdir -p /tmp/conf /tmp/events
    printf 'spark.eventLog.enabled true\\nspark.eventLog.dir file:///tmp/events\\n' > /tmp/conf/spark-defaults.conf
    SPARK_CONF_DIR=/tmp/conf scripts/bench suite --only normalize,join --runs streaming,flink
    scripts/bench keyed-stages /tmp/events --jobs normalize,join

Each event log is one process (a suite job, in the order they ran; ``--jobs``
names them); each process runs its query twice (whole, warm).  For every
stage with a ``transformWithStateInPandas`` step it lists each task's wall
time and the JVM's CPU time of the task (the Python worker's CPU is not in
it), and the stage's wall time, which is its slowest task's.  Writes
``benchmarks/results/keyed-stages-<time>.md`` and ``.json``.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
import time

import pyarrow as pa

HERE = os.path.dirname(os.path.abspath(__file__))


def _events(path: str):
    if path.endswith(".zstd"):
        with pa.CompressedInputStream(pa.OSFile(path), "zstd") as stream:
            text = stream.read().decode()
    else:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    for line in text.splitlines():
        if line.strip():
            yield json.loads(line)


def stateful_stages(path: str) -> list[dict]:
    """The stateful stages of one event log: run (1 whole, 2 warm), stage,
    tasks' wall and JVM CPU seconds, the stage's wall seconds."""
    stages, tasks, stage_query, queries = {}, collections.defaultdict(list), {}, []
    for e in _events(path):
        kind = e["Event"]
        if kind == "SparkListenerJobStart":
            q = (e.get("Properties") or {}).get("sql.streaming.queryId", "")
            for s in e.get("Stage IDs", []):
                stage_query[s] = q
            if q and q not in queries:
                queries.append(q)
        elif kind == "SparkListenerStageCompleted":
            info = e["Stage Info"]
            scopes = {json.loads(r["Scope"])["name"] for r in info.get("RDD Info", []) if r.get("Scope")}
            if any("TransformWithState" in s for s in scopes):
                stages[info["Stage ID"]] = (info.get("Completion Time", 0) - info.get("Submission Time", 0)) / 1000
        elif kind == "SparkListenerTaskEnd":
            t, m = e["Task Info"], e.get("Task Metrics") or {}
            tasks[e["Stage ID"]].append(((t["Finish Time"] - t["Launch Time"]) / 1000,
                                         m.get("Executor CPU Time", 0) / 1e9))
    out = []
    for s, wall in sorted(stages.items()):
        q = stage_query.get(s, "")
        out.append({"run": queries.index(q) + 1 if q in queries else None, "stage": s, "stage_s": round(wall, 3),
                    "task_wall_s": [round(w, 3) for w, _ in tasks[s]],
                    "task_jvm_cpu_s": [round(c, 3) for _, c in tasks[s]]})
    return out


def markdown(result: dict) -> str:
    lines = [f"# Keyed stages' tasks, {result['time_utc']} UTC", "",
             f"`{result['command']}` over the event logs of: {result['what']}", "",
             "| job | run | stage | stage wall s | tasks' wall s | tasks' JVM CPU s | slowest / mean task |",
             "|---|---|---|---|---|---|---|"]
    for job in result["jobs"]:
        for s in job["stages"]:
            walls = s["task_wall_s"]
            skew = max(walls) / (sum(walls) / len(walls)) if walls and sum(walls) else 0
            lines.append(f"| {job['job']} | {'whole' if s['run'] == 1 else 'warm' if s['run'] == 2 else '?'} "
                         f"| {s['stage']} | {s['stage_s']:.2f} | {', '.join(f'{w:.2f}' for w in walls)} "
                         f"| {', '.join(f'{c:.2f}' for c in s['task_jvm_cpu_s'])} | {skew:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("events", help="Spark's event log directory (spark.eventLog.dir)")
    ap.add_argument("--jobs", default="", help="the processes' names, in the order they ran (comma-separated)")
    ap.add_argument("--what", default="", help="what ran (for the results file)")
    args = ap.parse_args(argv)
    logs = sorted(glob.glob(os.path.join(args.events, "*", "events_*")) +
                  [p for p in glob.glob(os.path.join(args.events, "*")) if os.path.isfile(p)],
                  key=os.path.getmtime)
    names = [n for n in args.jobs.split(",") if n]
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    given = argv if argv is not None else sys.argv[1:]
    result = {"time_utc": stamp, "command": "scripts/bench keyed-stages " + " ".join(given),
              "what": args.what or args.events,
              "jobs": [{"job": names[i] if i < len(names) else os.path.basename(p), "log": os.path.basename(p),
                        "stages": stateful_stages(p)} for i, p in enumerate(logs)]}
    md = markdown(result)
    out = os.path.join(HERE, "results", f"keyed-stages-{stamp}")
    with open(out + ".json", "w") as fh:
        json.dump(result, fh, indent=1)
    with open(out + ".md", "w") as fh:
        fh.write(md)
    print(md + f"written: benchmarks/results/keyed-stages-{stamp}.md and .json")


if __name__ == "__main__":
    main()
