"""The driver JVM's class archive: Spark's classes loaded from a file mapped
at start, not parsed and verified jar by jar in every process
(docs/runtime.md, "Fixed costs of every process").

A local run's JVM loads some 20,000 classes of Spark and its libraries
before its first micro-batch ends.  Java's class data sharing (CDS) keeps
them, parsed and verified, in an archive that a later JVM maps: the JVM runs
a training job once with ``-XX:ArchiveClassesAtExit`` (a dynamic archive,
Java 13+), and every later local session starts with
``-XX:SharedArchiveFile`` (:func:`java_option`).  ``scripts/setup`` builds it
(``python -m spark_changelog.runtime.class_archive``), about half a minute.

The archive holds nothing of ours and no data: only class metadata of the
JDK and the jars on the JVM's class path.  The JVM checks it against its own
build and class path and ignores it (a warning in the Spark log, the run
goes on as without it) when they differ, so a stale or foreign archive can
cost speed, never a result.  Its file name carries the Java and PySpark
versions, so an upgrade of either builds a new one.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Optional


def _java_version() -> Optional[str]:
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else "java"
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60).stderr
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():    # openjdk version "17.0.13" 2024-10-15
        if "version" in line and '"' in line:
            return line.split('"')[1]
    return None


def archive_path(java_version: Optional[str] = None) -> Optional[str]:
    """Where this interpreter's archive lives (beside its packages: one per
    virtual environment), or None when Java cannot be asked its version."""
    import pyspark
    java_version = java_version or _java_version()
    if java_version is None:
        return None
    name = f"spark-classes-java{java_version}-pyspark{pyspark.__version__}.jsa"
    return os.path.join(sys.prefix, "share", "spark-changelog", name)


def java_option() -> str:
    """``-XX:SharedArchiveFile=...`` when this environment's archive exists,
    else nothing.  Looked up by name pattern (no ``java -version`` run at
    every session start): the JVM itself refuses an archive of another
    build."""
    import pyspark
    found = sorted(glob.glob(os.path.join(sys.prefix, "share", "spark-changelog",
                                          f"spark-classes-java*-pyspark{pyspark.__version__}.jsa")))
    return f"-XX:SharedArchiveFile={found[-1]}" if len(found) == 1 else ""


def _training_files(directory: str) -> str:
    """A few Debezium change files: creates, updates, a key change, deletes."""
    os.makedirs(directory)
    lines = []
    for i in range(200):
        k, src = i % 50, f'"source":{{"lsn":{1000 + i},"ts_ms":{1700000000000 + i}}}'
        before = f'{{"id":{k},"g":{k % 7},"v":{i - 50}}}' if i >= 50 else "null"
        op = "c" if i < 50 else "d" if i % 23 == 0 else "u"
        after = "null" if op == "d" else f'{{"id":{k},"g":{(k + i) % 7},"v":{i}}}'
        lines.append(f'{{"before":{before},"after":{after},"op":"{op}",{src},"ts_ms":{1700000000000 + i}}}')
    for f in range(2):
        with open(os.path.join(directory, f"part-{f}.json"), "w") as fh:
            fh.write("\n".join(lines[f::2]) + "\n")
    return directory


_TRAINING_SQL = """
SET 'table.exec.sink.upsert-materialize' = 'force';
CREATE TEMPORARY TABLE s (id BIGINT, g BIGINT, v BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'filesystem', 'path' = '{files}', 'format' = 'debezium-json');
CREATE TEMPORARY TABLE s2 (id BIGINT, g BIGINT, v BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'filesystem', 'path' = '{files}', 'format' = 'debezium-json');
CREATE TEMPORARY TABLE t (id BIGINT, g BIGINT, v BIGINT, g2 BIGINT, PRIMARY KEY (g, id) NOT ENFORCED)
  WITH ('connector' = 'blackhole');
CREATE TEMPORARY TABLE a (g BIGINT, c BIGINT, sv BIGINT, PRIMARY KEY (g) NOT ENFORCED)
  WITH ('connector' = 'blackhole');
INSERT INTO t SELECT s.id, s.g, s.v, s2.g AS g2 FROM s JOIN s2 ON s.id = s2.id;
INSERT INTO a SELECT g, COUNT(*) AS c, SUM(v) AS sv FROM s GROUP BY g;
"""


def _train(out: str) -> None:
    """In a child process: the training jobs (streaming and batch: readers,
    keyed operators, sinks), then the JVM's normal exit, which writes ``out``."""
    from .session import LOCAL_JAVA_OPTIONS, build_session
    from ..sql.runner import run_script
    from ..sql.script import read_script
    work = tempfile.mkdtemp(prefix="spark-changelog-cds-")
    try:
        files = _training_files(os.path.join(work, "files"))
        script = os.path.join(work, "job.sql")
        with open(script, "w") as fh:
            fh.write(_TRAINING_SQL.format(files=files))
        spark = build_session("spark-changelog-class-archive", master="local[2]", configs={
            "spark.driver.extraJavaOptions": f"{LOCAL_JAVA_OPTIONS} -XX:ArchiveClassesAtExit={out}"})
        for batch in (False, True):
            run_script(spark, read_script(script), batch=batch,
                       checkpoint=None if batch else os.path.join(work, "ck"),
                       dead_letter=os.path.join(work, f"dl-{batch}"), show_progress=False)
        proc, jvm = spark.sparkContext._gateway.proc, spark.sparkContext._jvm
        spark.stop()
        try:
            jvm.java.lang.System.exit(0)    # the archive is written by a normal exit only
        except Exception:   # noqa: BLE001 - the gateway closes under the call
            pass
        proc.wait(timeout=600)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build(force: bool = False) -> Optional[str]:
    """Build this environment's archive unless it exists -> its path (None:
    no Java).  Written under a temporary name and renamed when the training
    JVM has exited normally, so a killed build leaves no archive."""
    path = archive_path()
    if path is None or (os.path.exists(path) and not force):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    for old in glob.glob(os.path.join(os.path.dirname(path), "spark-classes-*.jsa")):
        os.remove(old)      # another Java's or PySpark's: the JVM would refuse it
    tmp = f"{path}.{os.getpid()}.tmp"
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "spark_changelog.runtime.class_archive", "--train", tmp],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if proc.returncode or not os.path.exists(tmp):
        if os.path.exists(tmp):
            os.remove(tmp)
        raise RuntimeError(f"the class archive was not built (exit {proc.returncode}); the Spark log "
                           f"has the training run's output")
    os.replace(tmp, path)
    print(f"class archive for the driver JVM: {path} ({os.path.getsize(path) / 2**20:.0f} MiB, "
          f"{time.time() - started:.0f} s)")
    return path


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--train":
        _train(sys.argv[2])
    else:
        build(force="--force" in sys.argv)
