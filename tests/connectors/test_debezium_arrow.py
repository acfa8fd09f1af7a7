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
    # values that do not fit their column: dead letters on both paths, never truncated
    '{"op":"c","after":{"id":45,"n":50.5},"source":{"lsn":27}}', '{"op":"c","after":{"id":46,"n":true}}',
    '{"op":"c","after":{"id":9223372036854775808}}', '{"op":"c","after":{"id":5e1},"source":{"lsn":28}}',
    '{"op":"c","after":{"id":47,"n":-2147483649}}', '{"op":"c","after":{"id":48,"n":"12"}}',
    '{"op":"c","after":{"id":49,"n":12.0}}',
]
#: lines for the line task's finished rows (kinds, values, nulls, every kind of
#: position, and lines it must leave to the VARIANT path): a file of their own,
#: so that the bad lines of TRICKY do not use up the parse budget first
FINISHED = [
    '{"op":"u","before":{"id":21,"name":null,"price":1.0},"after":{"id":21,"name":"x","ok":false,"n":-5},'
    '"source":{"lsn":22}}',
    '{"op":"u","before":{"id":22,"n":1},"after":{"id":23,"n":2},"source":{"file":"mysql-bin.000004","pos":7}}',
    '{"op":"d","before":{"id":23,"ok":true},"source":{"file":"bin.12","pos":5,"row":3}}',
    '{"op":"c","after":{"id":24},"source":{"ts_ms":1700000000005}}',
    '{"op":"u","before":{"id":24},"after":{"id":24,"price":-0.0},"ts_ms":5,"source":{"ts_ms":9}}',
    '{"op":"c","after":{"id":25},"source":{"file":"bin.000005\\n","pos":5}}',
    '{"op":"c","after":{"id":26,"price":NaN},"source":{"lsn":23}}', '{"op":"c","after":{"id":27},"x":Infinity}',
    '{"op":"c","after":{"id":28},"source":{"file":"b.1","pos":10,"row":-1}}',
    '{"op":"r","after":{"id":29},"source":{"lsn":0}}',
    '{"schema":{},"payload":{"op":"u","before":{"id":30},"after":{"id":31},"source":{"lsn":24}}}',
    '{"schema":null,"payload":{"op":"c","after":{"id":32}},"op":"c","after":{"id":33}}',
    '{"op":"c","after":{"id":35},"source":{"file":"binlog","pos":3},"ts_ms":77}',
    '{"op":"u","before":{"id":null},"after":{"id":36}}',
    '{"op":"c","after":{"id":37},"source":{"lsn":25,"file":"b.2","pos":1}}',
    '{"op":"d","before":{"id":38},"after":{"id":38},"source":{"file":"b.000000","pos":17179869183}}',
    '{"op":"c","after":{"id":39},"source":{"file":"b.268435456","pos":1}}',
    '{"op":"c","after":{"id":40},"ts_ms":4398046511103}', '{"op":"c","after":{"id":41,"price":-0e0}}',
    '{"op":"c","after":{"id":42,"price":0.1},"source":{"lsn":26}}', '{"op":"c","after":{"id":43,"price":1e-320}}',
    '{"op":"c","after":{"id":44,"n":7}}',
]


def _outputs(res):
    rows = res.rows.selectExpr("to_json(struct(*)) AS j").collect()
    return sorted(r["j"] for r in rows)


def test_arrow_path_equals_the_variant_path(spark, tmp_path, monkeypatch):
    data = tmp_path / "in"
    data.mkdir()
    (data / "tricky-000007.json").write_text("\n".join(TRICKY) + "\n")
    (data / "finished-000009.json").write_text("\n".join(FINISHED) + "\n")
    for sub in ("changes", "positions", "bad"):
        for f in (FIXTURES / sub).iterdir():
            (data / f.name).write_bytes(f.read_bytes())
    fast = read_debezium(spark, str(data), SCHEMA, ["id"])
    got = _outputs(fast)
    monkeypatch.setattr(D, "arrow_parser", lambda ctx: None)
    want = _outputs(read_debezium(spark, str(data), SCHEMA, ["id"]))
    assert got == want
    # the same lines became change rows, dead letters and skipped records
    kinds = [json.loads(j)["_kind"] for j in got]
    assert kinds.count(-1) > 20 and len(kinds) - kinds.count(-1) > 10


