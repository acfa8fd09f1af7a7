"""The session's JVM: a local run uses only the JIT's quick tier and compiles
Spark's large generated methods (runtime/session.py, docs/runtime.md "Fixed costs of every process")."""
from spark_changelog.runtime.session import LOCAL_JAVA_OPTIONS


def test_a_local_session_runs_the_quick_jit_tier(spark):
    jvm = spark.sparkContext._jvm
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert "-XX:TieredStopAtLevel=1" in args
    assert "-XX:-DontCompileHugeMethods" in args
    assert LOCAL_JAVA_OPTIONS in spark.sparkContext.getConf().get("spark.driver.extraJavaOptions")


def test_a_local_session_maps_the_class_archive_when_setup_built_one(spark):
    """scripts/setup builds the archive; a session started after it maps it
    (runtime/class_archive.py)."""
    from spark_changelog.runtime.class_archive import java_option
    jvm = spark.sparkContext._jvm
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    option = java_option()
    assert option == "" or option in args


def test_janinos_classes_come_from_the_unsigned_copy_when_setup_wrote_one(spark):
    """Spark's code generator (Janino, a signed jar) loaded from the copy
    first on the class path, whose classes the archive holds
    (runtime/class_archive.py)."""
    import os
    from spark_changelog.runtime.class_archive import driver_class_path
    copies = driver_class_path()
    jvm = spark.sparkContext._jvm
    where = jvm.java.lang.Class.forName("org.codehaus.janino.ClassBodyEvaluator") \
        .getProtectionDomain().getCodeSource().getLocation().getPath()
    if copies:
        assert spark.sparkContext.getConf().get("spark.driver.extraClassPath") == copies
        assert where in copies.split(os.pathsep)
    else:
        assert "/pyspark/jars/" in where


def test_the_unsigned_copies_hold_the_signed_jars_entries_without_the_signature(tmp_path, monkeypatch):
    import glob
    import os
    import sys
    import zipfile

    import pyspark

    from spark_changelog import class_archive_build
    from spark_changelog.runtime import class_archive
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert class_archive.driver_class_path() == ""
    written = class_archive_build.write_unsigned_jars()
    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    signed = [os.path.basename(j) for j in sorted(glob.glob(os.path.join(jars, "*.jar")))
              if class_archive_build._signed(j)]
    assert written == signed and "janino-3.1.9.jar" in written
    assert class_archive.driver_class_path().split(os.pathsep) == \
        [os.path.join(class_archive.unsigned_jars_dir(), j) for j in written]
    for name in written:
        with zipfile.ZipFile(os.path.join(jars, name)) as orig, \
                zipfile.ZipFile(os.path.join(class_archive.unsigned_jars_dir(), name)) as copy:
            kept = [n for n in orig.namelist() if not class_archive_build._SIGNATURE.fullmatch(n)]
            assert copy.namelist() == kept
            assert not class_archive_build._signed(os.path.join(class_archive.unsigned_jars_dir(), name))
            for n in kept:
                if n.endswith(".class"):
                    assert copy.read(n) == orig.read(n)
            manifest = copy.read("META-INF/MANIFEST.MF").decode()
            assert "Digest" not in manifest and manifest.startswith("Manifest-Version: 1.0")


def test_the_class_archive_option_names_this_environments_archive_only(tmp_path, monkeypatch):
    import sys

    import pyspark

    from spark_changelog.runtime import class_archive
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert class_archive.java_option() == ""
    where = tmp_path / "share" / "spark-changelog"
    where.mkdir(parents=True)
    (where / "spark-classes-java17.0.1-pyspark0.0.jsa").write_text("another PySpark's")
    assert class_archive.java_option() == ""
    ours = where / f"spark-classes-java17.0.1-pyspark{pyspark.__version__}.jsa"
    ours.write_text("x")
    assert class_archive.java_option() == f"-XX:SharedArchiveFile={ours}"
    assert class_archive.archive_path("17.0.1") == str(ours)


def test_a_session_of_the_python_api_keeps_mllibs_functions(spark):
    """``build_session`` (the Python API, a notebook that may also run
    MLlib) loads the extensions jars register, as Spark does: MLlib's
    ``vector_to_array`` calls the SQL function its extension registers.  A
    command's local session skips them (test_session_start.py)."""
    from pyspark.ml.functions import array_to_vector, vector_to_array
    from pyspark.sql import functions as F
    assert spark.conf.get("spark.sql.extensions.test.loadFromCp", None) is None
    df = spark.range(1).select(F.array(F.lit(1.0), F.lit(2.0)).alias("a"))
    assert df.select(vector_to_array(array_to_vector("a")).alias("b")).first().b == [1.0, 2.0]


