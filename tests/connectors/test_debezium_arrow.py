"""The Debezium fast path parsed by Arrow in the line task (connectors/debezium_arrow.py):
it only ever changes speed, never a row, a dead letter or a line number."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from hypothesis import given, settings, strategies as st

from spark_changelog.connectors import debezium as D
from spark_changelog.connectors import lines as L
from spark_changelog.connectors.debezium import read_debezium
from spark_changelog.connectors.debezium_arrow import DebeziumArrowParser

FIXTURES = Path(__file__).parent.parent / "fixtures" / "cdc" / "debezium"
SCHEMA = "id BIGINT, name STRING, price DOUBLE, ok BOOLEAN, n INT"

#: lines Arrow must either parse exactly like the VARIANT path or hand to it
TRICKY = [
    '{"op":"c","after":{"id":1,"name":"a","price":1.5,"ok":true,"n":7},"source":{"lsn":10}}',
    '{"op":"u","before":{"id":1,"name":"a"},"after":{"id":1,"name":"b","price":2},"source":{"lsn":11}}',
    '{"op":"u","before":{"id":1},"after":{"id":2},"source":{"lsn":12}}',
    '{"op":"d","before":{"id":2},"after":null,"ts_ms":1700000000000}',
    '{"op":"r","after":{"id":3},"source":{"file":"mysql-bin.000003","pos":100,"row":2}}',
    '{"op":"c","after":{"id":4}}',
    '{"schema":{"type":"struct"},"payload":{"op":"c","after":{"id":5,"name":"w"},"source":{"lsn":13}}}',
    '{"schema":null,"payload":null}', 'null', '', '   ', '{}', '{} {}', '{"op":"c","after":{"id":6}} x',
    '{"op":"c","after":{"id":"7"},"source":{"lsn":14}}', '{"op":"c","after":{"id":8.0},"source":{"lsn":15}}',
    '{"op":"c","after":{"id":9,"n":3000000000},"source":{"lsn":16}}', '{"op":"c","op":"d","after":{"id":10}}',
    '{"op":"c","after":{"id":11,"name":12},"source":{"lsn":17}}', "{'op':'c'}", '[1,2]', '{"op":',
    '{"op":"c","after":{"id":12},"source":{"lsn":-1}}', '{"op":"c","after":{"id":13},"source":{"lsn":"zz"}}',
    '{"op":"c","after":{"id":null},"source":{"lsn":18}}', '{"op":"t","source":{"lsn":19}}', '{"op":"m"}',
    '{"source":{"server":"s"},"ddl":"ALTER TABLE t ADD c INT"}', '  {"op":"c","after":{"id":14}}',
    '{"op":"c","after":{"id":15,"price":1e400},"source":{"lsn":20}}', '{"op":"c","after":{"id":16,"ok":1}}',
    '{"op":"c","after":{"id":17},"source":{"file":"mysql-bin.9999999999","pos":1}}',
    '{"op":"c","after":{"id":18},"ts_ms":4398046511104}', '{"op":"c","after":{"id":19,"name":"\\u00e9\\ud83d\\ude00"}}',
    '{"op":"c","after":{"id":20},"source":{"lsn":21}}\r',
]


def _outputs(res):
    rows = res.rows.selectExpr("to_json(struct(*)) AS j").collect()
    return sorted(r["j"] for r in rows)


def test_arrow_path_equals_the_variant_path(spark, tmp_path, monkeypatch):
    data = tmp_path / "in"
    data.mkdir()
    (data / "tricky-000007.json").write_text("\n".join(TRICKY) + "\n")
    for sub in ("changes", "positions", "bad"):
        for f in (FIXTURES / sub).iterdir():
            (data / f.name).write_bytes(f.read_bytes())
    fast = read_debezium(spark, str(data), SCHEMA, ["id"])
    got = _outputs(fast)
    monkeypatch.setattr(D, "arrow_parser", lambda schema, key: None)
    want = _outputs(read_debezium(spark, str(data), SCHEMA, ["id"]))
    assert got == want
    # the same lines became change rows, dead letters and skipped records
    kinds = [json.loads(j)["_kind"] for j in got]
    assert kinds.count(-1) > 20 and len(kinds) - kinds.count(-1) > 10


@settings(max_examples=150, deadline=None)
@given(picks=st.lists(st.integers(0, len(TRICKY) - 1), min_size=1, max_size=30),
       batch=st.integers(1, 7))
def test_each_line_gets_its_own_parse_or_its_text(picks, batch):
    """Rows map to lines one to one however bad lines are mixed in; a line
    without its text was parsed, is a plain or wrapped envelope, and has the
    values json.loads gives."""
    text = "\n".join(TRICKY[i] for i in picks).encode() + b"\n"
    parser = DebeziumArrowParser([("id", "bigint"), ("name", "string"), ("price", "double"), ("ok", "boolean"),
                                  ("n", "int")], ("id",))

    class Bytes:
        def read_at(self, n, offset):
            return text[offset:offset + n]

    schema = L.line_schema(False, parser)
    rows = [r for b in L.lines_of_range(Bytes(), "file:/t-1.json", len(text), 0, len(text), False, schema,
                                        parser, batch_lines=batch) for r in b.to_pylist()]
    lines = [TRICKY[i] for i in picks]
    while lines and not lines[-1].strip():
        lines.pop()                                     # trailing blank lines are not rows
    assert [r["line"] for r in rows] == list(range(1, len(lines) + 1))
    for row, line in zip(rows, lines):
        if row["raw"] is not None:
            assert row["raw"] == line.rstrip("\r")
            continue
        doc = json.loads(line)
        env = doc["payload"] if "payload" in doc and "schema" in doc else doc
        assert row["_j_ok"] and row["_j_op"] == env["op"] in ("c", "r", "u", "d")
        for side in ("before", "after"):
            image = env.get(side)
            assert (row[f"_j_{side}"] is None) == (image is None)
            if image is not None:
                assert {k: v for k, v in row[f"_j_{side}"].items() if v is not None} == \
                    {k: v for k, v in image.items() if v is not None}
        assert row["_j_lsn"] == env.get("source", {}).get("lsn")


def test_failing_parts_are_bisected_within_a_budget():
    good = b'{"op":"c","after":{"id":1},"source":{"lsn":1}}'
    bad = b'{"op":"c","after":{"id":"1"},"source":{"lsn":1}}'
    parser = DebeziumArrowParser([("id", "bigint")], ("id",))
    for lines, parsed in (([good] * 99 + [bad], 99), ([bad] * 100, 0)):
        text = b"\n".join(lines)
        buf = np.frombuffer(text, np.uint8)
        starts = np.cumsum([0] + [len(x) + 1 for x in lines[:-1]])
        ends = starts + np.array([len(x) for x in lines])
        columns, needs_raw = parser(buf, starts, ends, 1)
        assert int(np.sum(~needs_raw)) == parsed
        assert needs_raw[-1]
