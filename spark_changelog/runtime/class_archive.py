"""The driver JVM's class archive: Spark's classes loaded from a file mapped
at start, not parsed and verified jar by jar in every process
(docs/runtime.md, "Fixed costs of every process").

A local run's JVM loads some 20,000 classes of Spark and its libraries
before its first micro-batch ends.  Java's class data sharing (CDS) keeps
them, parsed and verified, in an archive that a later JVM maps: the JVM runs
a training job once with ``-XX:ArchiveClassesAtExit`` (a dynamic archive,
Java 13+), and every later local session starts with
``-XX:SharedArchiveFile`` (:func:`java_option`).  ``scripts/setup`` builds it
(``python -m spark_changelog.class_archive_build``, which runs that training
job through the SQL front end, so it lives above the runtime), about half a
minute.

Java's class data sharing leaves out the classes of a signed jar, and
loading them checks every class's digest against the jar's signature.
PySpark's Janino and commons-compiler jars are signed (a ``DUMMY``
signature): their 433 classes, Spark's code generator, were read, digested
and verified in every process's first micro-batch, on the query's own
thread.  So the build also writes unsigned copies of PySpark's signed jars
(the same entries without the signature files and the manifest's
per-entry digests) beside the archive, and a local session puts them
first on the driver's class path (:func:`driver_class_path`): the classes
are the same bytes, now archived.

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
import subprocess
import sys
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


def unsigned_jars_dir() -> str:
    """Where this environment keeps its unsigned copies of PySpark's signed
    jars (one directory per PySpark version)."""
    import pyspark
    return os.path.join(sys.prefix, "share", "spark-changelog", f"unsigned-jars-pyspark{pyspark.__version__}")


def driver_class_path() -> str:
    """The unsigned copies, for the front of the driver's class path
    (``spark.driver.extraClassPath``), when the archive's build wrote them,
    else nothing.  The archive was built with them on its class path, and
    the JVM refuses an archive whose class path is not the one it runs
    with."""
    where = unsigned_jars_dir()
    jars = sorted(glob.glob(os.path.join(where, "*.jar")))
    return os.pathsep.join(jars)


def java_option() -> str:
    """``-XX:SharedArchiveFile=...`` when this environment's archive exists,
    else nothing.  Looked up by name pattern (no ``java -version`` run at
    every session start): the JVM itself refuses an archive of another
    build."""
    import pyspark
    found = sorted(glob.glob(os.path.join(sys.prefix, "share", "spark-changelog",
                                          f"spark-classes-java*-pyspark{pyspark.__version__}.jsa")))
    return f"-XX:SharedArchiveFile={found[-1]}" if len(found) == 1 else ""
