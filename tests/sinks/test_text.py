"""Values as people read them (spark_changelog/sinks/text.py, the print sink
and ``cat``): written out as data, each line as Flink 2.3's print connector
writes it."""
from __future__ import annotations

import datetime as dt
import io
from decimal import Decimal as D

import pandas as pd
import pyarrow as pa

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
        "t> +U[5, 1, 0.0000000001, null, false]"]
    assert counts == {"upserted": 2, "deleted": 1, "skipped_replay": False}
    # the pandas entry point (an integer column with nulls arrives as float64 there)
    frame = pd.DataFrame({"n": pd.array([3, None], dtype="Int64"), "_kind": [0, 0],
                          "_seq": [1, 2]})
    out = io.StringIO()
    PrintSink(out=out).write_batch(frame, query_id="q", batch_id=0)
    assert out.getvalue().splitlines() == ["+I[3]", "+I[null]"]


def test_flink_text_of_each_type():
    cases = [(None, "null"), (True, "true"), (12, "12"), (D("-0.50"), "-0.50"),
             (D("12345678901234567890.1234567890"), "12345678901234567890.1234567890"),
             (0.1, "0.1"), (123456789.0, "1.23456789E8"), (1e-4, "1.0E-4"), (float("nan"), "NaN"),
             (dt.datetime(2021, 1, 15, 10, 0, 1, 500000, tzinfo=dt.timezone.utc),
              "2021-01-15T10:00:01.500000"),
             (dt.date(2024, 2, 29), "2024-02-29"), (b"\x00\xff", "x'00ff'"),
             ([1, None], "[1, null]"), ([("a", 1)], "{a=1}"), ({"x": 1, "y": "b"}, "(1, b)")]
    assert [flink_text(v) for v, _ in cases] == [t for _, t in cases]


def test_cat_json_and_csv_keep_every_digit():
    """Issue 21: ``cat --format json`` printed a DECIMAL(38, 10) as ``1.23456789e+25``."""
    df = pd.DataFrame({"k": pd.array([1, None], dtype="Int64"),
                       "d": [D("12345678901234567890123456.7890000000"), D("0E-10")],
                       "s": ["a\"b", None]})
    assert list(json_lines(df)) == [
        '{"k":1,"d":12345678901234567890123456.7890000000,"s":"a\\"b"}',
        '{"k":null,"d":0.0000000000,"s":null}']
    assert csv_ready(df).to_csv(index=False).splitlines() == [
        "k,d,s", "1,12345678901234567890123456.7890000000,\"a\"\"b\"", ",0.0000000000,"]
