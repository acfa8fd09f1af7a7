"""Benchmark: freshness, the time from a change's arrival to its row being readable in the Delta table.

    scripts/bench freshness [--source files|postgres] [--rate 10000] [--seconds 60] [--warmup 5]
                            [--file-events 1000] [--trigger "1 second"]
                            [--only normalize,join,aggregate,window] [--ids 100000] [--drain 120]

A feeder thread writes changes at a steady rate (``--rate`` events/s in
units of ``--file-events``) while one streaming query with a processing-time
trigger (``--trigger``) reads them and upserts into Delta.  Each operator
runs as its own process, one after the other.  The sources:

* ``files``: each unit is a small file written under a hidden name and
  renamed into place (Spark never lists half a file); its arrival time is
  taken right after the rename.  Debezium changes (``benchmarks/whole_job.py``'s
  generator, ``id, g, v``), clicks ``(u, t)`` for the window;
* ``postgres``: a server started for the run (``tests/pgserver.py``, or
  ``SPARK_CHANGELOG_PG_CONNINFO``) and read by the logical replication source
  (``read_postgres_cdc``, initial snapshot first); each unit is one
  transaction of ``--file-events`` updates stamping
  ``tx`` = the transaction's number; its arrival is the moment ``COMMIT``
  returned (autocommit).

The operators:

* ``normalize``: ``id, g, v`` -> ``normalize()`` -> Delta keyed by ``id``
  (what ``spark-changelog normalize --streaming`` runs);
* ``join``: two such streams (half the rate each, the same ids) ->
  ``s1.join(s2, on="id")`` -> the upsert materializer (``materialize="force"``)
  -> Delta keyed by ``id``;
* ``aggregate``: ``group_by("g").agg(COUNT(*), SUM(v), MIN(v))`` (postgres:
  also ``MAX(tx)``) -> Delta keyed by ``g``;
* ``window`` (files only: the PostgreSQL source is an upsert changelog and a
  window needs an insert-only input): insert-only clicks ``(u, t)`` whose
  event time is the wall clock when written (up to 0.5 s behind for 5% of them), watermark bound
  1 s, ``TUMBLE`` of 5 s, ``COUNT(DISTINCT u)``.  A window's row can only be
  written once the watermark passes its end, so its latency is measured
  from the arrival of the first unit holding an event at or past the
  window's end plus the bound (the change that closes it), not from each
  click.

When a change became readable comes from the table itself: its Delta log
gives, per version, the micro-batch its commit records (the sink's ``txn``)
and when its log file was written (from then on a reader sees it), and the
files it added.  Which micro-batch read a file comes from Spark's file source
log in the checkpoint (``sources/N/<batch>``), which version holds a
PostgreSQL transaction from the ``tx`` values the versions added (the source
reads in commit order: a version whose rows reach ``tx = n`` holds every
transaction up to ``n``), which version holds a window from its added files'
``window_start``.  Per event (per window): latency = that version's log
write - the unit's arrival.  Every measured event must land in a committed
version: ``not committed`` counts those that did not (the run says so
loudly).  Units fed in the first ``--warmup`` seconds are not measured: the
query's first micro-batches pay the Python workers' and the state store's
start, which is not what a running pipeline's freshness is.

Reported per operator: p50, p99 and max latency, and what bounds it, from
Spark's query progress of the measured batches (``durationMs``:
``triggerExecution``, ``addBatch``, ``queryPlanning``, ``latestOffset``,
``walCommit``, ``commitOffsets``), the sink's commit step (the run report's
per-batch record), the wait from arrival to the start of the batch that read
the change, and the trigger interval.

Writes ``freshness-<source>-<time>.json`` and a PNG (latency against arrival
time, one line per operator) to ``benchmarks/results/`` unless
``--no-results``; the suite (``scripts/bench suite --only freshness``) calls
:func:`run`.
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
SOURCES = ("files", "postgres")
WINDOW_MS, BOUND_MS = 5_000, 1_000
DURATIONS = ("triggerExecution", "addBatch", "queryPlanning", "latestOffset", "getBatch", "walCommit",
             "commitOffsets")


# --------------------------------------------------------------------------- the feeders

class Feeder(threading.Thread):
    """Writes one unit (``write(stream, n)`` -> (events, largest event time
    or None)) per stream every ``units * streams / rate`` seconds for
    ``seconds`` after ``warmup`` seconds; ``arrivals``: unit name ->
    (arrival time, events, largest event time) of the measured units.

    It starts once ``warm()`` is true (the query committed its first
    micro-batch) and goes on feeding unmeasured units after ``seconds`` until
    :meth:`stop` (the query must see input to run its last batches)."""

    def __init__(self, streams: list, write, rate: float, warmup: float, seconds: float, unit_events: int,
                 warm):
        super().__init__(daemon=True)
        self.streams, self.unit_write, self.rate = streams, write, rate
        self.warmup, self.seconds, self.unit_events, self.warm = warmup, seconds, unit_events, warm
        self.arrivals: dict = {}
        self.started = self.ended = None
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self):
        while not self.warm():
            time.sleep(0.1)
        interval = self.unit_events * len(self.streams) / self.rate
        start = time.time()
        self.started = start + self.warmup
        n = 0
        while not self._halt.is_set():
            now = time.time()
            if self.ended is None and now >= self.started + self.seconds:
                self.ended = now
            for stream in self.streams:
                name, events, max_t = self.unit_write(stream, n)
                if self.started <= now and self.ended is None and events:
                    self.arrivals[name] = (time.time(), events, max_t)
            n += 1
            self._halt.wait(max(0.0, start + n * interval - time.time()))


def debezium_lines(work: str, events: int, ids: int, seed: int):
    """The generator's Debezium lines, handed out in log order (again from
    the start when used up: the feeder's tail after the measured part)."""
    d = os.path.join(work, f"pool-{seed}")
    generate(d, events, ids, 1, seed=seed)
    with open(os.path.join(d, "part-0.json")) as fh:
        lines = fh.read().splitlines()
    pos = [0]

    def take(n):
        if pos[0] + n > len(lines):
            pos[0] = 0
        out = lines[pos[0]:pos[0] + n]
        pos[0] += n
        return out, None
    return take


