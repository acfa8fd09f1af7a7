"""Benchmark: the PostgreSQL CDC source (docs/sources.md, "PostgreSQL CDC").

    scripts/bench pgcdc [--changes 1000000] [--keys 100000] [--rate 1000]
                        [--seconds 60] [--trigger "0 seconds"] [--only throughput,freshness]

Starts its own PostgreSQL 15 server (tests/pgserver.py; or uses
``SPARK_CHANGELOG_PG_CONNINFO``).

* throughput: two slots are created on an empty table, then ``--changes``
  changes over ``--keys`` keys are committed (inserts, then updates in
  transactions of 10,000 rows).  ``pg_recvlogical`` drains one slot to
  /dev/null (the ceiling: the server decodes, a C client discards); our source
  drains the other into a Delta table (``read_postgres_cdc(...,
  latest-offset).write_upsert(delta)``, its own process).  Also timed: one
  server-side peek of the whole slot (the decoding our source pays twice, once
  to find a batch's end and once to read it).  The Delta table is checked
  against the PostgreSQL table.
* freshness: a writer commits ``--rate`` changes/s (100 transactions of
  rate/100 updates each, stamping ``wrote_at = clock_timestamp()``) for
  ``--seconds``; the query runs with a processing-time trigger ``--trigger``
  into Delta, and after each micro-batch's Delta commit reads that batch's
  changelog files: latency = visible time - ``wrote_at`` per change.  p50/p99
  over the run after a warm-up, and the micro-batch times that bound them.

Both jobs run one after the other; the machine's load is printed with every
number, and the results are written to ``benchmarks/results/pgcdc-<UTC time>.json``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
from whole_job import machine_load, run_process  # noqa: E402


def server():
    from pgserver import ExternalPgServer, PgServer
    if os.environ.get("SPARK_CHANGELOG_PG_CONNINFO"):
        return ExternalPgServer(os.environ["SPARK_CHANGELOG_PG_CONNINFO"])
    return PgServer(settings={"max_wal_size": "4GB"}).start()


def sql(conninfo, *stmts):
    import psycopg
    with psycopg.connect(conninfo, autocommit=True) as c:
        out = None
        for s in stmts:
            out = c.execute(s)
        return out.fetchall() if out is not None and out.description else None


def source_args(pg, db, table, slot):
    return dict(hostname=pg.host, port=pg.port, username=pg.user, database_name=db, slot_name=slot)


# --------------------------------------------------------------------------- jobs (own processes)

def throughput_job(spec: dict) -> None:
    from spark_changelog import build_session, read_postgres_cdc
    spark = build_session("pgcdc-bench")
    t = time.perf_counter()
    src = read_postgres_cdc(spark, "bench", scan_startup_mode="latest-offset",
                            **spec["source"], **{"scan.max-changes-per-batch": spec["batch"]})
    ends = []
    report = src.write_upsert(spec["delta"], checkpoint=spec["ck"],
                              progress=lambda r: ends.append(time.perf_counter() - t))
    print(json.dumps({"query_s": time.perf_counter() - t, "batches": report.batches,
                      "changes_out": report.changes_out, "batch_ends_s": ends}))


def freshness_job(spec: dict) -> None:
    import pyarrow.parquet as pq
    from spark_changelog import build_session, read_postgres_cdc
    from spark_changelog.sinks.changelog import committed_batches
    spark = build_session("pgcdc-freshness")
    src = read_postgres_cdc(spark, "fresh", scan_startup_mode="latest-offset", **spec["source"])
    seen: set = set()
    latencies, batches = [], []
    warm = [None]
    last = [time.time()]
    print("ready", flush=True)

    def progress(report):
        now = time.time()
        batches.append(now - last[0])
        last[0] = now
        print("batch", flush=True)
        for f in (f for _, files in committed_batches(spec["changelog"]) for f in files):
            if f in seen:
                continue
            seen.add(f)
            wrote = pq.read_table(f, columns=["wrote_at"])["wrote_at"]
            latencies.extend(now - w.timestamp() for w in wrote.to_pylist() if w is not None)
        if warm[0] is None:     # the warm-up changes of the first micro-batch
            warm[0] = len(latencies)

    stop_at = time.time() + spec["seconds"]
    src.write_upsert(spec["delta"], checkpoint=spec["ck"], changelog_path=spec["changelog"],
                     progress=progress, trigger=spec["trigger"], until=lambda r: time.time() > stop_at)
    print(json.dumps({"latencies": latencies, "batch_intervals": batches, "warm_up_changes": warm[0]}))


# --------------------------------------------------------------------------- the runs

def throughput(pg, args, work, log) -> dict:
    db = "bench_throughput"
    conninfo = pg.create_database(db)
    sql(conninfo, "CREATE TABLE bench (id bigint PRIMARY KEY, v bigint, note text)",
        "CREATE PUBLICATION bench_recv_pub FOR TABLE bench",
        # a publication must exist before the changes it is to decode
        "CREATE PUBLICATION bench_ours_pub FOR TABLE bench",
        "SELECT pg_create_logical_replication_slot('bench_recv', 'pgoutput')",
        "SELECT pg_create_logical_replication_slot('bench_ours', 'pgoutput')")
    keys, changes = args.keys, args.changes
    t = time.perf_counter()
    for lo in range(0, keys, 10_000):
        sql(conninfo, f"INSERT INTO bench SELECT g, 0, 'row ' || g FROM generate_series({lo + 1}, "
                      f"{min(lo + 10_000, keys)}) g")
    left = changes - keys
    while left > 0:
        for lo in range(0, keys, 10_000):
            n = min(10_000, keys - lo, left)
            if n <= 0:
                break
            sql(conninfo, f"UPDATE bench SET v = v + 1 WHERE id > {lo} AND id <= {lo + n}")
            left -= n
    endpos = sql(conninfo, "SELECT pg_current_wal_flush_lsn()::text")[0][0]
    print(f"  workload: {changes:,} changes over {keys:,} keys committed in "
          f"{time.perf_counter() - t:.1f} s")
    out = {"changes": changes, "keys": keys}

    load = machine_load()
    t = time.perf_counter()
    peeked = sql(conninfo, "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('bench_recv', "
                           "NULL, NULL, 'proto_version', '1', 'publication_names', 'bench_recv_pub')"
                 )[0][0]
    out["server_peek_s"] = time.perf_counter() - t
    print(f"  server-side decode (one peek of the slot, {peeked:,} messages): "
          f"{out['server_peek_s']:.1f} s   (load {load})")

    recv = os.path.join(pg.bindir if hasattr(pg, "bindir") else "", "pg_recvlogical")
    load = machine_load()
    t = time.perf_counter()
    subprocess.run([recv if os.path.exists(recv) else "pg_recvlogical", "-h", pg.host, "-p",
                    str(pg.port), "-U", pg.user, "-d", db, "--slot", "bench_recv", "--start",
                    f"--endpos={endpos}", "--no-loop", "-o", "proto_version=1", "-o",
                    "publication_names=bench_recv_pub", "-f", "/dev/null"], check=True)
    out["pg_recvlogical_s"] = time.perf_counter() - t
    out["pg_recvlogical_load"] = load
    print(f"  pg_recvlogical -> /dev/null:   {out['pg_recvlogical_s']:6.1f} s  "
          f"{changes / out['pg_recvlogical_s']:10,.0f} changes/s   (load {load})")

    spec = {"source": source_args(pg, db, "bench", "bench_ours"), "batch": args.batch,
            "delta": os.path.join(work, "delta"), "ck": os.path.join(work, "ck")}
    load = machine_load()
    secs, stdout = run_process([sys.executable, __file__, "--job", "throughput", json.dumps(spec)], log)
    job = json.loads(stdout.strip().splitlines()[-1])
    out.update(ours_process_s=secs, ours_query_s=job["query_s"], ours_batches=job["batches"],
               ours_batch_ends_s=job["batch_ends_s"], ours_load=load)
    print(f"  ours -> Delta (query):          {job['query_s']:6.1f} s  "
          f"{changes / job['query_s']:10,.0f} changes/s   ({job['batches']} micro-batches, "
          f"load {load})")
    print(f"  ours -> Delta (whole process):  {secs:6.1f} s  {changes / secs:10,.0f} changes/s; "
          f"micro-batches ended at {', '.join(f'{e:.1f}' for e in job['batch_ends_s'])} s")
    print(f"  => ours (query) / pg_recvlogical: {out['pg_recvlogical_s'] / job['query_s']:.2f} of "
          "the ceiling's rate")
    from spark_changelog.sinks.delta import read_arrow_table
    got = read_arrow_table(spec["delta"]).to_pandas()
    want = sql(conninfo, "SELECT count(*), sum(v) FROM bench")[0]
    out["table_equal"] = bool(len(got) == want[0] and int(got["v"].sum()) == int(want[1]))
    print(f"  Delta table equals the PostgreSQL table (rows, sum): {out['table_equal']}")
    return out


def freshness(pg, args, work, log) -> dict:
    import psycopg
    db = "bench_freshness"
    conninfo = pg.create_database(db)
    sql(conninfo, "CREATE TABLE fresh (id bigint PRIMARY KEY, v bigint, wrote_at timestamptz)",
        "INSERT INTO fresh SELECT g, 0, NULL FROM generate_series(1, 10000) g")
    warmup = 5.0
    spec = {"source": source_args(pg, db, "fresh", "bench_fresh"), "trigger": args.trigger,
            "seconds": args.seconds + warmup + 30, "delta": os.path.join(work, "fdelta"),
            "ck": os.path.join(work, "fck"), "changelog": os.path.join(work, "fchangelog")}
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(log, "a") as err:
        job = subprocess.Popen([sys.executable, __file__, "--job", "freshness", json.dumps(spec)],
                               env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    assert job.stdout.readline().strip() == "ready"
    # one change, and the writer starts once the running query has applied it
    # (the query's start, its first micro-batch included, is not freshness)
    started = threading.Event()

    def nudge():
        while not started.wait(1.0):
            sql(conninfo, "UPDATE fresh SET v = v + 1, wrote_at = clock_timestamp() WHERE id = 1")
    threading.Thread(target=nudge, daemon=True).start()
    while job.stdout.readline().strip() != "batch":
        pass
    started.set()
    per_tx = max(1, args.rate // 100)
    stop = threading.Event()
    rnd = random.Random(1)
    count = [0]

    def writer():
        with psycopg.connect(conninfo, autocommit=True) as c:
            start = time.time()
            i = 0
            while not stop.is_set():
                ids = rnd.sample(range(1, 10001), per_tx)
                c.execute("UPDATE fresh SET v = v + 1, wrote_at = clock_timestamp() WHERE id = ANY(%s)",
                          (ids,))
                count[0] += per_tx
                i += 1
                delay = start + i / 100.0 - time.time()
                if delay > 0:
                    time.sleep(delay)
    t = threading.Thread(target=writer, daemon=True)
    t0 = time.time()
    t.start()
    loads = []
    while time.time() < t0 + warmup + args.seconds:
        time.sleep(5)
        loads.append(float(machine_load()))
    stop.set()
    t.join()
    rate = count[0] / (time.time() - t0)
    stdout, _ = job.communicate(timeout=600)
    res = json.loads(stdout.strip().splitlines()[-1])
    res["latencies"] = res["latencies"][res["warm_up_changes"]:]
    import numpy as np
    # drop the warm-up (the first micro-batches pay the query start)
    lat_all = np.array(res["latencies"])
    n_warm = int(len(lat_all) * warmup / (warmup + args.seconds))
    steady = lat_all[n_warm:] if len(lat_all) > n_warm else lat_all
    intervals = np.array(res["batch_intervals"][3:]) if len(res["batch_intervals"]) > 3 else \
        np.array(res["batch_intervals"])
    out = {"rate_changes_per_s": rate, "trigger": args.trigger, "changes_seen": len(lat_all),
           "p50_s": float(np.percentile(steady, 50)), "p99_s": float(np.percentile(steady, 99)),
           "max_s": float(steady.max()), "batch_interval_mean_s": float(intervals.mean()),
           "batch_interval_p99_s": float(np.percentile(intervals, 99)),
           "load_mean": sum(loads) / len(loads), "load_max": max(loads)}
    print(f"  writer: {rate:,.0f} changes/s; trigger {args.trigger!r}")
    print(f"  freshness (commit -> visible in Delta): p50 {out['p50_s']:.2f} s, p99 "
          f"{out['p99_s']:.2f} s, max {out['max_s']:.2f} s over {len(steady):,} changes "
          f"(load mean {out['load_mean']:.1f}, max {out['load_max']:.1f})")
    print(f"  micro-batch interval: mean {out['batch_interval_mean_s']:.2f} s, p99 "
          f"{out['batch_interval_p99_s']:.2f} s (a change waits for the running batch, then its own)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--changes", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=250_000, help="scan.max-changes-per-batch")
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--trigger", default="0 seconds")
    ap.add_argument("--only", default="throughput,freshness")
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("spec", nargs="?", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job:
        {"throughput": throughput_job, "freshness": freshness_job}[args.job](json.loads(args.spec))
        return
    work = tempfile.mkdtemp(prefix="pgcdc-bench-")
    log = os.path.join(work, "jobs.log")
    os.environ.setdefault("SPARK_CHANGELOG_LOG", os.path.join(work, "spark.log"))
    pg = server()
    results = {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "load_at_start": open("/proc/loadavg").read().strip(), "cpus": os.cpu_count()}
    try:
        only = args.only.split(",")
        if "throughput" in only:
            print(f"throughput ({args.changes:,} changes over {args.keys:,} keys):")
            results["throughput"] = throughput(pg, args, work, log)
        if "freshness" in only:
            print(f"freshness ({args.rate:,} changes/s for {args.seconds:.0f} s):")
            results["freshness"] = freshness(pg, args, work, log)
    finally:
        pg.stop()
    results["load_at_end"] = open("/proc/loadavg").read().strip()
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    path = os.path.join(HERE, "results", f"pgcdc-{results['started'].replace(':', '')}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    print(f"results: {os.path.relpath(path, ROOT)}  (machine shared: numbers under load "
          f"{results['load_at_start'].split()[0]} .. {results['load_at_end'].split()[0]})")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
