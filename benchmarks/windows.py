"""Benchmark: tumbling one-minute count distinct, ours vs Spark's native
``withWatermark`` + ``groupBy(window())`` in append mode, streaming, same input,
same run.

    scripts/bench windows [--rows 1000000] [--users 10000] [--batch 100000]
                          [--key-groups N] [--skip-native] [--floor] [--no-warm-up]

Input: ``--rows`` clicks ``(u, t)`` over ``--users`` users, event times
advancing 60 ms per click (1000 clicks per minute), as parquet files of
``--batch`` rows (one micro-batch each).  5% arrive out of order within the
bound (10 s) and 0.5% beyond it (more than two micro-batches plus the bound
plus a window behind, so both engines call them late).  Watermark bound 10 s, windows of
one minute, ``COUNT(DISTINCT u)``:

* ours: ``window(tumble("rt", "1 minute")).aggregate(users="count(distinct u)")``
  (per-partition watermark state, late rows to the late output);
* native: ``withWatermark("rt", "10001 milliseconds")`` (the same watermark,
  ``max - 10 s - 1 ms``), ``groupBy(window("rt", "1 minute")).agg(size(collect_set(u)))``
  in append mode (Spark has no streaming ``COUNT(DISTINCT)``; ``collect_set``
  is exact).  Spark drops late rows silently.

``--floor`` also runs ours' data path without the operator: the same Arrow
pass and shuffle, and ``transformWithStateInPandas`` with a processor that
only unpacks and counts its rows (what any Python stateful step on Spark
costs here).

Both outputs are collected per micro-batch; the script checks that every window
both emitted has the same count, and prints rows/s (input rows over the sum of
the queries' ``triggerExecution`` times).
"""
from __future__ import annotations

import argparse
import os
import shutil
import calendar
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

BOUND_MS = 10_000
STEP_MS = 60


def generate(directory: str, rows: int, users: int, batch: int, seed: int = 7) -> dict:
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    t = 1_600_000_000_000 + np.arange(rows, dtype=np.int64) * STEP_MS
    r = rng.random(rows)
    within = r < 0.05
    # Spark's first two micro-batches judge no row late (it has no watermark
    # for late rows before its third batch): late rows start after them
    beyond = (r >= 0.05) & (r < 0.055) & (np.arange(rows) >= 2 * batch)
    t[within] -= rng.integers(0, BOUND_MS - STEP_MS, within.sum())
    # far enough behind that both engines call the row late: Spark drops rows
    # behind the watermark of the micro-batch *before* the current one (its
    # "watermark for late events" lags one batch more than ours) and drops a
    # row behind it even when its window is open (we and Flink count it in)
    far = 2 * batch * STEP_MS + BOUND_MS + 60_000
    t[beyond] -= rng.integers(far, far + 60_000, beyond.sum())
    u = np.char.add("user", rng.integers(0, users, rows).astype(str))
    for i, s in enumerate(range(0, rows, batch)):
        e = min(rows, s + batch)
        pq.write_table(pa.table({"u": u[s:e], "t": t[s:e],
                                 "_kind": pa.array(np.zeros(e - s, np.int8)),
                                 "_seq": pa.array(np.arange(s, e, dtype=np.int64))}),
                       os.path.join(directory, f"part-{i:05d}.parquet"))
    return {"within_bound": int(within.sum()), "beyond_bound": int(beyond.sum())}


def _durations(q) -> list:
    if os.environ.get("BENCH_VERBOSE"):
        for p in q.recentProgress:
            print("   ", p.batchId, p.numInputRows, dict(p.durationMs))
    return [p.durationMs.get("triggerExecution", 0) / 1000.0 for p in q.recentProgress]


def ours_stream(spark, src: str, key_groups: int):
    from spark_changelog.api import ChangelogStream
    from spark_changelog.model import ChangelogMode
    from spark_changelog.operators.window import tumble
    df = (spark.readStream.schema("u STRING, t BIGINT, _kind TINYINT, _seq BIGINT")
          .option("maxFilesPerTrigger", 1).parquet(src))
    return (ChangelogStream.from_dataframe(df, mode=ChangelogMode.INSERT_ONLY)
            .with_column("rt", "timestamp_millis(t)").with_watermark("rt", BOUND_MS)
            .window(tumble("rt", "1 minute"))
            .aggregate(users="count(distinct u)", key_groups=key_groups))


