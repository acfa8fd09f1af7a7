"""Benchmark: deduplication, group aggregation and Top-N as whole jobs (files in,
Delta out), beside Spark's native equivalents in the same run.

    scripts/bench ops [--rows 1000000] [--keys 100000] [--batch 100000] [--only keep_first,...]

Inputs (generated once):

* insert-only changelog Parquet files (``k, v, t``, ``_kind``, ``_seq``) of
  ``--batch`` rows each, ``--rows`` in all, keys uniform over ``--keys``,
  event time ``t`` rising with ``_seq`` plus up to 2 s of disorder;
* Debezium JSON files of the same size (``id, g, v``; ``source.lsn``): inserts
  of new ids, updates of live ids (``-U``/``+U``) and deletes, so that 20% of
  the change rows are retractions; ``g`` (the group key) uniform over ``--keys``.

Jobs, each a streaming query reading one file per micro-batch
(``availableNow``) and writing a Delta table with ``write_upsert``:

* ``keep_first``: ``deduplicate("k", keep="first")`` (processing time), beside native streaming ``dropDuplicates(["k"])``
  writing Delta in append mode (``deltalake``, as our sink);
* ``keep_first_rowtime`` / ``keep_last_rowtime``: ``deduplicate("k",
  order_by="rt", keep=...)``: event-time keep first (waits for the watermark,
  bound 2 s) / keep last;
* ``aggregate``: ``group_by("g").agg("COUNT(*) AS c", "SUM(v) AS s",
  "MIN(v) AS mn")`` over the Debezium input (the planner puts a
  ChangelogNormalize on ``id`` in front: a streaming CDC source is not ordered), beside native batch ``groupBy(g).agg(...)`` over the final row of
  each id (the same result, computed in one batch job);
* ``top3``: ``top_n(3, "k", "v DESC", with_rank=True)`` (insert-only input).

``--floor`` adds, after ``keep_first``, the two cheapest exact shapes a
keep-first on a streaming plan can have, each with a Python step that does
no work, into Delta like the others: the batch in one task through an
identity ``mapInArrow`` (ours' shape), and a keep-flag pandas UDF over only
the key and ``_seq`` (the rows stay in the JVM), each followed by native
``dropDuplicates``.  Spark refuses sorts and windows on a streaming plan, so
taking each key's first row by ``_seq`` within a micro-batch needs one of
them; their time against native's is the ceiling of any such operator
(docs/runtime.md, "Keep first on processing time").

rows/s is input changes / wall time of the whole job (query start to end,
including Spark's planning and the Delta commits); the median micro-batch time
is printed beside it.  Flink 2.3 on this machine (1M rows over 100k keys, warm
job, parallelism 2): keep-last deduplication ~450k rows/s, group aggregation
with retraction ~257k rows/s.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

from typing import Iterator, Tuple

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

INSERTS = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("t", pa.int64()),
                     ("_kind", pa.int8()), ("_seq", pa.int64())])
INSERTS_DDL = "k BIGINT, v BIGINT, t BIGINT, _kind TINYINT, _seq BIGINT"
FLINK = {"keep_last_rowtime": 450_000, "aggregate": 257_000}


def generate_inserts(directory: str, rows: int, keys: int, batch: int, seed: int = 1) -> int:
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    files = 0
    for start in range(0, rows, batch):
        n = min(batch, rows - start)
        seq = np.arange(start, start + n, dtype=np.int64)
        t = 1_000_000 + seq + rng.integers(0, 2000, n)
        table = pa.table({"k": rng.integers(0, keys, n), "v": rng.integers(0, 1000, n), "t": t,
                          "_kind": np.zeros(n, np.int8), "_seq": seq}, schema=INSERTS)
        pq.write_table(table, os.path.join(directory, f"part-{files:05d}.parquet"))
        files += 1
    return files


def generate_debezium(directory: str, rows: int, keys: int, batch: int, seed: int = 2) -> int:
    """Change rows: an update is two (-U, +U); 20% of the rows are retractions:
    per record 75% inserts, 10% updates, 5% deletes -> (10 + 5) / (75 + 20 + 5)."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    live_ids: list[int] = []
    where: dict[int, int] = {}
    state: dict[int, tuple[int, int]] = {}
    next_id, lsn, produced, files = 0, 0, 0, 0
    lines: list[str] = []

    def flush():
        nonlocal files, lines
        with open(os.path.join(directory, f"cdc-{files:05d}.json"), "w") as f:
            f.write("\n".join(lines) + "\n")
        files += 1
        lines = []

    while produced < rows:
        r = rng.random()
        lsn += 1
        if r < 0.75 or len(live_ids) < 100:
            i, next_id = next_id, next_id + 1
            row = (int(rng.integers(0, keys)), int(rng.integers(0, 1000)))
            where[i] = len(live_ids)
            live_ids.append(i)
            state[i] = row
            lines.append(json.dumps({"op": "c", "after": {"id": i, "g": row[0], "v": row[1]},
                                     "source": {"lsn": lsn}}))
            produced += 1
        else:
            i = live_ids[int(rng.integers(0, len(live_ids)))]
            old = state[i]
            before = {"id": i, "g": old[0], "v": old[1]}
            if r < 0.95:
                new = (old[0], int(rng.integers(0, 1000)))
                state[i] = new
                lines.append(json.dumps({"op": "u", "before": before,
                                         "after": {"id": i, "g": new[0], "v": new[1]},
                                         "source": {"lsn": lsn}}))
                produced += 2
            else:
                last = live_ids.pop()
                if last != i:
                    live_ids[where[i]] = last
                    where[last] = where[i]
                del where[i], state[i]
                lines.append(json.dumps({"op": "d", "before": before, "source": {"lsn": lsn}}))
                produced += 1
        if produced >= (files + 1) * batch:
            flush()
    if lines:
        flush()
    return files


