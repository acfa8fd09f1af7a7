"""Benchmark: the user's whole job, ours against a native PySpark script.

    scripts/bench whole-job [--events 1000000] [--ids 100000] [--files 4] [--streaming]

Generates (once, into ``--cache``) Debezium JSON change files like the ones of
issue #9: ``id BIGINT, g BIGINT, v BIGINT``, about 17% creates, 74% updates and
8% deletes over ``--ids`` ids, each id's history in one file in log order,
``source.lsn`` increasing through each file.  Then runs, each as a separate
process (so JVM start and imports count, as for a user):

* ours: ``spark-changelog normalize FILES OUT --format debezium-json --key id``
  (batch, into a Delta table; with ``--streaming`` also the streaming run);
* native: a PySpark script that reads the JSON with a schema, keeps the last
  row per id by file position (``row_number`` over file, block, row order) and
  writes the alive rows as a Delta table with ``deltalake``;
* the reader alone, ours (``read_debezium(...)`` to the ``noop`` sink, with
  its validation and dead letters) against ``spark.read.schema(...).json(...)``,
  in wall time and in CPU seconds of the JVM and its Python workers (on a
  shared machine the CPU ratio is the steadier one).

Prints wall times and ratios; both final tables are compared row by row.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA_DDL = "id BIGINT, g BIGINT, v BIGINT"


def generate(directory: str, events: int, ids: int, files: int, seed: int = 7) -> None:
    """Debezium change files: per event a random id of the file's ids; a dead
    id is created, an alive one deleted with probability 0.09, else updated."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    per_file = events // files
    lsn = 1_000_000
    ts = 1_700_000_000_000
    for f in range(files):
        file_ids = np.arange(f, ids, files)
        picks = rng.integers(0, len(file_ids), per_file)
        dice = rng.random(per_file)
        gs = rng.integers(0, 100, per_file)
        vs = rng.integers(0, 1_000_000_000, per_file)
        alive: dict[int, tuple[int, int]] = {}
        lines = []
        for i in range(per_file):
            k = int(file_ids[picks[i]])
            lsn += 40 + (i & 7)
            ts += 1
            src = f'"source":{{"connector":"postgresql","db":"bench","table":"t","lsn":{lsn},"ts_ms":{ts}}}'
            old = alive.get(k)
            if old is None:
                new = (int(gs[i]), int(vs[i]))
                alive[k] = new
                lines.append(f'{{"before":null,"after":{{"id":{k},"g":{new[0]},"v":{new[1]}}},"op":"c",'
                             f'{src},"ts_ms":{ts}}}')
            elif dice[i] < 0.09:
                del alive[k]
                lines.append(f'{{"before":{{"id":{k},"g":{old[0]},"v":{old[1]}}},"after":null,"op":"d",'
                             f'{src},"ts_ms":{ts}}}')
            else:
                new = (old[0], int(vs[i]))
                alive[k] = new
                lines.append(f'{{"before":{{"id":{k},"g":{old[0]},"v":{old[1]}}},'
                             f'"after":{{"id":{k},"g":{new[0]},"v":{new[1]}}},"op":"u",{src},"ts_ms":{ts}}}')
        with open(os.path.join(directory, f"part-{f}.json"), "w") as fh:
            fh.write("\n".join(lines) + "\n")


# --------------------------------------------------------------------------- the jobs (each its own process)

ENVELOPE_DDL = ("before STRUCT<id: BIGINT, g: BIGINT, v: BIGINT>, after STRUCT<id: BIGINT, g: BIGINT, v: BIGINT>, "
                "op STRING, source STRUCT<lsn: BIGINT>, ts_ms BIGINT")


