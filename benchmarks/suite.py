"""Benchmark suite: every workload, ours streaming and batch beside its references in the same run; results as data.

    scripts/bench suite [--only normalize,materializer,join,aggregate,dedup,windows,freshness,state]
                        [--events 1000000] [--ids 100000] [--files 4] [--no-flink] [--no-delta]
                        [--rate 10000] [--seconds 60] [--trigger "1 second"]
                        [--state-keys 10000,100000,1000000,5000000] [--state-batch 100000] [--readme]
                        [--runs streaming,batch,flink,delta,native,scan]

Without ``--only`` it runs everything at the sizes issue #25 asks for (one
line, for a quiet machine).  Each workload is one Flink SQL query
(``benchmarks/vs_flink.py``: the same text for both engines, on the same
generated files) and each run below is its own process, one after the
other, never two at once:

* **ours, streaming**: ``spark-changelog run job.sql --checkpoint`` (one
  available-now run from empty state), the job twice in one process:
  *whole* is the process start to the end of the first job, *warm* the
  second job alone;
* **ours, batch**: the same with ``--batch``;
* **Flink 2.3** (the Flink venv, ``--flink-python``; skipped when absent or
  with ``--no-flink``): PyFlink ``TableEnvironment``, streaming mode,
  parallelism 2, heap state, the job twice (whole, warm) and then the check;
* **native Spark** where Spark has the operator (normalize: streaming
  ``max_by`` per id on RocksDB; windows: streaming ``withWatermark`` +
  ``groupBy(window())``; join and aggregate: Spark has no retracting
  streaming version, so a batch job over the final state of each input);
  the job twice, like the others;
* **the scan-only ceiling**: the job's sources read and discarded
  (``INSERT INTO blackhole SELECT ... FROM source``), ours batch (a
  streaming read would plan the ordering normalize) and Flink streaming;
  once per input set.

``--runs`` picks which of these run (``streaming,flink``: the same-run ratio
to Flink alone, for profiling; the default is all of them).

**Like for like.**  Every timed run above writes to a sink that does no work:
Flink's ``blackhole``, ours' ``blackhole`` (the driver collects each
micro-batch and counts it), native's ``noop``.  What our Delta sink adds is
a separate run, **ours streaming into Delta** (skipped with ``--no-delta``),
whose table is also the one compared with Flink's result (row count and
column sums, ``vs_flink.check_sql``).

Each run records wall time, CPU seconds and the peak resident memory of its
whole process tree (driver Python, JVM, Python workers; Flink's JVM), and
the 1-minute load before and after it.  Rates are input events per second
(the join: both sides).  ``freshness`` and ``state`` run
``benchmarks/freshness.py`` and ``benchmarks/state_growth.py``.

Writes ``benchmarks/results/suite-<time>.md`` and ``.json`` (and the PNGs of
the freshness and state-growth runs beside them); ``--readme`` also puts the
table into README.md between its ``suite results`` markers.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import freshness  # noqa: E402
import state_growth  # noqa: E402
import vs_flink  # noqa: E402
from streaming import TreeCpu  # noqa: E402
from whole_job import ENVELOPE_DDL, machine_load, run_process  # noqa: E402

WORKLOADS = ("normalize", "materializer", "join", "aggregate", "dedup", "windows")
PARTS = WORKLOADS + ("freshness", "state")
#: the native reference of each workload that has one, and what it is
NATIVE = {"normalize": "streaming max_by (RocksDB)", "join": "batch join of the final states",
          "aggregate": "batch groupBy over the final state", "windows": "streaming window (withWatermark)"}
RUNS = ("streaming", "batch", "flink", "delta", "native", "scan")
README_BEGIN, README_END = "<!-- suite results: begin -->", "<!-- suite results: end -->"


# --------------------------------------------------------------------------- native Spark (its own process)

def native_child(spec_path: str) -> None:
    """Native PySpark, the same files, into ``noop``: the job twice (whole, warm)."""
    t0 = time.time()
    with open(spec_path) as fh:
        spec = json.load(fh)
    from pyspark.sql import SparkSession, functions as F
    from spark_changelog.runtime.session import ROCKSDB_PROVIDER

    spark = (SparkSession.builder.master("local[2]").appName("native")
             .config("spark.driver.memory", "4g").config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    name, src, work = spec["workload"], spec["sources"], spec["work"]

    def changes(path, stream):
        r = spark.readStream if stream else spark.read
        return r.schema(ENVELOPE_DDL).json(path).select(
            F.coalesce("after.id", "before.id").alias("id"), F.struct("after.g", "after.v", "op").alias("r"),
            F.col("source.lsn").alias("lsn"))

    def final(path):     # the last change per id, kept unless a delete
        last = changes(path, False).groupBy("id").agg(F.max_by("r", "lsn").alias("r"))
        return last.where("r.op <> 'd'").select("id", "r.g", "r.v")

    def job(run):
        ck = os.path.join(work, f"ck-{run}")
        if name == "normalize":
            df = changes(src["s"], True).groupBy("id").agg(F.max_by("r", "lsn").alias("r"))
            q = (df.writeStream.outputMode("update").format("noop").option("checkpointLocation", ck)
                 .trigger(availableNow=True).start())
            q.awaitTermination()
        elif name == "windows":
            df = (spark.readStream.schema("u BIGINT, t BIGINT").json(src["clicks"])
                  .withColumn("rt", F.timestamp_millis("t")).withWatermark("rt", "10001 milliseconds")
                  .groupBy(F.window("rt", "1 minute")).agg(F.size(F.collect_set("u")).alias("users")))
            q = (df.writeStream.outputMode("append").format("noop").option("checkpointLocation", ck)
                 .trigger(availableNow=True).start())
            q.awaitTermination()
        elif name == "join":
            left, right = final(src["s1"]), final(src["s2"]).selectExpr("id", "g AS g2", "v AS v2")
            left.join(right, "id").write.format("noop").mode("overwrite").save()
        else:   # aggregate
            (final(src["s"]).groupBy("g").agg(F.count("*"), F.sum("v"), F.min("v"))
             .write.format("noop").mode("overwrite").save())

    result = {}
    for run in ("first_job", "warm_job"):
        t = time.time()
        job(run)
        result[run] = time.time() - t
        if run == "first_job":
            result["process_start_to_first_job_end"] = time.time() - t0
    print("RESULT " + json.dumps(result), flush=True)
    spark.stop()


def run_native(workload: str, job: dict, work: str, log: str) -> dict:
    spec = os.path.join(work, "native.json")
    with open(spec, "w") as fh:
        json.dump({"workload": workload, "sources": job["sources"], "work": work}, fh)
    secs, out = run_process([sys.executable, __file__, "--native-child", spec], log)
    line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT "):])
    result["whole"] = result["process_start_to_first_job_end"] + vs_flink._python_start_overhead(sys.executable)
    result["process_total"] = secs
    return result


# --------------------------------------------------------------------------- one run, measured

def measured(fn) -> dict:
    """``fn()``'s result with the process tree's CPU seconds, peak RSS (MiB)
    and the load before and after; an error is recorded, not raised."""
    load0 = machine_load()
    try:
        with TreeCpu() as tree:
            result = fn()
    except (Exception, SystemExit) as err:   # noqa: BLE001 (a failed run is a result too)
        return {"error": str(err)[-500:], "load": f"{load0}-{machine_load()}"}
    return {**result, "cpu_s": round(tree.seconds, 1), "peak_rss_mib": round(tree.peak_rss / 2**20),
            "load": f"{load0}-{machine_load()}"}


def workload_rows(args, inputs: dict, root: str, log: str, flink: bool) -> list[dict]:
    rows, ceilings = [], {}
    for name in [w for w in args.only if w in WORKLOADS]:
        job = vs_flink.JOBS[name](inputs)
        events = args.events
        work = os.path.join(root, name)
        runs = {}

        def sub(tag):
            d = os.path.join(work, tag)
            os.makedirs(d, exist_ok=True)
            return d
        print(f"{name}:", flush=True)
        if "streaming" in args.runs:
            runs["ours_streaming"] = measured(lambda: vs_flink.run_ours(job, sub("ours-streaming"), "streaming", log,
                                                                        sink="blackhole"))
            _say("ours streaming", runs["ours_streaming"], events)
        if "batch" in args.runs:
            runs["ours_batch"] = measured(lambda: vs_flink.run_ours(job, sub("ours-batch"), "batch", log,
                                                                    sink="blackhole"))
            _say("ours batch", runs["ours_batch"], events)
        if flink and "flink" in args.runs:
            runs["flink"] = measured(lambda: vs_flink.run_flink(job, sub("flink"), True, args.flink_python, log))
            _say("Flink 2.3", runs["flink"], events)
        if not args.no_delta and "delta" in args.runs:
            runs["ours_streaming_delta"] = measured(lambda: vs_flink.run_ours(job, sub("ours-delta"), "streaming",
                                                                              log, sink="delta"))
            _say("ours streaming into Delta", runs["ours_streaming_delta"], events)
        if name in NATIVE and "native" in args.runs:
            runs["native"] = measured(lambda: run_native(name, job, sub("native"), log))
            _say(f"native Spark ({NATIVE[name]})", runs["native"], events)
        scan_key = tuple(sorted(job["sources"].values()))
        if scan_key not in ceilings and "scan" in args.runs:
            scan = vs_flink.scan_job(job)
            ceilings[scan_key] = {"ours": measured(lambda: vs_flink.run_ours(scan, sub("scan-ours"), "batch", log,
                                                                             sink="blackhole"))}
            _say("scan-only ceiling, ours", ceilings[scan_key]["ours"], events)
            if flink:
                ceilings[scan_key]["flink"] = measured(lambda: vs_flink.run_flink(scan, sub("scan-flink"), False,
                                                                                  args.flink_python, log))
                _say("scan-only ceiling, Flink", ceilings[scan_key]["flink"], events)
        if scan_key in ceilings:
            runs["scan_ours"] = ceilings[scan_key]["ours"]
            if flink:
                runs["scan_flink"] = ceilings[scan_key]["flink"]
        delta, fl = runs.get("ours_streaming_delta", {}), runs.get("flink", {})
        agree = ("not compared" if "check" not in delta or "check" not in fl else
                 "yes" if delta["check"] == fl["check"] else f"NO: ours {delta['check']}, Flink {fl['check']}")
        print(f"  same result as Flink (ours streaming into Delta): {agree}", flush=True)
        rows.append({"workload": name, "events": events, "query": job["query"], "native": NATIVE.get(name),
                     "same_result": agree,
                     "runs": {k: {x: y for x, y in v.items() if x != "plan"} for k, v in runs.items()}})
        shutil.rmtree(work, ignore_errors=True)
    return rows


def _say(what: str, r: dict, events: int) -> None:
    if "error" in r:
        print(f"  {what:<44} FAILED: {r['error'][-300:]}", flush=True)
        return
    print(f"  {what:<44} whole {r['whole']:6.1f} s, warm {r['warm_job']:6.1f} s ({_rate(events, r['warm_job'])}/s warm)"
          f" | CPU {r['cpu_s']:.0f} s | peak RSS {r['peak_rss_mib']:,} MiB | load {r['load']}", flush=True)
    if "warm_job_before_query_start" in r:
        print(f"  {'':<44} session start {r['session_start']:.1f} s; before the query starts: first job "
              f"{r['first_job_before_query_start']:.1f} s, warm {r['warm_job_before_query_start']:.1f} s"
              f"{_planning(r)}", flush=True)


def _planning(r: dict) -> str:
    """The first micro-batch's ``queryPlanning`` of the first and the warm job, when recorded."""
    if "warm_job_query_planning" not in r:
        return ""
    return (f"; first micro-batch's planning: first job {r['first_job_query_planning']:.1f} s, "
            f"warm {r['warm_job_query_planning']:.1f} s")