@settings(max_examples=150, deadline=None)
@given(picks=st.lists(st.integers(0, len(TRICKY) + len(FINISHED) - 1), min_size=1, max_size=30),
       batch=st.integers(1, 7))
def test_each_line_gets_its_own_rows_or_its_text(picks, batch):
    """Rows map to lines, in line order, however bad lines are mixed in; a
    line without its text was parsed, is a plain or wrapped envelope, and its
    finished rows have the kinds and values json.loads gives (the exact rows
    and ``_seq``: the Spark test above)."""
    text = "\n".join((TRICKY + FINISHED)[i] for i in picks).encode() + b"\n"
    columns = ["id", "name", "price", "ok", "n"]
    parser = DebeziumArrowParser(list(zip(columns, ["bigint", "string", "double", "boolean", "int"])), ("id",))

    class Bytes:
        def read_at(self, n, offset):
            return text[offset:offset + n]

    schema = L.line_schema(False, parser)
    rows = [r for b in L.lines_of_range(Bytes(), "file:/t-1.json", len(text), 0, len(text), False, schema,
                                        parser, batch_lines=batch) for r in b.to_pylist()]
    lines = [(TRICKY + FINISHED)[i] for i in picks]
    while lines and not lines[-1].strip():
        lines.pop()                                     # trailing blank lines are not rows
    assert sorted(set(r["line"] for r in rows)) == list(range(1, len(lines) + 1))
    assert [r["line"] for r in rows] == sorted(r["line"] for r in rows)
    for number, line in enumerate(lines, 1):
        got = [r for r in rows if r["line"] == number]
        if got[0]["raw"] is not None:
            assert len(got) == 1 and got[0]["raw"] == line.rstrip("\r")
            assert got[0]["_j_kind"] is None and got[0]["_j_seq"] is None
            continue
        doc = json.loads(line)
        env = doc["payload"] if doc.get("payload") is not None and doc.get("schema") is not None else doc
        images = {"c": ["after"], "r": ["after"], "u": ["before", "after"], "d": ["before"]}[env["op"]]
        assert len(got) == len(images)
        key_changed = env["op"] == "u" and env["before"]["id"] != env["after"]["id"]
        want_kinds = {"c": [0], "r": [0], "d": [3], "u": [3, 0] if key_changed else [1, 2]}[env["op"]]
        assert [r["_j_kind"] for r in got] == want_kinds
        for row, side in zip(got, images):
            assert [row[f"_j_{i}"] for i in range(len(columns))] == [env[side].get(c) for c in columns]
            assert row["_j_seq"] % 2 == (side == "after")
        lsn = env.get("source", {}).get("lsn")
        if lsn is not None:
            assert got[0]["_j_seq"] >> 1 == lsn


