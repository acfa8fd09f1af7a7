"""Benchmark: streaming normalize, whole job (Debezium files in, Delta out),
against Spark's native streaming aggregation in the same run.

    scripts/bench streaming [--events 2000000] [--ids 1000000] [--files 4]
                            [--max-files-per-trigger N] [--no-fold] [--only ours,native]
                            [--checkpoint-managers ROUNDS] [--key-groups ROUNDS]

Input: Debezium JSON files from ``benchmarks/whole_job.py``'s generator
(``id, g, v``; creates, updates, deletes; cached in ``--cache``).  Each job is
its own process (JVM start and imports count, as for a user), one after the
other, never at the same time:

* ours: ``read_debezium(..., streaming=True)`` -> ``normalize()`` ->
  ``write_upsert`` into Delta, with micro-batch folding as ``spark-changelog
  normalize`` runs it (``--no-fold``: without, every version is emitted);
* native: ``spark.readStream.schema(envelope).json(...)`` ->
  ``groupBy(id).agg(max_by(struct(g, v, op), lsn))`` (update mode, RocksDB
  state store) -> ``foreachBatch`` merging into Delta with ``deltalake``
  (delete where the last op is ``d``).

``--checkpoint-managers ROUNDS``: ours only, with Spark's default checkpoint
file manager (what local sessions use, docs/runtime.md "The checkpoint file
manager replaces files") against Hadoop's ``FileSystem``-based one (used
before; it drops a replayed batch's state files), alternating A, B, A, B, ...
in one run; the per-batch times and the load go to
``benchmarks/results/checkpoint-managers-<time>.md``.

``--key-groups ROUNDS``: ours only, with 32 key groups (the default on
``local[2]``, ``model.partitioning.default_key_groups``) against a flat 256,
alternating in one run the same way; results to
``benchmarks/results/key-groups-<time>.md`` (docs/runtime.md, "Why key groups").

Both read all files in one micro-batch by default (the first batch, empty
state); ``--max-files-per-trigger 1`` makes one micro-batch per file.  Prints
whole-process and per-batch times, ratios (native time / ours: above 1 means
ours is faster) and whether the final tables are equal.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from whole_job import (ENVELOPE_DDL, SCHEMA_DDL, cached_files, descendants, final_table,  # noqa: E402
                       input_arguments, last_json, machine_load, process_cpu, run_process)  # noqa: E402  (the reader helper's generator)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class TreeCpu:
    """CPU seconds and peak memory of this process's descendants (the job
    process, its JVM, the Python workers) while the block runs: each
    process's last CPU time read from /proc every 0.2 s, so workers that exit
    before the JVM count too, and the largest sum of their resident set
    sizes seen at one poll (``peak_rss``, bytes).  CPU is steadier than wall
    time on a shared machine."""

    def __enter__(self):
        self.seen: dict = {}
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self):
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.wait(0.2):
            procs = process_cpu()
            rss = 0
            for pid in descendants(procs, os.getpid()):
                self.seen[pid] = max(self.seen.get(pid, 0.0), procs[pid][1])
                try:
                    with open(f"/proc/{pid}/statm") as fh:
                        rss += int(fh.read().split()[1]) * page
                except OSError:
                    pass
            self.peak_rss = max(self.peak_rss, rss)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @property
    def seconds(self) -> float:
        return sum(self.seen.values())


#: Hadoop's FileSystem-based checkpoint manager (local sessions' before issue #26)
FILE_SYSTEM_MANAGER = ("org.apache.spark.sql.execution.streaming.checkpointing."
                       "FileSystemBasedCheckpointFileManager")


def ours_job(inp: str, out: str, ck: str, max_files: int, fold: bool, manager: str = "",
             key_groups: str = "") -> None:
    from spark_changelog.api import read_debezium
    from spark_changelog.runtime.session import build_session

    t0 = time.perf_counter()
    spark = build_session("bench-streaming", configs={
        "spark.sql.streaming.checkpointFileManagerClass": manager} if manager else None)
    ends = []
    s = read_debezium(spark, inp, SCHEMA_DDL, ["id"], streaming=True,
                      max_files_per_trigger=max_files)
    t_query = time.perf_counter()
    rep = s.with_mini_batch(fold).normalize(key_groups=int(key_groups) if key_groups else None).write_upsert(
        out, checkpoint=ck, dead_letter=out + "-dl", progress=lambda r: ends.append(time.perf_counter()))
    batches = [b - a for a, b in zip([t_query] + ends[:-1], ends)]
    print(json.dumps({"batches": batches, "changes_out": rep.changes_out, "rows_in": rep.rows_in,
                      "setup": t_query - t0, "counters": rep.counters}))
    spark.stop()


def phases_job(inp: str, work: str, fold: bool) -> None:
    """The micro-batch's phases, each a streaming query (``availableNow``,
    own checkpoint) into the ``noop`` sink, in one process: the reader alone,
    reader + normalize; then Spark's query progress (durations, state
    operator metrics) of each."""
    from spark_changelog.api import read_debezium
    from spark_changelog.runtime.session import build_session

    spark = build_session("bench-streaming-phases")
    res = {}
    for name in ("reader", "reader+normalize"):
        s = read_debezium(spark, inp, SCHEMA_DDL, ["id"], streaming=True)
        if name != "reader":
            s = s.with_mini_batch(fold).normalize()
        t0 = time.perf_counter()
        q = (s.df.writeStream.format("noop").option("checkpointLocation", os.path.join(work, name))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        p = [x for x in q.recentProgress if x.numInputRows][0]
        res[name] = {"seconds": time.perf_counter() - t0, "durationMs": dict(p.durationMs),
                     "state": [{k: v for k, v in json.loads(o.json).items()
                                if k in ("numRowsUpdated", "allUpdatesTimeMs", "commitTimeMs",
                                         "numRowsTotal", "customMetrics")}
                               for o in p.stateOperators]}
    print(json.dumps(res))
    spark.stop()


def native_job(inp: str, out: str, ck: str, max_files: int) -> None:
    from deltalake import DeltaTable, write_deltalake
    from pyspark.sql import SparkSession, functions as F

    from spark_changelog.runtime.session import ROCKSDB_PROVIDER
    spark = (SparkSession.builder.master("local[2]").appName("native-streaming")
             .config("spark.driver.memory", "4g").config("spark.sql.shuffle.partitions", "4")
             .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    reader = spark.readStream.schema(ENVELOPE_DDL)
    if max_files:
        reader = reader.option("maxFilesPerTrigger", max_files)
    rows = reader.json(inp).select(F.coalesce("after.id", "before.id").alias("id"),
                                   F.struct("after.g", "after.v", "op").alias("r"),
                                   F.col("source.lsn").alias("lsn"))
    last = rows.groupBy("id").agg(F.max_by("r", "lsn").alias("r")).select(
        "id", "r.g", "r.v", (F.col("r.op") == "d").alias("deleted"))

    def write(batch, _):
        t = batch.toArrow()
        if not DeltaTable.is_deltatable(out):
            alive = t.filter(t.column("deleted").to_numpy(zero_copy_only=False) == False)  # noqa: E712
            write_deltalake(out, alive.drop_columns(["deleted"]), mode="overwrite")
            return
        (DeltaTable(out).merge(t, "t.id = s.id", source_alias="s", target_alias="t")
         .when_matched_delete("s.deleted").when_matched_update(
             {"g": "s.g", "v": "s.v"}, "NOT s.deleted")
         .when_not_matched_insert({"id": "s.id", "g": "s.g", "v": "s.v"}, "NOT s.deleted")
         .execute())

    q = (last.writeStream.outputMode("update").foreachBatch(write)
         .option("checkpointLocation", ck).trigger(availableNow=True).start())
    q.awaitTermination()
    batches = [p.durationMs.get("triggerExecution", 0) / 1000.0 for p in q.recentProgress
               if p.numInputRows]
    print(json.dumps({"batches": batches}))
    spark.stop()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    input_arguments(ap, events=2_000_000, ids=1_000_000)
    ap.add_argument("--max-files-per-trigger", type=int, default=0,
                    help="files per micro-batch (0: all files in one micro-batch)")
    ap.add_argument("--no-fold", action="store_true", help="ours without micro-batch folding")
    ap.add_argument("--only", default="ours,native")
    ap.add_argument("--ours-job", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint-managers", type=int, default=0, metavar="ROUNDS",
                    help="ours with Spark's default checkpoint manager against the FileSystem-based "
                         "one, alternating, ROUNDS times each")
    ap.add_argument("--key-groups", type=int, default=0, metavar="ROUNDS",
                    help="ours with 32 key groups against 256, alternating, ROUNDS times each")
    ap.add_argument("--native-job", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--phases", action="store_true",
                    help="ours only: the reader alone and reader + normalize into noop, "
                         "with Spark's query progress of each (one process)")
    ap.add_argument("--phases-job", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.ours_job:
        inp, out, ck, mf, fold, *manager = args.ours_job
        return ours_job(inp, out, ck, int(mf) or None, fold == "1", *manager)
    if args.phases_job:
        inp, work, fold = args.phases_job
        return phases_job(inp, work, fold == "1")
    if args.native_job:
        inp, out, ck, mf = args.native_job
        return native_job(inp, out, ck, int(mf) or None)

    inp = cached_files(args.cache, args.events, args.ids, args.files)
    work = tempfile.mkdtemp(prefix="bench-streaming-")
    log = os.path.join(work, "jobs.log")
    mf = str(args.max_files_per_trigger)
    only = set(args.only.split(","))
    print(f"{args.events:,} Debezium events over {args.ids:,} ids in {args.files} files, "
          f"{'all files in one micro-batch' if not args.max_files_per_trigger else mf + ' file(s) per micro-batch'}; "
          f"load {machine_load()}; logs: {log}", flush=True)
    if args.checkpoint_managers:
        return compare_variants(args, inp, work, log, "checkpoint-managers", args.checkpoint_managers,
                                [("default (FileContext)", []), ("FileSystem", [FILE_SYSTEM_MANAGER])])
    if args.key_groups:
        return compare_variants(args, inp, work, log, "key-groups", args.key_groups,
                                [("32 key groups", ["", "32"]), ("256 key groups", ["", "256"])])
    if args.phases:
        secs, out = run_process([sys.executable, __file__, "--phases-job", inp, work,
                                 "0" if args.no_fold else "1"], log)
        print(json.dumps(last_json(out), indent=1) + f"\n  whole process {secs:.1f} s (load {machine_load()})")
        shutil.rmtree(work, ignore_errors=True)
        return
    res = {}
    for name in ("ours", "native"):
        if name not in only:
            continue
        out, ck = os.path.join(work, name), os.path.join(work, name + "-ck")
        if name == "ours":
            cmd = [sys.executable, __file__, "--ours-job", inp, out, ck, mf,
                   "0" if args.no_fold else "1"]
        else:
            cmd = [sys.executable, __file__, "--native-job", inp, out, ck, mf]
        with TreeCpu() as tree:
            secs, out = run_process(cmd, log)
        cpu = tree.seconds
        info = last_json(out)
        res[name] = (secs, info, cpu)
        b = info["batches"]
        later = max(b[1:]) / b[0] if len(b) > 1 else None
        print(f"  {name:<7} whole process {secs:6.1f} s, CPU {cpu:6.1f} s | batches {', '.join(f'{x:.1f}' for x in b)} s"
              + (f" | slowest later / first {later:.2f}" if later else "")
              + (f" | changes out {info['changes_out']:,}" if "changes_out" in info else "")
              + f"   (load {machine_load()})", flush=True)
    if len(res) == 2:
        o, n = res["ours"], res["native"]
        print(f"  => native / ours, whole process: {n[0] / o[0]:.2f}x; batches: "
              f"{sum(n[1]['batches']) / sum(o[1]['batches']):.2f}x; CPU: {n[2] / o[2]:.2f}x "
              "(above 1: ours faster)")
        same = final_table(os.path.join(work, "ours")).equals(final_table(os.path.join(work, "native")))
        print(f"  final tables equal: {same}")
    shutil.rmtree(work, ignore_errors=True)


def compare_variants(args, inp: str, work: str, log: str, slug: str, rounds: int, variants) -> None:
    """ours in each of ``variants`` ((name, extra ``--ours-job`` arguments)),
    alternating A, B, A, B, ... ``rounds`` times, in one run; a results table
    with the load to ``benchmarks/results/<slug>-<time>.md``."""
    mf = str(args.max_files_per_trigger)
    rows = []
    for r in range(rounds):
        for name, extra in variants:
            out, ck = os.path.join(work, f"{r}-{len(rows)}"), os.path.join(work, f"{r}-{len(rows)}-ck")
            load0 = machine_load()
            try:
                with TreeCpu() as tree:
                    secs, text = run_process([sys.executable, __file__, "--ours-job", inp, out, ck, mf,
                                              "0" if args.no_fold else "1"] + extra, log)
            except SystemExit as failed:     # a run that failed (the load): said, and left out
                print(f"  {name:<22} {str(failed).splitlines()[0]}", flush=True)
                continue
            info = last_json(text)
            rows.append((name, secs, tree.seconds, info["batches"], f"{load0}-{machine_load()}",
                         final_table(out)))
            b = info["batches"]
            print(f"  {name:<22} whole process {secs:6.1f} s, CPU {tree.seconds:6.1f} s | batches "
                  f"{', '.join(f'{x:.2f}' for x in b)} s | later batches {sum(b[1:]):.2f} s   (load {rows[-1][4]})",
                  flush=True)
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(ck, ignore_errors=True)
    same = all(r[5].equals(rows[0][5]) for r in rows)
    lines = [f"# {slug}, `scripts/bench streaming --{slug} {rounds}`",
             "", f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.events:,} events over "
             f"{args.ids:,} ids in {args.files} files, {mf} file(s) per micro-batch; "
             f"{' / '.join(v[0] for v in variants)} alternating; final tables all equal: {same}.", "",
             "| variant | whole process s | CPU s | batches s | later batches s | load |", "|---|---|---|---|---|---|"]
    for name, secs, cpu, b, load, _ in rows:
        lines.append(f"| {name} | {secs:.1f} | {cpu:.1f} | {', '.join(f'{x:.2f}' for x in b)} | "
                     f"{sum(b[1:]):.2f} | {load} |")
    for name, _ in variants:
        mine = [r for r in rows if r[0] == name]
        if not mine:
            continue
        lines.append(f"\n{name}: median whole process {sorted(r[1] for r in mine)[len(mine) // 2]:.1f} s, "
                     f"median CPU {sorted(r[2] for r in mine)[len(mine) // 2]:.1f} s, "
                     f"median later batches {sorted(sum(r[3][1:]) for r in mine)[len(mine) // 2]:.2f} s")
    results = os.path.join(ROOT, "benchmarks", "results")
    os.makedirs(results, exist_ok=True)
    path = os.path.join(results, f"{slug}-{time.strftime('%Y%m%d-%H%M', time.gmtime())}.md")
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines[-len(variants):]) + f"\nwritten: {path}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
