"""Benchmark: freshness, the time from a change's arrival to its row being readable in the Delta table.

    scripts/bench freshness [--rate 10000] [--seconds 60] [--file-events 1000] [--trigger "1 second"]
                            [--only normalize,join,aggregate,window] [--ids 100000]

A feeder thread writes small files into the source directory at a steady
rate (``--rate`` events/s, ``--file-events`` per file; a file is written
under a hidden name and renamed into place, so Spark never lists half a
file; its arrival time is taken right after the rename) while one streaming
query with a processing-time trigger (``--trigger``) reads them and upserts
into Delta.  Each operator runs as its own process, one after the other:

* ``normalize``: Debezium changes (``benchmarks/whole_job.py``'s generator,
  ``id, g, v``) -> ``with_mini_batch().normalize()`` -> Delta keyed by ``id``
  (what ``spark-changelog normalize --streaming`` runs);
* ``join``: two Debezium streams (half the rate each, the same ids) ->
  ``s1.join(s2, on="id")`` -> the upsert materializer (``materialize="force"``)
  -> Delta keyed by ``id``;
* ``aggregate``: the Debezium stream -> ``group_by("g").agg(COUNT(*),
  SUM(v), MIN(v))`` -> Delta keyed by ``g``;
* ``window``: insert-only clicks ``(u, t)`` whose event time is the wall
  clock when written (up to 0.5 s behind for 5% of them), watermark bound
  1 s, ``TUMBLE`` of 5 s, ``COUNT(DISTINCT u)``.  A window's row can only be
  written once the watermark passes its end, so its latency is measured
  from the arrival of the first file holding an event at or past the
  window's end plus the bound (the change that closes it), not from each
  click.

Which file went into which micro-batch comes from Spark's file source log
in the checkpoint (``sources/N/<batch>``); when a batch became readable, from
the Delta sink's commit of that batch id (its ``write_arrow_batch`` timed in
this process).  Per event (per window): latency = commit end of its batch -
arrival of its file.  Reported per operator: p50, p99 and max latency, and
what bounds it, from Spark's query progress of the batches that read data
(``durationMs``: ``triggerExecution``, ``addBatch``, ``queryPlanning``,
``latestOffset``, ``walCommit``, ``commitOffsets``), the sink commit's time,
the wait from arrival to the start of the batch that read the file, and the
trigger interval.  Flink's end-to-end latency at such rates is sub-second.

Writes ``freshness-<time>.json`` and a PNG (latency against arrival time, one
line per operator) to ``benchmarks/results/`` unless ``--no-results``; the
suite (``scripts/bench suite --only freshness``) calls :func:`run`.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from whole_job import SCHEMA_DDL, generate, last_json, machine_load, run_process  # noqa: E402

OPERATORS = ("normalize", "join", "aggregate", "window")
WINDOW_MS, BOUND_MS = 5_000, 1_000
DURATIONS = ("triggerExecution", "addBatch", "queryPlanning", "latestOffset", "getBatch", "walCommit",
             "commitOffsets")


# --------------------------------------------------------------------------- the feeder

class Feeder(threading.Thread):
    """Writes ``file_events`` lines per file into each directory at
    ``rate`` events/s in all, for ``seconds``; ``arrivals``: file name ->
    (arrival time, events, largest event time in it or None).

    First it writes one warm-up file per directory and waits until
    ``warm()`` is true (the query committed its first micro-batch): the
    query's first batch pays the JVM's, the Python workers' and the state
    store's start, which is not what a running pipeline's freshness is."""

    def __init__(self, dirs: list[str], pools: list, rate: float, seconds: float, file_events: int, warm):
        super().__init__(daemon=True)
        self.dirs, self.pools, self.rate, self.seconds, self.file_events = dirs, pools, rate, seconds, file_events
        self.warm = warm
        self.arrivals: dict = {}
        self.started = self.ended = None

    def write(self, d: str, name: str, lines: list[str]) -> None:
        tmp = os.path.join(d, "." + name)
        with open(tmp, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        os.rename(tmp, os.path.join(d, name))

    def run(self):
        for d, pool in zip(self.dirs, self.pools):
            self.write(d, "warm-up.json", pool(self.file_events)[0])
        while not self.warm():
            time.sleep(0.1)
        interval = self.file_events * len(self.dirs) / self.rate
        self.started = start = time.time()
        n = 0
        while time.time() < start + self.seconds:
            for d, pool in zip(self.dirs, self.pools):
                lines, max_t = pool(self.file_events)
                if not lines:
                    continue
                name = f"f-{n:06d}.json"
                self.write(d, name, lines)
                self.arrivals[os.path.join(os.path.basename(d), name)] = (time.time(), len(lines), max_t)
            n += 1
            time.sleep(max(0.0, start + n * interval - time.time()))
        self.ended = time.time()


def debezium_pool(work: str, events: int, ids: int, seed: int):
    """The generator's Debezium lines, handed out in log order."""
    d = os.path.join(work, f"pool-{seed}")
    generate(d, events, ids, 1, seed=seed)
    with open(os.path.join(d, "part-0.json")) as fh:
        lines = fh.read().splitlines()
    pos = [0]

    def take(n):
        out = lines[pos[0]:pos[0] + n]
        pos[0] += n
        return out, None
    return take


