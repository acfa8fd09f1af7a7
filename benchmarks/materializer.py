"""Benchmark: streaming SinkUpsertMaterializer into the Delta sink, vs normalize() on the same input.

    scripts/bench materializer [--rows 1000000] [--keys 100000] [--disorder 0.3] [--batch 100000]
                               [--conflict deduplicate|nothing]

Input: what a join feeding an upsert sink looks like after Spark's shuffles.
Each of ``--keys`` sink keys (``id``) gets a chain of versions ``(id, ver,
payload)``: ``+I`` of version 0, then updates as ``-U`` of version i-1 and
``+U`` of version i, about ``--rows`` changes in all.  For ``--disorder`` of
the keys (30%) every update arrives as ``+U`` of the new version *before* the
``-U`` of the previous one (a later ``_seq``, often a later micro-batch): the
order per sink key is broken the way a join emitting from two key groups breaks
it (docs/semantics.md, section 2).  The keys' changes are interleaved at random over the
whole run, written as parquet changelog files (data columns + ``_kind`` +
``_seq``) of ``--batch`` rows, one file per micro-batch.

Two streaming pipelines (trigger available-now, checkpointed) into Delta tables:

* ``write_upsert(table, key="id", materialize="force")`` over the stream without
  an upsert key: the SinkUpsertMaterializer (transformWithStateInPandas,
  RocksDB), then the Delta sink (MERGE, one commit per micro-batch); the final
  table is checked against the last version of every key;
* ``normalize()`` by ``id`` on the same files, then the same Delta sink (the
  keep-last rate for comparison; it does not repair the disorder: a late ``-U``
  deletes its key, so its table is not checked).

``--conflict nothing``: the materializer runs as ``ON CONFLICT DO NOTHING``
over a watermark on the event time ``t`` (ms, bound 0): every micro-batch
is folded in the next one (a timer per key group); its table is not checked
(keeping the first row is what DO NOTHING means when a ``+U`` arrives a
watermark before its ``-U``).

Per-batch times are the wall time between the pipeline's progress callbacks
(the sink commit included); rows/s counts input changes.  State rows: the
operator's metric rows (largest per-batch sum over the key groups).
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

SCHEMA = pa.schema([("id", pa.int64()), ("ver", pa.int64()), ("payload", pa.string()),
                    ("t", pa.int64()), ("_kind", pa.int8()), ("_seq", pa.int64())])
DDL = "id BIGINT, ver BIGINT, payload STRING, t BIGINT, _kind TINYINT, _seq BIGINT"


def generate(directory: str, rows: int, keys: int, disorder: float, batch: int, seed: int = 1):
    """Returns (files, changes, expected final rows as {id: ver}, disordered keys)."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    avg_updates = max(0.0, (rows / keys - 1) / 2)
    updates = np.floor(avg_updates).astype(np.int64) + (rng.random(keys) < avg_updates % 1)
    per_key = 1 + 2 * updates
    n = int(per_key.sum())
    key = np.repeat(np.arange(keys, dtype=np.int64), per_key)
    start = np.cumsum(per_key) - per_key
    j = np.arange(n, dtype=np.int64) - np.repeat(start, per_key)     # position in the key's chain
    # chain: j=0 +I v0; j odd: -U v(j-1)/2; j even > 0: +U v j/2
    kind = np.where(j == 0, 0, np.where(j % 2 == 1, 1, 2)).astype(np.int8)
    ver = np.where(j % 2 == 1, (j - 1) // 2, j // 2)
    bad = rng.random(keys) < disorder
    # disordered keys: swap each (-U v(i-1), +U v i) pair: the +U comes first
    swap = bad[key] & (j > 0)
    order_j = np.where(swap, np.where(j % 2 == 1, j + 1, j - 1), j)
    # random interleaving keeping each key's (possibly swapped) order: per-key cumsum of gaps
    gaps = rng.exponential(1.0, n)
    csum = np.cumsum(gaps)
    t = csum - np.repeat(csum[start] - gaps[start], per_key)
    t = t / np.repeat(t[start + per_key - 1], per_key)                 # each key spans the run
    # position of the k-th event (in arrival order) of a key: sort its times, assign rows by order_j
    arrival_t = np.empty(n)
    arrival_t[start[key] + order_j] = t                                 # row at order_j gets the j-th time
    order = np.argsort(arrival_t, kind="stable")
    payload = np.char.add("p", ((key * 7919 + ver) % 1_000_003).astype(str)).astype(object)
    # event time t (ms) of a version = arrival position of the change creating it;
    # a retraction carries the retracted version's t (it is that row's image)
    arrival_pos = np.empty(n, dtype=np.int64)
    arrival_pos[order] = np.arange(n, dtype=np.int64)
    creator = np.where(kind == 1, np.arange(n) - 1, np.arange(n))    # -U v sits right after +U v
    event_t = arrival_pos[creator]
    files = 0
    for s in range(0, n, batch):
        idx = order[s:s + batch]
        tb = pa.table([key[idx], ver[idx], pa.array(payload[idx], pa.string()), event_t[idx],
                       kind[idx], np.arange(s, s + len(idx), dtype=np.int64)], schema=SCHEMA)
        pq.write_table(tb, os.path.join(directory, f"part-{files:05d}.parquet"))
        files += 1
    expected = dict(zip(range(keys), updates.tolist()))
    return files, n, expected, int(bad.sum())


def timed(run) -> tuple[object, list[float]]:
    marks = [time.perf_counter()]

    def progress(_report):
        marks.append(time.perf_counter())

    report = run(progress)
    return report, [b - a for a, b in zip(marks[:-1], marks[1:])]


def line(name, report, secs, n, batch):
    rate = n / sum(secs) if secs else 0.0
    steady = secs[1:]
    print(f"  {name:<32} batches {' '.join(f'{s:.1f}' for s in secs)} s | median "
          f"{statistics.median(secs) if secs else 0:.2f} s | {rate:,.0f} rows/s"
          f"{f' (after the first batch {(n - min(batch, n)) / sum(steady):,.0f})' if steady else ''}"
          f" | changes out {report.changes_out:,} | state rows {report.state_rows:,}")
    return rate


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--disorder", type=float, default=0.3, help="share of keys with out-of-order retractions")
    ap.add_argument("--batch", type=int, default=100_000, help="changes per file (= micro-batch)")
    ap.add_argument("--key-groups", type=int, default=32)
    ap.add_argument("--partitions", type=int, default=4, help="spark.sql.shuffle.partitions")
    ap.add_argument("--driver-memory", default="8g")
    ap.add_argument("--work", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--conflict", choices=["deduplicate", "nothing"], default="deduplicate")
    args = ap.parse_args(argv)
    from spark_changelog.api import ChangelogStream
    from spark_changelog.runtime.session import build_session
    from spark_changelog.sinks.delta import read_table

    work = args.work or tempfile.mkdtemp(prefix="bench-materializer-")
    d = os.path.join(work, "in")
    shutil.rmtree(d, ignore_errors=True)
    t = time.perf_counter()
    files, n, expected, bad = generate(d, args.rows, args.keys, args.disorder, args.batch)
    print(f"== materializer: {n:,} changes over {args.keys:,} sink keys, {bad:,} keys with out-of-order "
          f"retractions, {files} files of {args.batch:,} (generated in {time.perf_counter() - t:.0f} s)")
    spark = build_session("bench-materializer", configs={"spark.sql.shuffle.partitions": str(args.partitions),
                                                         "spark.driver.memory": args.driver_memory})

    def source(pk):
        df = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).parquet(d)
        return ChangelogStream.from_dataframe(df, primary_key=pk, name="joined")

    table = os.path.join(work, "t_materialized")
    mat_in = source(None)
    if args.conflict != "deduplicate":
        mat_in = mat_in.with_column("rt", "timestamp_millis(t)").with_watermark("rt", 0)
    rep, secs = timed(lambda cb: mat_in.write_upsert(
        table, key="id", materialize="force", conflict=args.conflict,
        checkpoint=os.path.join(work, "ck1"), progress=cb, key_groups=args.key_groups))
    r_mat = line(f"materializer {args.conflict} (ours, G={args.key_groups})", rep, secs, n,
                 args.batch)
    got = read_table(table)
    if args.conflict == "deduplicate":
        ok = len(got) == len(expected) and \
            dict(zip(got["id"].astype(int), got["ver"].astype(int))) == expected
        print(f"    check: final table {len(got):,} rows, expected {len(expected):,}: "
              f"{'identical' if ok else 'DIFFERENT'}; retractions without a match: "
              f"{rep.counters.get('retract_no_match', 0)}")
    else:
        print(f"    final table {len(got):,} rows; watermark timers fired "
              f"{rep.counters.get('watermark_timers', 0)}")

    rep2, secs2 = timed(lambda cb: source(["id"]).normalize(key_groups=args.key_groups).write_upsert(
        os.path.join(work, "t_normalized"), checkpoint=os.path.join(work, "ck2"), progress=cb))
    r_norm = line(f"normalize (ours, G={args.key_groups})", rep2, secs2, n, args.batch)
    if r_norm:
        print(f"  => materializer / normalize: {r_mat / r_norm:.2f}x")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
