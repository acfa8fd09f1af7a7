"""JSON lines with a repeated key (docs/sql.md, "Repeated keys"): the last
value wins, on the line task's Arrow path and on the VARIANT path alike,
equal to Flink 2.3's answer (tests/fixtures/flink/repeated_keys.json,
recorded by record_repeated_keys.py)."""
from __future__ import annotations

import numpy as np
import pytest

from changelog_data import load_fixture
from spark_changelog.connectors import changelog_files as F
from spark_changelog.connectors import debezium as D
from spark_changelog.connectors.cdc_json import read_changes
from spark_changelog.connectors.debezium_arrow import DebeziumArrowParser
from spark_changelog.model.rowkind import RowKind

FLINK = load_fixture("flink/repeated_keys.json")
SCHEMA = ", ".join(f"{c} {t}" for c, t in zip(FLINK["columns"], FLINK["types"]))
#: Flink's format -> ours (Flink's plain ``json`` is our changelog JSON without a kind column)
OURS = {"debezium-json": ("debezium-json", {}), "canal-json": ("canal-json", {}),
        "maxwell-json": ("maxwell-json", {}), "json": ("changelog", {"kind_column": None})}
#: Flink's ``json`` format with its default streaming parser stops reading an
#: object once every column has a value: a later repeat is not read (first
#: value wins) and a column after a repeat is lost.  Ours reads as Flink's tree
#: parser (``json.decode.json-parser.enabled = false``) and its CDC formats do
DEFAULT_JSON_PARSER_DIFFERS = {"json_column", "json_column_before_the_last_column"}
#: per format, a line Arrow fails on (a fraction for a BIGINT) and the
#: VARIANT path makes a dead letter: 99 of them before a line use up the line
#: task's parse budget (debezium_arrow.parse_lines), so that line takes the
#: VARIANT path
BAD_NEIGHBOUR = {"debezium-json": '{"op":"c","after":{"id":1.5},"source":{"lsn":1}}', "json": '{"id":1.5}'}
KIND = {int(RowKind.INSERT): "+I", int(RowKind.UPDATE_BEFORE): "-U", int(RowKind.UPDATE_AFTER): "+U",
        int(RowKind.DELETE): "-D"}


def _cases(fmt):
    return [c for c in FLINK["cases"] if c["format"] == fmt and not c.get("options", {}).get(
        "json.decode.json-parser.enabled") and c["name"] not in DEFAULT_JSON_PARSER_DIFFERS]


def _flink_rows(cases):
    return sorted((k, tuple(v)) for c in cases for k, v in c["expected"])


def _read(spark, tmp_path, name, fmt, lines):
    d = tmp_path / name
    d.mkdir()
    (d / "part-000001.json").write_text("\n".join(lines) + "\n")
    ours, kw = OURS[fmt]
    res = read_changes(spark, str(d), ours, SCHEMA, None, **kw)
    rows = sorted((KIND[r["_kind"]], tuple(r[c] for c in FLINK["columns"])) for r in res.changes.collect())
    return rows, res.invalid.count()


def test_the_recorded_cases_cover_read_and_skipped_fields():
    names = {c["name"] for c in FLINK["cases"]}
    assert {"debezium_unread_source", "debezium_after_column", "debezium_op", "debezium_before_image",
            "canal_type", "maxwell_type", "json_column_tree_parser"} <= names
    assert all("expected" in c for c in FLINK["cases"])


@pytest.mark.parametrize("fmt", ["debezium-json", "json"])
def test_both_paths_take_the_last_value_as_flink(spark, tmp_path, monkeypatch, fmt):
    """The same lines give Flink's rows on the line task's Arrow path (a
    repeated key it types fails its parse; one in a field it skips does
    not), behind 99 lines that send them to the VARIANT path, and with
    the VARIANT path only."""
    cases = _cases(fmt)
    lines = [c["line"] for c in cases]
    want = _flink_rows(cases)
    assert _read(spark, tmp_path, "fast", fmt, lines) == (want, 0)
    assert _read(spark, tmp_path, "neighbours", fmt, [BAD_NEIGHBOUR[fmt]] * 99 + lines) == (want, 99)
    with monkeypatch.context() as m:
        m.setattr(D, "arrow_parser", lambda ctx: None)
        m.setattr(F, "arrow_parser", lambda ctx: None)
        assert _read(spark, tmp_path, "variant", fmt, lines) == (want, 0)


@pytest.mark.parametrize("fmt", ["canal-json", "maxwell-json"])
def test_canal_and_maxwell_take_the_last_value_as_flink(spark, tmp_path, fmt):
    cases = _cases(fmt)
    assert _read(spark, tmp_path, "in", fmt, [c["line"] for c in cases]) == (_flink_rows(cases), 0)


def test_plain_json_reads_as_flinks_tree_parser():
    """Where Flink's two JSON parsers differ, ours is the tree parser's answer."""
    by_name = {c["name"]: c for c in FLINK["cases"]}
    for name in DEFAULT_JSON_PARSER_DIFFERS:
        tree = by_name[f"{name}_tree_parser"]
        assert tree["line"] == by_name[name]["line"]
        assert tree["expected"] != by_name[name]["expected"]


def test_bad_neighbours_send_a_line_to_the_variant_path():
    """The premise of the neighbours case above: a line with a repeated key
    only in a skipped field is parsed by Arrow alone, not behind 99 bad lines."""
    line = next(c["line"] for c in FLINK["cases"] if c["name"] == "debezium_unread_source").encode()
    parser = DebeziumArrowParser([(c, t.lower()) for c, t in zip(FLINK["columns"], FLINK["types"])], ())
    for lines, taken_by_arrow in (([line], True), ([BAD_NEIGHBOUR["debezium-json"].encode()] * 99 + [line], False)):
        text = b"\n".join(lines)
        starts = np.cumsum([0] + [len(x) + 1 for x in lines[:-1]])
        ends = starts + np.array([len(x) for x in lines])
        _, _, needs_raw = parser(np.frombuffer(text, np.uint8), starts, ends, 1, np.arange(1, len(lines) + 1))
        assert bool(needs_raw[-1]) is not taken_by_arrow