def test_finished_rows_of_every_key_type_equal_the_variant_path(spark, tmp_path, monkeypatch):
    """Key-changing updates are told apart exactly as the SQL does (``<=>`` on
    each key column) for every fast type, -0.0 and 0.0 included."""
    lines = [
        '{"op":"c","after":{"k":"a","d":0.0,"b":true,"i":1,"v":"x"},"source":{"lsn":1}}',
        '{"op":"u","before":{"k":"a","d":0.0,"b":true,"i":1},"after":{"k":"a","d":-0.0,"b":true,"i":1,"v":"y"},'
        '"source":{"lsn":2}}',
        '{"op":"u","before":{"k":"a","d":0.0,"b":true,"i":1},"after":{"k":"a","d":0.0,"b":false,"i":1},'
        '"source":{"lsn":3}}',
        '{"op":"u","before":{"k":"a","d":0.0,"b":false,"i":1},"after":{"k":"a","d":0.0,"b":false,"i":2},'
        '"source":{"lsn":4}}',
        '{"op":"u","before":{"k":"a","d":0.0,"b":false,"i":2},"after":{"k":"\\u00e9","d":0.0,"b":false,"i":2}}',
        '{"op":"u","before":{"k":"b","d":1.5,"b":false,"i":2},"after":{"k":"b","d":1.5,"b":false,"i":2,"v":"z"}}',
        '{"op":"d","before":{"k":"b","d":1.5,"b":false,"i":2}}',
    ]
    data = tmp_path / "keys"
    data.mkdir()
    (data / "k-3.json").write_text("\n".join(lines) + "\n")
    schema, key = "k STRING, d DOUBLE, b BOOLEAN, i INT, v STRING", ["k", "d", "b", "i"]
    got = _outputs(read_debezium(spark, str(data), schema, key))
    monkeypatch.setattr(D, "arrow_parser", lambda ctx: None)
    want = _outputs(read_debezium(spark, str(data), schema, key))
    assert got == want
    kinds = [json.loads(j)["_kind"] for j in got]
    assert sorted(kinds) == [0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 3, 3]


def test_failing_parts_are_bisected_within_a_budget():
    good = b'{"op":"c","after":{"id":1},"source":{"lsn":1}}'
    bad = b'{"op":"c","after":{"id":"1"},"source":{"lsn":1}}'
    parser = DebeziumArrowParser([("id", "bigint")], ("id",))
    for lines, parsed in (([good] * 99 + [bad], 99), ([bad] * 100, 0)):
        text = b"\n".join(lines)
        buf = np.frombuffer(text, np.uint8)
        starts = np.cumsum([0] + [len(x) + 1 for x in lines[:-1]])
        ends = starts + np.array([len(x) for x in lines])
        line_of, columns, needs_raw = parser(buf, starts, ends, 1, np.arange(1, len(lines) + 1))
        assert list(line_of) == list(range(len(lines)))
        assert int(np.sum(~needs_raw)) == parsed
        assert needs_raw[-1]


def test_the_line_task_finishes_exactly_the_lines_it_can_prove():
    """Which FINISHED lines the line task finishes itself (the others keep
    their text for the VARIANT path: -0.0, NaN/Infinity anywhere, a file name
    with a line break, a negative row, a schema key with a JSON null, a null
    key, an out-of-range file)."""
    text = ("\n".join(FINISHED) + "\n").encode()

    class Bytes:
        def read_at(self, n, offset):
            return text[offset:offset + n]

    parser = DebeziumArrowParser([("id", "bigint"), ("name", "string"), ("price", "double"), ("ok", "boolean"),
                                  ("n", "int")], ("id",))
    rows = [r for b in L.lines_of_range(Bytes(), "file:/f-9.json", len(text), 0, len(text), False,
                                        L.line_schema(False, parser), parser) for r in b.to_pylist()]
    finished = sorted({r["line"] for r in rows if r["raw"] is None})
    assert finished == [1, 2, 3, 4, 10, 11, 13, 15, 16, 18, 20, 21, 22]
    # each line's first row: lsn; binlog file number and pos + row; ts_ms (else
    # source.ts_ms) with the line; the file number with the line
    seqs: dict = {}
    for r in rows:
        seqs.setdefault(r["line"], r["_j_seq"])
    assert seqs[1] == 22 * 2 and seqs[2] == ((4 << 34) + 7) * 2
    assert seqs[3] == ((12 << 34) + 8) * 2 and seqs[4] == ((1700000000005 << 20) + 4) * 2 + 1
    assert seqs[10] == 1 and seqs[11] == 24 * 2 and seqs[13] == ((77 << 20) + 13) * 2 + 1
    assert seqs[22] == ((9 << 28) + 22) * 2 + 1
