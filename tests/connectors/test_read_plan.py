"""A read whose line task finishes rows is built once (docs/runtime.md,
"Before the query starts"): its rows are built when first asked for, their
schema is known before (``ReadResult.schema``), and a keyed operator reading
them directly builds only the packed read plan."""
from __future__ import annotations

import json

import pytest

from spark_changelog.api import read_changes as api_read_changes
from spark_changelog.connectors.cdc_json import read_changes

SCHEMA = "id BIGINT, g INT, v DOUBLE, s STRING, b BOOLEAN"


def _write(path, lines):
    path.mkdir(parents=True, exist_ok=True)
    (path / "part-000001.json").write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture
def debezium_files(tmp_path):
    after = {"id": 1, "g": 2, "v": 0.5, "s": "x", "b": True}
    return _write(tmp_path / "dbz", [json.dumps({"before": None, "after": after, "op": "c",
                                                 "source": {"lsn": 1}}), "not json"])


@pytest.fixture
def changelog_files(tmp_path):
    return _write(tmp_path / "cl", [json.dumps({"id": 1, "g": 2, "v": 0.5, "s": "x", "b": True,
                                                "op": "+I", "n": 3}), "{"])


READS = [
    ("debezium", "debezium-json", {}),
    ("changelog", "changelog", {}),
    ("changelog", "changelog", {"seq_column": "n"}),
    ("changelog", "changelog", {"kind_column": None}),
]


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("files,fmt,kw", READS)
def test_the_schema_before_the_rows_is_the_rows_schema(spark, request, files, fmt, kw, streaming):
    path = request.getfixturevalue(f"{files}_files")
    read = read_changes(spark, path, fmt, SCHEMA, ["id"], streaming=streaming, **kw)
    assert not read.built
    before = read.schema
    assert read.schema.json() == read.rows.schema.json()
    assert before == read.rows.schema
    assert read.built


def test_a_read_with_slow_types_is_built_at_once(spark, debezium_files):
    read = read_changes(spark, debezium_files, "debezium-json", "id BIGINT, d DATE", ["id"])
    assert read.built


def test_a_missing_path_fails_where_the_read_is_declared(spark, tmp_path):
    with pytest.raises(Exception, match="(?i)path does not exist|PATH_NOT_FOUND"):
        read_changes(spark, str(tmp_path / "nothing"), "debezium-json", SCHEMA, ["id"])


def test_a_name_json_cannot_hold_fails_where_the_read_is_declared(spark, debezium_files):
    with pytest.raises(ValueError, match="both quote characters"):
        read_changes(spark, debezium_files, "debezium-json", "id BIGINT, `a'b\"c` STRING", ["id"])


@pytest.mark.parametrize("streaming", [False, True])
def test_a_keyed_operator_reading_the_source_builds_only_the_packed_plan(spark, debezium_files,
                                                                         streaming, tmp_path):
    stream = api_read_changes(spark, debezium_files, "debezium-json", SCHEMA, "id", streaming=streaming)
    (reader,) = stream.sources
    normalized = stream.normalize()
    plan = normalized.df._jdf.queryExecution().analyzed().toString()
    assert "_packed_rows" in plan
    assert not reader.built
    # the rows themselves, when asked for, are the unpacked read
    assert "_packed_rows" not in reader.rows.columns
    if not streaming:
        assert sorted(r["id"] for r in normalized.df.where("_kind >= 0").collect()) == [1]


def test_a_projection_over_the_source_builds_the_rows_when_read(spark, debezium_files):
    """A projection of plain columns (and ``current_timestamp()``) over rows
    not built yet is not built either until something reads it; its schema
    is the built one's."""
    stream = api_read_changes(spark, debezium_files, "debezium-json", SCHEMA, "id")
    (reader,) = stream.sources
    projected = stream.select("id", "v").with_column("pt", "current_timestamp()", deterministic=False)
    assert not reader.built
    schema = projected.spark_schema
    assert sorted(r["id"] for r in projected.df.where("_kind >= 0").collect()) == [1]
    assert reader.built
    assert schema.json() == projected.df.schema.json()


def test_a_computed_projection_over_the_source_builds_the_rows(spark, debezium_files):
    stream = api_read_changes(spark, debezium_files, "debezium-json", SCHEMA, "id")
    (reader,) = stream.sources
    stream.select("id", "v + 1 AS w")
    assert reader.built


def test_plain_rows_take_their_kind_without_a_case_mapping(spark, changelog_files):
    """A plain file's rows are inserts by a constant, not by ``upper(trim('+I'))``:
    folding that initialises ICU's case mapping in the JVM, about a second of
    a process's first query planning (docs/runtime.md, "Where the time goes");
    a file with a kind column still reads it case-insensitively."""
    plain = read_changes(spark, changelog_files, "changelog", SCHEMA, ["id"], kind_column=None)
    assert "upper(" not in plain.rows._jdf.queryExecution().analyzed().toString()
    assert [(r["_kind"], r["id"]) for r in plain.rows.where("_kind >= 0").collect()] == [(0, 1)]
    kinds = read_changes(spark, changelog_files, "changelog", SCHEMA, ["id"])
    assert "upper(" in kinds.rows._jdf.queryExecution().analyzed().toString()