def _rate(events: int, secs) -> str:
    if not secs:
        return "-"
    r = events / secs
    return f"{r / 1e6:.2f}M" if r >= 1e6 else f"{r / 1e3:.0f}k" if r >= 1e4 else f"{r / 1e3:.1f}k"


# --------------------------------------------------------------------------- the results

def _ratio(a: dict, b: dict, key: str) -> str:
    """a's rate over b's: b's time over a's."""
    if not a or not b or "error" in a or "error" in b:
        return "-"
    return f"{b[key] / a[key]:.0%}"


def code_version() -> str:
    """The commit the suite ran (``+`` when the work tree had changes)."""
    import subprocess
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+" if dirty else "")


def markdown(result: dict) -> str:
    m = result["machine"]
    code = f" (code {result['code']})" if result.get("code") else ""
    lines = [f"# Benchmark suite, {result['time_utc']} UTC", "",
             f"`{result['command']}`{code}", "",
             f"Machine: {m['cores']} cores, {m['memory_gib']} GiB, {m['platform']}; 1-minute load "
             f"{result['load']} over the run (each run's own below).  "
             f"{result['events']:,} events over {result['ids']:,} ids in {result['files']} files.  "
             "Rates are input events per second of the warm job (the second run in the same process; "
             "*whole* is the first, process start included).  Every timed run writes to a sink that does no "
             "work (Flink `blackhole`, ours `blackhole`, native `noop`); *into Delta* is ours streaming "
             "writing the Delta table, whose result is compared with Flink's.  Peak RSS: the whole process "
             "tree (driver Python, JVM, workers).", ""]
    if result["workloads"]:
        lines += ["| workload | ours streaming: warm (whole) | Flink 2.3: warm (whole) | ours / Flink: warm, whole "
                  "| ours batch: warm (whole) | native Spark: warm (whole) | scan-only ceiling, warm: ours / Flink "
                  "| ours into Delta: warm (whole) | peak RSS MiB: ours / Flink / native | same result | load "
                  "(ours streaming) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for w in result["workloads"]:
            r, n = w["runs"], w["events"]

            def cell(k):
                x = r.get(k)
                if not x:
                    return "-"
                if "error" in x:
                    return "failed"
                return f"{_rate(n, x['warm_job'])}/s ({_rate(n, x['whole'])}/s)"

            def mem(k):
                x = r.get(k)
                return str(x["peak_rss_mib"]) if x and "peak_rss_mib" in x else "-"
            native = f"{cell('native')} {w['native']}" if w["native"] else "none"
            lines.append(
                f"| {w['workload']} | {cell('ours_streaming')} | {cell('flink')} | "
                f"{_ratio(r.get('ours_streaming'), r.get('flink'), 'warm_job')}, "
                f"{_ratio(r.get('ours_streaming'), r.get('flink'), 'whole')} | {cell('ours_batch')} | {native} | "
                f"{cell('scan_ours').split(' ')[0]} / {cell('scan_flink').split(' ')[0]} | "
                f"{cell('ours_streaming_delta')} | {mem('ours_streaming')} / {mem('flink')} / {mem('native')} | "
                f"{w['same_result']} | {r.get('ours_streaming', {}).get('load', '-')} |")
        lines.append("")
        starts = [(w["workload"], w["runs"]["ours_streaming"]) for w in result["workloads"]
                  if "warm_job_before_query_start" in w["runs"].get("ours_streaming", {})]
        if starts:
            lines += ["Ours streaming, before its query starts (from `run_script`'s call to the query's start: "
                      "translation, lowering, the query's start; docs/runtime.md, \"Before the query starts\"): "
                      + "; ".join(f"{name} {x['first_job_before_query_start']:.1f} s in the first job, "
                                  f"{x['warm_job_before_query_start']:.1f} s warm (session start "
                                  f"{x['session_start']:.1f} s{_planning(x)})" for name, x in starts) + ".", ""]
        if any(w["workload"] == "windows" for w in result["workloads"]):
            lines += ["windows: the clicks are in two files (one per reader), each ending with a closing click "
                      "ten days after the last real one, "
                      "so that every real window closes on both engines (Flink's bounded source also closes the "
                      "rest at the end of input; a streaming run of ours leaves the windows its watermark has not "
                      "passed open for later input); the check compares the windows before the closing one "
                      "(docs/runtime.md, \"The jobs against Flink 2.3\").", ""]
    if result.get("freshness"):
        f = result["freshness"]
        lines += [f"## Freshness: {f['rate']:,.0f} events/s for {f['seconds']:.0f} s, {f['file_events']} events "
                  f"per file, trigger {f['trigger']}", "",
                  "Arrival of a file -> its rows readable in Delta (the Delta log's version holding them).  Window: per "
                  "window, from the arrival of the change that closes it (TUMBLE 5 s, watermark bound 1 s).", "",
                  "| operator | p50 | p99 | max | measured | batch (triggerExecution, median) | addBatch | planning "
                  "| sink commit | arrival -> batch start | not committed | load |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for row in f["rows"]:
            d = row["median_durations_s"]
            lines.append(f"| {row['operator']} | {_sec(row['p50_s'])} | {_sec(row['p99_s'])} | {_sec(row['max_s'])} "
                         f"| {row['n']:,} {row['measured'].split()[-1]}s | {_sec(d.get('triggerExecution'))} | "
                         f"{_sec(d.get('addBatch'))} | {_sec(d.get('queryPlanning'))} | "
                         f"{_sec(row['median_sink_commit_s'])} | {_sec(row['median_wait_for_batch_s'])} | "
                         f"{row['not_committed_events']:,} events | {row['load']} |"
                         + (f" failed: {row['error']}" if row.get("error") else ""))
        lines += ["", f"![freshness]({os.path.basename(result['freshness_png'])})", ""]
    for part in ("freshness", "state"):
        if result.get(part + "_error"):
            lines += [f"{part}: FAILED: {result[part + '_error']}", ""]
    if result.get("state"):
        s = result["state"]
        lines += [f"## State growth: micro-batches of {s['batch_rows']:,} updates against growing state", "",
                  "| operator | keys of state | per-batch seconds (measured batches) | median | load |",
                  "|---|---|---|---|---|"]
        for row in s["rows"]:
            lines.append(f"| {row['operator']} | {row['keys']:,} | {', '.join(f'{x:.2f}' for x in row['batches_s'])} "
                         f"| {_sec(row['median_s'])} | {row['load']} |")
        lines += ["", f"![state growth]({os.path.basename(result['state_png'])})", ""]
    return "\n".join(lines) + "\n"


def _sec(x) -> str:
    return "-" if x is None else f"{x:.2f} s"


def update_readme(md: str, results_name: str) -> None:
    path = os.path.join(ROOT, "README.md")
    with open(path) as fh:
        text = fh.read()
    if README_BEGIN not in text:
        raise SystemExit(f"README.md has no '{README_BEGIN}' marker")
    body = md.split("\n", 2)[2].replace("](", "](benchmarks/results/").replace("\n## ", "\n#### ")
    block = f"{README_BEGIN}\n_From `benchmarks/results/{results_name}`:_\n{body}{README_END}"
    head, rest = text.split(README_BEGIN, 1)
    with open(path, "w") as fh:
        fh.write(head + block + rest.split(README_END, 1)[1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(PARTS), help=f"a subset of {','.join(PARTS)}")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--ids", type=int, default=100_000)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "spark-changelog-bench"))
    ap.add_argument("--no-flink", action="store_true")
    ap.add_argument("--flink-python", default=vs_flink.FLINK_PYTHON)
    ap.add_argument("--no-delta", action="store_true", help="skip ours streaming into Delta (and the result check)")
    ap.add_argument("--rate", type=float, default=10_000, help="freshness: events per second")
    ap.add_argument("--seconds", type=float, default=60, help="freshness: how long the feeder writes")
    ap.add_argument("--file-events", type=int, default=1000, help="freshness: events per file")
    ap.add_argument("--trigger", default="1 second", help="freshness: the processing-time trigger")
    ap.add_argument("--state-keys", default="10000,100000,1000000,5000000")
    ap.add_argument("--state-batch", type=int, default=100_000)
    ap.add_argument("--runs", default=",".join(RUNS), help=f"which runs of each workload: a subset of {','.join(RUNS)}")
    ap.add_argument("--readme", action="store_true", help="also put the table into README.md")
    ap.add_argument("--native-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.native_child:
        return native_child(args.native_child)
    args.only = args.only.split(",")
    args.runs = args.runs.split(",")
    if set(args.runs) - set(RUNS):
        ap.error(f"unknown run(s) {', '.join(sorted(set(args.runs) - set(RUNS)))}; choose from {','.join(RUNS)}")
    unknown = set(args.only) - set(PARTS)
    if unknown:
        ap.error(f"unknown part(s) {', '.join(sorted(unknown))}; choose from {','.join(PARTS)}")
    flink = not args.no_flink and os.path.exists(args.flink_python)
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    root = tempfile.mkdtemp(prefix="bench-suite-")
    log = os.path.join(root, "jobs.log")
    load0 = machine_load()
    command = "scripts/bench suite " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"suite {stamp} UTC: {', '.join(args.only)}; Flink 2.3: {'yes' if flink else 'no (not found or --no-flink)'}; "
          f"load {load0}; logs: {log}", flush=True)
    result = {"time_utc": stamp, "command": command.strip(), "code": code_version(), "events": args.events,
              "ids": args.ids,
              "files": args.files,
              "machine": {"cores": os.cpu_count(), "platform": platform.platform(),
                          "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)},
              "workloads": []}
    out_dir = os.path.join(HERE, "results")
    os.makedirs(out_dir, exist_ok=True)
    if any(w in WORKLOADS for w in args.only):
        inputs = vs_flink.ensure_inputs(args.events, args.ids, args.files, args.cache)
        result["workloads"] = workload_rows(args, inputs, root, log, flink)
    # runs started in the same minute (several people benchmarking at once)
    # must not overwrite each other's files
    name = f"suite-{stamp}"
    n = 1
    while os.path.exists(os.path.join(out_dir, name + ".json")):
        n += 1
        name = f"suite-{stamp}-{n}"
    write_results(result, out_dir, name, load0)      # after each part: a later failure keeps the earlier ones
    if "freshness" in args.only:
        print(f"freshness: {args.rate:,.0f} events/s for {args.seconds:.0f} s, trigger {args.trigger}", flush=True)
        try:
            result["freshness"] = freshness.run(list(freshness.OPERATORS), args.rate, args.seconds,
                                                args.file_events, args.trigger, args.ids, log)
            result["freshness_png"] = os.path.join(out_dir, f"{name}-freshness.png")
            freshness.plot(result["freshness"], result["freshness_png"],
                           f"freshness, {args.rate:,.0f} events/s, trigger {args.trigger}, {stamp} UTC")
        except (Exception, SystemExit) as err:   # noqa: BLE001
            result["freshness_error"] = str(err)[-500:]
            print(f"  freshness FAILED: {result['freshness_error']}", flush=True)
        write_results(result, out_dir, name, load0)
    if "state" in args.only:
        print(f"state growth: keys {args.state_keys}, micro-batches of {args.state_batch:,}", flush=True)
        try:
            result["state"] = state_growth.run([int(k) for k in args.state_keys.split(",")], args.state_batch,
                                               state_growth.MEASURED, list(state_growth.OPERATORS))
            result["state_png"] = os.path.join(out_dir, f"{name}-state-growth.png")
            state_growth.plot(result["state"], result["state_png"],
                              f"state growth, batches of {args.state_batch:,}, {stamp} UTC")
        except Exception as err:   # noqa: BLE001
            result["state_error"] = str(err)[-500:]
            print(f"  state growth FAILED: {result['state_error']}", flush=True)
    md = write_results(result, out_dir, name, load0)
    if args.readme:
        update_readme(md, name + ".md")
    print("\n" + md + f"written: benchmarks/results/{name}.md and .json")
    shutil.rmtree(root, ignore_errors=True)


def write_results(result: dict, out_dir: str, name: str, load0: str) -> str:
    """The JSON and the Markdown of what has run so far; the Markdown."""
    result["load"] = f"{load0}-{machine_load()}"
    md = markdown(result)
    data = {k: (os.path.relpath(v, ROOT) if k.endswith("_png") else v) for k, v in result.items()}
    with open(os.path.join(out_dir, name + ".json"), "w") as fh:
        json.dump(data, fh, indent=1)
    with open(os.path.join(out_dir, name + ".md"), "w") as fh:
        fh.write(md)
    return md


if __name__ == "__main__":
    main()
