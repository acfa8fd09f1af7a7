"""Spark's driver-side Python processes and its fixed 10 s wait for them to
connect back (runtime/worker_launcher.py, runtime/session.py ``QueryStarts``;
docs/deploy.md, "Spark Connect"), with real time-outs: the Python that Spark
starts is delayed on purpose."""
from __future__ import annotations

import os
import sys

import cluster as cl
from long_variants import long_only
from spark_changelog.demo import generate_debezium

PRE_INIT = "pyspark.sql.streaming.transform_with_state_driver_worker"
WRAPPER = os.path.join(os.path.dirname(sys.executable), "spark-changelog-python")


@long_only("two deliberate waits past Spark's 10 s, about a minute")
def test_a_slow_start_is_started_again_and_slow_imports_wait_after_connecting_back(tmp_path):
    """transformWithState's pre-init process, started on the driver when a
    query starts, is delayed twice over Spark's 10 s:

    * the first one 12 s before it can connect back (a script in front of
      the Python Spark starts): Spark fails the query's start, and the run
      starts it again from its checkpoint (``QueryStarts``);
    * every one 12 s in importing its module (an import hook): through
      ``spark-changelog-python`` the process has connected back before it
      imports, so Spark waits for its answer and the query runs.

    The table is exact."""
    delayed = tmp_path / "delayed"
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n"
                      f"case \"$*\" in *{PRE_INIT}*)\n"
                      f"  if mkdir {tmp_path}/slow-start 2>/dev/null; then sleep 12; fi;;\n"
                      "esac\n"
                      f"exec {WRAPPER} \"$@\"\n")
    python.chmod(0o755)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(
        "import sys, time\n"
        "class SlowImport:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name == {PRE_INIT!r}:\n"
        f"            open({str(delayed)!r}, 'a').write('x')\n"
        "            time.sleep(12)\n"
        "        return None\n"
        "sys.meta_path.insert(0, SlowImport())\n")
    expected = generate_debezium(str(tmp_path / "in"), 300, 40, files=1, bad_lines=0)
    log = tmp_path / "spark.log"
    r = cl.run_cli(cl.normalize_args(tmp_path / "in", tmp_path, changelog=False),
                   env={"PYSPARK_PYTHON": str(python), "PYTHONPATH": str(hooks),
                        "SPARK_CHANGELOG_LOG": str(log)})
    assert r.returncode == 0, r.stderr + r.stdout
    text = log.read_text(errors="replace")
    assert text.count("starting the query again from its checkpoint") == 1
    assert (tmp_path / "slow-start").is_dir()
    assert "x" in delayed.read_text()       # imported slowly after connecting back
    cl.assert_table(tmp_path / "table", expected)
