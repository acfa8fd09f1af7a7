"""Pipelines on a real standalone cluster started on this machine
(tests/cluster.py): a master and two workers, each a JVM with its own
executor and Python workers, the package shipped as a zip on
``spark.submit.pyFiles`` to executors whose Python does not have it, the
checkpoint and tables on a path every process sees (docs/deploy.md).

The default run has one case: the streaming normalize over four
micro-batches.  ``SPARK_CHANGELOG_LONG_TESTS=1`` adds the batch normalize,
the SQL join (two normalizes, the join and the sink upsert materializer) in
streaming and batch, a worker SIGKILLed in the middle of a micro-batch, and
the driver SIGKILLed in the middle of one and restarted from the checkpoint.
"""
from __future__ import annotations

import os
import time

import pandas as pd
import pytest

import cluster as cl
import long_variants
import kill_window as kw
from cluster import FILES, assert_summary, assert_table, cdc, normalize_args  # noqa: F401 (cdc: a fixture)
from spark_changelog.connectors.dead_letter import read_dead_letter
from spark_changelog.sinks.delta import read_table

long_only = long_variants.long_only("a cluster job of minutes")


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    cluster = cl.StandaloneCluster(str(tmp_path_factory.mktemp("standalone")))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def changelog_rows(path) -> pd.DataFrame:
    """The emitted changelog (its committed batches: on the cluster, part files
    the executors wrote), as sorted rows with their batch id."""
    from spark_changelog.sinks.changelog import read_changelog
    rows = read_changelog(path)
    assert len(rows), path
    return rows.sort_values(list(rows.columns)).reset_index(drop=True)


def executors_ran_tasks(cluster) -> list[int]:
    return [i for i, text in cluster.executor_logs().items() if "Finished task" in text]


@long_only
def test_streaming_normalize_on_two_workers(standalone, cdc, tmp_path):
    src, expected = cdc
    r = cl.run_cli(standalone.cli_args() + normalize_args(src, tmp_path))
    assert r.returncode == 0, r.stderr + r.stdout
    assert_table(tmp_path / "table", expected)
    assert_summary(r.stdout, FILES)
    assert len(read_dead_letter(str(tmp_path / "dead"))) == 3
    # both workers' executors ran tasks, importing the package from the shipped zip
    assert executors_ran_tasks(standalone) == [0, 1]
    assert any("spark_changelog.zip" in text for text in standalone.executor_logs().values())


@long_only
def test_batch_normalize_on_two_workers(standalone, cdc, tmp_path):
    src, expected = cdc
    r = cl.run_cli(standalone.cli_args() + normalize_args(src, tmp_path, streaming=False))
    assert r.returncode == 0, r.stderr + r.stdout
    assert_table(tmp_path / "table", expected)
    assert_summary(r.stdout, 1)


@long_only
@pytest.mark.parametrize("mode", ["streaming", "batch"])
def test_sql_join_with_materializer_on_two_workers(standalone, tmp_path, mode):
    """Two normalizes, the join and the sink upsert materializer (the sink
    key is not the join's unique key), from SQL."""
    base = tmp_path / "job"
    kw.write_files(base, 0, kw.FILES)
    script = tmp_path / "join.sql"
    script.write_text(kw.sql_script("join", base))
    mode_args = ["--checkpoint", tmp_path / "ck"] if mode == "streaming" else ["--batch"]
    r = cl.run_cli(standalone.cli_args() + ["run", script, "--dead-letter", base / "dead",
                                            "--no-progress", *mode_args])
    assert r.returncode == 0, r.stderr + r.stdout
    got = read_table(str(base / "out"))[list(kw.OUT_COLS["join"])].astype(object).values.tolist()
    assert sorted(map(tuple, got)) == kw.expected_table("join", kw.FILES)
    dead = sorted((os.path.basename(d["file"]), d["line"], d["reason"])
                  for d in read_dead_letter(str(base / "dead")))
    assert dead == kw.EXPECTED_DEAD


def _batch_running(checkpoint, batch: int) -> bool:
    """Micro-batch ``batch`` is planned (its offsets written) and not committed."""
    main = os.path.join(checkpoint, "main")
    return (os.path.exists(os.path.join(main, "offsets", str(batch)))
            and not os.path.exists(os.path.join(main, "commits", str(batch))))


def _wait_inside_batch(proc, checkpoint, batch: int, timeout_s=600) -> None:
    deadline = time.time() + timeout_s
    while not _batch_running(checkpoint, batch):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "the micro-batch never started"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def local_reference(cdc, tmp_path_factory):
    """The same streaming normalize on the embedded default (``local[2]``):
    its emitted changelog is what the killed runs must end with."""
    src, expected = cdc
    out = tmp_path_factory.mktemp("reference")
    r = cl.run_cli(normalize_args(src, out))
    assert r.returncode == 0, r.stderr + r.stdout
    assert_table(out / "table", expected)
    return changelog_rows(out / "log")


@long_only
def test_worker_killed_in_a_micro_batch(cdc, local_reference, tmp_path):
    """SIGKILL one worker (its JVM, executor and Python workers) while
    micro-batch 1 runs: the query goes on on the other worker; table,
    dead letters and emitted changelog exact."""
    src, expected = cdc
    cluster = cl.StandaloneCluster(str(tmp_path / "cluster")).start()
    try:
        job = cl.start_cli(cluster.cli_args() + normalize_args(src, tmp_path / "out"))
        _wait_inside_batch(job, tmp_path / "out" / "ck", 1)
        time.sleep(0.5)
        assert _batch_running(tmp_path / "out" / "ck", 1)
        cluster.kill_worker(0)
        out, err = job.communicate(timeout=900)
        assert job.returncode == 0, err + out
    finally:
        cluster.stop()
    assert_table(tmp_path / "out" / "table", expected)
    assert_summary(out, FILES)
    pd.testing.assert_frame_equal(changelog_rows(tmp_path / "out" / "log"), local_reference)


@long_only
def test_driver_killed_in_a_micro_batch_then_restarted(standalone, cdc, local_reference, tmp_path):
    """SIGKILL the driver (the CLI process and its JVM) while micro-batch 1
    runs, then run the same command again: it resumes from the checkpoint;
    table, dead letters and emitted changelog exact."""
    src, expected = cdc
    args = standalone.cli_args() + normalize_args(src, tmp_path / "out")
    job = cl.start_cli(args)
    _wait_inside_batch(job, tmp_path / "out" / "ck", 1)
    time.sleep(0.5)
    os.killpg(job.pid, 9)
    job.wait(timeout=60)
    assert not os.path.exists(tmp_path / "out" / "ck" / "main" / "commits" / "1")
    r = cl.run_cli(args)
    assert r.returncode == 0, r.stderr + r.stdout
    assert_table(tmp_path / "out" / "table", expected)
    assert len(read_dead_letter(str(tmp_path / "out" / "dead"))) == 3
    pd.testing.assert_frame_equal(changelog_rows(tmp_path / "out" / "log"), local_reference)
