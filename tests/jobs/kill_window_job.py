"""A streaming job of one pipeline kind, in SQL or the Python API, run as its
own process by tests/runtime/test_kill_window.py.

argv: FRONT(sql|api) KIND BASE CHECKPOINT
Reads BASE/s1 and BASE/s2, writes the table BASE/out, dead letters to
BASE/dead and the emitted changelog to BASE/log.  With
``KILL_WINDOW_LOG`` set, it kills itself in the next replay window
(tests/kill_window.py).
"""
import os
import sys

import kill_window as kw
from spark_changelog.runtime.session import build_session


def main() -> None:
    front, kind, base, ck = sys.argv[1:5]
    if os.environ.get("KILL_WINDOW_LOG"):
        kw.start_window_killer(ck, os.environ["KILL_WINDOW_LOG"])
    spark = build_session("kill-window-job", configs={"spark.sql.shuffle.partitions": "2"})
    if front == "sql":
        from spark_changelog.sql.runner import run_script
        from spark_changelog.sql.script import parse_script
        runs = run_script(spark, parse_script(kw.sql_script(kind, base), f"{kind}.sql"), batch=False,
                          checkpoint=ck, dead_letter=f"{base}/dead", changelog=f"{base}/log",
                          key_groups=kw.KEY_GROUPS, show_progress=False)
        reports = [r.report for r in runs]
    else:
        stream, options = kw.api_pipeline(spark, kind, base)
        reports = [stream.write_upsert(f"{base}/out", checkpoint=ck, changelog_path=f"{base}/log",
                                       dead_letter=f"{base}/dead", key_groups=kw.KEY_GROUPS,
                                       **options)]
    for r in reports:
        print(f"finished batches={r.batches} replayed={r.replayed_batches}", flush=True)


if __name__ == "__main__":
    main()
