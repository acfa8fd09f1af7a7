"""The job process of the kill-and-restart tests (tests/kill_restart.py):
several pipelines of tests/crash_pipelines.py at once, each in its own
thread of one Spark session, so that a test run starts one JVM for all its
crashes.

argv: a JSON list of ``[name, pipeline, args, hang_after]``.  Prints
``committed NAME k`` after batch k of NAME reached its sinks; with
``hang_after == k`` NAME then hangs inside the batch (before Spark records
it as done), so the test can kill the process there and the restart must
replay batch k.  A run that ends prints ``finished NAME batches=B
replayed=R``, one that fails ``failed NAME: <its message as JSON>``.
"""
import json
import sys
import threading
import time
import traceback

from crash_pipelines import PIPELINES, retrying
from spark_changelog.runtime.session import build_session


def run(spark, name: str, pipeline: str, args: list, hang_after,
        before: threading.Event, started: threading.Event) -> None:
    """One pipeline; it starts once the one before it has finished a
    micro-batch (or ended): Spark starts a Python process for a stateful
    query's first batch, and many at once on a loaded machine miss Spark's
    10 s for it to connect back."""
    before.wait()

    def progress(report):
        started.set()
        done = report.batches - 1
        print(f"committed {name} {done}", flush=True)
        if done == hang_after:
            time.sleep(3600)
    try:
        report = retrying(lambda: PIPELINES[pipeline](spark, args, progress))
        print(f"finished {name} batches={report.batches} replayed={report.replayed_batches}", flush=True)
    except Exception as e:                                  # noqa: BLE001 (reported to the test)
        print(f"failed {name}: " + json.dumps("".join(traceback.format_exception_only(e))), flush=True)
    finally:
        started.set()


def main() -> None:
    runs = json.loads(sys.argv[1])
    spark = build_session("crash-test-job", configs={"spark.sql.shuffle.partitions": "2"})
    events = [threading.Event() for _ in range(len(runs) + 1)]
    events[0].set()
    threads = [threading.Thread(target=run, args=(spark, *r, events[i], events[i + 1]))
               for i, r in enumerate(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
