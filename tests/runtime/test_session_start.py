"""The session started while the command does its own work
(runtime/session.py ``SessionStart``; docs/runtime.md, "Before the query
starts"): the settings it gets, one JVM, and no JVM left by a command that
fails or is stopped before it took the session.  Each test runs a fresh
interpreter (tests/jobs/session_start_job.py, or the command): this test
process has its JVM already."""
import json
import os
import signal
import subprocess
import sys
import time
import uuid

JOB = os.path.join(os.path.dirname(os.path.dirname(__file__)), "jobs", "session_start_job.py")
sys.path.insert(0, os.path.dirname(JOB))
from session_start_job import processes_named  # noqa: E402


def _job(action: str, marker: str, tmp_path) -> dict:
    env = dict(os.environ, SPARK_CHANGELOG_LOG=str(tmp_path / "spark.log"))
    out = subprocess.run([sys.executable, JOB, action, marker], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_the_early_session_gets_the_settings_of_build_session_and_one_jvm(tmp_path):
    marker = uuid.uuid4().hex
    r = _job("take", marker, tmp_path)
    # Spark's context puts its own module options before a JVM's extra options
    java = {k for k in r["asked"] if k.endswith("extraJavaOptions")}
    assert java and all(r["got"][k].endswith(" " + r["asked"][k]) for k in java)
    assert {k: r["got"].get(k) for k in r["asked"] if k not in java} == \
        {k: v for k, v in r["asked"].items() if k not in java}
    assert r["got"]["spark.master"] == "local[2]"
    assert "-XX:TieredStopAtLevel=1" in r["got"]["spark.driver.extraJavaOptions"]
    # a command's local session skips the jars' session extensions, and runs a job
    assert r["got"]["spark.sql.extensions.test.loadFromCp"] == "false"
    # the JVM started early is the session's, and no second one was started
    assert r["jvms"] == [r["jvm_pid"]] and r["gateway_pid"] == r["jvm_pid"]
    assert r["count"] == 5
    # the JVM's own start-up lines went to the log file, not to the terminal
    assert "log4j" in (tmp_path / "spark.log").read_text()


def test_a_cancelled_start_ends_its_jvm(tmp_path):
    marker = uuid.uuid4().hex
    r = _job("cancel", marker, tmp_path)
    assert r["running_before"], "the JVM's process had not started"
    assert r["left"] == []


def _script(tmp_path, text: str) -> str:
    p = tmp_path / "job.sql"
    p.write_text(text)
    return str(p)


def test_a_bad_script_gives_its_error_and_leaves_no_jvm(tmp_path):
    marker = uuid.uuid4().hex
    p = _script(tmp_path, "CREATE TABLE t (id BIGINT) WITH ('connector' = 'blackhole');\n"
                          "INSERT INTO t SELEC 1;\n")
    exe = os.path.join(os.path.dirname(sys.executable), "spark-changelog")
    out = subprocess.run([exe, "--conf", f"spark.sessionstart.marker={marker}", "run", p,
                          "--checkpoint", str(tmp_path / "ck")],
                         env=dict(os.environ, SPARK_CHANGELOG_LOG=str(tmp_path / "spark.log")),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(f"error: {p}:2:"), out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert processes_named(marker) == []


def test_ctrl_c_while_the_session_starts_leaves_no_jvm(tmp_path):
    """SIGINT to ``spark-changelog run`` as soon as its JVM's process
    runs, long before the JVM is up and the command took the session."""
    marker = uuid.uuid4().hex
    exe = os.path.join(os.path.dirname(sys.executable), "spark-changelog")
    p = _script(tmp_path, "CREATE TABLE t (id BIGINT) WITH ('connector' = 'blackhole');\n"
                          "INSERT INTO t SELECT 1;\n")
    proc = subprocess.Popen([exe, "--conf", f"spark.sessionstart.marker={marker}", "run", p,
                             "--checkpoint", str(tmp_path / "ck")],
                            env=dict(os.environ, SPARK_CHANGELOG_LOG=str(tmp_path / "spark.log")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    # the command's own command line holds the marker too
    while not set(processes_named(marker)) - {proc.pid} and proc.poll() is None \
            and time.time() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert processes_named(marker) == []
    assert proc.returncode == 130, err
    assert err.startswith("interrupted: stopped by Ctrl-C"), err
    assert "Traceback" not in err
