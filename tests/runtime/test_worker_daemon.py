"""The Python worker daemon drops PySpark's bundled zip and jar from the
import path when the same PySpark is installed as a package."""
import os

from spark_changelog.runtime.worker_daemon import without_bundled_copies


def test_bundled_copies_inside_the_installed_package_are_dropped(tmp_path):
    site = tmp_path / "site-packages"
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    zip_, py4j = str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")
    jar = str(site / "pyspark" / "jars" / "spark-core.jar")
    other = str(tmp_path / "user-deps.zip")
    path = [str(tmp_path), zip_, py4j, jar, other, str(site)]
    assert without_bundled_copies(path) == [str(tmp_path), other, str(site)]


def test_a_spark_home_without_an_installed_pyspark_is_left_alone(tmp_path):
    zip_ = str(tmp_path / "spark" / "python" / "lib" / "pyspark.zip")
    path = [zip_, str(tmp_path / "site-packages")]
    assert without_bundled_copies(path) == path


def test_workers_import_pyspark_from_the_package(spark):
    """What the daemon gives every worker: PySpark from the installed
    package (compiled bytecode cached), not from the zip."""
    files = spark.sparkContext.parallelize([0, 1], 2).map(
        lambda _: (__import__("pyspark").__file__,
                   any(p.endswith("pyspark.zip") for p in __import__("sys").path))).collect()
    import pyspark
    assert files == [(pyspark.__file__, False)] * 2
    assert not os.path.dirname(pyspark.__file__).endswith(".zip")


def test_workers_start_with_the_shared_modules_imported(spark):
    """The daemon imports numpy, pyarrow, pandas and the package's worker
    modules once, before it forks (``worker_daemon.preload``): a plain RDD
    task, which imports none of them itself, finds them loaded; the
    single-threaded OpenBLAS setting does not leak into the workers'
    environment."""
    def probe(_):
        import os
        import sys
        return (all(m in sys.modules for m in ("pyarrow", "pandas", "spark_changelog.runtime.spark_keyed")),
                os.environ.get("OPENBLAS_NUM_THREADS"))
    seen = spark.sparkContext.parallelize([0, 1], 2).map(probe).collect()
    assert seen == [(True, os.environ.get("OPENBLAS_NUM_THREADS"))] * 2


def test_preload_leaves_failing_modules_to_the_worker(monkeypatch):
    from spark_changelog.runtime.worker_daemon import preload
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    preload(("json", "no_such_module_of_spark_changelog"))
    assert "OPENBLAS_NUM_THREADS" not in os.environ


def test_the_launcher_runs_a_module_with_pyspark_from_the_package(tmp_path):
    """What Spark runs without the daemon (the stateful operators' driver
    process, ``-m pyspark.sql.streaming.transform_with_state_driver_worker``)
    through ``PYSPARK_PYTHON``: the module runs as ``__main__`` with its
    arguments and the working directory first on the path, PySpark imported
    from the package even with the zip first on ``PYTHONPATH`` as Spark puts
    it; any other command line goes to the interpreter unchanged."""
    import subprocess
    import sys

    import pyspark
    from spark_changelog.runtime.worker_launcher import launcher

    exe = launcher(directory=str(tmp_path / "bin"))
    assert launcher(directory=str(tmp_path / "bin")) == exe and os.access(exe, os.X_OK)
    (tmp_path / "probe_module.py").write_text(
        "import sys, pyspark\nprint(__name__, pyspark.__file__, sys.argv[1:], "
        "any(p.endswith('pyspark.zip') for p in sys.path))\n")
    zip_ = os.path.join(os.path.dirname(pyspark.__file__), "python", "lib", "pyspark.zip")
    env = dict(os.environ, PYTHONPATH=zip_)
    out = subprocess.run([exe, "-m", "probe_module", "a", "b"], cwd=tmp_path, env=env, text=True,
                         capture_output=True, check=True).stdout.split()
    assert out == ["__main__", pyspark.__file__, "['a',", "'b']", "False"]
    out = subprocess.run([exe, "-c", "import sys; print(sys.executable)"], env=env, text=True,
                         capture_output=True, check=True).stdout.strip()
    assert out == sys.executable
