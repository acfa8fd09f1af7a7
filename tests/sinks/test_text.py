"""Values as people read them (spark_changelog/sinks/text.py, the print sink
and ``cat``): written out as data, each line as Flink 2.3's print connector
writes it."""
from __future__ import annotations

import datetime as dt
import io
from decimal import Decimal as D

import pandas as pd
import pyarrow as pa

from changelog_data import load_fixture
from spark_changelog.sinks.console import PrintSink
from spark_changelog.sinks.text import csv_ready, flink_text, json_lines


def test_print_sink_writes_integers_with_nulls_as_integers_and_decimals_exactly():
    """Issue 21: a BIGINT column holding nulls printed as ``+I[3.0, null, null]``."""
    batch = pa.table({
        "n": pa.array([3, None, 5], pa.int64()), "m": pa.array([None, None, 1], pa.int64()),
        "d": pa.array([D("1.10"), None, D("0.0000000001")], pa.decimal128(38, 10)),
        "f": pa.array([1.0, 1e7, None]), "b": pa.array([True, None, False]),
        "_kind": pa.array([0, 3, 2], pa.int8()), "_seq": pa.array([2, 1, 3], pa.int64())})
    out = io.StringIO()
    counts = PrintSink(identifier="t", out=out).write_arrow_batch(batch, query_id="q", batch_id=0)
    assert out.getvalue().splitlines() == [
        "t> -D[null, null, null, 1.0E7, null]",
        "t> +I[3, null, 1.1000000000, 1.0, true]",
        "t> +U[5, 1, 1E-10, null, false]"]
    assert counts == {"upserted": 2, "deleted": 1, "skipped_replay": False}
    # the pandas entry point (an integer column with nulls arrives as float64 there)
    frame = pd.DataFrame({"n": pd.array([3, None], dtype="Int64"), "_kind": [0, 0],
                          "_seq": [1, 2]})
    out = io.StringIO()
    PrintSink(out=out).write_batch(frame, query_id="q", batch_id=0)
    assert out.getvalue().splitlines() == ["+I[3]", "+I[null]"]


#: one row through Flink 2.3's print connector (PyFlink, table.local-time-zone UTC):
#: INSERT INTO p SELECT CAST(NULL AS BIGINT), CAST('1.1' AS DECIMAL(10,2)),
#: CAST('0.0000000001' AS DECIMAL(38,10)), 1.0E7, 0.5, DATE '2024-01-01',
#: TIMESTAMP '2024-01-02 10:00:00.5', TIME '10:11:12', x'00ff', ARRAY[1, 2], MAP['a', 1],
#: ROW(1, 'b'), true
FLINK_PRINTED = ("+I[null, 1.10, 1E-10, 1.0E7, 0.5, 2024-01-01, 2024-01-02T10:00:00.500, "
                 "10:11:12, [0, -1], [1, 2], {a=1}, +I[1, b], true]")


def test_print_sink_line_of_every_type_is_flinks():
    batch = pa.table({
        "a": pa.array([None], pa.int64()), "d": pa.array([D("1.10")], pa.decimal128(10, 2)),
        "dd": pa.array([D("1E-10")], pa.decimal128(38, 10)), "f": [1.0e7], "g": [0.5],
        "dt": pa.array([dt.date(2024, 1, 1)]),
        "ts": pa.array([dt.datetime(2024, 1, 2, 10, 0, 0, 500000)], pa.timestamp("us", tz="UTC")),
        "tm": pa.array([dt.time(10, 11, 12)]), "b": pa.array([b"\x00\xff"]),
        "arr": pa.array([[1, 2]], pa.list_(pa.int32())),
        "m": pa.array([[("a", 1)]], pa.map_(pa.string(), pa.int32())),
        "r": pa.array([{"x": 1, "y": "b"}]), "bo": [True],
        "_kind": pa.array([0], pa.int8()), "_seq": pa.array([0], pa.int64())})
    out = io.StringIO()
    PrintSink(out=out).write_arrow_batch(batch, query_id="q", batch_id=0)
    assert out.getvalue() == FLINK_PRINTED + "\n"


STATEMENTS = {c["name"]: c for c in load_fixture("flink/statements.json")["cases"]}


def test_print_sink_line_of_nested_values_is_flinks():
    """ARRAY, MAP and ROW with nulls inside, empty ones, nesting: the line
    Flink 2.3 printed (statements.json P1; an empty MAP is ``{}``)."""
    s, i = pa.string(), pa.int32()
    batch = pa.table({
        "a": pa.array([["id", "x"]], pa.list_(s)), "e": pa.array([[1, None]], pa.list_(i)),
        "n": pa.array([None], pa.list_(s)),
        "m": pa.array([[("a", 1), ("b", 2)]], pa.map_(s, i)), "em": pa.array([[]], pa.map_(s, s)),
        "mn": pa.array([[("a", None)]], pa.map_(s, i)),
        "r": pa.array([{"x": 1, "y": "b"}], pa.struct([("x", i), ("y", s)])),
        "rr": pa.array([{"x": 1, "z": {"w": "w"}}],
                       pa.struct([("x", i), ("z", pa.struct([("w", s)]))])),
        "ar": pa.array([[{"x": 1}, {"x": 2}]], pa.list_(pa.struct([("x", i)]))),
        "_kind": pa.array([0], pa.int8()), "_seq": pa.array([0], pa.int64())})
    out = io.StringIO()
    PrintSink(out=out).write_arrow_batch(batch, query_id="q", batch_id=0)
    assert out.getvalue().splitlines() == STATEMENTS["P1_print_nested_values"]["expected_lines"]


def test_flink_text_of_more_values():
    cases = [(D("12345678901234567890.1234567890"), "12345678901234567890.1234567890"),
             (D("0E-10"), "0E-10"), (0.1, "0.1"), (123456789.0, "1.23456789E8"),
             (1e-4, "1.0E-4"), (float("nan"), "NaN"), (float("-inf"), "-Infinity"),
             (dt.datetime(2021, 1, 15, 10, 0), "2021-01-15T10:00"),
             (dt.datetime(2021, 1, 15, 10, 0, 0, 1), "2021-01-15T10:00:00.000001"),
             ([1, None], "[1, null]")]
    assert [flink_text(v) for v, _ in cases] == [t for _, t in cases]


def test_cat_json_and_csv_keep_every_digit():
    """Issue 21: ``cat --format json`` printed a DECIMAL(38, 10) as ``1.23456789e+25``."""
    df = pd.DataFrame({"k": pd.array([1, None], dtype="Int64"),
                       "d": [D("12345678901234567890123456.7890000000"), D("0E-10")],
                       "s": ["a\"b", None]})
    assert list(json_lines(pa.Table.from_pandas(df, preserve_index=False))) == [
        '{"k":1,"d":12345678901234567890123456.7890000000,"s":"a\\"b"}',
        '{"k":null,"d":0.0000000000,"s":null}']
    assert csv_ready(df).to_csv(index=False).splitlines() == [
        "k,d,s", "1,12345678901234567890123456.7890000000,\"a\"\"b\"", ",0.0000000000,"]
    nested = pa.table({"r": pa.array([{"a": 2, "b": "q"}, None]),
                       "m": pa.array([[("y", 2)], None], pa.map_(pa.string(), pa.int32())),
                       "arr": pa.array([[1, None], []], pa.list_(pa.int32())),
                       "b": [b"\x00\xff", None]})
    assert list(json_lines(nested)) == ['{"r":{"a":2,"b":"q"},"m":{"y":2},"arr":[1,null],"b":"00ff"}',
                                        '{"r":null,"m":null,"arr":[],"b":null}']
