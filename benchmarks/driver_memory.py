"""Benchmark: the driver's peak memory while a batch of N rows goes into an
upsert sink (docs/runtime.md, "Sink writers on the executors").

    scripts/bench driver-memory [--rows 1000000,10000000] [--paths staged,collect]
                                [--sink postgres|delta] [--changelog] [--inserts-only]

Each (rows, path) runs as its own process (``local[2]``, the pipeline's
``BatchHandler.run``, the step every micro-batch takes), writing N generated
changes (+I of N keys: id, a 40-character name, a score) into a new table;
with ``--sink delta`` then a second batch of N updates of those keys (+U,
applied with deletion vectors, docs/sinks.md; ``--inserts-only`` leaves it
out).  ``--changelog``: every batch also goes to a changelog output (Parquet,
``changelog_path``), whose committed row count is checked:

* ``staged``: the sink writers stage the batch on the executors (COPY into the
  batch's staging table; Delta: data files, and the updated rows' positions;
  the changelog's part files), only counts (and Delta's positions, as
  RoaringBitmaps) come back, the driver commits;
* ``collect``: the reference in the same run, the path of a sink without a
  staged writer (print, a Delta MERGE): the batch collected as Arrow on the
  driver (``toArrow()``), then written from there (the changelog too).

Peak memory is Linux's high-water mark of resident memory (``VmHWM``) of the
driver's Python process and of its JVM (which, on ``local[2]``, also hosts the
executors: its share of the shuffle is not the driver's).  ``--master
standalone`` runs the jobs on a two-worker standalone cluster started on this
machine (tests/cluster.py, docs/deploy.md), where the driver's JVM is the
driver's alone.  Starts its own
PostgreSQL (tests/pgserver.py) unless ``SPARK_CHANGELOG_PG_CONNINFO`` is set;
the jobs' stderr goes to ``$SPARK_CHANGELOG_LOG``.
Results: ``benchmarks/results/driver-memory-<UTC time>.json``, with the load.
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
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))


def vm_hwm_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def jvm_pid() -> int:
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "java":
                    return pid
        except OSError:
            pass
    raise RuntimeError("no JVM below this process")


def child(rows: int, path: str, conninfo: str, changelog: "str | None", inserts_only: bool) -> None:
    """``conninfo``: a PostgreSQL connection string, or ``delta:<directory>``;
    ``changelog``: a directory for the changelog outputs, or None."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    from spark_changelog.api import ChangelogStream
    from spark_changelog.runtime.session import build_session
    from spark_changelog.sinks.base import UpsertSink
    from spark_changelog.sinks.postgres import PostgresUpsertSink

    class Collected(UpsertSink):
        """The sink without its staged writer: the batch is collected."""

        def __init__(self, inner):
            self.inner, self.key = inner, inner.key

        def write_batch(self, changes, *, query_id, batch_id):
            return self.inner.write_batch(changes, query_id=query_id, batch_id=batch_id)

        def write_arrow_batch(self, changes, *, query_id, batch_id):
            return self.inner.write_arrow_batch(changes, query_id=query_id, batch_id=batch_id)

        def last_batch_id(self, query_id):
            return self.inner.last_batch_id(query_id)

    spark = build_session("driver-memory", master=os.environ.get("BENCH_MASTER"),
                          configs=json.loads(os.environ.get("BENCH_CONFS", "{}")))
    jvm = jvm_pid()
    df = spark.range(rows).select(
        F.col("id"), F.sha1(F.col("id").cast("string")).substr(1, 40).alias("name"),
        (F.col("id") % 1000).alias("score"),
        F.lit(0).cast("tinyint").alias("_kind"), F.col("id").alias("_seq"))
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.int64())])
    if conninfo.startswith("delta:"):
        from spark_changelog.sinks.delta import DeltaUpsertSink
        sink = DeltaUpsertSink(os.path.join(conninfo[len("delta:"):], f"mem_{path}_{rows}"), ["id"], schema)
        batches = [df] if inserts_only else \
            [df, df.withColumn("_kind", F.lit(2).cast("tinyint")).withColumn("name", F.lit("updated"))]
    else:
        sink = PostgresUpsertSink(conninfo, f"mem_{path}_{rows}", ["id"], schema)
        batches = [df]
    before = {"python_mb": vm_hwm_mb(os.getpid()), "jvm_mb": vm_hwm_mb(jvm)}
    t = time.perf_counter()
    writes: dict = {}
    logs = []
    for i, batch in enumerate(batches):
        # a run of a bounded input is batch 0: one changelog output per run
        logs.append(os.path.join(changelog, f"log_{path}_{rows}_{i}") if changelog else None)
        report = ChangelogStream.from_dataframe(batch, primary_key=["id"]).write_upsert(
            sink if path == "staged" else Collected(sink), changelog_path=logs[-1])
        assert report.upserted == rows, report
        for k, v in report.sink_writes.items():
            writes[k] = writes.get(k, 0) + v
    secs = time.perf_counter() - t
    if changelog:
        from spark_changelog.sinks.changelog import committed_batches
        for log in logs:
            [(_, parts)] = committed_batches(log)
            with open(os.path.join(parts[0].parent.parent, "_commit.json")) as f:
                commit = json.load(f)
            assert commit["rows"] == rows, commit
            writes["changelog parts"] = writes.get("changelog parts", 0) + len(parts)
    print(json.dumps({"rows": rows, "path": path, "seconds": round(secs, 1),
                      "python_peak_mb": round(vm_hwm_mb(os.getpid()), 1),
                      "jvm_peak_mb": round(vm_hwm_mb(jvm), 1),
                      "python_peak_before_mb": round(before["python_mb"], 1),
                      "jvm_peak_before_mb": round(before["jvm_mb"], 1),
                      "sink_writes": writes}), flush=True)
    if hasattr(sink, "close"):
        sink.close()
    spark.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1000000,10000000")
    ap.add_argument("--paths", default="staged,collect")
    ap.add_argument("--sink", choices=["postgres", "delta"], default="postgres")
    ap.add_argument("--changelog", action="store_true", help="also write a changelog output")
    ap.add_argument("--inserts-only", action="store_true", help="Delta: no second batch of updates")
    ap.add_argument("--master", choices=["local", "standalone"], default="local",
                    help="local[2], or a two-worker standalone cluster started here")
    ap.add_argument("--child", nargs=5, metavar=("ROWS", "PATH", "CONNINFO", "CHANGELOG", "INSERTS_ONLY"))
    args = ap.parse_args()
    if args.child:
        child(int(args.child[0]), args.child[1], args.child[2],
              None if args.child[3] == "-" else args.child[3], args.child[4] == "1")
        return
    import shutil
    import tempfile

    from pgcdc import server
    from whole_job import machine_load, run_process
    pg = server() if args.sink == "postgres" else None
    work = tempfile.mkdtemp(prefix="driver-memory-")
    log = os.environ.get("SPARK_CHANGELOG_LOG", "/tmp/spark-changelog.log")
    results = []
    cluster, master = None, "local[2]"
    try:
        if args.master == "standalone":
            import importlib.util   # tests/cluster.py, by path (benchmarks/ has a cluster.py too)
            spec = importlib.util.spec_from_file_location("test_cluster_support",
                                                          os.path.join(ROOT, "tests", "cluster.py"))
            cl = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(cl)
            cluster = cl.StandaloneCluster(os.path.join(work, "cluster")).start()
            master = f"standalone, {cluster.n_workers} workers x {cluster.cores} core"
            os.environ.update(BENCH_MASTER=cluster.url, BENCH_CONFS=json.dumps(cluster.job_confs()))
        conninfo = pg.create_database("driver_memory") if pg else f"delta:{work}"
        for rows in (int(r) for r in args.rows.split(",")):
            for path in args.paths.split(","):
                load = machine_load()
                _, out = run_process([sys.executable, __file__, "--child", str(rows), path, conninfo,
                                      work if args.changelog else "-", "1" if args.inserts_only else "0"], log)
                r = json.loads(out.strip().splitlines()[-1])
                r["load_before"], r["load_after"] = load, machine_load()
                print(json.dumps(r), flush=True)
                results.append(r)
    finally:
        if cluster:
            cluster.stop()
        if pg:
            pg.stop()
        shutil.rmtree(work, ignore_errors=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H%M%S+0000")
    out = os.path.join(ROOT, "benchmarks", "results", f"driver-memory-{stamp}.json")
    with open(out, "w") as f:
        json.dump({"benchmark": "driver-memory", "sink": args.sink, "changelog": args.changelog,
                   "inserts_only": args.inserts_only, "master": master, "results": results},
                  f, indent=1)
    print(f"results: {out}")


if __name__ == "__main__":
    main()