def native_job(inp: str, out: str) -> None:
    """The reference: plain PySpark + deltalake, the last row per id by file position."""
    from deltalake import write_deltalake
    from pyspark.sql import SparkSession, Window, functions as F

    spark = (SparkSession.builder.master("local[2]").appName("native")
             .config("spark.driver.memory", "4g").config("spark.sql.shuffle.partitions", "4")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.read.schema(ENVELOPE_DDL).json(inp)
    rows = df.select(F.coalesce("after.id", "before.id").alias("id"), "after.g", "after.v", "op",
                     F.col("_metadata.file_path").alias("f"), F.col("_metadata.file_block_start").alias("b"),
                     F.monotonically_increasing_id().alias("n"))
    w = Window.partitionBy("id").orderBy(F.col("f").desc(), F.col("b").desc(), F.col("n").desc())
    last = rows.withColumn("rn", F.row_number().over(w)).where("rn = 1 AND op <> 'd'").select("id", "g", "v")
    write_deltalake(out, last.toArrow(), mode="overwrite")
    spark.stop()


def process_cpu() -> dict:
    """Every process's (parent pid, CPU seconds so far), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    rest = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            procs[int(d)] = (int(rest[1]), (int(rest[11]) + int(rest[12])) / tick)
    return procs


def descendants(procs: dict, root: int) -> list:
    """The pids below ``root`` in ``procs`` (:func:`process_cpu`)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _tree_cpu() -> float:
    """CPU seconds used so far by this process's descendants (the JVM and its
    Python workers), from /proc."""
    procs = process_cpu()
    return sum(procs[pid][1] for pid in descendants(procs, os.getpid()))


def reader_job(inp: str) -> None:
    """Reader alone, in one process: ours (with validation and dead letters) and
    Spark's JSON reader with a schema, each to the ``noop`` sink, best of two
    (wall seconds and CPU seconds of the JVM and its Python workers)."""
    from spark_changelog.api import read_debezium
    from spark_changelog.runtime.session import build_session

    spark = build_session("reader-bench")
    files = sorted(os.path.join(inp, f) for f in os.listdir(inp) if f.endswith(".json"))

    def timed(df) -> tuple[float, float]:
        t, cpu = time.perf_counter(), _tree_cpu()
        df.write.format("noop").mode("overwrite").save()
        return time.perf_counter() - t, _tree_cpu() - cpu

    native = lambda: spark.read.schema(ENVELOPE_DDL).json(files)  # noqa: E731
    ours = lambda: read_debezium(spark, files, SCHEMA_DDL, ["id"]).df  # noqa: E731
    timed(native())   # warm-up (JIT, file cache)
    times = {"native": [], "ours": []}
    for _ in range(2):
        times["ours"].append(timed(ours()))
        times["native"].append(timed(native()))
    best = {k: min(v) for k, v in times.items()}
    print(json.dumps({"ours": best["ours"][0], "native": best["native"][0],
                      "ours_cpu": min(c for _, c in times["ours"]), "native_cpu": min(c for _, c in times["native"])}))


# --------------------------------------------------------------------------- driver


def cached_files(cache: str, events: int, ids: int, files: int, seed: int = 7) -> str:
    """The directory of these generated Debezium files under ``cache``,
    generated once (every whole-process benchmark reads the same sets)."""
    path = os.path.join(cache, f"debezium-{events}-{ids}-{files}" + ("" if seed == 7 else f"-seed{seed}"))
    if not os.path.isdir(path):
        t = time.perf_counter()
        generate(path + ".tmp", events, ids, files, seed=seed)
        os.replace(path + ".tmp", path)
        print(f"generated {path} in {time.perf_counter() - t:.0f} s")
    return path


def run_process(cmd: list[str], log: str) -> tuple[float, str]:
    """Run one job as its own process (this checkout first on the Python path,
    its stderr appended to ``log``): its wall time and its stdout.  Shared by
    the benchmarks that compare whole processes."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t = time.perf_counter()
    with open(log, "a") as fh:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=fh, text=True)
    secs = time.perf_counter() - t
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}); see {log}\n{proc.stdout}")
    return secs, proc.stdout


def last_json(stdout: str) -> dict:
    """The JSON object a job process prints last."""
    return json.loads(stdout.strip().splitlines()[-1])


def machine_load() -> str:
    return open("/proc/loadavg").read().split(" ")[0] if os.path.exists("/proc/loadavg") else "?"


def final_table(path: str):
    """The (id, g, v) rows of a Delta table, sorted by id (to compare results)."""
    from spark_changelog.sinks.delta import read_arrow_table
    return read_arrow_table(path).to_pandas().sort_values("id").reset_index(drop=True)[["id", "g", "v"]]


def input_arguments(ap, events: int = 1_000_000, ids: int = 100_000) -> None:
    """The generated input's options (:func:`cached_files`), shared by the
    benchmarks that read these Debezium files."""
    ap.add_argument("--events", type=int, default=events)
    ap.add_argument("--ids", type=int, default=ids)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "spark-changelog-bench"))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    input_arguments(ap)
    ap.add_argument("--streaming", action="store_true", help="also run ours as a streaming query")
    ap.add_argument("--no-reader", action="store_true", help="skip the reader-alone comparison")
    ap.add_argument("--native-job", nargs=2, metavar=("IN", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--reader-job", metavar="IN", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.native_job:
        return native_job(*args.native_job)
    if args.reader_job:
        return reader_job(args.reader_job)

    inp = cached_files(args.cache, args.events, args.ids, args.files)
    work = tempfile.mkdtemp(prefix="whole-job-")
    log = os.path.join(work, "jobs.log")
    py = sys.executable
    print(f"{args.events:,} Debezium events over {args.ids:,} ids in {args.files} files; "
          f"load average {machine_load()} at start; logs: {log}")
    results = {}
    ours_cmd = [py, "-m", "spark_changelog.cli", "normalize", inp, os.path.join(work, "ours"),
                "--format", "debezium-json", "--key", "id", "--schema", SCHEMA_DDL,
                "--dead-letter", os.path.join(work, "dl")]
    results["ours, batch"] = run_process(ours_cmd, log)[0]
    print(f"  ours, batch (spark-changelog normalize, whole process): {results['ours, batch']:6.1f} s"
          f"   (load {machine_load()})")
    results["native"] = run_process([py, __file__, "--native-job", inp, os.path.join(work, "native")],
                                    log)[0]
    print(f"  native PySpark + deltalake (whole process):             {results['native']:6.1f} s"
          f"   (load {machine_load()})")
    if args.streaming:
        cmd = [py, "-m", "spark_changelog.cli", "normalize", inp, os.path.join(work, "ours_stream"),
               "--format", "debezium-json", "--key", "id", "--schema", SCHEMA_DDL, "--streaming",
               "--checkpoint", os.path.join(work, "ck"), "--dead-letter", os.path.join(work, "dl2")]
        results["ours, streaming"] = run_process(cmd, log)[0]
        print(f"  ours, streaming (one micro-batch, whole process):       "
              f"{results['ours, streaming']:6.1f} s   (load {machine_load()})")
    print(f"  => ours / native: {results['ours, batch'] / results['native']:.2f}x")
    same = final_table(os.path.join(work, "ours")).equals(final_table(os.path.join(work, "native")))
    print(f"  final tables equal: {same}")
    if args.streaming:
        print(f"  streaming table equal: "
              f"{final_table(os.path.join(work, 'ours_stream')).equals(final_table(os.path.join(work, 'native')))}")
    if not args.no_reader:
        r = last_json(run_process([py, __file__, "--reader-job", inp], log)[1])
        print(f"  reader alone (noop sink, best of 2): ours {r['ours']:.1f} s, "
              f"spark.read.schema(...).json {r['native']:.1f} s => native/ours rate {r['native'] / r['ours']:.2f}"
              f"   (load {machine_load()})")
        print(f"  reader alone, CPU seconds (JVM + Python workers): ours {r['ours_cpu']:.1f}, "
              f"native {r['native_cpu']:.1f} => rate {r['native_cpu'] / r['ours_cpu']:.2f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
