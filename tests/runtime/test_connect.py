"""Pipelines run from a Spark Connect client: a Connect server started from
the PySpark installation (tests/cluster.py, ``ConnectServer``) and the CLI
with ``--remote sc://...`` or ``SPARK_REMOTE`` (docs/deploy.md, "Spark
Connect").  Paths are absolute: the server resolves them.

The default run has one case (the batch normalize); ``SPARK_CHANGELOG_LONG_TESTS=1``
adds the streaming normalize (its report compared with the embedded
default's) and the SQL join with its materializer, streaming and batch,
through ``SPARK_REMOTE``.  A streaming query's ``foreachBatch`` Python
process must connect back to the server within Spark's fixed timeout (about
10 s, not configurable): on this machine at load 20 it twice did not, so the
streaming cases are long variants (docs/deploy.md, "Spark Connect").
"""
from __future__ import annotations

import os

import pytest

import cluster as cl
import long_variants
from cluster import FILES, KEYS, ROWS, assert_summary, assert_table
import kill_window as kw
from spark_changelog.connectors.dead_letter import read_dead_letter
from spark_changelog.demo import generate_debezium
from spark_changelog.sinks.delta import read_table

long_only = long_variants.long_only("a cluster job of minutes")


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    server = cl.ConnectServer(str(tmp_path_factory.mktemp("connect")))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def cdc(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("cdc") / "in")
    return directory, generate_debezium(directory, ROWS, KEYS, files=FILES)


@pytest.mark.parametrize("mode", [pytest.param("streaming", marks=long_only), "batch"])
def test_normalize_through_connect(connect_server, cdc, tmp_path, mode):
    """Table exact, dead letters written, and the run report's counts right:
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
    if streaming and LONG:
        # the same counts as the embedded default's run of the same job
        local = cl.run_cli(cl.normalize_args(src, tmp_path / "local"))
        assert local.returncode == 0, local.stderr
        assert _counts(r.stdout) == _counts(local.stdout)


def _counts(summary: str) -> list[str]:
    """The summary's lines with counts (not the time or the paths)."""
    return [line for line in summary.splitlines()
            if not line.startswith(("time:", "upsert table:", "changelog:", "dead letter:"))]


@long_only
@pytest.mark.parametrize("mode", ["streaming", "batch"])
def test_sql_join_through_connect(connect_server, tmp_path, mode):
    base = tmp_path / "job"
    kw.write_files(base, 0, kw.FILES)
    script = tmp_path / "join.sql"
    script.write_text(kw.sql_script("join", base))
    mode_args = ["--checkpoint", tmp_path / "ck"] if mode == "streaming" else ["--batch"]
    r = cl.run_cli(["run", script, "--dead-letter", base / "dead", "--no-progress", *mode_args],
                   env={"SPARK_REMOTE": connect_server.url})
    assert r.returncode == 0, r.stderr + r.stdout
    got = read_table(str(base / "out"))[list(kw.OUT_COLS["join"])].astype(object).values.tolist()
    assert sorted(map(tuple, got)) == kw.expected_table("join", kw.FILES)
    dead = sorted((os.path.basename(d["file"]), d["line"], d["reason"])
                  for d in read_dead_letter(str(base / "dead")))
    assert dead == kw.EXPECTED_DEAD