def run_ours(spark, src: str, ck: str, late: str, key_groups: int) -> dict:
    from spark_changelog.runtime.late_output import late_records, write_late_rows
    from spark_changelog.runtime.pipeline import split_metrics

    stream = ours_stream(spark, src, key_groups)
    windows, n_late, op_seconds = {}, [0], []

    def consume(bdf, batch_id):
        data, metrics = split_metrics(bdf.toArrow())
        for ws, n in zip(data["window_start"], data["users"]):
            windows[int(ws.timestamp())] = int(n)
        records = late_records(metrics)
        n_late[0] += len(records)
        op_seconds.append(sum(float(m.get("seconds", 0)) for m in metrics))
        if records:
            write_late_rows(records, late, batch_id)

    q = (stream.df.writeStream.foreachBatch(consume).option("checkpointLocation", ck)
         .trigger(availableNow=True).start())
    q.awaitTermination()
    return {"windows": windows, "durs": _durations(q), "late": n_late[0],
            "operator_seconds": sum(op_seconds)}


def run_floor(spark, src: str, ck: str, key_groups: int) -> dict:
    """The floor of ours' data path: the same plan up to the window operator's
    Arrow pass (windows assigned, progress summary, packing), the shuffle by
    key group and ``transformWithStateInPandas``, with a processor that only
    unpacks its rows and counts them (no state, no operator)."""
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor
    from spark_changelog.plan.lower import lower
    from spark_changelog.runtime.arrow_packing import unpack
    from spark_changelog.runtime.spark_event_time import (EVENT_TIME_KEY_GROUPS, KEY_GROUP_COL,
                                                          pack_event_time_input)

    class UnpackAndCount(StatefulProcessor):
        def init(self, handle) -> None:
            pass

        def handleInputRows(self, key, rows, timerValues):
            n = sum(unpack(list(frame.iloc[:, -1])).num_rows for frame in rows)
            yield pd.DataFrame({"rows": [n]})

        def close(self) -> None:
            pass

    stream = ours_stream(spark, src, key_groups)
    low = lower(stream.node)
    op, tvf = low.operators[-1], stream.node.input
    source = lower(tvf.input.input).df
    packed, _ = pack_event_time_input(source, tvf.spec, op.key, key_groups or EVENT_TIME_KEY_GROUPS,
                                      tvf.window)
    counted = packed.groupBy(KEY_GROUP_COL).transformWithStateInPandas(
        statefulProcessor=UnpackAndCount(), outputStructType="rows long", outputMode="Append",
        timeMode="None")
    total = [0]

    def consume(bdf, batch_id):
        total[0] += sum(bdf.toArrow().column("rows").to_pylist())

    q = (counted.writeStream.foreachBatch(consume).option("checkpointLocation", ck)
         .trigger(availableNow=True).start())
    q.awaitTermination()
    return {"durs": _durations(q), "rows": total[0]}


