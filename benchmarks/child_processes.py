"""The programs a streaming run's JVM starts as child processes, counted and
attributed, with Hadoop's checksummed local file system and with the raw one
(docs/runtime.md, "Checkpoint files on the local file system").

    scripts/bench child-processes [--jobs join,normalize] [--events 1000000]
                                  [--fs checksum,raw] [--timed N]

Each job of the suite (``vs_flink.JOBS``) runs once in its own process, as the
suite's streaming run does (its SQL script, into ``blackhole``, with a
checkpoint), under ``strace -f`` (``execve``, ``clone``, ``vfork`` and the
threads' names).  Every program a JVM thread starts is counted by name, by the
checkpoint file it works on (offset, commit and source logs, the operators'
metadata and state schema, the state stores' files, RocksDB's local
directories) and by the kind of thread that started it (the query's driver
thread, a task, state store maintenance).  ``--fs``: ``checksum`` is Hadoop's
default ``LocalFs`` (a ``.crc`` file beside each checkpoint file), ``raw``
Hadoop's ``RawLocalFs`` (runtime/session.py).  strace slows the run down, so
only the counts are the result, not the times.

``--timed N``: no strace; each job's process runs the query twice (*first*
and *warm*, as the suite does), N times per file system, alternately, and
records the job times and, from Spark's query progress, the driver's log
writes per micro-batch (``walCommit``: the offset log, ``commitOffsets``:
the commit log), the first batch's ``queryPlanning`` (the operators' state
schema and metadata files) and the stateful operators' state store commit
time (``commitTimeMs``, summed over operators: the tasks' state files).
Writes ``benchmarks/results/child-processes-<time>.json`` and ``.md``.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
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
#: the ``file:`` scheme's Hadoop file system behind FileContext, Spark's
#: default checkpoint file manager
FILE_SYSTEMS = {"checksum": "org.apache.hadoop.fs.local.LocalFs",
                "raw": "org.apache.hadoop.fs.local.RawLocalFs"}
FS_KEY = "spark.hadoop.fs.AbstractFileSystem.file.impl"

#: what a path in a program's arguments is, first match wins
COMPONENTS = [("offset log", re.compile(r"/offsets/")), ("commit log", re.compile(r"/commits/")),
              ("source log", re.compile(r"/sources/")),
              ("operator metadata", re.compile(r"/state/\d+/_metadata/")),
              ("state schema", re.compile(r"/_stateSchema/")),
              ("state store files", re.compile(r"/state/\d+/\d+/")),
              ("query metadata", re.compile(r"/metadata$|/\.metadata")),
              ("RocksDB local directory", re.compile(r"StateStoreId|rocksdb|/spark-[0-9a-f-]{36}/"))]
#: the kind of thread that started a program, by its native name (the
#: first 15 characters of the Java thread's name when it started)
THREADS = [("query driver thread", "stream execut"), ("task", "Executor task"),
           ("state store maintenance", "state-store"), ("state store maintenance", "RocksDB")]

_LINE = re.compile(r"^(\d+)\s+(\d+:\d+:\d+\.\d+)\s+(.*)$")


def child(job_name: str, work: str, events: int, fs: str, timed: bool) -> None:
    """``job_name``'s streaming query (the suite's script) with ``fs`` as
    the ``file:`` scheme's FileContext file system: once, or (``timed``)
    twice with the query progress recorded."""
    job = vs_flink.JOBS[job_name](vs_flink.ensure_inputs(events, 100_000, 4, CACHE))
    from spark_changelog.runtime.session import build_session
    from spark_changelog.sql.runner import run_script
    from spark_changelog.sql.script import read_script
    spark = build_session("child-processes", configs={FS_KEY: FILE_SYSTEMS[fs]})
    progress = _progress_listener(spark)
    result = {}
    for run in ("first", "warm") if timed else ("first",):
        script = os.path.join(work, f"{run}.sql")
        with open(script, "w") as fh:
            fh.write(vs_flink.ours_script(job, os.path.join(work, f"out-{run}"), "blackhole"))
        t = time.time()
        run_script(spark, read_script(script), batch=False, checkpoint=os.path.join(work, f"ck-{run}"),
                   dead_letter=os.path.join(work, f"dl-{run}"), show_progress=False)
        result[f"{run}_job"] = round(time.time() - t, 2)
    ck = os.path.join(work, "ck-first")
    result["checkpoint_files"] = sum(len(files) for _, _, files in os.walk(ck))
    result["crc_files"] = sum(f.endswith(".crc") for _, _, files in os.walk(ck) for f in files)
    if timed:
        deadline = time.time() + 10         # the listener's events arrive asynchronously
        while len({p["id"] for p in progress}) < 2 and time.time() < deadline:
            time.sleep(0.05)
        result["batches"] = progress
    print("RESULT " + json.dumps(result), flush=True)


def _progress_listener(spark) -> list:
    """Each micro-batch's durations and state store commit times, appended
    as Spark reports them."""
    from pyspark.sql.streaming import StreamingQueryListener
    out: list = []

    class Progress(StreamingQueryListener):
        def onQueryStarted(self, event):
            pass

        def onQueryProgress(self, event):
            p = event.progress
            d = dict(p.durationMs)
            out.append({"id": str(p.id), "batch": p.batchId, "rows": p.numInputRows,
                        "walCommit": d.get("walCommit", 0), "commitOffsets": d.get("commitOffsets", 0),
                        "queryPlanning": d.get("queryPlanning", 0),
                        "triggerExecution": d.get("triggerExecution", 0),
                        "stateCommit": sum(op.commitTimeMs for op in p.stateOperators)})

        def onQueryIdle(self, event):
            pass

        def onQueryTerminated(self, event):
            pass

    spark.streams.addListener(Progress())
    return out


def parse_trace(path: str) -> list[dict]:
    """The programs started by a JVM's threads in an ``strace -f -tt`` log:
    one dict per program (name, arguments, the starting thread's name)."""
    names: dict = {}            # tid -> native thread name
    tgid: dict = {}             # tid -> process id
    exe: dict = {}              # process id -> the program it runs
    started_by: dict = {}       # child pid -> parent tid
    programs: dict = {}         # child pid -> (program, argv)
    pending: dict = {}          # tid -> the call it left unfinished
    with open(path, errors="replace") as fh:
        for line in fh:
            m = _LINE.match(line.rstrip("\n"))
            if not m:
                continue
            tid, rest = int(m.group(1)), m.group(3)
            tgid.setdefault(tid, tid)
            if rest.endswith("<unfinished ...>"):
                pending[tid] = rest
                continue
            if rest.startswith("<..."):
                rest = pending.pop(tid, "") + rest
            if rest.startswith(("clone", "vfork")):
                r = re.search(r"= (\d+)$", rest)
                if r:
                    new = int(r.group(1))
                    if "CLONE_THREAD" in rest:
                        tgid[new] = tgid[tid]
                        names[new] = names.get(tid, "")
                    else:
                        tgid[new] = new
                        started_by[new] = tid
            elif rest.startswith("prctl(PR_SET_NAME"):
                n = re.search(r'"(.*)"', rest)
                if n:
                    names[tid] = n.group(1)
            elif rest.startswith("execve(") and rest.endswith("= 0"):
                prog = re.match(r'execve\("([^"]+)", \[(.*?)\]', rest)
                if not prog:
                    continue
                argv = re.findall(r'"((?:[^"\\]|\\.)*)"', prog.group(2))
                exe[tgid[tid]] = prog.group(1)
                if not prog.group(1).endswith("jspawnhelper"):
                    programs[tid] = (os.path.basename(prog.group(1)), argv)
    out = []
    for pid, (prog, argv) in programs.items():
        parent = started_by.get(pid)
        if parent is None or not exe.get(tgid.get(parent, -1), "").endswith("/java"):
            continue
        out.append({"program": prog, "argv": argv, "thread": names.get(parent, "")})
    return out


def attribute(programs: list[dict]) -> dict:
    by_program = collections.Counter(p["program"] for p in programs)
    by_component: dict = collections.defaultdict(collections.Counter)
    by_thread: dict = collections.defaultdict(collections.Counter)
    for p in programs:
        path = p["argv"][-1] if p["argv"] else ""
        if p["program"] == "chmod" and p["argv"][1:2] == ["0755"]:
            comp = "directories"        # a directory Spark creates (mkdirs)
        else:
            comp = next((c for c, rx in COMPONENTS if rx.search(path)), "other")
        if os.path.basename(path).endswith(".crc"):
            comp += " (.crc)"
        by_component[comp][p["program"]] += 1
        kind = next((k for k, prefix in THREADS if p["thread"].startswith(prefix)), p["thread"] or "?")
        by_thread[kind][p["program"]] += 1
    return {"total": len(programs), "by_program": dict(by_program),
            "by_component": {k: dict(v) for k, v in sorted(by_component.items())},
            "by_thread": {k: dict(v) for k, v in sorted(by_thread.items())}}


def run_one(job: str, fs: str, events: int, env: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="child-processes-") as work:
        trace = os.path.join(work, "strace.log")
        load0 = machine_load()
        cmd = ["strace", "-f", "-q", "-tt", "-s", "512", "-e", "trace=execve,clone,clone3,vfork,prctl",
               "-o", trace, sys.executable, __file__, "--events", str(events), "--child", job, work, fs, "0"]
        out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             check=True).stdout
        r = json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1][7:])
        r["job_s"] = r.pop("first_job")
        programs = parse_trace(trace)
        r.update(attribute(programs))
        r["programs"] = programs
        r["load"] = f"{load0}-{machine_load()}"
        return r