def clicks_pool(users: int, seed: int = 7):
    """Clicks stamped with the wall clock when written (5% up to 0.5 s behind)."""
    rng = np.random.default_rng(seed)
    seq = [0]

    def take(n):
        now = int(time.time() * 1000)
        t = now - np.where(rng.random(n) < 0.05, rng.integers(0, 500, n), 0)
        us = rng.integers(0, users, n)
        lines = [f'{{"u":{u},"t":{x},"s":{seq[0] + i}}}' for i, (u, x) in enumerate(zip(us, t))]
        seq[0] += n
        return lines, int(t.max())
    return take


# --------------------------------------------------------------------------- one operator (its own process)

def operator_job(spec_path: str) -> None:
    """Run one operator's query while the feeder writes; print the measurements."""
    with open(spec_path) as fh:
        spec = json.load(fh)
    from pyspark.sql import functions as F
    from pyspark.sql.streaming import StreamingQueryListener
    from spark_changelog.api import ChangelogStream, read_debezium
    from spark_changelog.model import ChangelogMode
    from spark_changelog.model.windows import tumble
    from spark_changelog.runtime.session import build_session
    from spark_changelog.sinks.delta import DeltaUpsertSink

    op, work = spec["operator"], spec["work"]
    spark = build_session("bench-freshness")
    progress: list = []

    class Progress(StreamingQueryListener):
        def onQueryStarted(self, event):
            pass

        def onQueryProgress(self, event):
            p = event.progress
            progress.append({"batch": p.batchId, "start": p.timestamp, "rows": p.numInputRows,
                             "durationMs": dict(p.durationMs)})

        def onQueryIdle(self, event):
            pass

        def onQueryTerminated(self, event):
            pass

    spark.streams.addListener(Progress())
    commits: dict = {}
    write = DeltaUpsertSink.write_arrow_batch

    def timed_write(self, changes, *, query_id, batch_id):
        t = time.time()
        out = write(self, changes, query_id=query_id, batch_id=batch_id)
        keys = (changes.column("window_start").cast("int64").to_pylist()
                if op == "window" and "window_start" in changes.column_names else None)
        commits[batch_id] = {"start": t, "end": time.time(), "rows": changes.num_rows, "windows": keys}
        return out
    DeltaUpsertSink.write_arrow_batch = timed_write     # this benchmark process only: times each commit

    dirs = [os.path.join(work, "in", s) for s in (("s1", "s2") if op == "join" else ("s",))]
    for d in dirs:
        os.makedirs(d)
    if op == "window":
        pools = [clicks_pool(max(spec["ids"] // 10, 100))]
    else:
        per = int(spec["rate"] * spec["seconds"] / len(dirs)) + 20 * spec["file_events"]
        pools = [debezium_pool(work, per, spec["ids"], seed) for seed in (7, 11)[:len(dirs)]]

    def cdc(d):
        return read_debezium(spark, d, SCHEMA_DDL, ["id"], streaming=True, name=os.path.basename(d))
    if op == "normalize":
        stream, key, extra = cdc(dirs[0]).with_mini_batch().normalize(), "id", {}
    elif op == "join":
        right = cdc(dirs[1]).select("id", g2="g", v2="v")
        stream, key, extra = cdc(dirs[0]).join(right, on="id"), "id", {"materialize": "force"}
    elif op == "aggregate":
        stream = cdc(dirs[0]).group_by("g").agg("COUNT(*) AS c", "SUM(v) AS sv", "MIN(v) AS mv")
        key, extra = "g", {}
    else:
        df = (spark.readStream.schema("u BIGINT, t BIGINT, s BIGINT").json(dirs[0])
              .select("u", "t", F.lit(0).cast("tinyint").alias("_kind"), F.col("s").alias("_seq")))
        stream = (ChangelogStream.from_dataframe(df, mode=ChangelogMode.INSERT_ONLY, name="clicks")
                  .with_column("rt", "timestamp_millis(t)").with_watermark("rt", BOUND_MS)
                  .window(tumble("rt", WINDOW_MS)).aggregate(users="count(distinct u)"))
        key, extra = ["window_start", "window_end"], {}
    ck = os.path.join(work, "ck")
    feeder = Feeder(dirs, pools, spec["rate"], spec["seconds"], spec["file_events"], warm=lambda: bool(commits))
    placed: dict = {}

    give_up = time.time() + spec["seconds"] + spec["drain"] + 600     # a query that never gets going

    def drained(_report) -> bool:
        if feeder.ended is None:
            return time.time() > give_up
        if time.time() > feeder.ended + spec["drain"]:
            return True
        placed.update(file_batches(os.path.join(ck, "main", "sources")))
        if not all(f in placed for f in feeder.arrivals):
            return False
        last = max(placed[f] for f in feeder.arrivals)
        return max(commits, default=-1) >= last + (1 if op == "window" else 0)

    feeder.start()
    error = None
    try:
        stream.write_upsert(os.path.join(work, "table"), checkpoint=ck, key=key, trigger=spec["trigger"],
                            until=drained, dead_letter=os.path.join(work, "dl"), **extra)
    except Exception as err:    # noqa: BLE001 (what was measured until then is still reported)
        error = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
    placed.update(file_batches(os.path.join(ck, "main", "sources")))
    time.sleep(0.5)     # the listener's last events
    print(json.dumps({"started": feeder.started, "fed_until": feeder.ended, "arrivals": feeder.arrivals,
                      "placed": placed, "commits": commits, "progress": progress, "error": error}))
    spark.stop()


def file_batches(sources: str) -> dict:
    """``source dir/file name`` -> micro-batch id, from Spark's file source
    logs under the checkpoint's ``sources/`` (compacted logs included)."""
    out: dict = {}
    if not os.path.isdir(sources):
        return out
    for src in os.listdir(sources):
        d = os.path.join(sources, src)
        for name in os.listdir(d):
            if name.startswith("."):
                continue
            with open(os.path.join(d, name)) as fh:
                for line in fh.read().splitlines()[1:]:
                    entry = json.loads(line)
                    parts = entry["path"].rstrip("/").split("/")
                    out[f"{parts[-2]}/{parts[-1]}"] = entry["batchId"]
    return out


# --------------------------------------------------------------------------- analysis

def _epoch(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def analyse(op: str, raw: dict, trigger: str) -> dict:
    """Latency percentiles per event (per window for ``window``) and the
    medians of what the batches that read data spent their time on."""
    commits = {int(b): c for b, c in raw["commits"].items()}
    lat, series = [], []
    if op == "window":
        closing = sorted((a[2], a[0]) for a in raw["arrivals"].values() if a[2] is not None)
        seen = set()
        for b in sorted(commits):
            for ws in commits[b]["windows"] or []:
                if ws in seen:
                    continue
                seen.add(ws)
                closes = ws // 1000 + WINDOW_MS + BOUND_MS     # ms; window_start arrives in microseconds
                first = next((arr for t, arr in closing if t >= closes), None)
                if first is not None:
                    lat.append(commits[b]["end"] - first)
                    series.append((first - (raw["started"] or 0), commits[b]["end"] - first))
    else:
        for f, (arrived, events, _) in raw["arrivals"].items():
            b = raw["placed"].get(f)
            if b is not None and b in commits:
                lat += [commits[b]["end"] - arrived] * events
                series.append((arrived - (raw["started"] or 0), commits[b]["end"] - arrived))
    unplaced = sum(a[1] for f, a in raw["arrivals"].items() if raw["placed"].get(f) not in commits)
    # the batches that read the measured files (not the warm-up's)
    measured = {raw["placed"][f] for f in raw["arrivals"] if f in raw["placed"]}
    data = [p for p in raw["progress"] if p["rows"] and p["batch"] in measured]
    med = {k: float(np.median([p["durationMs"].get(k, 0) for p in data])) / 1000 for k in DURATIONS} if data else {}
    waits = []
    starts = {p["batch"]: _epoch(p["start"]) for p in raw["progress"]}
    for f, (arrived, _, _) in raw["arrivals"].items():
        b = raw["placed"].get(f)
        if b in starts:
            waits.append(starts[b] - arrived)
    sink = [c["end"] - c["start"] for b, c in commits.items() if b in measured]
    pct = (lambda q: float(np.percentile(lat, q))) if lat else (lambda q: None)
    return {"operator": op, "error": raw.get("error"), "measured": "per window" if op == "window" else "per event",
            "n": len(lat), "p50_s": pct(50), "p99_s": pct(99), "max_s": max(lat) if lat else None,
            "not_committed_events": unplaced, "trigger": trigger, "data_batches": len(data),
            "median_durations_s": med, "median_sink_commit_s": float(np.median(sink)) if sink else None,
            "median_wait_for_batch_s": float(np.median(waits)) if waits else None,
            "series": series}


def run(operators: list[str], rate: float, seconds: float, file_events: int, trigger: str, ids: int,
        log: str, drain: float = 120.0) -> dict:
    """Each operator in its own process, one after the other."""
    rows = []
    for op in operators:
        work = tempfile.mkdtemp(prefix=f"bench-fresh-{op}-")
        spec = os.path.join(work, "spec.json")
        with open(spec, "w") as fh:
            json.dump({"operator": op, "work": work, "rate": rate, "seconds": seconds, "ids": ids,
                       "file_events": file_events, "trigger": trigger, "drain": drain}, fh)
        load0 = machine_load()
        _, out = run_process([sys.executable, os.path.abspath(__file__), "--operator-job", spec], log)
        row = analyse(op, last_json(out), trigger)
        row["load"] = f"{load0}-{machine_load()}"
        rows.append(row)
        d = row["median_durations_s"]
        print(f"  {op:<10} latency p50 {_s(row['p50_s'])}, p99 {_s(row['p99_s'])}, max {_s(row['max_s'])} "
              f"({row['n']:,} {'windows' if op == 'window' else 'events'}); batch {_s(d.get('triggerExecution'))} "
              f"(addBatch {_s(d.get('addBatch'))}, sink commit {_s(row['median_sink_commit_s'])}), "
              f"wait for the batch {_s(row['median_wait_for_batch_s'])}   (load {row['load']})"
              + (f"\n  {op:<10} FAILED: {row['error']}" if row["error"] else ""), flush=True)
        shutil.rmtree(work, ignore_errors=True)
    return {"rate": rate, "seconds": seconds, "file_events": file_events, "trigger": trigger, "rows": rows}


def _s(x) -> str:
    return "-" if x is None else f"{x:.2f} s"


def plot(result: dict, path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in result["rows"]:
        if row["series"]:
            xs, ys = zip(*sorted(row["series"]))
            ax.plot(xs, ys, marker="." if row["operator"] == "window" else None, label=row["operator"])
    ax.set_xlabel("arrival, seconds since the feeder started")
    ax.set_ylabel("arrival -> readable in Delta, seconds")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=10_000, help="events per second, all sources together")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--file-events", type=int, default=1000)
    ap.add_argument("--trigger", default="1 second")
    ap.add_argument("--ids", type=int, default=100_000)
    ap.add_argument("--only", default=",".join(OPERATORS))
    ap.add_argument("--no-results", action="store_true")
    ap.add_argument("--operator-job", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.operator_job:
        return operator_job(args.operator_job)
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    log = os.path.join(tempfile.mkdtemp(prefix="bench-fresh-log-"), "jobs.log")
    print(f"freshness: {args.rate:,.0f} events/s for {args.seconds:.0f} s, {args.file_events} events per file, "
          f"trigger {args.trigger}; load {machine_load()}; logs: {log}", flush=True)
    load0 = machine_load()
    result = run(args.only.split(","), args.rate, args.seconds, args.file_events, args.trigger, args.ids, log)
    result.update(time_utc=stamp, load=f"{load0}-{machine_load()}", cores=os.cpu_count())
    if not args.no_results:
        out = os.path.join(HERE, "results")
        with open(os.path.join(out, f"freshness-{stamp}.json"), "w") as fh:
            json.dump(result, fh, indent=1)
        plot(result, os.path.join(out, f"freshness-{stamp}.png"),
             f"freshness, {args.rate:,.0f} events/s, trigger {args.trigger}, {stamp} UTC, load {result['load']}")
        print(f"written: benchmarks/results/freshness-{stamp}.json and .png")


if __name__ == "__main__":
    main()
