"""The job of tests/runtime/test_kill_window.py: every query of a group
(tests/kill_window.py: ``debezium`` or ``event_time``, each kind in SQL and
in the Python API) at once, each in its own thread of one Spark session.

argv: GROUP INPUT OUTPUT CHECKPOINT [REF_OUTPUT REF_CHECKPOINT]
Reads INPUT/s1, INPUT/s2 and INPUT/ev; each query writes under
OUTPUT/<front>-<kind> and keeps its checkpoint under CHECKPOINT/<front>-<kind>.
With ``KILL_WINDOW_LOG`` set, it kills itself with every query in a replay
window (``kill_window.WindowKiller``).  With REF_OUTPUT, the same queries
then run again, uninterrupted, from REF_CHECKPOINT into REF_OUTPUT: the
reference, in the same process.  Prints ``[reference ]finished NAME
batches=B replayed=R`` per query, ``failed NAME: ...`` for one that failed.
"""
import os
import sys
import threading
import traceback

import kill_window as kw
from crash_pipelines import retrying
from spark_changelog.runtime.session import build_session


def run_all(spark, group: str, inputs: str, out: str, ck: str, label: str, killer=None) -> None:
    """Each query in its own thread; each starts once the one before has
    finished a micro-batch (or ended): Spark starts a Python process for a
    stateful query's first batch, and many at once on a loaded machine miss
    Spark's 10 s for it to connect back."""
    def run(q, before: threading.Event, started: threading.Event):
        before.wait()
        stop = killer.on_batch(q.name) if killer else None

        def on_batch(report):
            started.set()
            if stop:
                stop(report)
        try:
            r = retrying(lambda: q.run(spark, inputs, out, ck, on_batch))
            print(f"{label}finished {q.name} batches={r.batches} replayed={r.replayed_batches}", flush=True)
        except Exception:                                   # noqa: BLE001 (printed for the test)
            print(f"{label}failed {q.name}: {traceback.format_exc()}", flush=True)
        finally:
            started.set()
            if killer:
                killer.end(q.name)
    events = [threading.Event()]
    events[0].set()
    threads = []
    queries = kw.queries(group)
    if killer:
        queries = killer.order(queries)
    for q in queries:
        events.append(threading.Event())
        threads.append(threading.Thread(target=run, args=(q, events[-2], events[-1])))
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main() -> None:
    group, inputs, out, ck, *ref = sys.argv[1:]
    killer = None
    if os.environ.get("KILL_WINDOW_LOG"):
        killer = kw.WindowKiller(os.environ["KILL_WINDOW_LOG"], ck, [q.name for q in kw.queries(group)])
        killer.start()
    spark = build_session("kill-window-job", configs={"spark.sql.shuffle.partitions": "2"})
    run_all(spark, group, inputs, out, ck, "", killer)
    if ref:
        run_all(spark, group, inputs, *ref, "reference ")


if __name__ == "__main__":
    main()
