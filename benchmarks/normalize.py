"""Benchmark: streaming ChangelogNormalize vs Spark's native equivalents.

    scripts/bench normalize [--keys 100000,1000000,5000000] [--batch 100000,1000000]

For each (keys, batch size): changelog files of ``batch`` rows each are
generated: first inserts of every key (the state build-up), then
``--measure`` batches of random updates over all keys.  Three jobs read the
same files, one file per micro-batch, and write to Spark's ``noop`` sink:

* ours: ``ChangelogStream.normalize`` (transformWithStateInPandas, key groups,
  run-stack state on RocksDB);
* native streaming aggregation: ``max_by(struct, _seq)`` per key, RocksDB
  state, update mode (the same "last row per key" without retractions);
* native batch: ``row_number() over (partition by id order by _seq desc) = 1``
  over all files at once.

Per-batch times come from each query's progress (``triggerExecution``); the
rows/s of the update batches (state already built) is the headline.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.int64()),
                    ("_kind", pa.int8()), ("_seq", pa.int64())])
DDL = "id BIGINT, name STRING, score BIGINT, _kind TINYINT, _seq BIGINT"


def generate(directory: str, keys: int, batch: int, measure: int, seed: int = 1) -> tuple[int, int]:
    """Returns (number of load files, number of update files)."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    seq = 0
    n = 0

    def write(ids, kinds):
        nonlocal seq, n
        m = len(ids)
        t = pa.table({"id": ids, "name": pa.array(np.char.add("n", (ids % 1000).astype(str)).astype(object)),
                      "score": rng.integers(0, 1_000_000, m), "_kind": kinds.astype(np.int8),
                      "_seq": np.arange(seq, seq + m, dtype=np.int64)}, schema=SCHEMA)
        pq.write_table(t, os.path.join(directory, f"part-{n:05d}.parquet"))
        seq += m
        n += 1

    ids = rng.permutation(keys).astype(np.int64)
    for i in range(0, keys, batch):
        chunk = ids[i:i + batch]
        write(chunk, np.zeros(len(chunk)))
    load = n
    for _ in range(measure):
        write(rng.integers(0, keys, batch).astype(np.int64), np.full(batch, 2))   # +U
    return load, measure


def _durations(query) -> list[float]:
    out = []
    for p in query.recentProgress:
        if p.numInputRows:
            out.append((p.durationMs.get("triggerExecution", 0) / 1000.0, p.numInputRows))
    return out


def run_stream(spark, df, path_ck, update_mode=False) -> list[tuple[float, int]]:
    w = df.writeStream.format("noop").option("checkpointLocation", path_ck).trigger(availableNow=True)
    if update_mode:
        w = w.outputMode("update")
    q = w.start()
    q.awaitTermination()
    return _durations(q)


def report(name, durs, load_files, batch):
    upd = durs[load_files:]
    load = durs[:load_files]
    if not upd:
        print(f"  {name:<34} no update batches measured")
        return None
    secs = [d for d, _ in upd]
    rows = sum(r for _, r in upd)
    rate = rows / sum(secs)
    print(f"  {name:<34} load batches: {' '.join(f'{d:.1f}' for d, _ in load)} s | "
          f"update batches: {' '.join(f'{d:.1f}' for d in secs)} s | median {statistics.median(secs):.2f} s"
          f" | {rate:,.0f} rows/s")
    return statistics.median(secs), rate


def bench(spark, keys: int, batch: int, measure: int, key_groups: int, work: str) -> dict:
    from pyspark.sql import Window, functions as F
    from spark_changelog.api import ChangelogStream

    d = os.path.join(work, f"k{keys}_b{batch}")
    shutil.rmtree(d, ignore_errors=True)
    t = time.perf_counter()
    load_files, _ = generate(os.path.join(d, "in"), keys, batch, measure)
    print(f"\n== {keys:,} keys, {batch:,}-row micro-batches ({load_files} load + {measure} update batches; "
          f"generated in {time.perf_counter() - t:.0f} s)")

    def source():
        return spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).parquet(os.path.join(d, "in"))

    res = {}
    ours = ChangelogStream.from_dataframe(source(), primary_key=["id"]).normalize(key_groups=key_groups)
    res["ours"] = report(f"normalize (ours, G={key_groups})", run_stream(spark, ours.df, os.path.join(d, "ck1")),
                         load_files, batch)
    native = source().groupBy("id").agg(F.max_by(F.struct("name", "score", "_kind", "_seq"), "_seq").alias("last"))
    res["native_stream"] = report("native streaming max_by (RocksDB)",
                                  run_stream(spark, native, os.path.join(d, "ck2"), update_mode=True),
                                  load_files, batch)
    t = time.perf_counter()
    all_rows = spark.read.schema(DDL).parquet(os.path.join(d, "in"))
    w = Window.partitionBy("id").orderBy(F.col("_seq").desc())
    all_rows.withColumn("rn", F.row_number().over(w)).where("rn = 1").write.format("noop").mode("overwrite").save()
    secs = time.perf_counter() - t
    total = keys + measure * batch
    print(f"  {'native batch row_number (all files)':<34} {secs:.1f} s for {total:,} rows | {total / secs:,.0f} rows/s")
    res["native_batch"] = (secs, total / secs)
    if res["ours"] and res["native_stream"]:
        print(f"  => ours / native streaming: {res['ours'][1] / res['native_stream'][1]:.2f}x")
    shutil.rmtree(d, ignore_errors=True)
    return res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", default="100000,1000000,5000000")
    ap.add_argument("--batch", default="100000,1000000")
    ap.add_argument("--measure", type=int, default=3, help="update batches measured per config")
    ap.add_argument("--key-groups", type=int, default=32)
    ap.add_argument("--partitions", type=int, default=4, help="spark.sql.shuffle.partitions")
    ap.add_argument("--work", default=None, help="scratch directory (default: a temp dir)")
    args = ap.parse_args(argv)
    from spark_changelog.runtime.session import build_session
    spark = build_session("bench-normalize", configs={"spark.sql.shuffle.partitions": str(args.partitions),
                                                      "spark.driver.memory": "8g"})
    work = args.work or tempfile.mkdtemp(prefix="bench-normalize-")
    summary = []
    for batch in map(int, args.batch.split(",")):
        for keys in map(int, args.keys.split(",")):
            r = bench(spark, keys, batch, args.measure, args.key_groups, work)
            summary.append((keys, batch, r))
    print("\nsummary (update batches, state built):")
    print(f"{'keys':>10} {'batch':>9} | {'ours s/batch':>12} {'rows/s':>10} | {'native s/batch':>14} {'rows/s':>10} | "
          f"{'batch row_number rows/s':>24}")
    for keys, batch, r in summary:
        o, n, b = r["ours"] or (0, 0), r["native_stream"] or (0, 0), r["native_batch"]
        print(f"{keys:>10,} {batch:>9,} | {o[0]:>12.2f} {o[1]:>10,.0f} | {n[0]:>14.2f} {n[1]:>10,.0f} | {b[1]:>24,.0f}")


if __name__ == "__main__":
    main()
