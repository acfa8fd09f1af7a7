"""Flink's JSON format options in the CDC readers (connectors/format_options.py,
docs/sql.md "Format options"): Canal ``INIT``, the database/table filters, every
metadata key, non-numeric numbers, schema-included envelopes and tombstones,
and no silent value changes (a value that does not fit its column is a dead
letter naming the field).

Inputs: tests/fixtures/cdc/formats/; expected rows written out here as data,
(kind, columns..., _seq) ordered by _seq, with the ``_seq`` layout of
``test_readers``.
"""
from __future__ import annotations

import math
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest

from spark_changelog.connectors.cdc_json import read_changes
from spark_changelog.connectors.format_options import FormatOptions, from_table_options
from spark_changelog.model.rowkind import RowKind

from tests.connectors.test_readers import A, B, canal_pos, lsn, maxwell_ts, seq

FIXTURES = Path(__file__).parents[1] / "fixtures" / "cdc" / "formats"
NAN, INF = "NaN", "Infinity"


def ts(ms: int) -> datetime:
    """A TIMESTAMP value as PySpark returns it (naive local time) from epoch ms."""
    return datetime.fromtimestamp(datetime.fromtimestamp(ms / 1000, timezone.utc).timestamp())


def plain(v):
    """Values comparable as data: NaN and infinities by name, maps sorted."""
    if isinstance(v, float) and math.isnan(v):
        return NAN
    if isinstance(v, float) and math.isinf(v):
        return INF if v > 0 else "-" + INF
    if isinstance(v, dict):
        return dict(sorted(v.items()))
    return v


def read(spark, fmt: str, directory: str, schema: str, key, options=None):
    """(changes, invalid, skipped) of a batch read: changes (kind, columns...,
    _seq) by _seq, invalid (line, reason), skipped (line, category, reason)."""
    res = read_changes(spark, str(FIXTURES / directory), format=fmt, schema=schema, primary_key=key,
                       options=options)
    cols = res.stream_schema.columns
    changes = sorted(((RowKind(r["_kind"]).short, *[plain(r[c]) for c in cols], r["_seq"])
                      for r in res.changes.collect()), key=lambda t: t[-1])
    invalid = sorted((r["line"], r["reason"]) for r in res.invalid.collect())
    skipped = sorted((r["line"], r["category"], r["reason"]) for r in res.skipped.collect())
    return changes, invalid, skipped


# ----------------------------------------------------------------- Canal

CANAL = "id BIGINT, name STRING, price DOUBLE"


def test_canal_init_reads_as_inserts_and_non_numeric_numbers_are_malformed_by_default(spark):
    changes, invalid, skipped = read(spark, "canal-json", "canal", CANAL, ["id"])
    assert changes == [
        ("+I", 1, "apple", 1.5, seq(canal_pos(1700000000000, 1, 0), A)),     # type INIT
        ("+I", 2, "pear", 2.0, seq(canal_pos(1700000000000, 1, 1), A)),
        ("+I", 9, "x", 9.0, seq(canal_pos(1700000001000, 2, 0), A)),
        ("+I", 8, "y", 8.0, seq(canal_pos(1700000002000, 3, 0), A)),
        ("-U", 1, "apple", 1.5, seq(canal_pos(1700000003000, 4, 0), B)),
        ("+U", 1, "apple", 1.75, seq(canal_pos(1700000003000, 4, 0), A)),
        ("-D", 2, "pear", 2.0, seq(canal_pos(1700000007000, 9, 0), B)),
    ]
    assert invalid == [(6, "malformed JSON: the record does not parse"),
                       (7, "field 'type': TRUNCATE cannot be expressed as row changes")]
    assert skipped == [(5, "ignored", "Canal type 'ALTER' (DDL) ignored"),
                       (8, "tombstone", "Kafka tombstone (empty or null value)")]


CANAL_META = (CANAL + ", origin_db STRING, origin_table STRING, pks ARRAY<STRING>, sql_type MAP<STRING, INT>, "
              "ingested TIMESTAMP, event TIMESTAMP")


