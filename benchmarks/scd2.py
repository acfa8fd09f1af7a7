"""Benchmark: SCD type 2 history of 1M Debezium changes over 100k keys, whole job into Delta.

    scripts/bench scd2 [--events 1000000] [--ids 100000] [--files 4] [--repeat N]
                       [--no-spark-auto-cdc]

On the whole-job benchmark's generated Debezium files (benchmarks/whole_job.py;
about 17% creates, 74% updates, 8% deletes), each run as its own process, so
JVM start and imports count, in the same run:

* ours, SCD type 2: ``spark-changelog normalize FILES OUT --format debezium-json
  --key id --scd-type 2`` (batch, into a Delta history table keyed by
  ``id, __START_AT``);
* ours, SCD type 1: the same command without ``--scd-type`` (the table);
* Spark's own Auto CDC: a Spark Declarative Pipelines project whose flow is
  ``create_auto_cdc_flow(..., stored_as_scd_type=2)`` over the same files,
  run with ``spark-pipelines run``; when it cannot run here, the reason it
  gave is recorded instead of a time.

Checks that the history's current versions (``__END_AT`` null and not
deleted) are the SCD type 1 table row for row.  The machine load (1-minute
load average) is recorded beside every number; results go to
``benchmarks/results/scd2-<UTC time>.json``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from whole_job import (ROOT, SCHEMA_DDL, cached_files, input_arguments, machine_load,  # noqa: E402
                       run_process)

RESULTS = os.path.join(ROOT, "benchmarks", "results")

PIPELINE = '''from pyspark import pipelines as dp
from pyspark.sql import SparkSession, functions as F

spark = SparkSession.active()
ENVELOPE = ("before STRUCT<id: BIGINT, g: BIGINT, v: BIGINT>, "
            "after STRUCT<id: BIGINT, g: BIGINT, v: BIGINT>, op STRING, source STRUCT<lsn: BIGINT>")


@dp.temporary_view
def changes():
    df = spark.readStream.schema(ENVELOPE).json({inp!r})
    return df.select(F.coalesce("after.id", "before.id").alias("id"), "after.g", "after.v", "op",
                     F.col("source.lsn").alias("lsn"))


dp.create_streaming_table("history")
dp.create_auto_cdc_flow(target="history", source="changes", keys=["id"], sequence_by="lsn",
                        apply_as_deletes="op = 'd'", except_column_list=["op"],
                        stored_as_scd_type=2)
'''


def spark_auto_cdc(inp: str, work: str, log: str) -> dict:
    """Spark's create_auto_cdc_flow over ``inp`` with ``spark-pipelines run``:
    ``{"seconds": ...}`` or ``{"error": the reason it gave}``."""
    project = os.path.join(work, "sdp")
    os.makedirs(os.path.join(project, "transformations"))
    with open(os.path.join(project, "spark-pipeline.yml"), "w") as fh:
        fh.write(f"name: scd2_bench\nstorage: file://{project}/storage\n"
                 "libraries:\n  - glob:\n      include: transformations/**\n")
    with open(os.path.join(project, "transformations", "cdc.py"), "w") as fh:
        fh.write(PIPELINE.format(inp=inp))
    import pyspark
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, SPARK_HOME=os.path.dirname(pyspark.__file__),
               PYSPARK_PYTHON=sys.executable, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    t = time.perf_counter()
    proc = subprocess.run([os.path.join(bindir, "spark-pipelines"), "run"], cwd=project, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    secs = time.perf_counter() - t
    with open(log, "a") as fh:
        fh.write(proc.stdout)
    if proc.returncode == 0:
        return {"seconds": secs}
    lines = [ln for ln in proc.stdout.splitlines()
             if "Exception" in ln or "Error" in ln or "SQLSTATE" in ln]
    return {"error": (lines[-1] if lines else proc.stdout.strip().splitlines()[-1])[:600],
            "seconds_until_failure": secs}


def current_versions_equal_table(history: str, table: str) -> bool:
    from spark_changelog.sinks.delta import read_arrow_table
    h = read_arrow_table(history).to_pandas()
    current = h[h["__END_AT"].isna()][["id", "g", "v"]].sort_values("id").reset_index(drop=True)
    t = read_arrow_table(table).to_pandas()[["id", "g", "v"]].sort_values("id").reset_index(drop=True)
    return current.equals(t)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    input_arguments(ap)
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of each of ours, alternating which goes first (best of them)")
    ap.add_argument("--no-spark-auto-cdc", action="store_true",
                    help="skip Spark's create_auto_cdc_flow (Spark Declarative Pipelines)")
    args = ap.parse_args(argv)
    inp = cached_files(args.cache, args.events, args.ids, args.files)
    work = tempfile.mkdtemp(prefix="scd2-bench-")
    log = os.path.join(work, "jobs.log")
    py = sys.executable
    print(f"{args.events:,} Debezium changes over {args.ids:,} keys in {args.files} files; "
          f"load average {machine_load()} at start; logs: {log}")
    result = {"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "events": args.events, "ids": args.ids, "files": args.files, "runs": {}}
    base = [py, "-m", "spark_changelog.cli", "normalize", inp, "", "--format", "debezium-json",
            "--key", "id", "--schema", SCHEMA_DDL, "--dead-letter", os.path.join(work, "dl")]

    def ours(name: str, out: str, extra: list) -> None:
        cmd = list(base)
        cmd[5] = os.path.join(work, out)
        shutil.rmtree(cmd[5], ignore_errors=True)
        load = machine_load()
        secs, stdout = run_process(cmd + extra, log)
        run = result["runs"].setdefault(name, {"seconds": [], "load_before": [],
                                               "load_after": []})
        run["seconds"].append(round(secs, 2))
        run["load_before"].append(load)
        run["load_after"].append(machine_load())
        run["summary"] = stdout.strip()
        print(f"  {name + ' (whole process):':44s} {secs:6.1f} s   "
              f"(load {load} -> {machine_load()})")

    scd2_name, scd1_name = "ours SCD2 (normalize --scd-type 2)", "ours SCD1 (normalize)"
    for i in range(args.repeat):
        # alternate which goes first: a shared machine's load drifts
        pair = [(scd2_name, "history", ["--scd-type", "2"]), (scd1_name, "table", [])]
        for job in (pair if i % 2 == 0 else pair[::-1]):
            ours(*job)
    scd2 = min(result["runs"][scd2_name]["seconds"])
    scd1 = min(result["runs"][scd1_name]["seconds"])
    result["scd2_over_scd1"] = round(scd2 / scd1, 2)
    print(f"  => SCD2 / SCD1 (best of {args.repeat} each): {scd2 / scd1:.2f}x")
    from spark_changelog.sinks.delta import read_arrow_table
    result["history_rows"] = len(read_arrow_table(os.path.join(work, "history")).to_pandas())
    result["current_versions_equal_scd1_table"] = current_versions_equal_table(
        os.path.join(work, "history"), os.path.join(work, "table"))
    print(f"  history rows: {result['history_rows']:,}; current versions equal the SCD1 table: "
          f"{result['current_versions_equal_scd1_table']}")
    if not args.no_spark_auto_cdc:
        load = machine_load()
        ref = spark_auto_cdc(inp, work, log)
        ref.update(load_before=load, load_after=machine_load())
        result["runs"]["Spark create_auto_cdc_flow (spark-pipelines run)"] = ref
        if "error" in ref:
            print(f"  Spark's create_auto_cdc_flow could not run: {ref['error']}")
        else:
            print(f"  Spark's create_auto_cdc_flow (whole process): {ref['seconds']:6.1f} s "
                  f"=> ours / Spark: {scd2 / ref['seconds']:.2f}x")
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"scd2-{result['when'][:19].replace(':', '')}.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=2)
    print(f"  results: {path}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
