"""Benchmark: the Delta upsert sink's time per micro-batch against the
table's size (docs/sinks.md, "Speed").

    scripts/bench delta-table-size [--tables 100000,1000000,10000000] [--batch 100000]
                                   [--shapes new_keys,recent_keys,random_updates] [--repeat 3]
                                   [--layouts deletion-vectors,merge] [--batches 2] [--executors]

For each table size T a table of T rows (id 0..T-1, a 40-character name, a
score) is written by the sink itself (its first batch: an append into the
empty table), ``optimize()``d (clustered by the key, as the sink's policy
recommends), then the same-sized batches of each shape are committed by
``DeltaUpsertSink.write_arrow_batch`` (the sink's whole path: net change per
key, decision, commit with the batch id), each on a fresh copy of the table:

* ``new_keys``: B inserts of keys above the table's (a growing key: orders,
  events);
* ``recent_keys``: B updates of the table's newest keys (key-local updates);
* ``random_updates``: B updates of keys drawn uniformly over the table.

``--batches`` (default 2) batches go into each copy, one after the other,
all timed: the ``cold`` one by a sink just opened, the ``warm`` ones after
it (their median), as the micro-batches of a running query (a process keeps
the key columns it read, docs/sinks.md "Updates and deletes: deletion
vectors").  The copy is flushed to disk (``sync``) before the first batch:
otherwise the copy's write-back lands in the batch's own ``fsync`` of its
commit, a cost of the set-up that grows with the table.

Each in two layouts, in the same run: ``deletion-vectors`` (the sink's
default: updates and deletes become deletion vectors, docs/sinks.md
"Updates and deletes: deletion vectors"; committed here from the driver with
one partition, the code each executor runs for its keys) and ``merge`` (a
table without the deletion-vector feature, ``deletion_vectors=False``: a
delta-rs MERGE rewriting every file it touches), the reference.

``--executors``: each batch takes the pipeline's path instead (a local[2]
Spark session): ``stage_batch`` on the driver, the sink writers on the
executors (``runtime.sink_writers.write_partitions``, the batch
repartitioned by the key), the driver's commit; a layout without a stage
(``merge``) is collected as Arrow and merged, as the pipeline does.  The
time is from the stage to the commit (the batch's DataFrame is built and
cached before).

The issue's bar: time per batch grows by less than 2x from the smallest to
the largest table.  Printed and written to
``benchmarks/results/delta-table-size-<UTC time>.json`` with the machine's load.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)


def rows(ids, kind: int, seq0: int):
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    ids = pa.array(np.asarray(ids, dtype=np.int64))
    names = pc.utf8_slice_codeunits(pc.binary_join_element_wise(
        pc.cast(ids, pa.string()), pa.scalar("-abcdefghijklmnopqrstuvwxyz0123456789abcdef"), ""), 0, 40)
    return pa.table({"id": ids, "name": names, "score": pc.multiply(ids, 3),
                     "_kind": pa.array(np.full(len(ids), kind, dtype=np.int8)),
                     "_seq": pa.array(np.arange(seq0, seq0 + len(ids), dtype=np.int64))})


def batch_ids(shape: str, table_rows: int, batch: int, nth: int = 0):
    """The keys of the ``nth`` batch of a shape (new keys above the last
    batch's, the same newest keys again, other random keys)."""
    import numpy as np
    if shape == "new_keys":
        return np.arange(table_rows + nth * batch, table_rows + (nth + 1) * batch)
    if shape == "recent_keys":
        return np.arange(table_rows - batch, table_rows)
    return np.sort(np.random.default_rng(7 + nth).choice(table_rows, size=batch, replace=False))


def main() -> None:
    import pyarrow as pa

    from spark_changelog.sinks.delta import DeltaUpsertSink
    from whole_job import machine_load

    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", default="100000,1000000,10000000")
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--shapes", default="new_keys,recent_keys,random_updates")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--layouts", default="deletion-vectors,merge")
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--executors", action="store_true")
    args = ap.parse_args()
    spark = None
    if args.executors:
        from spark_changelog.runtime.session import build_session
        spark = build_session("delta-table-size")
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.int64())])
    work = tempfile.mkdtemp(prefix="delta-table-size-")
    results = []
    try:
        sizes = [int(t) for t in args.tables.split(",")]
        layouts, shapes = args.layouts.split(","), args.shapes.split(",")
        for table_rows in sizes:
            for layout in layouts:
                base = os.path.join(work, f"base-{layout}-{table_rows}")
                t = time.perf_counter()
                sink = DeltaUpsertSink(base, ["id"], schema, deletion_vectors=layout == "deletion-vectors")
                sink.write_arrow_batch(rows(range(table_rows), 0, 0), query_id="load", batch_id=0)
                sink.optimize()
                print(f"{layout}: table of {table_rows:,} rows written and optimized in "
                      f"{time.perf_counter() - t:.1f} s", flush=True)
        if spark is not None:       # the executors' Python workers started before the timed batches
            warm_up = os.path.join(work, "warm-up")
            shutil.copytree(os.path.join(work, f"base-{layouts[0]}-{sizes[0]}"), warm_up)
            write(spark, DeltaUpsertSink(warm_up, ["id"], schema, deletion_vectors=layouts[0] == "deletion-vectors"),
                  rows(batch_ids("random_updates", sizes[0], min(args.batch, sizes[0])), 2, sizes[0] + 1), 0)
        # the sizes interleaved, repeat by repeat: each size's batches see the same load
        runs: dict = {}
        for r in range(args.repeat):
            for shape in shapes:
                kind = 0 if shape == "new_keys" else 2
                for layout in layouts:
                    for table_rows in sizes:
                        path = os.path.join(work, f"run-{layout}-{table_rows}-{shape}-{r}")
                        shutil.copytree(os.path.join(work, f"base-{layout}-{table_rows}"), path)
                        os.sync()
                        s = DeltaUpsertSink(path, ["id"], schema, deletion_vectors=layout == "deletion-vectors")
                        run = runs.setdefault((layout, table_rows, shape),
                                              {"cold": [], "warm": [], "write": set(), "load": []})
                        run["load"].append(machine_load())
                        warm = []
                        for nth in range(max(2, args.batches)):
                            b = rows(batch_ids(shape, table_rows, args.batch, nth), kind,
                                     table_rows + 1 + nth * args.batch)
                            out, seconds = write(spark, s, b, nth)
                            (run["cold"] if nth == 0 else warm).append(seconds)
                            run["write"].add(out.get("write"))
                        run["warm"].append(statistics.median(warm))
                        shutil.rmtree(path)
                        print(f"{layout} {shape} {table_rows:,}: cold {run['cold'][-1]:.3f} s, "
                              f"warm {run['warm'][-1]:.3f} s", flush=True)
        for (layout, table_rows, shape), run in runs.items():
            res = {"layout": layout, "table_rows": table_rows, "batch_rows": args.batch, "shape": shape,
                   "seconds": [round(x, 3) for x in run["cold"]],
                   "median_s": round(statistics.median(run["cold"]), 3),
                   "warm_seconds": [round(x, 3) for x in run["warm"]],
                   "warm_median_s": round(statistics.median(run["warm"]), 3),
                   "write": sorted(w for w in run["write"] if w), "load": run["load"]}
            print(json.dumps(res), flush=True)
            results.append(res)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sizes = sorted({r["table_rows"] for r in results})
    growth: dict = {}
    for when, field in (("cold", "median_s"), ("warm", "warm_median_s")):
        by = {(r["layout"], r["shape"], r["table_rows"]): r[field] for r in results}
        growth.update({f"{layout} {shape} {when}":
                       round(by[(layout, shape, sizes[-1])] / by[(layout, shape, sizes[0])], 2)
                       for layout in args.layouts.split(",") for shape in args.shapes.split(",")
                       if len(sizes) > 1})
    print(f"growth of the time per batch from {sizes[0]:,} to {sizes[-1]:,} rows: {growth} (bar: < 2)")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H%M%S+0000")
    path = os.path.join(ROOT, "benchmarks", "results", f"delta-table-size-{stamp}.json")
    with open(path, "w") as f:
        json.dump({"benchmark": "delta-table-size", "path": "executors" if args.executors else "in-process",
                   "results": results, "growth": growth}, f, indent=1)
    print(f"results: {path}")
    if spark is not None:
        spark.stop()


def write(spark, sink, batch, batch_id: int):
    """One batch into ``sink`` -> (its result, seconds): in this process, or
    (``spark``) on the pipeline's path: staged on the executors, committed here."""
    if spark is None:
        t = time.perf_counter()
        return sink.write_arrow_batch(batch, query_id="bench", batch_id=batch_id), time.perf_counter() - t
    from spark_changelog.runtime.sink_writers import write_partitions
    df = spark.createDataFrame(batch).cache()
    df.count()
    t = time.perf_counter()
    stage = sink.stage_batch("bench", batch_id)
    if stage is None:
        out = sink.write_arrow_batch(df.toArrow(), query_id="bench", batch_id=batch_id)
    else:
        _, _, (written,) = write_partitions(df, [stage], ["id"], "t")
        out = stage.commit(written)
    seconds = time.perf_counter() - t
    df.unpersist()
    return out, seconds


if __name__ == "__main__":
    main()