def test_canal_filters_metadata_and_non_numeric_numbers(spark):
    options = from_table_options("canal-json", {
        "canal-json.database.include": "shop", "canal-json.table.include": r"products(_\d+)?",
        "json.allow-non-numeric-numbers": "true"},
        metadata=(("origin_db", "value.database"), ("origin_table", "value.table"), ("pks", "pk-names"),
                  ("sql_type", "value.sql-type"), ("ingested", "value.ingestion-timestamp"),
                  ("event", "event-timestamp")))
    changes, invalid, skipped = read(spark, "canal-json", "canal", CANAL_META, ["id"], options)
    types = {"id": 4, "name": 12, "price": 8}
    meta = lambda table, es, ts_ms, sql_type=None: ("shop", table, ["id"], sql_type,  # noqa: E731
                                                    ts(ts_ms), ts(es))
    assert changes == [
        ("+I", 1, "apple", 1.5, *meta("products", 1700000000000, 1700000000500, types),
         seq(canal_pos(1700000000000, 1, 0), A)),
        ("+I", 2, "pear", 2.0, *meta("products", 1700000000000, 1700000000500, types),
         seq(canal_pos(1700000000000, 1, 1), A)),
        ("-U", 1, "apple", 1.5, *meta("products", 1700000003000, 1700000003500, types),
         seq(canal_pos(1700000003000, 4, 0), B)),
        ("+U", 1, "apple", 1.75, *meta("products", 1700000003000, 1700000003500, types),
         seq(canal_pos(1700000003000, 4, 0), A)),
        ("+I", 3, "NaN pie", NAN, *meta("products", 1700000005000, 1700000005500),
         seq(canal_pos(1700000005000, 6, 0), A)),
        ("+I", 4, "inf", "-" + INF, *meta("products", 1700000005000, 1700000005500),
         seq(canal_pos(1700000005000, 6, 1), A)),
        ("-D", 2, "pear", 2.0, *meta("products_2024", 1700000007000, 1700000007500),
         seq(canal_pos(1700000007000, 9, 0), B)),
    ]
    assert invalid == []
    assert skipped == [
        (2, "ignored", r"table 'orders' not included by 'canal-json.table.include' = 'products(_\d+)?'"),
        (3, "ignored", "database 'other' not included by 'canal-json.database.include' = 'shop'"),
        (5, "ignored", "Canal type 'ALTER' (DDL) ignored"),
        # a filtered table's TRUNCATE is skipped, not invalid: Flink filters first
        (7, "ignored", r"table 'orders' not included by 'canal-json.table.include' = 'products(_\d+)?'"),
        (8, "tombstone", "Kafka tombstone (empty or null value)"),
    ]


# ----------------------------------------------------------------- Maxwell

MAXWELL_META = CANAL + ", db STRING, pkc ARRAY<STRING>, ingested TIMESTAMP, tbl STRING"


def test_maxwell_filter_metadata_and_non_numeric_numbers(spark):
    options = from_table_options("maxwell-json", {
        "maxwell-json.table.include": "products", "maxwell-json.allow-non-numeric-numbers": "true"},
        metadata=(("db", "value.database"), ("pkc", "value.primary-key-columns"),
                  ("ingested", "value.ingestion-timestamp"), ("tbl", "table")))
    changes, invalid, skipped = read(spark, "maxwell-json", "maxwell", MAXWELL_META, ["id"], options)
    assert changes == [
        ("+I", 1, "apple", 1.5, "shop", ["id"], ts(1700000000000), "products", seq(maxwell_ts(1700000000, 1), A)),
        ("-U", 1, "apple", 1.5, "shop", ["id"], ts(1700000002000), "products", seq(maxwell_ts(1700000002, 3), B)),
        ("+U", 1, "apple", INF, "shop", ["id"], ts(1700000002000), "products", seq(maxwell_ts(1700000002, 3), A)),
        ("-D", 1, "apple", 1.0, "other", None, ts(1700000004000), "products", seq(maxwell_ts(1700000004, 5), B)),
        # the string "Infinity" is a DOUBLE with or without the option
        ("-D", 1, "apple", INF, "shop", ["id"], ts(1700000005000), "products", seq(maxwell_ts(1700000005, 7), B)),
    ]
    assert invalid == []
    assert skipped == [
        (2, "ignored", "table 'orders' not included by 'maxwell-json.table.include' = 'products'"),
        (4, "ignored", "Maxwell type 'table-alter' ignored"),
        (6, "tombstone", "Kafka tombstone (empty or null value)"),
    ]


# ----------------------------------------------------------------- Debezium

DEBEZIUM_META = (CANAL + ", tbl STRING, db STRING, sch STRING, ingested TIMESTAMP, source_ts TIMESTAMP, "
                 "envelope_schema STRING, props MAP<STRING, STRING>")


