"""The changelog JSON fast path parsed by Arrow in the line task
(connectors/changelog_arrow.py): it only ever changes speed, never a row, a
dead letter, a skipped record or a line number."""
from __future__ import annotations

import json
from pathlib import Path

from spark_changelog.connectors import changelog_files as F
from spark_changelog.connectors.cdc_json import read_changes

FIXTURES = Path(__file__).parent.parent / "fixtures" / "cdc" / "changelog" / "json"
SCHEMA = "id BIGINT, name STRING, price DOUBLE, ok BOOLEAN, n INT"

#: lines the line task must either finish exactly as the VARIANT path does or
#: leave to it: every spelling of every kind, blanks and case, values of every
#: fast type, nulls, -0.0, NaN, bad JSON, wrong types, missing keys, tombstones
LINES = [
    '{"op":"+I","id":1,"name":"a","price":1.5,"ok":true,"n":7}',
    '{"op":"-U","id":1,"name":"a","price":1.5}', '{"op":" +u ","id":1,"name":"b"}',
    '{"op":"delete","id":1}', '{"op":"INSERT","id":2,"name":"\\u00e9\\ud83d\\ude00"}',
    '{"op":"update_before","id":2}', '{"op":"UPDATE_AFTER","id":2,"n":-5}', '{"op":"3","id":2}',
    '{"op":"0","id":3,"ok":false}', '{"op":"+i","id":4}', '{"op":"\\t+I","id":5}', '{"op":"+I\\u00a0","id":6}',
    '{"op":"+X","id":7}', '{"op":3,"id":8}', '{"id":9}', '{"op":null,"id":10}', '{"op":"+I"}',
    '{"op":"+I","id":null}', '{"op":"+I","id":"11"}', '{"op":"+I","id":12.0}', '{"op":"+I","id":13,"n":3000000000}',
    '{"op":"+I","id":14,"price":-0.0}', '{"op":"+I","id":15,"price":NaN}', '{"op":"+I","id":16,"price":1e400}',
    '{"op":"+I","id":17,"ok":1}', '{"op":"+I","op":"-D","id":18}', '{"op":"+I","id":19} x', '{} {}', '{}',
    'null', '', '   ', '[1,2]', "{'op':'+I'}", '{"op":', '  {"op":"+I","id":20}', '{"op":"+I","id":21}\r',
    '{"op":"+I","id":22,"extra":{"deep":[1,2,{"x":null}]}}', '{"op":"-D","id":23,"price":1e-320}',
    '{"op":"+I","id":24,"name":12}', '{"op":"+I","id":25,"price":0.1,"name":""}',
]


def _outputs(rows):
    return sorted(r["j"] for r in rows.selectExpr("to_json(struct(*)) AS j").collect())


def _both_paths(spark, monkeypatch, path, **kw):
    fast = _outputs(read_changes(spark, path, "changelog", SCHEMA, ["id"], **kw).rows)
    with monkeypatch.context() as m:
        m.setattr(F, "arrow_parser", lambda ctx: None)
        slow = _outputs(read_changes(spark, path, "changelog", SCHEMA, ["id"], **kw).rows)
    return fast, slow


def test_arrow_path_equals_the_variant_path(spark, tmp_path, monkeypatch):
    data = tmp_path / "in"
    data.mkdir()
    (data / "lines-000007.json").write_text("\n".join(LINES) + "\n")
    for f in FIXTURES.iterdir():
        (data / f.name).write_bytes(f.read_bytes())
    fast, slow = _both_paths(spark, monkeypatch, str(data))
    assert fast == slow
    kinds = [json.loads(j)["_kind"] for j in fast]
    assert kinds.count(-1) > 15 and len(kinds) - kinds.count(-1) > 12


def test_a_sequence_column_is_taken_as_is(spark, tmp_path, monkeypatch):
    lines = ['{"op":"+I","id":1,"seq":10}', '{"op":"-U","id":1,"seq":-3}', '{"op":"+U","id":1,"seq":null}',
             '{"op":"+U","id":1}', '{"op":"-D","id":1,"seq":1.5}', '{"op":"+I","id":2,"seq":"7"}',
             '{"op":"+I","id":3,"seq":9223372036854775807}', '{"op":"+I","id":4,"seq":9223372036854775808}']
    data = tmp_path / "seq"
    data.mkdir()
    (data / "s-1.json").write_text("\n".join(lines) + "\n")
    fast, slow = _both_paths(spark, monkeypatch, str(data), seq_column="seq")
    assert fast == slow
    seqs = [json.loads(j)["_seq"] for j in fast if json.loads(j)["_kind"] >= 0]
    assert -3 in seqs and 10 in seqs and 9223372036854775807 in seqs


def test_the_line_task_finishes_the_plain_lines(tmp_path):
    """The common lines leave the task finished (no text): every spelling of
    every kind, a CRLF line end, ignored nested fields, tiny doubles; a line
    with a blank before its object takes the VARIANT path.  (A file of its
    own: failing lines use up a range's parse budget, see debezium_arrow.)"""
    import pyarrow.fs as pafs

    from spark_changelog.connectors import lines as L
    from spark_changelog.connectors.changelog_arrow import ChangelogArrowParser
    parser = ChangelogArrowParser([("id", "bigint"), ("name", "string"), ("price", "double"), ("ok", "boolean"),
                                   ("n", "int")], ["id"], "op", None)
    good = LINES[:10] + ['{"op":"+I","id":21}\r', '{"op":"+I","id":22,"extra":{"deep":[1,2,{"x":null}]}}',
                         '{"op":"-D","id":23,"price":1e-320}', '  {"op":"+I","id":20}',
                         '{"op":"+I","id":25,"price":0.1,"name":""}']
    path = tmp_path / "f-3.json"
    path.write_text("\n".join(good) + "\n")
    size = path.stat().st_size
    with pafs.LocalFileSystem().open_input_file(str(path)) as fh:
        batches = list(L.lines_of_range(fh, str(path), size, 0, size, False, L.line_schema(False, parser), parser))
    rows = [r for b in batches for r in b.to_pylist()]
    assert sorted(r["line"] for r in rows if r["raw"] is None) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15]
    assert [r["_j_kind"] for r in sorted(rows, key=lambda r: r["line"])][:10] == [0, 1, 2, 3, 0, 1, 2, 3, 0, 0]