def run_timed(job: str, fs: str, events: int, env: dict) -> dict:
    """One process, the job twice, no strace: times and query progress."""
    with tempfile.TemporaryDirectory(prefix="child-processes-") as work:
        load0 = machine_load()
        out = subprocess.run([sys.executable, __file__, "--events", str(events), "--child", job, work, fs, "1"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             check=True).stdout
    r = json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1][7:])
    batches = r.pop("batches")
    queries = sorted({b["id"] for b in batches}, key=[b["id"] for b in batches].index)
    for run, qid in zip(("first", "warm"), queries):
        mine = [b for b in batches if b["id"] == qid]
        r[f"{run}_batches"] = len(mine)
        for k in ("walCommit", "commitOffsets", "stateCommit"):
            r[f"{run}_{k}_ms"] = sum(b[k] for b in mine)
        r[f"{run}_queryPlanning_ms"] = mine[0]["queryPlanning"] if mine else None
    r["load"] = f"{load0}-{machine_load()}"
    return r


TIMED = ("first_job", "warm_job", "first_queryPlanning_ms", "warm_queryPlanning_ms", "warm_walCommit_ms",
         "warm_commitOffsets_ms", "warm_stateCommit_ms")


def markdown_timed(result: dict) -> str:
    lines = [f"# Checkpoint files: Hadoop's LocalFs against RawLocalFs, timed ({result['time_utc']})", "",
             f"`scripts/bench child-processes --timed {result['timed']}`, {result['events']} events; each "
             "process runs the suite's streaming query twice (first, warm) into blackhole; the file systems "
             "alternate.  Medians; *_ms are Spark's query progress summed over the query's micro-batches "
             "(walCommit: offset log, commitOffsets: commit log, stateCommit: the state stores' commit, "
             "summed over operators and tasks).", ""]
    for job, runs in result["runs"].items():
        lines += [f"## {job}", "", "| file system | " + " | ".join(TIMED) + " | loads |",
                  "|---|" + "---|" * (len(TIMED) + 1)]
        for fs, rs in runs.items():
            med = {k: statistics.median(r[k] for r in rs) for k in TIMED}
            lines.append(f"| {fs} | " + " | ".join(f"{med[k]:g}" for k in TIMED) + " | "
                         + ", ".join(r["load"] for r in rs) + " |")
        lines.append("")
    return "\n".join(lines)