def test_only_a_commands_local_session_skips_them_and_a_setting_brings_them_back(monkeypatch):
    """A command's session on a cluster, a session of the Python API, and a
    Spark Connect server started with LOCAL_CONFIGS (tests/cluster.py) keep
    Spark's default; ``configs=`` (the CLI's ``--conf``) wins over ours
    (runtime/session.py, COMMAND_LOCAL_CONFIGS)."""
    import os
    from spark_changelog.runtime.session import LOCAL_CONFIGS, _classic_options
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):     # which _classic_options sets
        if name in os.environ:
            monkeypatch.setenv(name, os.environ[name])
        else:       # restored as unset afterwards
            monkeypatch.setenv(name, "")
            monkeypatch.delenv(name)
    key = "spark.sql.extensions.test.loadFromCp"
    assert _classic_options("a", "local[2]", None, command=True)[key] == "false"
    assert _classic_options("a", "local[2]", {key: "true"}, command=True)[key] == "true"
    assert key not in _classic_options("a", "local[2]", None)
    assert key not in _classic_options("a", "spark://host:7077", None, command=True)
    assert key not in LOCAL_CONFIGS


def test_local_workers_start_from_our_daemon(spark):
    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == \
        "spark_changelog.runtime.worker_daemon"


def test_a_local_master_runs_one_task_per_core():
    from spark_changelog.runtime.session import local_cores
    import os
    assert [local_cores(m) for m in ("local", "local[2]", "local[3,2]", "local-cluster[2,1,1024]")] == \
        [1, 2, 3, None]
    assert local_cores("local[*]") == os.cpu_count()


def test_checkpoint_files_are_replaced_on_replay(spark):
    """Spark's default checkpoint manager (FileContext, renames with
    OVERWRITE), not the FileSystem one that keeps a killed attempt's state file
    (docs/runtime.md, "The checkpoint file manager replaces files")."""
    assert spark.conf.get("spark.sql.streaming.checkpointFileManagerClass", None) is None
    jvm = spark.sparkContext._jvm
    manager = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.create(
        jvm.org.apache.hadoop.fs.Path("file:///tmp"), spark.sparkContext._jsc.hadoopConfiguration())
    assert manager.getClass().getSimpleName() == "FileContextBasedCheckpointFileManager"


def test_a_master_and_a_connect_url_exclude_each_other(monkeypatch):
    import pytest
    from spark_changelog.model.errors import UsageError
    from spark_changelog.runtime.session import build_session
    with pytest.raises(UsageError, match=r"both a master \(local\[2\]\) and a Spark Connect URL"):
        build_session(master="local[2]", remote="sc://127.0.0.1:1")
    # SPARK_REMOTE is the default only when no master is given; a master wins over it
    monkeypatch.setenv("SPARK_REMOTE", "sc://127.0.0.1:1")
    monkeypatch.setenv("SPARK_CHANGELOG_MASTER", "local[2]")
    with pytest.raises(UsageError, match="both a master"):
        build_session(remote="sc://127.0.0.1:1")


def test_the_connect_session_sets_only_session_settings():
    from spark_changelog.runtime.session import CONNECT_SESSION_CONFIGS
    assert CONNECT_SESSION_CONFIGS["spark.sql.session.timeZone"] == "UTC"
    # a repeated JSON key reads as its last value on the VARIANT path there too (docs/sql.md, "Repeated keys")
    assert CONNECT_SESSION_CONFIGS["spark.sql.variant.allowDuplicateKeys"] == "true"
    assert all(k.startswith("spark.sql.") for k in CONNECT_SESSION_CONFIGS)
    assert "spark.sql.streaming.stateStore.providerClass" not in CONNECT_SESSION_CONFIGS


def test_spark_python_start_time_out_is_recognised_through_its_wrappers():
    from spark_changelog.runtime.session import QueryStarts, python_start_timed_out
    try:
        try:
            raise TimeoutError("Timed out while waiting for the Python worker to connect back")
        except TimeoutError as inner:
            raise RuntimeError("Python worker failed to connect back.") from inner
    except RuntimeError as err:
        try:
            raise ValueError("[STREAM_FAILED] Query terminated with exception") from err
        except ValueError as outer:
            wrapped = outer
    assert python_start_timed_out(wrapped)
    assert not python_start_timed_out(ValueError("Python worker exited unexpectedly (crashed)"))
    starts = QueryStarts(attempts=3)
    assert [starts.again(wrapped) for _ in range(3)] == [True, True, False]
    assert not QueryStarts().again(ValueError("an operator's own error"))