def run_native(spark, src: str, ck: str) -> dict:
    from pyspark.sql import functions as F
    df = (spark.readStream.schema("u STRING, t BIGINT, _kind TINYINT, _seq BIGINT")
          .option("maxFilesPerTrigger", 1).parquet(src)
          .withColumn("rt", F.timestamp_millis("t"))
          .withWatermark("rt", f"{BOUND_MS + 1} milliseconds"))
    agg = df.groupBy(F.window("rt", "1 minute")).agg(F.size(F.collect_set("u")).alias("users"))
    windows = {}

    def consume(bdf, batch_id):
        for r in bdf.select(F.col("window.start").alias("ws"), "users").collect():
            windows[int(calendar.timegm(r["ws"].timetuple()))] = int(r["users"])

    q = (agg.writeStream.outputMode("append").foreachBatch(consume)
         .option("checkpointLocation", ck).trigger(availableNow=True).start())
    q.awaitTermination()
    return {"windows": windows, "durs": _durations(q)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--key-groups", type=int, default=None,
                    help="default: the runtime's (one per shuffle partition)")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--skip-native", action="store_true")
    ap.add_argument("--floor", action="store_true",
                    help="also run the floor of ours' data path (Arrow pass, shuffle, a stateful "
                         "step that only unpacks and counts) on the same input")
    ap.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                    help="measure the first query of the process cold")
    args = ap.parse_args(argv)

    from spark_changelog.runtime.session import build_session
    spark = build_session("bench-windows", configs={
        "spark.sql.shuffle.partitions": str(args.partitions),
        "spark.sql.session.timeZone": "UTC"})
    d = tempfile.mkdtemp(prefix="bench_windows_")
    try:
        info = generate(os.path.join(d, "in"), args.rows, args.users, args.batch)
        print(f"input: {args.rows} clicks over {args.users} users, {info['within_bound']} out of "
              f"order within the bound, {info['beyond_bound']} beyond it; "
              f"{-(-args.rows // args.batch)} micro-batches", flush=True)
        if args.warm_up:
            # JVM code generation and Python workers start once per process: a
            # small run of each query first, so neither measured run pays it
            generate(os.path.join(d, "warm"), 2 * args.batch // 10, args.users, args.batch // 10)
            run_ours(spark, os.path.join(d, "warm"), os.path.join(d, "ck_warm_ours"),
                     os.path.join(d, "late_warm"), args.key_groups)
            if not args.skip_native:
                run_native(spark, os.path.join(d, "warm"), os.path.join(d, "ck_warm_native"))
            if args.floor:
                run_floor(spark, os.path.join(d, "warm"), os.path.join(d, "ck_warm_floor"), args.key_groups)
        ours = run_ours(spark, os.path.join(d, "in"), os.path.join(d, "ck_ours"),
                        os.path.join(d, "late"), args.key_groups)
        t_ours = sum(ours["durs"])
        print(f"ours:   {t_ours:7.1f} s  {args.rows / t_ours:10,.0f} rows/s  "
              f"windows {len(ours['windows'])}  late rows {ours['late']}  (operator calls: "
              f"{ours['operator_seconds']:.1f} s)", flush=True)
        if args.floor:
            floor = run_floor(spark, os.path.join(d, "in"), os.path.join(d, "ck_floor"), args.key_groups)
            t_floor = sum(floor["durs"])
            print(f"floor:  {t_floor:7.1f} s  {args.rows / t_floor:10,.0f} rows/s  (Arrow pass, shuffle, "
                  f"a stateful step that only unpacks and counts: {floor['rows']:,} rows incl. summaries)",
                  flush=True)
        if not args.skip_native:
            native = run_native(spark, os.path.join(d, "in"), os.path.join(d, "ck_native"))
            t_nat = sum(native["durs"])
            both = sorted(set(ours["windows"]) & set(native["windows"]))
            differ = [w for w in both if ours["windows"][w] != native["windows"][w]]
            print(f"native: {t_nat:7.1f} s  {args.rows / t_nat:10,.0f} rows/s  "
                  f"windows {len(native['windows'])} (late rows dropped silently)")
            # the first micro-batch of a query carries its start (for ours the
            # planning of transformWithStateInPandas, which starts a Python
            # process on the driver): the ratio without it is the per-batch one
            steady = sum(native["durs"][1:]) / max(sum(ours["durs"][1:]), 1e-9)
            print(f"ours / native throughput: {t_nat / t_ours:.2f}x (after the first micro-batch: "
                  f"{steady:.2f}x); windows both emitted: {len(both)}, differing: {len(differ)}")
            if differ:
                for w in differ[:5]:
                    print(f"  window {w}: ours {ours['windows'][w]}, native {native['windows'][w]}")
                raise SystemExit(f"results differ on {len(differ)} windows, e.g. {differ[:3]}")
    finally:
        shutil.rmtree(d, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
