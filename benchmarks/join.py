"""Benchmark: streaming RegularJoin (``ChangelogStream.join``) vs Spark's native batch join.

    scripts/bench join [--rows 500000] [--keys 50000] [--batch 50000] [--how inner,left]
                       [--order restored,declared]

Two changelog inputs (left ``id, k, v``; right ``id, k, w``; primary key ``id``
on both, join on ``k``) of ``--rows`` changes each over ``--keys`` join keys:
75% inserts of new ids, 20% updates (a ``-U``/``+U`` pair of one id, which may
move it to another join key), 5% deletes, as parquet changelog files (data
columns + ``_kind`` tinyint + ``_seq`` bigint) of ``--batch`` rows each.  For
each join type:

* ours: two streaming sources (one file of each side per micro-batch) ->
  ``left.join(right, on="k", how=...)`` (transformWithStateInPandas, RocksDB);
  each micro-batch's output is consumed in the JVM by one aggregate (the count
  of emitted rows and the operator's metric rows, ``_kind == -1``), the
  equivalent of Spark's ``noop`` sink that also yields the state size;
* native batch: the final state of each side (last change per ``id`` by
  ``_seq``, kept when it is an insert/update-after) joined with Spark's own join
  over all files at once, written to the ``noop`` sink.

``--order``: ``restored`` (default) lets the planner put a sequence-aware
ChangelogNormalize in front of each side (docs/semantics.md, section 10: the
streaming inputs do not guarantee per-key order); ``declared`` reads the sides
with ``ordered=True`` (no normalize), which shows what the guarantee costs.

Per-batch times come from the query's progress (``triggerExecution``).  rows/s
counts input changes (both sides).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

LEFT = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("v", pa.string()),
                  ("_kind", pa.int8()), ("_seq", pa.int64())])
RIGHT = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("w", pa.string()),
                   ("_kind", pa.int8()), ("_seq", pa.int64())])
DDL = {"left": "id BIGINT, k BIGINT, v STRING, _kind TINYINT, _seq BIGINT",
       "right": "id BIGINT, k BIGINT, w STRING, _kind TINYINT, _seq BIGINT"}


def generate_side(directory: str, schema: pa.Schema, rows: int, keys: int, batch: int,
                  seed: int, p_update: float = 0.20, p_delete: float = 0.05) -> int:
    """A valid changelog (every -U/-D retracts the id's current row); returns the number of files.
    Updates and deletes are drawn by share of changes: an update is two changes."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    ids = np.empty(rows, np.int64)
    ks = np.empty(rows, np.int64)
    vals = np.empty(rows, np.int64)
    kinds = np.empty(rows, np.int8)
    live: list[int] = []             # ids in state
    pos: dict[int, int] = {}         # id -> index in live
    cur_k: dict[int, int] = {}
    cur_v: dict[int, int] = {}
    next_id = 0
    r = rng.random(rows)
    rk = rng.integers(0, keys, rows)
    rv = rng.integers(0, 1_000_000, rows)
    pick = rng.random(rows)
    move = rng.random(rows) < 0.5
    n = 0
    # event probabilities so that changes are ~20% update rows, ~5% deletes
    pu = p_update / 2 / (1 - p_update / 2)
    pd_ = p_delete / (1 - p_update / 2)
    i = 0
    while n < rows:
        x = r[i % rows]
        if live and x < pu and n + 2 <= rows:
            j = live[int(pick[i % rows] * len(live))]
            ids[n], ks[n], vals[n], kinds[n] = j, cur_k[j], cur_v[j], 1
            nk = int(rk[i % rows]) if move[i % rows] else cur_k[j]
            ids[n + 1], ks[n + 1], vals[n + 1], kinds[n + 1] = j, nk, rv[i % rows], 2
            cur_k[j], cur_v[j] = nk, int(rv[i % rows])
            n += 2
        elif live and x < pu + pd_:
            idx = int(pick[i % rows] * len(live))
            j = live[idx]
            ids[n], ks[n], vals[n], kinds[n] = j, cur_k[j], cur_v[j], 3
            last = live.pop()
            if last != j:
                live[idx] = last
                pos[last] = idx
            del pos[j], cur_k[j], cur_v[j]
            n += 1
        else:
            j = next_id
            next_id += 1
            ids[n], ks[n], vals[n], kinds[n] = j, rk[i % rows], rv[i % rows], 0
            pos[j] = len(live)
            live.append(j)
            cur_k[j], cur_v[j] = int(rk[i % rows]), int(rv[i % rows])
            n += 1
        i += 1
    text = np.char.add("x", (vals % 100_000).astype(str)).astype(object)
    files = 0
    for s in range(0, rows, batch):
        e = min(rows, s + batch)
        t = pa.table([ids[s:e], ks[s:e], pa.array(text[s:e], pa.string()), kinds[s:e],
                      np.arange(s, e, dtype=np.int64)], schema=schema)
        pq.write_table(t, os.path.join(directory, f"part-{files:05d}.parquet"))
        files += 1
    return files


def run_ours(spark, d: str, how: str, key_groups: int, ck: str, ordered: bool) -> dict:
    from pyspark.sql import functions as F
    from spark_changelog.api import ChangelogStream

    def side(name):
        df = spark.readStream.schema(DDL[name]).option("maxFilesPerTrigger", 1).parquet(os.path.join(d, name))
        return ChangelogStream.from_dataframe(df, primary_key=["id"], name=name, ordered=ordered)

    joined = side("left").join(side("right"), on="k", how=how, key_groups=key_groups)
    per_batch: list[dict] = []

    def consume(bdf, batch_id):
        row = bdf.agg(F.count_if(F.col("_kind") != F.lit(-1)).alias("out"),
                      F.collect_list("_metrics").alias("m")).first()
        metrics = [json.loads(s) for s in row["m"]]
        per_batch.append({"out": int(row["out"]),
                          "state_rows": sum(int(m.get("state_rows", 0)) for m in metrics),
                          "groups": len(metrics)})

    q = (joined.df.writeStream.foreachBatch(consume).option("checkpointLocation", ck)
         .trigger(availableNow=True).start())
    q.awaitTermination()
    durs = [(p.durationMs.get("triggerExecution", 0) / 1000.0, p.numInputRows)
            for p in q.recentProgress if p.numInputRows]
    return {"durs": durs, "batches": per_batch}


def native_batch(spark, d: str, how: str) -> float:
    from pyspark.sql import Window, functions as F
    w = Window.partitionBy("id").orderBy(F.col("_seq").desc())

    def final(name):
        df = spark.read.schema(DDL[name]).parquet(os.path.join(d, name))
        last = df.withColumn("rn", F.row_number().over(w)).where("rn = 1")
        return last.where(F.col("_kind").isin(0, 2)).drop("rn", "_kind", "_seq")

    t = time.perf_counter()
    l, r = final("left"), final("right").withColumnRenamed("id", "id0").withColumnRenamed("k", "k0")
    l.join(r, l["k"] == r["k0"], how).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=500_000, help="changes per side")
    ap.add_argument("--keys", type=int, default=50_000, help="join keys")
    ap.add_argument("--batch", type=int, default=50_000, help="changes per file (per side and micro-batch)")
    ap.add_argument("--how", default="inner,left")
    ap.add_argument("--order", default="restored,declared",
                    help="restored: planner-inserted ChangelogNormalize per side; declared: ordered=True")
    ap.add_argument("--key-groups", type=int, default=32)
    ap.add_argument("--partitions", type=int, default=4, help="spark.sql.shuffle.partitions")
    ap.add_argument("--driver-memory", default="8g")
    ap.add_argument("--work", default=None, help="scratch directory (default: a temp dir)")
    args = ap.parse_args(argv)
    from spark_changelog.runtime.session import build_session

    work = args.work or tempfile.mkdtemp(prefix="bench-join-")
    d = os.path.join(work, "in")
    shutil.rmtree(d, ignore_errors=True)
    t = time.perf_counter()
    nl = generate_side(os.path.join(d, "left"), LEFT, args.rows, args.keys, args.batch, seed=1)
    nr = generate_side(os.path.join(d, "right"), RIGHT, args.rows, args.keys, args.batch, seed=2)
    print(f"== join: {args.rows:,} changes per side over {args.keys:,} join keys, {args.batch:,}-row files "
          f"({nl} + {nr} files; generated in {time.perf_counter() - t:.0f} s)")
    spark = build_session("bench-join", configs={"spark.sql.shuffle.partitions": str(args.partitions),
                                                 "spark.driver.memory": args.driver_memory})
    total = 2 * args.rows
    summary = []
    for how in args.how.split(","):
        for order in args.order.split(","):
            res = run_ours(spark, d, how, args.key_groups,
                           os.path.join(work, f"ck-{how}-{order}"), ordered=order == "declared")
            secs = [s for s, _ in res["durs"]]
            rows_in = sum(r for _, r in res["durs"])
            rate = rows_in / sum(secs) if secs else 0.0
            steady = secs[1:]
            steady_rate = sum(r for _, r in res["durs"][1:]) / sum(steady) if steady else rate
            out = sum(b["out"] for b in res["batches"])
            last = res["batches"][-1] if res["batches"] else {"state_rows": 0, "groups": 0}
            print(f"  {how:<5} ours, order {order} (G={args.key_groups}): batches "
                  f"{' '.join(f'{s:.1f}' for s in secs)} s | median "
                  f"{statistics.median(secs) if secs else 0:.2f} s | {rate:,.0f} rows/s "
                  f"(after the first batch {steady_rate:,.0f}) | {rows_in:,} in, {out:,} out | "
                  f"state rows at the end: {last['state_rows']:,}")
            summary.append((f"{how}/{order}", rate, steady_rate, None))
        nsecs = native_batch(spark, d, how)
        print(f"  {how:<5} native batch join of the final states: {nsecs:.1f} s | {total / nsecs:,.0f} rows/s")
        summary.append((f"{how}/native", None, None, total / nsecs))
    print("\nsummary (rows/s of input changes, both sides):")
    print(f"{'join/order':<16} {'ours':>12} {'ours steady':>12} {'native batch':>13}")
    for name, r, s, n in summary:
        cells = [f"{v:>12,.0f}" if v is not None else f"{'':>12}" for v in (r, s)]
        print(f"{name:<16} {cells[0]} {cells[1]} {'' if n is None else f'{n:>13,.0f}'}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