def markdown(result: dict) -> str:
    lines = [f"# Child processes of a streaming run's JVM ({result['time_utc']})", "",
             f"`scripts/bench child-processes`, {result['events']} events, one run per job and file "
             "system under strace (counts only; strace slows the run).", ""]
    for job, runs in result["runs"].items():
        lines += [f"## {job}", "", "| file system | total | chmod | readlink | rm | checkpoint files "
                  "(.crc) | load |", "|---|---|---|---|---|---|---|"]
        for fs, r in runs.items():
            p = r["by_program"]
            lines.append(f"| {fs} | {r['total']} | {p.get('chmod', 0)} | {p.get('readlink', 0)} | "
                         f"{p.get('rm', 0)} | {r['checkpoint_files']} ({r['crc_files']}) | {r['load']} |")
        for fs, r in runs.items():
            lines += ["", f"{fs}, by checkpoint file: " + "; ".join(
                f"{c} {sum(v.values())} ({', '.join(f'{k} {n}' for k, n in sorted(v.items()))})"
                for c, v in r["by_component"].items()),
                "", f"{fs}, by thread: " + "; ".join(
                f"{t} {sum(v.values())} ({', '.join(f'{k} {n}' for k, n in sorted(v.items()))})"
                for t, v in r["by_thread"].items())]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="join,normalize")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--fs", default="checksum,raw")
    ap.add_argument("--timed", type=int, default=0, help="N timed runs per file system, no strace")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], args.child[1], args.events, args.child[2], args.child[3] == "1")
    if args.timed:
        return main_timed(args)
    if not shutil.which("strace"):
        sys.exit("child-processes needs strace (apt-get install strace)")
    vs_flink.ensure_inputs(args.events, 100_000, 4, CACHE)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    result = {"time_utc": stamp, "events": args.events, "runs": {}}
    for job in args.jobs.split(","):
        for fs in args.fs.split(","):
            r = run_one(job, fs, args.events, env)
            result["runs"].setdefault(job, {})[fs] = r
            p = r["by_program"]
            print(f"{job:<10} {fs:<8}: {r['total']:4d} child processes (chmod {p.get('chmod', 0)}, readlink "
                  f"{p.get('readlink', 0)}, rm {p.get('rm', 0)}); checkpoint files {r['checkpoint_files']}, "
                  f".crc {r['crc_files']}; load {r['load']}", flush=True)
    base = os.path.join(HERE, "results", f"child-processes-{stamp}")
    with open(base + ".json", "w") as fh:
        json.dump(result, fh, indent=1)
    with open(base + ".md", "w") as fh:
        fh.write(markdown(result))
    print(f"written: {os.path.relpath(base, ROOT)}.json, .md")


