"""Pipelines run from a Spark Connect client: a Connect server started from
the PySpark installation (tests/cluster.py, ``ConnectServer``) and the CLI
with ``--remote sc://...`` or ``SPARK_REMOTE`` (docs/deploy.md, "Spark
Connect").  Paths are absolute: the server resolves them.

The default run has one case (the batch normalize); ``SPARK_CHANGELOG_LONG_TESTS=1``
adds the streaming normalize and the SQL join with its materializer and the
SQL aggregation, streaming and batch, through ``SPARK_REMOTE``, each with its
run report compared with the embedded default's run of the same job.  The
server's Python is ``spark-changelog-python``, which connects Spark's
driver-side Python processes back before their imports (docs/deploy.md,
"Starting a streaming query").
"""
from __future__ import annotations

import os

import pytest

import cluster as cl
import long_variants
from cluster import FILES, assert_summary, assert_table, cdc  # noqa: F401 (cdc: a fixture)
import kill_window as kw
from spark_changelog.connectors.dead_letter import read_dead_letter
from spark_changelog.sinks.changelog import read_changelog
from spark_changelog.sinks.delta import read_table

long_only = long_variants.long_only("a cluster job of minutes")


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    server = cl.ConnectServer(str(tmp_path_factory.mktemp("connect")))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.mark.parametrize("mode", [pytest.param("streaming", marks=long_only), "batch"])
def test_normalize_through_connect(connect_server, cdc, tmp_path, mode):
    """Table exact, dead letters and the changelog output written, and the run report's counts right:
    streaming, the batch handler runs in the server's Python process and
    the client reads its per-batch records (docs/deploy.md, "Spark Connect")."""
    src, expected = cdc
    streaming = mode == "streaming"
    r = cl.run_cli(["--remote", connect_server.url]
                   + cl.normalize_args(src, tmp_path, streaming=streaming))
    assert r.returncode == 0, r.stderr + r.stdout
    assert_table(tmp_path / "table", expected)
    assert_summary(r.stdout, FILES if streaming else 1)
    assert len(read_dead_letter(str(tmp_path / "dead"))) == 3
    # the changelog output, written by the server's executors: every change out, committed
    log = read_changelog(tmp_path / "log")
    assert len(log) == int(r.stdout.split("changes out: ")[1].split()[0]) > 0
    assert sorted(set(log["_batch"])) == list(range(FILES if streaming else 1))
    if streaming:
        # the same counts as the embedded default's run of the same job
        local = cl.run_cli(cl.normalize_args(src, tmp_path / "local"))
        assert local.returncode == 0, local.stderr
        assert _counts(r.stdout) == _counts(local.stdout)


def _counts(summary: str) -> list[str]:
    """The summary's lines with counts (not the time or the paths)."""
    return [line for line in summary.splitlines()
            if not line.startswith(("time:", "upsert table:", "changelog:", "dead letter:"))]


def _run_sql(kind: str, mode: str, directory, env=None):
    """``spark-changelog run`` of the kill-window jobs' SQL script of
    ``kind`` over their two CDC sources -> (process, output table rows, dead letters)."""
    base = directory / "job"
    kw.write_files(base, 0, kw.FILES)
    script = directory / f"{kind}.sql"
    script.write_text(kw.sql_script(kind, base))
    mode_args = ["--checkpoint", directory / "ck"] if mode == "streaming" else ["--batch"]
    r = cl.run_cli(["run", script, "--dead-letter", base / "dead", "--no-progress", *mode_args], env=env)
    assert r.returncode == 0, r.stderr + r.stdout
    got = read_table(str(base / "out"))[list(kw.OUT_COLS[kind])].astype(object).values.tolist()
    dead = sorted((os.path.basename(d["file"]), d["line"], d["reason"])
                  for d in read_dead_letter(str(base / "dead")))
    return r, sorted(map(tuple, got)), dead


@long_only
@pytest.mark.parametrize("mode", ["streaming", "batch"])
@pytest.mark.parametrize("kind", ["join", "aggregation"])
def test_sql_through_connect(connect_server, tmp_path, kind, mode):
    """The SQL join of two normalized sources with the sink upsert
    materializer, and the SQL aggregation, through ``SPARK_REMOTE``: exact
    tables, the dead letter, and the run report's counts equal to the
    embedded default's run of the same script."""
    r, table, dead = _run_sql(kind, mode, tmp_path / "connect", env={"SPARK_REMOTE": connect_server.url})
    assert table == kw.expected_table(kind, kw.FILES)
    assert dead == kw.EXPECTED_DEAD
    local, _, _ = _run_sql(kind, mode, tmp_path / "local")
    assert _counts(r.stdout) == _counts(local.stdout)