def test_debezium_filter_every_metadata_key_schema_included_and_tombstones(spark):
    options = FormatOptions(table_include="products", allow_non_numeric_numbers=True, metadata=(
        ("tbl", "source.table"), ("db", "source.database"), ("sch", "source.schema"),
        ("ingested", "ingestion-timestamp"), ("source_ts", "source.timestamp"), ("envelope_schema", "schema"),
        ("props", "source.properties")))
    changes, invalid, skipped = read(spark, "debezium-json", "debezium", DEBEZIUM_META, ["id"], options)

    def meta(source_ms: int, ingest_ms: int, position: int, schema=None):
        props = {"connector": "postgresql", "db": "shop", "lsn": str(position), "schema": "public",
                 "table": "products", "ts_ms": str(source_ms)}
        return ("products", "shop", "public", ts(ingest_ms), ts(source_ms), schema, props)

    envelope = '{"fields":[],"name":"shop.public.products.Envelope","type":"struct"}'
    assert changes == [
        ("+I", 1, "apple", 1.5, *meta(1700000000000, 1700000000100, 100), seq(lsn(100), A)),
        # schema-included envelope: the payload is read, the schema is metadata
        ("-U", 1, "apple", 1.5, *meta(1700000002000, 1700000002100, 120, envelope), seq(lsn(120), B)),
        ("+U", 1, "apple", NAN, *meta(1700000002000, 1700000002100, 120, envelope), seq(lsn(120), A)),
        ("-D", 1, "apple", 2.0, *meta(1700000003000, 1700000003100, 130), seq(lsn(130), B)),
    ]
    assert invalid == []
    assert skipped == [
        (2, "ignored", "table 'orders' not included by 'debezium-json.table.include' = 'products'"),
        (4, "tombstone", "Kafka tombstone (empty or null value)"),
        # an unknown op of a filtered table is skipped, not invalid
        (6, "ignored", "table 'orders' not included by 'debezium-json.table.include' = 'products'"),
    ]


# ----------------------------------------------------------------- no silent value changes

VALUES = "id BIGINT, n BIGINT, i INT, d DECIMAL(10,2), b BOOLEAN"


def test_a_value_that_does_not_fit_its_column_is_a_dead_letter_naming_the_field(spark):
    changes, invalid, skipped = read(spark, "debezium-json", "values", VALUES, ["id"])
    assert changes == [
        ("+I", 1, 50, 7, Decimal("12.34"), True, seq(lsn(10), A)),
        # an exponent that is a whole number, the extremes of the types
        ("+I", 7, 50, -2147483648, Decimal("-99999999.99"), False, seq(lsn(70), A)),
        ("+I", 12, 50, 7, Decimal("12.34"), True, seq(lsn(120), A)),    # 50.000: a whole number
    ]
    assert invalid == [
        (2, "field 'n': value 50.5 is not a BIGINT (in 'after')"),                  # was 50
        (3, "field 'i': value 3000000000 is not an INT (in 'after')"),
        (4, "field 'd': value 12.345 is not a DECIMAL(10,2) (in 'after')"),         # was 12.35
        (5, "field 'd': value \"123456789.5\" is not a DECIMAL(10,2) (in 'after')"),
        (6, "field 'n': value true is not a BIGINT (in 'after')"),                  # was 1
        (8, "field 'n': value 9223372036854775808 is not a BIGINT (in 'after')"),
        (9, "field 'b': value \"x\" is not a BOOLEAN (in 'after')"),
        # fractions below a DOUBLE's precision (were 1 and 9007199254740993)
        (10, "field 'n': value 1.0000000000000000001 is not a BIGINT (in 'after')"),
        (11, "field 'n': value 9007199254740993.5 is not a BIGINT (in 'after')"),
    ]
    assert skipped == []


def test_csv_decimal_too_many_digits_is_a_dead_letter(spark, tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "c-1.csv").write_text("op,id,d\n+I,1,12.34\n+I,2,12.345\n+I,3,1.5e1\n")
    res = read_changes(spark, str(tmp_path / "in"), format="changelog", changelog_file_format="csv",
                       schema="id BIGINT, d DECIMAL(10,2)", primary_key="id")
    assert sorted((r["id"], r["d"]) for r in res.changes.collect()) == [(1, Decimal("12.34")),
                                                                       (3, Decimal("15.00"))]
    assert sorted((r["line"], r["reason"]) for r in res.invalid.collect()) == [
        (3, "field 'd': value \"12.345\" is not a DECIMAL(10,2) (in record)")]


# ----------------------------------------------------------------- options


