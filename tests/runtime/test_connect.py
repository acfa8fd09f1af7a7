"""Pipelines run from a Spark Connect client: a Connect server started from
the PySpark installation (tests/cluster.py, ``ConnectServer``) and the CLI
with ``--remote sc://...`` or ``SPARK_REMOTE`` (docs/deploy.md, "Spark
Connect").  Paths are absolute: the server resolves them.

The default run has one case (the normalize); ``SPARK_CHANGELOG_LONG_TESTS=1``
adds the SQL join with its materializer, through ``SPARK_REMOTE``.
"""
from __future__ import annotations

import os

import pytest

import cluster as cl
from cluster import FILES, KEYS, ROWS, assert_summary, assert_table
import kill_window as kw
from spark_changelog.connectors.dead_letter import read_dead_letter
from spark_changelog.demo import generate_debezium
from spark_changelog.sinks.delta import read_table

LONG = bool(os.environ.get("SPARK_CHANGELOG_LONG_TESTS"))
long_only = pytest.mark.skipif(not LONG, reason="long variant: SPARK_CHANGELOG_LONG_TESTS=1")


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


def test_batch_normalize_through_connect(connect_server, cdc, tmp_path):
    src, expected = cdc
    r = cl.run_cli(["--remote", connect_server.url] + cl.normalize_args(src, tmp_path, streaming=False))
    assert r.returncode == 0, r.stderr + r.stdout
    assert_table(tmp_path / "table", expected)
    assert_summary(r.stdout, 1)
    assert len(read_dead_letter(str(tmp_path / "dead"))) == 3


@long_only
@pytest.mark.parametrize("mode", ["batch"])
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
