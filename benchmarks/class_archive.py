"""The driver JVM's class archive, A/B (docs/runtime.md, "Fixed costs of every process").

    scripts/bench class-archive [--job materializer] [--repeats 3] [--events 1000000] [--against ARCHIVE]

The suite's streaming job (``vs_flink.JOBS``, into ``blackhole``) as a whole
process, alternately without the archive (``-Xshare:auto``: the JDK's own
archive only) and with this environment's archive (``scripts/setup`` builds
it: ``runtime/class_archive.py``, with the unsigned copies of PySpark's
signed jars first on the class path), each its own process: session start,
the first job, and the whole.  ``--against ARCHIVE``: instead of no
archive, another archive file, run with PySpark's jars as they are (no
copies first: an archive built before the copies).  Writes
``benchmarks/results/class-archive-<time>.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import vs_flink  # noqa: E402
from whole_job import machine_load  # noqa: E402


def child(job_name: str, work: str, option: str, events: int) -> None:
    t0 = time.time()
    job = vs_flink.JOBS[job_name](vs_flink.ensure_inputs(events, 100_000, 4,
                                                          os.path.join(tempfile.gettempdir(), "spark-changelog-bench")))
    with open(os.path.join(work, "job.sql"), "w") as fh:
        fh.write(vs_flink.ours_script(job, os.path.join(work, "out"), "blackhole"))
    from spark_changelog.runtime.session import LOCAL_JAVA_OPTIONS, build_session
    from spark_changelog.sql.runner import run_script
    from spark_changelog.sql.script import read_script
    configs = {"spark.driver.extraJavaOptions": f"{LOCAL_JAVA_OPTIONS} {option}"}
    if "CLASS_ARCHIVE_CLASS_PATH" in os.environ:     # the driver's class path without the copies
        configs["spark.driver.extraClassPath"] = os.environ["CLASS_ARCHIVE_CLASS_PATH"]
    spark = build_session("class-archive-ab", configs=configs)
    t1 = time.time()
    run_script(spark, read_script(os.path.join(work, "job.sql")), batch=False, checkpoint=os.path.join(work, "ck"),
               dead_letter=os.path.join(work, "dl"), show_progress=False)
    t2 = time.time()
    print("RESULT " + json.dumps({"session": t1 - t0, "first_job": t2 - t1, "whole": t2 - t0}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default="materializer", choices=sorted(vs_flink.JOBS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--against", help="another archive (built without the unsigned copies), run with "
                                      "PySpark's jars as they are, instead of none")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], args.child[1], os.environ["CLASS_ARCHIVE_OPTION"], args.events)
    from spark_changelog.runtime.class_archive import java_option
    archive = java_option()
    if not archive:
        raise SystemExit("no class archive in this environment: run scripts/setup (or "
                         "python -m spark_changelog.class_archive_build)")
    vs_flink.ensure_inputs(args.events, 100_000, 4, os.path.join(tempfile.gettempdir(), "spark-changelog-bench"))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    other = {"CLASS_ARCHIVE_CLASS_PATH": ""} if args.against else {}
    runs = {"without": [], "with": []}
    for i in range(args.repeats):
        for tag, option in (("without", f"-XX:SharedArchiveFile={args.against}" if args.against else "-Xshare:auto"),
                            ("with", archive)):
            with tempfile.TemporaryDirectory(prefix="class-archive-") as work:
                load0 = machine_load()
                out = subprocess.run([sys.executable, __file__, "--events", str(args.events), "--child", args.job,
                                      work], env=dict(env, CLASS_ARCHIVE_OPTION=option, **(other if tag == "without" else {})), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, check=True).stdout
            r = json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1][7:])
            r["load"] = f"{load0}-{machine_load()}"
            runs[tag].append(r)
            print(f"{tag:<8} archive: session {r['session']:5.1f} s, first job {r['first_job']:5.1f} s, "
                  f"whole {r['whole']:5.1f} s | load {r['load']}", flush=True)
    med = {t: {k: round(statistics.median(r[k] for r in rs), 2) for k in ("session", "first_job", "whole")}
           for t, rs in runs.items()}
    print(f"median whole: {med['without']['whole']:.1f} s without, {med['with']['whole']:.1f} s with the archive "
          f"({med['with']['whole'] / med['without']['whole']:.2f}x)")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = os.path.join(HERE, "results", f"class-archive-{stamp}.json")
    with open(path, "w") as fh:
        json.dump({"time_utc": stamp, "job": args.job, "events": args.events, "archive": archive,
                   "without": args.against or "no archive",
                   "runs": runs, "median": med}, fh, indent=1)
    print(f"written: {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    main()