def clicks(users: int, seed: int = 7):
    """Clicks ``(u, t)`` stamped with the wall clock when made (5% up to 0.5 s behind)."""
    rng = np.random.default_rng(seed)

    def take(n):
        now = int(time.time() * 1000)
        t = now - np.where(rng.random(n) < 0.05, rng.integers(0, 500, n), 0)
        return rng.integers(0, users, n), t
    return take


class FileUnits:
    """Units as small files in ``<work>/in/<stream>``."""

    def __init__(self, work: str, op: str, spec: dict):
        self.streams = ["s1", "s2"] if op == "join" else ["s"]
        self.dirs = {s: os.path.join(work, "in", s) for s in self.streams}
        for d in self.dirs.values():
            os.makedirs(d)
        if op == "window":
            make = clicks(max(spec["ids"] // 10, 100))
            seq = [0]

            def click_lines(n):
                us, t = make(n)
                out = [f'{{"u":{u},"t":{x},"s":{seq[0] + i}}}' for i, (u, x) in enumerate(zip(us, t))]
                seq[0] += n
                return out, int(t.max())
            self.pools = {"s": click_lines}
        else:
            per = int(spec["rate"] * (spec["warmup"] + spec["seconds"]) / len(self.streams)) \
                + 20 * spec["file_events"]
            self.pools = {s: debezium_lines(work, per, spec["ids"], seed)
                          for s, seed in zip(self.streams, (7, 11))}
        self.unit_events = spec["file_events"]

    def write(self, stream: str, n: int):
        lines, max_t = self.pools[stream](self.unit_events)
        name = f"f-{n:06d}.json"
        tmp = os.path.join(self.dirs[stream], "." + name)
        with open(tmp, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        os.rename(tmp, os.path.join(self.dirs[stream], name))
        return f"{stream}/{name}", len(lines), max_t

    def warm_up(self) -> None:
        for s in self.streams:
            self.write(s, -1)


class PostgresUnits:
    """Units as transactions on a PostgreSQL server: tables ``s`` (or ``s1``,
    ``s2``) ``(id, g, v, tx)`` holding ``ids`` rows (the query's snapshot),
    updated ``unit`` rows per transaction."""

    def __init__(self, conninfo: str, op: str, spec: dict):
        import psycopg
        self.op, self.ids, self.unit_events = op, spec["ids"], spec["file_events"]
        self.streams = ["s1", "s2"] if op == "join" else ["s"]
        self.conn = psycopg.connect(conninfo, autocommit=True)
        self.rng, self.tx = np.random.default_rng(7), 0
        for t in self.streams:
            self.conn.execute(f"CREATE TABLE {t} (id bigint PRIMARY KEY, g int, v bigint, tx bigint)")
            self.conn.execute(f"INSERT INTO {t} SELECT i, i %% 100, 0, -1 FROM generate_series(1, %s) i",
                              (self.ids,))

    def write(self, stream: str, n: int):
        self.tx += 1      # transactions numbered in commit order (one connection), over all tables
        ids = self.rng.choice(self.ids, self.unit_events, replace=False) + 1
        self.conn.execute(f"UPDATE {stream} SET v = v + 1, tx = %s WHERE id = ANY(%s)", (self.tx, ids.tolist()))
        return f"tx-{self.tx}", self.unit_events, None

    def warm_up(self) -> None:
        """The snapshot is the first micro-batch."""


# --------------------------------------------------------------------------- one operator (its own process)

def operator_job(spec_path: str) -> None:
    """Run one operator's query while the feeder writes; print the measurements."""
    with open(spec_path) as fh:
        spec = json.load(fh)
    from pyspark.sql.streaming import StreamingQueryListener
    from spark_changelog.api import ChangelogStream, read_debezium, read_postgres_cdc
    from spark_changelog.model import ChangelogMode
    from spark_changelog.model.windows import tumble
    from spark_changelog.runtime.session import build_session

    op, work, source = spec["operator"], spec["work"], spec["source"]
    spark = build_session("bench-freshness")
    progress: list = []

    class Progress(StreamingQueryListener):
        def onQueryStarted(self, event):
            pass

        def onQueryProgress(self, event):
            p = event.progress
            ops = p.stateOperators
            progress.append({"batch": p.batchId, "start": p.timestamp, "rows": p.numInputRows,
                             "durationMs": dict(p.durationMs),
                             # the state stores: commit, and the updates' time (Python included)
                             "stateCommitMs": sum(o.commitTimeMs for o in ops),
                             "stateUpdatesMs": sum(o.allUpdatesTimeMs for o in ops),
                             "stateRows": sum(o.numRowsTotal for o in ops)})

        def onQueryIdle(self, event):
            pass

        def onQueryTerminated(self, event):
            pass

    spark.streams.addListener(Progress())
    units = (PostgresUnits(spec["conninfo"], op, spec) if source == "postgres"
             else FileUnits(work, op, spec))
    if source == "postgres":
        def cdc(t):
            return read_postgres_cdc(spark, t, **spec["pg"], slot_name=f"fresh_{op}_{t}", name=t)
    else:
        def cdc(t):
            return read_debezium(spark, units.dirs[t], SCHEMA_DDL, ["id"], streaming=True, name=t)
    tx = ["tx"] if source == "postgres" else []
    if op == "normalize":
        stream, key, extra = cdc("s").normalize(), "id", {}
    elif op == "join":
        right = cdc("s2").select("id", g2="g", v2="v", **({"tx2": "tx"} if tx else {}))
        stream, key, extra = cdc("s1").join(right, on="id"), "id", {"materialize": "force"}
    elif op == "aggregate":
        stream = cdc("s").group_by("g").agg("COUNT(*) AS c", "SUM(v) AS sv", "MIN(v) AS mv",
                                            *(["MAX(tx) AS tx"] if tx else []))
        key, extra = "g", {}
    else:
        from pyspark.sql import functions as F
        df = (spark.readStream.schema("u BIGINT, t BIGINT, s BIGINT").json(units.dirs["s"])
              .select("u", "t", F.lit(0).cast("tinyint").alias("_kind"), F.col("s").alias("_seq")))
        base = ChangelogStream.from_dataframe(df, mode=ChangelogMode.INSERT_ONLY, name="clicks")
        stream = (base.with_column("rt", "timestamp_millis(t)").with_watermark("rt", BOUND_MS)
                  .window(tumble("rt", WINDOW_MS)).aggregate(users="count(distinct u)"))
        key, extra = ["window_start", "window_end"], {}
    ck = os.path.join(work, "ck")
    sink_commits: dict = {}

    def on_batch(report) -> None:
        # the run report's record of the batch just committed
        b = report.last_batch
        sink_commits[b["batch_id"]] = b["sink_commit_s"]

    feeder = Feeder(units.streams, units.write, spec["rate"], spec["warmup"], spec["seconds"],
                    spec["file_events"], warm=lambda: bool(sink_commits))
    units.warm_up()
    give_up = time.time() + spec["warmup"] + spec["seconds"] + spec["drain"] + 600   # a query that never starts

    def drained(_report) -> bool:
        if feeder.ended is None:
            return time.time() > give_up
        if time.time() > feeder.ended + spec["drain"]:
            return True
        # batches that started after the measured part (they read all of it;
        # the window's last ones need the next batch's watermark)
        after = [p for p in list(progress) if p["rows"] and _epoch(p["start"]) > feeder.ended]
        return len(after) >= (2 if op == "window" else 1)

    feeder.start()
    error = None
    try:
        stream.write_upsert(os.path.join(work, "table"), checkpoint=ck, key=key, trigger=spec["trigger"],
                            progress=on_batch, until=drained, dead_letter=os.path.join(work, "dl"), **extra)
    except Exception as err:    # noqa: BLE001 (what was measured until then is still reported)
        error = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
    feeder.stop()
    feeder.join()
    placed = file_batches(os.path.join(ck, "main", "sources")) if source == "files" else {}
    time.sleep(0.5)     # the listener's last events
    versions = table_versions(os.path.join(work, "table"), window=op == "window",
                              tx_columns=(["tx", "tx2"] if op == "join" else ["tx"]) if tx and op != "window"
                              else [])
    print(json.dumps({"started": feeder.started, "fed_until": feeder.ended, "arrivals": feeder.arrivals,
                      "placed": placed, "versions": versions, "sink_commit_s": sink_commits,
                      "progress": progress, "error": error}))
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


def table_versions(table: str, *, window: bool = False, tx_columns: list = ()) -> list[dict]:
    """The Delta table's commits in version order: the micro-batch each
    records (its ``txn`` action), when it became readable (its log file's
    modification time: a reader sees the version once that file is in
    place), and what the files it added hold (``window_start`` values; the
    largest of ``tx_columns``)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    log = os.path.join(table, "_delta_log")
    out = []
    if not os.path.isdir(log):
        return out
    for name in sorted(n for n in os.listdir(log) if n.endswith(".json") and n[:-5].isdigit()):
        path = os.path.join(log, name)
        with open(path) as fh:
            actions = [json.loads(line) for line in fh if line.strip()]
        batch = next((a["txn"]["version"] for a in actions if "txn" in a), None)
        adds = [a["add"]["path"] for a in actions if "add" in a]
        v = {"version": int(name[:-5]), "batch": batch, "readable_at": os.stat(path).st_mtime, "rows": 0}
        windows, top = set(), None
        for f in adds:
            cols = (["window_start"] if window else []) + list(tx_columns)
            if not cols:
                v["rows"] += pq.ParquetFile(os.path.join(table, f)).metadata.num_rows
                continue
            t = pq.read_table(os.path.join(table, f), columns=[c for c in cols if c])
            v["rows"] += t.num_rows
            if window:
                windows.update(t["window_start"].cast("int64").to_pylist())
            for c in tx_columns:
                m = pc.max(t[c]).as_py()
                if m is not None and (top is None or m > top):
                    top = m
        v["windows"], v["max_tx"] = sorted(windows), top
        out.append(v)
    return out


# --------------------------------------------------------------------------- analysis

def _epoch(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def readable_versions(raw: dict) -> dict:
    """unit name -> the first version holding it (``None``: in no version)."""
    versions = raw["versions"]
    if raw["placed"]:        # files: the batch that read the file, then the version recording that batch
        first_of_batch: dict = {}
        for v in versions:
            if v["batch"] is not None:
                first_of_batch.setdefault(v["batch"], v)
        return {u: first_of_batch.get(raw["placed"].get(u)) for u in raw["arrivals"]}
    out, top, i = {}, None, 0     # postgres: the first version whose rows reach the unit's tx
    ordered = sorted(raw["arrivals"], key=lambda u: int(u.split("-")[1]))
    for u in ordered:
        n = int(u.split("-")[1])
        while i < len(versions) and (top is None or top < n):
            if versions[i]["max_tx"] is not None:
                top = versions[i]["max_tx"] if top is None else max(top, versions[i]["max_tx"])
            i += 1
        out[u] = versions[i - 1] if top is not None and top >= n else None
    return out


def analyse(op: str, raw: dict, trigger: str) -> dict:
    """Latency percentiles per event (per window for ``window``) and the
    medians of what the batches that read data spent their time on."""
    lat, series, measured_batches = [], [], set()
    started = raw["started"] or 0
    if op == "window":
        closing = sorted((a[2], a[0]) for a in raw["arrivals"].values() if a[2] is not None)
        seen = set()
        for v in raw["versions"]:
            for ws in v["windows"]:
                if ws in seen:
                    continue
                seen.add(ws)
                closes = ws // 1000 + WINDOW_MS + BOUND_MS     # ms; window_start arrives in microseconds
                first = next((arr for t, arr in closing if t >= closes), None)
                if first is not None:
                    lat.append(v["readable_at"] - first)
                    series.append((first - started, v["readable_at"] - first))
                    measured_batches.add(v["batch"])
        unplaced = 0     # a window is measured once it is in the table; the open ones are not late
    else:
        holding = readable_versions(raw)
        unplaced = 0
        for u, (arrived, events, _) in raw["arrivals"].items():
            v = holding.get(u)
            if v is None:
                unplaced += events
                continue
            lat += [v["readable_at"] - arrived] * events
            series.append((arrived - started, v["readable_at"] - arrived))
            measured_batches.add(v["batch"])
    data = [p for p in raw["progress"] if p["rows"] and p["batch"] in measured_batches]
    med = {k: float(np.median([p["durationMs"].get(k, 0) for p in data])) / 1000 for k in DURATIONS} if data else {}
    for k in ("stateCommitMs", "stateUpdatesMs"):
        if data:
            med[k.replace("Ms", "")] = float(np.median([p.get(k, 0) for p in data])) / 1000
    waits = []
    starts = {p["batch"]: _epoch(p["start"]) for p in raw["progress"]}
    if raw["placed"]:
        for u, (arrived, _, _) in raw["arrivals"].items():
            b = raw["placed"].get(u)
            if b in starts:
                waits.append(starts[b] - arrived)
    sink = [s for b, s in raw["sink_commit_s"].items() if int(b) in measured_batches]
    batch_starts = sorted(_epoch(p["start"]) for p in data)
    pct = (lambda q: float(np.percentile(lat, q))) if lat else (lambda q: None)
    return {"operator": op, "error": raw.get("error"), "measured": "per window" if op == "window" else "per event",
            "n": len(lat), "p50_s": pct(50), "p99_s": pct(99), "max_s": max(lat) if lat else None,
            "not_committed_events": unplaced, "trigger": trigger, "data_batches": len(data),
            "median_durations_s": med, "median_sink_commit_s": float(np.median(sink)) if sink else None,
            "median_wait_for_batch_s": float(np.median(waits)) if waits else None,
            "median_batch_interval_s": float(np.median(np.diff(batch_starts))) if len(batch_starts) > 1 else None,
            "series": series}


def run(operators: list[str], rate: float, seconds: float, file_events: int, trigger: str, ids: int,
        log: str, drain: float = 120.0, source: str = "files", warmup: float = 5.0) -> dict:
    """Each operator in its own process, one after the other (postgres: one
    server for the run, a database per operator)."""
    rows = []
    if source == "postgres" and "window" in operators:
        # the source is an upsert changelog; a window TVF needs insert-only
        # input (ours and Flink's alike: docs/windows.md)
        print("  window     not measured from postgres: a window needs an insert-only input, the "
              "PostgreSQL source is an upsert changelog", flush=True)
        operators = [op for op in operators if op != "window"]
    pg = _pg_server() if source == "postgres" else None
    try:
        for op in operators:
            work = tempfile.mkdtemp(prefix=f"bench-fresh-{op}-")
            spec = os.path.join(work, "spec.json")
            job = {"operator": op, "work": work, "rate": rate, "seconds": seconds, "ids": ids, "source": source,
                   "file_events": file_events, "trigger": trigger, "drain": drain, "warmup": warmup}
            if pg is not None:
                db = f"fresh_{op}"
                job["conninfo"] = pg.create_database(db)
                job["pg"] = {"hostname": pg.host, "port": pg.port, "username": pg.user, "database_name": db}
            with open(spec, "w") as fh:
                json.dump(job, fh)
            load0 = machine_load()
            _, out = run_process([sys.executable, os.path.abspath(__file__), "--operator-job", spec], log)
            row = analyse(op, last_json(out), trigger)
            row["load"] = f"{load0}-{machine_load()}"
            rows.append(row)
            d = row["median_durations_s"]
            print(f"  {op:<10} latency p50 {_s(row['p50_s'])}, p99 {_s(row['p99_s'])}, max {_s(row['max_s'])} "
                  f"({row['n']:,} {'windows' if op == 'window' else 'events'}); batch "
                  f"{_s(d.get('triggerExecution'))} (addBatch {_s(d.get('addBatch'))}, sink commit "
                  f"{_s(row['median_sink_commit_s'])}), every {_s(row['median_batch_interval_s'])}"
                  + (f", wait for the batch {_s(row['median_wait_for_batch_s'])}"
                     if row["median_wait_for_batch_s"] is not None else "")
                  + f"   (load {row['load']})"
                  + (f"\n  {op:<10} NOT COMMITTED: {row['not_committed_events']:,} events never reached "
                     "the table" if row["not_committed_events"] else "")
                  + (f"\n  {op:<10} FAILED: {row['error']}" if row["error"] else ""), flush=True)
            shutil.rmtree(work, ignore_errors=True)
    finally:
        if pg is not None:
            pg.stop()
    return {"source": source, "rate": rate, "seconds": seconds, "warmup": warmup, "file_events": file_events,
            "trigger": trigger, "rows": rows}


def _pg_server():
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    from pgserver import ExternalPgServer, PgServer
    if os.environ.get("SPARK_CHANGELOG_PG_CONNINFO"):
        return ExternalPgServer(os.environ["SPARK_CHANGELOG_PG_CONNINFO"])
    return PgServer().start()


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
    ax.set_xlabel("arrival, seconds since the measured feed started")
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
    ap.add_argument("--source", choices=SOURCES, default="files")
    ap.add_argument("--rate", type=float, default=10_000, help="events per second, all streams together")
    ap.add_argument("--seconds", type=float, default=60, help="how long the measured feed lasts")
    ap.add_argument("--warmup", type=float, default=5, help="seconds fed before the measured feed")
    ap.add_argument("--file-events", type=int, default=1000, help="events per file (per transaction)")
    ap.add_argument("--trigger", default="1 second")
    ap.add_argument("--ids", type=int, default=100_000)
    ap.add_argument("--only", default=",".join(OPERATORS))
    ap.add_argument("--drain", type=float, default=120,
                    help="seconds after the measured feed to wait for its last batches (then: not committed)")
    ap.add_argument("--no-results", action="store_true")
    ap.add_argument("--operator-job", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.operator_job:
        return operator_job(args.operator_job)
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    log = os.path.join(tempfile.mkdtemp(prefix="bench-fresh-log-"), "jobs.log")
    print(f"freshness from {args.source}: {args.rate:,.0f} events/s for {args.seconds:.0f} s after "
          f"{args.warmup:.0f} s of warm-up, {args.file_events} events per "
          f"{'transaction' if args.source == 'postgres' else 'file'}, trigger {args.trigger}; "
          f"load {machine_load()}; logs: {log}", flush=True)
    load0 = machine_load()
    result = run(args.only.split(","), args.rate, args.seconds, args.file_events, args.trigger, args.ids, log,
                 source=args.source, warmup=args.warmup, drain=args.drain)
    result.update(time_utc=stamp, load=f"{load0}-{machine_load()}", cores=os.cpu_count())
    if not args.no_results:
        out = os.path.join(HERE, "results")
        name = f"freshness-{args.source}-{stamp}"
        with open(os.path.join(out, name + ".json"), "w") as fh:
            json.dump(result, fh, indent=1)
        plot(result, os.path.join(out, name + ".png"),
             f"freshness from {args.source}, {args.rate:,.0f} events/s, trigger {args.trigger}, {stamp} UTC, "
             f"load {result['load']}")
        print(f"written: benchmarks/results/{name}.json and .png")
    if any(r["not_committed_events"] for r in result["rows"]):
        raise SystemExit("some measured events never reached the table (see NOT COMMITTED above)")


if __name__ == "__main__":
    main()
