"""The process of tests/runtime/test_session_start.py: a ``SessionStart``
in a fresh interpreter (the test process has its session already).

argv: ``take MARKER`` builds the session (a command's) and prints, as JSON, the settings
it was asked for and those its context got, and the JVMs among this
process's descendants; ``cancel MARKER`` waits until the JVM's process runs,
cancels and prints whether any process of the start is left.  ``MARKER`` is
a setting's value that names this test's processes (their command lines).
"""
import json
import os
import sys
import time

from spark_changelog.runtime.session import SessionStart, _children, _classic_options


def descendants_named(marker: str) -> list:
    """This process's descendants whose command line holds ``marker``."""
    found = []
    for pid in _children(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def processes_named(marker: str) -> list:
    """Every process on the machine whose command line holds ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if marker.encode() in fh.read() and int(pid) != os.getpid():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def main(action: str, marker: str) -> None:
    configs = {"spark.sessionstart.marker": marker}
    starting = SessionStart("session-start-test", configs=configs, command=True)
    if action == "take":
        spark = starting.session()
        from pyspark import SparkContext
        asked = _classic_options("session-start-test", None, configs, command=True)
        got = dict(spark.sparkContext.getConf().getAll())
        jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
        print(json.dumps({"asked": asked, "got": got, "jvm_pid": jvm_pid,
                          "gateway_pid": SparkContext._gateway.proc.pid,
                          "jvms": descendants_named(marker),
                          "count": spark.range(5).count()}), flush=True)
        return
    deadline = time.time() + 120
    while not descendants_named(marker) and time.time() < deadline:
        time.sleep(0.01)
    running = descendants_named(marker)
    starting.cancel()
    print(json.dumps({"running_before": running, "left": processes_named(marker)}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