def test_table_options_map_to_format_options():
    o = from_table_options("canal-json", {"canal-json.ignore-parse-errors": "true",
                                          "json.ignore-parse-errors": "false",
                                          "canal-json.table.include": "t.*"})
    assert (o.ignore_parse_errors, o.table_include, o.database_include) == (True, "t.*", None)
    assert from_table_options("json", {"json.ignore-parse-errors": "TRUE"}).ignore_parse_errors
    with pytest.raises(ValueError, match=r"option 'debezium-json.ignore-parse-errors': expected 'true' or 'false'"):
        from_table_options("debezium-json", {"debezium-json.ignore-parse-errors": "yes"})
    with pytest.raises(ValueError, match=r"unknown metadata key 'value.source.tbl' for format 'debezium-json'"):
        from_table_options("debezium-json", {}, metadata=(("t", "value.source.tbl"),))
    with pytest.raises(ValueError, match="table.include: '\\(' is not a regular expression"):
        FormatOptions(table_include="(")


def test_ignore_parse_errors_marks_dead_letters(spark):
    res = read_changes(spark, str(FIXTURES / "values"), format="debezium-json", schema=VALUES, primary_key="id",
                       options=FormatOptions(ignore_parse_errors=True))
    from spark_changelog.model import METRICS_COL
    payloads = [r[0] for r in res.rows.where("_kind = -1").select(METRICS_COL).collect()]
    assert len(payloads) == 9 and all('"ignored":true' in p for p in payloads)


# ----------------------------------------------------------------- Debezium's type encodings

ENCODINGS = ("id BIGINT, amount DECIMAL(10,2), rate DECIMAL(20,6), d DATE, ts_ms TIMESTAMP, ts_us TIMESTAMP, "
             "ts_ns TIMESTAMP, tz TIMESTAMP")
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def us(n: int) -> datetime:
    """A TIMESTAMP value as PySpark returns it (naive local time) from epoch µs."""
    return (EPOCH + timedelta(microseconds=n)).astimezone().replace(tzinfo=None)


def test_debezium_decimals_dates_and_timestamps_by_schema_or_declared_type(spark):
    changes, invalid, skipped = read(spark, "debezium-json", "encodings", ENCODINGS, ["id"])
    t_ms, t_us, tz = us(1704067200123000), us(1704067200123456), us(1704067200123456)
    day = date(2024, 1, 1)
    assert changes == [
        # schema: Decimal (scale 2), VariableScaleDecimal, Date, Timestamp, MicroTimestamp, NanoTimestamp, Zoned
        ("+I", 1, Decimal("12.34"), Decimal("123.456000"), day, t_ms, t_us, t_us, tz, seq(lsn(10), A)),
        # no schema: a base64 string in a DECIMAL column has the column's scale; "5.5" is a number
        ("+I", 2, Decimal("-12.34"), Decimal("5.500000"), day, None, None, None, tz, seq(lsn(20), A)),
        ("+I", 5, Decimal("123.45"), None, day, t_ms, t_us, t_us, tz, seq(lsn(50), A)),
        ("+I", 6, Decimal("12.34"), None, day, None, None, None, tz, seq(lsn(60), A)),
        # the extremes: the smallest DECIMAL(10,2), the day and the microsecond before 1970
        ("+I", 8, Decimal("-99999999.99"), None, date(1969, 12, 31), us(-1000), us(-1), us(-1), tz,
         seq(lsn(80), A)),
    ]
    assert invalid == [
        # an epoch number without schema could be ms, µs or ns: debezium-json.timestamp.unit says which
        (3, "field 'ts_us': value 1704067200123456 is not a TIMESTAMP (expected an ISO-8601 string) "
            "(in 'after')"),
        # nanoseconds a TIMESTAMP (µs) would drop
        (4, "field 'ts_ns': value 1704067200123456789 is not a TIMESTAMP (expected an ISO-8601 string) "
            "(in 'after')"),
        # 10^20 / 100 has more digits than DECIMAL(10,2)
        (7, "field 'amount': value \"BWvHXi1jEAAA\" is not a DECIMAL(10,2) (in 'after')"),
    ]


def test_debezium_timestamp_unit_option_reads_epoch_numbers_without_schema(spark):
    changes, invalid, _ = read(spark, "debezium-json", "encodings", ENCODINGS, ["id"],
                               from_table_options("debezium-json", {"debezium-json.timestamp.unit": "micros"}))
    assert [c for c in changes if c[1] == 3] == [
        ("+I", 3, Decimal("12.34"), Decimal("-7.000000"), date(2024, 1, 1), None, us(1704067200123456), None, None,
         seq(lsn(30), A))]
    assert [line for line, _ in invalid] == [4, 7]
