"""Builds the driver JVM's class archive (``runtime/class_archive.py``
says what it is and how a session uses it): a training job through the SQL
front end, streaming and batch, in a JVM started with
``-XX:ArchiveClassesAtExit``.  An entry point, run by ``scripts/setup``:

    python -m spark_changelog.class_archive_build [--force]
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from typing import Optional

from .runtime.class_archive import archive_path, unsigned_jars_dir


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
    from .runtime.session import LOCAL_JAVA_OPTIONS, build_session
    from .sql.runner import run_script
    from .sql.script import read_script
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


def _signed(jar: str) -> bool:
    with zipfile.ZipFile(jar) as z:
        return any(_SIGNATURE.fullmatch(n) for n in z.namelist())


#: a jar's signature files (``META-INF/NAME.SF`` and its signature block)
_SIGNATURE = re.compile(r"META-INF/[^/]+\.(SF|DSA|RSA|EC)", re.IGNORECASE)


def write_unsigned_jars() -> list:
    """Unsigned copies of PySpark's signed jars in ``unsigned_jars_dir()``
    (runtime/class_archive.py says why): every entry but the signature files,
    and the manifest's main section without the per-entry digests that the
    signature covers.  The directory is replaced whole."""
    import pyspark
    where = unsigned_jars_dir()
    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    tmp = f"{where}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    written = []
    for jar in sorted(glob.glob(os.path.join(jars, "*.jar"))):
        if not _signed(jar):
            continue
        out = os.path.join(tmp, os.path.basename(jar))
        with zipfile.ZipFile(jar) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
            for info in zin.infolist():
                if _SIGNATURE.fullmatch(info.filename):
                    continue
                data = zin.read(info)
                if info.filename.upper() == "META-INF/MANIFEST.MF":
                    main = data.replace(b"\r\n", b"\n").split(b"\n\n", 1)[0].rstrip(b"\n")
                    data = main.replace(b"\n", b"\r\n") + b"\r\n\r\n"
                zout.writestr(info, data)
        written.append(os.path.basename(jar))
    shutil.rmtree(where, ignore_errors=True)
    os.replace(tmp, where)
    return written


def build(force: bool = False) -> Optional[str]:
    """Build this environment's archive unless it exists -> its path (None:
    no Java).  Written under a temporary name and renamed when the training
    JVM has exited normally, so a killed build leaves no archive."""
    path = archive_path()
    if path is None or (os.path.exists(path) and os.path.isdir(unsigned_jars_dir()) and not force):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    for old in glob.glob(os.path.join(os.path.dirname(path), "spark-classes-*.jsa")):
        os.remove(old)      # another Java's or PySpark's: the JVM would refuse it
    for old in glob.glob(os.path.join(os.path.dirname(path), "unsigned-jars-*")):
        shutil.rmtree(old, ignore_errors=True)
    # first: the training JVM runs with them on its class path, as every
    # local session then does (session.py), and archives their classes
    write_unsigned_jars()
    tmp = f"{path}.{os.getpid()}.tmp"
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "spark_changelog.class_archive_build", "--train", tmp],
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
