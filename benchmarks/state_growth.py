"""Benchmark: the same micro-batch against growing state, for normalize, the join and the aggregation.

    scripts/bench state-growth [--keys 10000,100000,1000000,5000000] [--batch 100000]
                               [--measure 5] [--only normalize,join,aggregate] [--no-native]

For each key count K: changelog Parquet files (``id, name, score``, ``_kind``,
``_seq``) are generated: first inserts of all K keys in load batches of up to
1M rows (the state build-up, not measured), then ``--measure`` batches of
``--batch`` random updates (``+U``) over all K keys.  Each operator reads one
file per micro-batch (``availableNow``) into Spark's ``noop`` sink:

* normalize: ``ChangelogStream.normalize()`` by ``id`` (state: K rows);
  reference: Spark's native streaming ``max_by(struct, _seq)`` per ``id`` on
  RocksDB (update mode), in the same process right after;
* join: ``left.join(right, on="id")``, both sides such files (seeds 1 and 2;
  state: K rows per side);
* aggregate: ``group_by("id").agg(COUNT(*), SUM(score))`` (state: K groups).

Per-batch time is Spark's ``triggerExecution`` of each measured batch.  The
question (issue #25): does a batch's time grow with the state (it must not
grow in proportion to it)?  Writes ``state-growth-<time>.json`` and a PNG
(per-batch time against keys of state, log scale) to ``benchmarks/results/``
unless ``--no-results``; the suite (``scripts/bench suite --only state``)
calls :func:`run`.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from whole_job import machine_load  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.int64()),
                    ("_kind", pa.int8()), ("_seq", pa.int64())])
DDL = "id BIGINT, name STRING, score BIGINT, _kind TINYINT, _seq BIGINT"
OPERATORS = ("normalize", "join", "aggregate")
LOAD_BATCH = 1_000_000
#: measured batches per (operator, key count): the median of 5 held against
#: one or two slow batches under load (benchmarks/results/state-growth-20261126-0745.json)
MEASURED = 5


def generate(directory: str, keys: int, batch: int, measure: int, seed: int = 1) -> int:
    """The files of one key count; returns the number of load files (the
    measured update files follow them in name order)."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    seq, n = 0, 0

    def write(ids, kind):
        nonlocal seq, n
        m = len(ids)
        t = pa.table({"id": ids, "name": pa.array(np.char.add("n", (ids % 1000).astype(str)).astype(object)),
                      "score": rng.integers(0, 1_000_000, m), "_kind": np.full(m, kind, np.int8),
                      "_seq": np.arange(seq, seq + m, dtype=np.int64)}, schema=SCHEMA)
        pq.write_table(t, os.path.join(directory, f"part-{n:05d}.parquet"))
        seq += m
        n += 1

    ids = rng.permutation(keys).astype(np.int64)
    load = max(batch, LOAD_BATCH)
    for i in range(0, keys, load):
        write(ids[i:i + load], 0)
    loads = n
    for _ in range(measure):
        write(rng.integers(0, keys, batch).astype(np.int64), 2)
    return loads


def batch_times(query) -> list[float]:
    """``triggerExecution`` of each micro-batch that read rows, in seconds."""
    return [p.durationMs.get("triggerExecution", 0) / 1000.0 for p in query.recentProgress if p.numInputRows]


def to_noop(df, ck: str, update_mode: bool = False) -> list[float]:
    w = df.writeStream.format("noop").option("checkpointLocation", ck).trigger(availableNow=True)
    if update_mode:
        w = w.outputMode("update")
    q = w.start()
    q.awaitTermination()
    return batch_times(q)


def run(keys: list[int], batch: int, measure: int, operators: list[str], native: bool = True,
        work: str | None = None) -> dict:
    """Every (operator, key count) in one Spark session; per-batch seconds of
    the measured batches, with the load at each."""
    from pyspark.sql import functions as F
    from spark_changelog.api import ChangelogStream
    from spark_changelog.runtime.session import build_session

    spark = build_session("bench-state-growth", configs={"spark.driver.memory": "8g"})
    own = work is None
    work = work or tempfile.mkdtemp(prefix="bench-state-")
    rows = []
    try:
        for k in keys:
            d = os.path.join(work, f"k{k}")
            t = time.perf_counter()
            loads = generate(os.path.join(d, "left"), k, batch, measure, seed=1)
            if "join" in operators:
                generate(os.path.join(d, "right"), k, batch, measure, seed=2)
            print(f"{k:,} keys: {loads} load + {measure} measured batches of {batch:,} "
                  f"(generated in {time.perf_counter() - t:.0f} s)", flush=True)

            def source(side="left"):
                df = (spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1)
                      .parquet(os.path.join(d, side)))
                return ChangelogStream.from_dataframe(df, primary_key=["id"], name=side)

            jobs = {"normalize": lambda: source().normalize().df,
                    "join": lambda: source().join(source("right").select("id", score2="score"),
                                                  on="id").df,
                    "aggregate": lambda: source().group_by("id").agg("COUNT(*) AS n", "SUM(score) AS s").df}
            todo = [(op, jobs[op], False) for op in operators]
            if native and "normalize" in operators:
                todo.append(("native streaming max_by", lambda: source().df.groupBy("id").agg(
                    F.max_by(F.struct("name", "score", "_kind", "_seq"), "_seq").alias("last")), True))
            for name, job, update in todo:
                load0 = machine_load()
                secs = to_noop(job(), os.path.join(d, f"ck-{len(rows)}"), update)[loads:]
                row = {"operator": name, "keys": k, "batch_rows": batch, "batches_s": secs,
                       "median_s": statistics.median(secs) if secs else None,
                       "load": f"{load0}-{machine_load()}"}
                rows.append(row)
                print(f"  {name:<26} measured batches {', '.join(f'{s:.2f}' for s in secs)} s "
                      f"(load {row['load']})", flush=True)
            shutil.rmtree(d, ignore_errors=True)
    finally:
        spark.stop()
        if own:
            shutil.rmtree(work, ignore_errors=True)
    return {"batch_rows": batch, "measured_batches": measure, "rows": rows}


def plot(result: dict, path: str, title: str) -> None:
    """Median per-batch time against keys of state, one line per operator."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for op in dict.fromkeys(r["operator"] for r in result["rows"]):
        pts = [(r["keys"], r["median_s"]) for r in result["rows"] if r["operator"] == op and r["median_s"]]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=op)
    ax.set_xscale("log")
    ax.set_xlabel("keys of state")
    ax.set_ylabel(f"seconds per micro-batch of {result['batch_rows']:,} rows (median)")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", default="10000,100000,1000000,5000000")
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--measure", type=int, default=MEASURED)
    ap.add_argument("--only", default=",".join(OPERATORS))
    ap.add_argument("--no-native", action="store_true")
    ap.add_argument("--no-results", action="store_true", help="print only, write nothing to benchmarks/results/")
    args = ap.parse_args(argv)
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    load0 = machine_load()
    result = run([int(k) for k in args.keys.split(",")], args.batch, args.measure, args.only.split(","),
                 native=not args.no_native)
    result.update(time_utc=stamp, load=f"{load0}-{machine_load()}", cores=os.cpu_count())
    if not args.no_results:
        out = os.path.join(HERE, "results")
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"state-growth-{stamp}.json"), "w") as fh:
            json.dump(result, fh, indent=1)
        plot(result, os.path.join(out, f"state-growth-{stamp}.png"),
             f"state growth, {stamp} UTC, {os.cpu_count()} cores, load {result['load']}")
        print(f"written: benchmarks/results/state-growth-{stamp}.json and .png")


if __name__ == "__main__":
    main()