def main_timed(args) -> None:
    vs_flink.ensure_inputs(args.events, 100_000, 4, CACHE)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    result = {"time_utc": stamp, "events": args.events, "timed": args.timed, "runs": {}}
    for job in args.jobs.split(","):
        for _ in range(args.timed):
            for fs in args.fs.split(","):
                r = run_timed(job, fs, args.events, env)
                result["runs"].setdefault(job, {}).setdefault(fs, []).append(r)
                print(f"{job:<10} {fs:<8}: jobs first {r['first_job']:5.1f} s, warm {r['warm_job']:5.1f} s | warm "
                      f"query: offset log {r['warm_walCommit_ms']} ms, commit log {r['warm_commitOffsets_ms']} ms, "
                      f"state commit {r['warm_stateCommit_ms']} ms over {r['warm_batches']} batches; first "
                      f"queryPlanning {r['first_queryPlanning_ms']} ms | load {r['load']}", flush=True)
    base = os.path.join(HERE, "results", f"child-processes-{stamp}")
    with open(base + ".json", "w") as fh:
        json.dump(result, fh, indent=1)
    with open(base + ".md", "w") as fh:
        fh.write(markdown_timed(result))
    print(f"written: {os.path.relpath(base, ROOT)}.json, .md")


if __name__ == "__main__":
    main()