def batch_seconds(query) -> list[float]:
    return [p.durationMs.get("triggerExecution", 0) / 1000.0 for p in query.recentProgress
            if p.numInputRows]


def line(name: str, rows: int, secs: float, batches=None, ref=None) -> float:
    rate = rows / secs
    extra = f" | median batch {statistics.median(batches):.2f} s" if batches else ""
    flink = f" | {rate / ref:.2f}x Flink 2.3 ({ref:,} rows/s)" if ref else ""
    print(f"  {name:<44} {secs:7.1f} s | {rate:>10,.0f} rows/s{extra}{flink}", flush=True)
    return rate


def keep_first_floor(spark, directory: str, work: str, shape: str):
    """A keep-first shape whose Python step does no work (``--floor``):
    returns (seconds, micro-batch seconds)."""
    from deltalake import write_deltalake
    from pyspark.sql.functions import pandas_udf

    df = spark.readStream.schema(INSERTS_DDL).option("maxFilesPerTrigger", 1).parquet(directory)
    if shape == "identity mapInArrow":
        def identity(batches):
            yield from batches
        df = df.coalesce(1).mapInArrow(identity, df.schema)
    else:
        @pandas_udf("boolean")
        def keep(it: Iterator[Tuple[pd.Series, pd.Series]]) -> Iterator[pd.Series]:
            for k, _ in it:
                yield pd.Series(True, index=k.index)
        # non-deterministic, or Spark moves the filter below the shuffle
        df = df.coalesce(1).where(keep.asNondeterministic()("k", "_seq"))
    table = os.path.join(work, "table")
    t = time.perf_counter()
    q = (df.dropDuplicates(["k"]).writeStream
         .foreachBatch(lambda b, _: write_deltalake(table, b.toArrow(), mode="append"))
         .option("checkpointLocation", os.path.join(work, "ck")).trigger(availableNow=True).start())
    q.awaitTermination()
    return time.perf_counter() - t, batch_seconds(q)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--key-groups", type=int, default=None)
    ap.add_argument("--only", default="keep_first,keep_first_rowtime,keep_last_rowtime,"
                                       "aggregate,top3")
    ap.add_argument("--floor", action="store_true",
                    help="also run the keep-first floors (a Python step doing no work + dropDuplicates)")
    ap.add_argument("--work", default=None, help="directory for inputs and tables (default: a temp dir)")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))

    from deltalake import write_deltalake
    from pyspark.sql import Window, functions as F
    from spark_changelog.api import ChangelogStream, read_debezium
    from spark_changelog.runtime.session import build_session
    from spark_changelog.runtime.spark_keyed import session_key_groups
    from spark_changelog.model import ChangelogMode

    work = args.work or tempfile.mkdtemp(prefix="bench-ops-")
    spark = build_session("bench-ops")
    kg = args.key_groups or session_key_groups(spark)
    t0 = time.perf_counter()
    ins_dir, cdc_dir = os.path.join(work, "inserts"), os.path.join(work, "debezium")
    n_ins = generate_inserts(ins_dir, args.rows, args.keys, args.batch)
    n_cdc = generate_debezium(cdc_dir, args.rows, args.keys, args.batch)
    print(f"{args.rows:,} rows over {args.keys:,} keys, {args.batch:,}-row micro-batches "
          f"({n_ins} Parquet + {n_cdc} Debezium files, generated in {time.perf_counter() - t0:.0f} s), "
          f"key groups {kg}; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)

    def inserts(event_time=False, directory=ins_dir):
        df = spark.readStream.schema(INSERTS_DDL).option("maxFilesPerTrigger", 1).parquet(directory)
        s = ChangelogStream.from_dataframe(df, mode=ChangelogMode.INSERT_ONLY, name="inserts")
        if event_time:
            s = s.with_column("rt", "timestamp_millis(t)").with_watermark("rt", 2000)
        return s

    def run(name, stream, key):
        d = os.path.join(work, name)
        t = time.perf_counter()
        rep = stream.write_upsert(os.path.join(d, "table"), checkpoint=os.path.join(d, "ck"),
                                  key=list(key))
        return time.perf_counter() - t, rep

    # warm-up, untimed: the JVM's JIT and the Python workers, so that the job
    # that happens to run first is not charged for them
    warm = os.path.join(work, "warmup")
    generate_inserts(warm, args.batch, args.keys, args.batch, seed=9)
    run("warmup-ours", inserts(directory=warm).deduplicate("k", keep="first", key_groups=kg), ["k"])
    (spark.readStream.schema(INSERTS_DDL).parquet(warm).dropDuplicates(["k"]).writeStream
     .format("noop").option("checkpointLocation", os.path.join(work, "warmup-native"))
     .trigger(availableNow=True).start().awaitTermination())

    results = {}
    if "keep_first" in only:
        print("\nkeep first (insert-only input)")
        secs, rep = run("keep_first", inserts().deduplicate("k", keep="first", key_groups=kg), ["k"])
        results["keep_first"] = line(f"ours keep first ({rep.batches} batches)", args.rows, secs)
        print(f"  ours' Delta commits: {rep.sink_writes}")
        d = os.path.join(work, "native_dropdup")
        t = time.perf_counter()
        table = os.path.join(d, "table")
        q = (spark.readStream.schema(INSERTS_DDL).option("maxFilesPerTrigger", 1).parquet(ins_dir)
             .dropDuplicates(["k"]).writeStream
             .foreachBatch(lambda b, _: write_deltalake(table, b.toArrow(), mode="append"))
             .option("checkpointLocation", os.path.join(d, "ck")).trigger(availableNow=True)
             .start())
        q.awaitTermination()
        secs = time.perf_counter() - t
        native = line("native streaming dropDuplicates -> Delta", args.rows, secs, batch_seconds(q))
        print(f"  => ours / native: {results['keep_first'] / native:.2f}x")
        if args.floor:
            for shape in ("identity mapInArrow", "keep-flag UDF"):
                secs, batches = keep_first_floor(spark, ins_dir, os.path.join(work, "floor-" + shape[:4]),
                                                 shape)
                rate = line(f"floor: {shape} + dropDuplicates", args.rows, secs, batches)
                print(f"  => floor / native: {rate / native:.2f}x")
    for name, keep in (("keep_first_rowtime", "first"), ("keep_last_rowtime", "last")):
        if name not in only:
            continue
        print(f"\n{name} (insert-only input, event time t, watermark bound 2 s)")
        s = inserts(event_time=True).deduplicate("k", order_by="rt", keep=keep, key_groups=kg)
        secs, rep = run(name, s, ["k"])
        results[name] = line(f"ours keep {keep} on event time ({rep.batches} batches)", args.rows,
                             secs, ref=FLINK.get(name))
    if "aggregate" in only:
        print("\naggregate: count(*), sum(v), min(v) GROUP BY g over Debezium (20% retractions)")
        s = read_debezium(spark, cdc_dir, schema="id BIGINT, g BIGINT, v BIGINT", primary_key="id",
                          streaming=True, max_files_per_trigger=1)
        s = s.group_by("g").agg("COUNT(*) AS c", "SUM(v) AS s", "MIN(v) AS mn", key_groups=kg)
        secs, rep = run("aggregate", s, ["g"])
        results["aggregate"] = line(f"ours group aggregate ({rep.batches} batches)", args.rows,
                                    secs, ref=FLINK["aggregate"])
        t = time.perf_counter()
        b = read_debezium(spark, cdc_dir, schema="id BIGINT, g BIGINT, v BIGINT", primary_key="id")
        last = (b.df.withColumn("rn", F.row_number().over(
            Window.partitionBy("id").orderBy(F.col("_seq").desc())))
            .where("rn = 1 and _kind in (0, 2)"))
        agg = last.groupBy("g").agg(F.count("*").alias("c"), F.sum("v").alias("s"),
                                    F.min("v").alias("mn"))
        write_deltalake(os.path.join(work, "native_agg"), agg.toArrow(), mode="overwrite")
        line("native batch groupBy().agg() -> Delta", args.rows, time.perf_counter() - t)
    if "top3" in only:
        print("\ntop 3 per k by v desc, with the rank number (insert-only input)")
        s = inserts().top_n(3, "k", "v DESC", with_rank=True, key_groups=kg)
        secs, rep = run("top3", s, ["k", "rn"])
        results["top3"] = line(f"ours top 3 ({rep.batches} batches)", args.rows, secs)
    spark.stop()
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
