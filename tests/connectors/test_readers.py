"""CDC readers (spark_changelog.connectors, docs/semantics.md, sections 1-2).

Inputs are the files under tests/fixtures/cdc/; expected rows are written here as
data: (kind, user columns..., _seq) ordered by _seq.  Expected ``_seq`` values are
computed with the bit layout documented in ``cdc_json`` (re-implemented below in
plain Python, so a change of the encoding fails these tests).
"""
from __future__ import annotations

import json
import os
import shutil
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_changelog.connectors.canal import read_canal
from spark_changelog.connectors.cdc_json import (
    InvalidChangeError,
    ReadResult,
    first_invalid,
    raise_if_invalid,
    read_changes,
)
from spark_changelog.connectors.changelog_files import read_changelog
from spark_changelog.connectors.dead_letter import count_dead_letter, read_dead_letter, write_dead_letter
from spark_changelog.connectors.debezium import read_debezium
from spark_changelog.connectors.maxwell import read_maxwell
from spark_changelog.model.rowkind import RowKind

FIXTURES = Path(__file__).parents[1] / "fixtures" / "cdc"
PRODUCTS = "id BIGINT, name STRING, price DOUBLE"


# ----------------------------------------------------------------- expected _seq layout


def seq(position: int, phase: int) -> int:
    return position * 2 + phase


def lsn(value: int) -> int:
    return value


def binlog(file_no: int, pos_plus_row: int) -> int:
    return (file_no << 34) | pos_plus_row


def ts_line(ts_ms: int, line: int) -> int:
    return (ts_ms << 20) | line


def file_line(file_no: int, line: int) -> int:
    return (file_no << 28) | line


def canal_pos(es_ms: int, line: int, index: int) -> int:
    return ((es_ms // 1000) << 28) | (line << 8) | index


def maxwell_pos(file_no: int, offset: int, xoffset: int) -> int:
    return (file_no << 42) | (offset << 10) | xoffset


def maxwell_ts(ts: int, line: int) -> int:
    return (ts << 28) | line


B, A = 0, 1  # phase of the before / after image


def utc(*args) -> datetime:
    """A UTC wall-clock time as PySpark returns TIMESTAMP values (naive, local time)."""
    return datetime.fromtimestamp(datetime(*args, tzinfo=timezone.utc).timestamp())


# ----------------------------------------------------------------- helpers


def outputs(res: ReadResult) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """(changes, invalid, skipped) of a batch read, with one Spark job.

    changes: (kind, user columns..., _seq) ordered by _seq; invalid: (line, reason);
    skipped: (line, category, reason), both ordered by (file, line).  Values go
    through JSON: decimals and doubles come back as Decimal (equal to the floats
    of the expectations), timestamps as ISO strings.
    """
    parts: dict[str, list[dict]] = {"changes": [], "invalid": [], "skipped": []}
    for part, row in _all_outputs(res).collect():
        parts[part].append(json.loads(row, parse_float=Decimal))
    cols = res.stream_schema.columns
    changes = [(RowKind(r["_kind"]).short, *[r.get(c) for c in cols], r["_seq"])
               for r in sorted(parts["changes"], key=lambda r: r["_seq"])]
    by_place = lambda r: (r["file"], r["line"])  # noqa: E731
    invalid = [(r["line"], r["reason"]) for r in sorted(parts["invalid"], key=by_place)]
    skipped = [(r["line"], r["category"], r["reason"]) for r in sorted(parts["skipped"], key=by_place)]
    return changes, invalid, skipped


def _all_outputs(res: ReadResult):
    """The three outputs of a read as one frame of (part, JSON row)."""
    parts = [res.changes.selectExpr("'changes' AS part", "to_json(struct(*)) AS row"),
             res.invalid.selectExpr("'invalid' AS part", "to_json(struct(*)) AS row"),
             res.skipped.selectExpr("'skipped' AS part", "to_json(struct(*)) AS row")]
    return parts[0].unionByName(parts[1]).unionByName(parts[2])


def copy_dir(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ----------------------------------------------------------------- Debezium


def test_debezium_inserts_updates_deletes_snapshot_schemas_tombstones(spark):
    res = read_debezium(spark, str(FIXTURES / "debezium" / "changes"), PRODUCTS, ["id"])
    changes, invalid, skipped = outputs(res)
    assert changes == [
        ("+I", 1, "apple", 1.5, seq(lsn(24023128), A)),       # op r (snapshot)
        ("+I", 2, "pear", 2.0, seq(lsn(24023200), A)),        # op c
        ("-U", 1, "apple", 1.5, seq(lsn(24023300), B)),       # op u
        ("+U", 1, "apple", 1.75, seq(lsn(24023300), A)),
        ("-D", 2, "pear", 2.0, seq(lsn(24023400), B)),        # op u changing the key, schemas enabled
        ("+I", 3, "pear", 2.0, seq(lsn(24023400), A)),
        ("-D", 1, "apple", 1.75, seq(lsn(24023500), B)),      # op d
    ]
    assert invalid == []
    assert skipped == [
        (4, "tombstone", "Kafka tombstone (empty or null value)"),
        (7, "tombstone", "Kafka tombstone (empty or null value)"),
        (8, "tombstone", "Kafka tombstone (empty or null value)"),
        (9, "ignored", "Debezium op 'm' (not a row change)"),
    ]
    assert res.tombstones_skipped == 3
    assert res.ignored_skipped == 1


def test_debezium_result_schema(spark):
    res = read_changes(spark, str(FIXTURES / "debezium" / "changes"), format="debezium-json",
                       schema=PRODUCTS, primary_key="id")
    assert [(f.name, f.dataType.simpleString()) for f in res.changes.schema.fields] == [
        ("id", "bigint"), ("name", "string"), ("price", "double"), ("_kind", "tinyint"), ("_seq", "bigint")]
    assert [(f.name, f.dataType.simpleString()) for f in res.invalid.schema.fields] == [
        ("raw", "string"), ("file", "string"), ("line", "bigint"), ("reason", "string")]
    assert res.stream_schema.primary_key == ("id",)


def test_debezium_positions(spark):
    # file mixed-000042.json: the fallback position uses the file number 42
    res = read_debezium(spark, str(FIXTURES / "debezium" / "positions"), "id BIGINT", ["id"])
    changes, invalid, skipped = outputs(res)
    assert changes == [
        ("+I", 13, seq(file_line(42, 4), A)),                  # no position at all: file number + line
        ("+I", 10, seq(binlog(3, 154 + 2), A)),                # MySQL: mysql-bin.000003, pos 154, row 2
        ("-U", 10, seq(binlog(4, 4), B)),
        ("+U", 10, seq(binlog(4, 4), A)),
        ("+I", 11, seq(ts_line(1700000000000, 2), A)),         # ts_ms + line
        ("+I", 12, seq(ts_line(1700000000000, 3), A)),         # source.ts_ms + line: equal ts keep file order
    ]


def test_debezium_bad_input_reasons(spark):
    res = read_debezium(spark, str(FIXTURES / "debezium" / "bad"), PRODUCTS + ", ts TIMESTAMP", ["id"])
    changes, invalid, skipped = outputs(res)
    assert changes == [
        ("+I", 1, "ok", 1.0, "2024-01-02T03:04:05.000Z", seq(lsn(100), A)),
    ]
    assert invalid == [
        (2, "field 'price': value \"abc\" is not a DOUBLE (in 'after')"),
        (3, "field 'id': primary key is missing or null (in 'after')"),
        (4, "field 'op': unknown value \"x\" (expected c, r, u or d)"),
        (5, "malformed JSON: the record does not parse"),
        (6, "field 'after': missing or null for op 'c'"),
        (7, "field 'before': missing or null for op 'd'"),
        (8, "field 'before': missing or null for op 'u' (PostgreSQL: set REPLICA IDENTITY FULL)"),
        (9, "field 'source.lsn': value 4611686018427387904 is outside the range of the _seq encoding "
            "(0 <= value < 2^62)"),
        (10, "field 'ts': value 1700000000000 is not a TIMESTAMP (expected an ISO-8601 string) (in 'after')"),
        (11, "field 'op': truncate events ('t') cannot be expressed as row changes"),
        (12, "field 'id': value \"twelve\" is not a BIGINT (in 'after')"),
        (13, "malformed record: not a JSON object"),
        (14, "field 'source.lsn': value \"zz\" is not a BIGINT"),
        (16, "field 'op': missing"),
    ]
    assert skipped == [(15, "ignored", "Debezium schema change event")]
    raw, file = res.invalid.where("line = 2").select("raw", "file").first()
    assert raw.startswith('{"before":null,"after":{"id":2,"name":"x","price":"abc"}')
    assert file.endswith("debezium/bad/bad-000001.json")


def test_strict_batch_names_first_file_line_and_field(spark, tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    good = '{"op":"c","after":{"id":1,"price":1.0},"source":{"lsn":1}}'
    (d / "b-000002.json").write_text('{"op":"c","after":{"id":2,"price":"dear"},"source":{"lsn":9}}\n')
    (d / "a-000001.json").write_text(
        f'{good}\n{good}\n{{"op":"c","after":{{"id":3,"price":"cheap"}},"source":{{"lsn":3}}}}\n')
    with pytest.raises(InvalidChangeError) as err:
        read_changes(spark, str(d), format="debezium-json", schema="id BIGINT, price DOUBLE",
                     primary_key=["id"], strict=True)
    message = str(err.value)
    assert "a-000001.json line 3: field 'price': value \"cheap\" is not a DOUBLE (in 'after')" in message
    assert err.value.line == 3 and err.value.file.endswith("a-000001.json")
    # not strict: both bad records are reported, nothing is raised
    res = read_changes(spark, str(d), format="debezium-json", schema="id BIGINT, price DOUBLE", primary_key=["id"])
    assert [(Path(f).name, n) for f, n in res.invalid.select("file", "line").orderBy("file").collect()] == [
        ("a-000001.json", 3), ("b-000002.json", 1)]


def test_schema_is_required_and_validated(spark):
    with pytest.raises(ValueError, match="needs schema="):
        read_changes(spark, str(FIXTURES / "canal"), format="canal-json", schema=None)
    with pytest.raises(ValueError, match="unknown CDC format"):
        read_changes(spark, str(FIXTURES / "canal"), format="ogg-json", schema=PRODUCTS)
    with pytest.raises(ValueError, match="not among columns"):
        read_changes(spark, str(FIXTURES / "canal"), format="canal-json", schema=PRODUCTS, primary_key=["sku"])
    with pytest.raises(ValueError, match="reserved"):
        read_changes(spark, str(FIXTURES / "canal"), format="canal-json", schema="id BIGINT, _seq BIGINT")
    with pytest.raises(ValueError, match="metadata"):
        read_changes(spark, str(FIXTURES / "changelog" / "json"), format="changelog", schema="id INT, op STRING")


# ----------------------------------------------------------------- Canal


def test_canal(spark):
    es = 1589373515000
    res = read_canal(spark, str(FIXTURES / "canal"), "id INT, name STRING, price DECIMAL(10,2)", ["id"])
    d = Decimal
    changes, invalid, skipped = outputs(res)
    assert changes == [
        ("+I", 1, "apple", d("1.50"), seq(canal_pos(es, 1, 0), A)),
        ("+I", 2, "pear", d("2.00"), seq(canal_pos(es, 1, 1), A)),
        ("-U", 1, "apple", d("1.50"), seq(canal_pos(es + 1000, 2, 0), B)),   # data overlaid with old
        ("+U", 1, "apple", d("1.75"), seq(canal_pos(es + 1000, 2, 0), A)),
        ("-D", 2, "pear", d("2.00"), seq(canal_pos(es + 2000, 3, 0), B)),    # key changed: -D/+I
        ("+I", 3, "pear", d("2.00"), seq(canal_pos(es + 2000, 3, 0), A)),
        ("-D", 1, "apple", d("1.75"), seq(canal_pos(es + 3000, 4, 0), B)),
    ]
    assert invalid == [
        (6, "field 'price': value \"abc\" is not a DECIMAL(10,2) (in data[0]); "
            "field 'id': primary key is missing or null (in data[1])"),
        (7, "field 'price': value \"cheap\" is not a DECIMAL(10,2) (in old[0])"),
        (8, "field 'type': TRUNCATE cannot be expressed as row changes"),
        (9, "field 'type': unknown value \"UPSERT\" (expected INSERT, INIT, UPDATE or DELETE)"),
    ]
    assert skipped == [(5, "ignored", "Canal type 'CREATE' (DDL) ignored")]


# ----------------------------------------------------------------- Maxwell


def test_maxwell(spark):
    res = read_maxwell(spark, str(FIXTURES / "maxwell"), "id INT, name STRING, price DOUBLE", ["id"])
    changes, invalid, skipped = outputs(res)
    assert changes == [
        ("+I", 1, "apple", 1.5, seq(maxwell_pos(3, 1000, 0), A)),      # bootstrap-insert
        ("+I", 2, "pear", 2.0, seq(maxwell_pos(3, 1234, 0), A)),
        ("-U", 1, "apple", 1.5, seq(maxwell_pos(3, 1300, 0), B)),      # data overlaid with old
        ("+U", 1, "apple", 1.75, seq(maxwell_pos(3, 1300, 0), A)),
        ("-D", 2, "pear", 2.0, seq(maxwell_pos(3, 1300, 1), B)),       # key changed, xoffset 1
        ("+I", 3, "pear", 2.0, seq(maxwell_pos(3, 1300, 1), A)),
        ("-D", 1, "apple", 1.75, seq(maxwell_pos(4, 120, 0), B)),
        ("+I", 20, "no position", 3.0, seq(maxwell_ts(1449786318, 13), A)),
    ]
    assert invalid == [
        (9, "field 'id': value \"eight\" is not an INT (in 'data')"),
        (10, "field 'id': primary key is missing or null (in 'old')"),
        (11, "field 'type': unknown value \"replace\" (expected insert, update or delete)"),
        (12, "field 'position': value \"nowhere\" is not 'binlog-file.N:offset'"),
    ]
    assert [(n, c) for n, c, _ in skipped] == [(1, "ignored"), (3, "ignored"), (8, "ignored")]


# ----------------------------------------------------------------- changelog files


def test_changelog_json_with_seq_column(spark):
    res = read_changelog(spark, str(FIXTURES / "changelog" / "json"), "id INT, name STRING", ["id"],
                         seq_column="seq")
    changes, invalid, skipped = outputs(res)
    assert changes == [
        ("+I", 1, "apple", 10), ("-U", 1, "apple", 11), ("+U", 1, "Apple", 12), ("-D", 1, "Apple", 13)]
    assert invalid == [
        (6, "field 'op': unknown row kind \"+X\" (expected +I, -U, +U, -D or INSERT, UPDATE_BEFORE, "
            "UPDATE_AFTER, DELETE)"),
        (7, "field 'id': value \"two\" is not an INT (in record)"),
        (8, "field 'seq': missing or null"),
        (9, "field 'op': missing or null"),
    ]
    assert skipped == [(5, "tombstone", "Kafka tombstone (empty or null value)")]


def test_changelog_csv_header_and_line_sequence(spark):
    res = read_changelog(spark, str(FIXTURES / "changelog" / "csv"), "id INT, name STRING", ["id"],
                         changelog_file_format="csv")
    f = 1  # log-000001.csv
    changes, invalid, skipped = outputs(res)
    assert changes == [
        ("+I", 1, "apple", seq(file_line(f, 2), A)),
        ("-U", 1, "apple, red", seq(file_line(f, 3), B)),
        ("+U", 1, "Apple", seq(file_line(f, 4), A)),
        ("-D", 2, "pear", seq(file_line(f, 6), B)),
        ("+I", 3, None, seq(file_line(f, 7), A)),
    ]
    assert invalid == [(8, "field 'id': value \"three\" is not an INT (in record)")]
    assert skipped == [(5, "tombstone", "empty line")]


def test_changelog_parquet_infers_user_columns(spark, tmp_path):
    d = tmp_path / "pq"
    d.mkdir()
    table = pa.table({"id": pa.array([1, 1, 1, None], pa.int32()), "name": ["a", "a", "b", "x"],
                      "op": ["+I", "-U", "+U", "+I"]})
    pq.write_table(table, d / "log-000005.parquet")
    res = read_changes(spark, str(d), format="changelog", changelog_file_format="parquet", primary_key=["id"])
    assert res.stream_schema.columns == ("id", "name")
    changes, invalid, skipped = outputs(res)
    assert changes == [
        ("+I", 1, "a", seq(file_line(5, 1), A)), ("-U", 1, "a", seq(file_line(5, 2), B)),
        ("+U", 1, "b", seq(file_line(5, 3), A))]
    assert invalid == [(4, "field 'id': primary key is missing or null (in record)")]
    assert res.invalid.first()["raw"] == '{"name":"x","op":"+I"}'


def test_changelog_parquet_with_wider_file_types_checks_every_value(spark, tmp_path):
    """Issue 21: an int64 file for INT and SMALLINT columns, a double file for
    a FLOAT column: values that fit are read, the others are dead letters
    naming the field (Spark's reader refuses the file, or wraps an int32 into
    a SMALLINT).  A DECIMAL column narrower than the file's is Spark's error."""
    d = tmp_path / "pq"
    d.mkdir()
    pq.write_table(pa.table({
        "id": pa.array([1, 2, 3, 4, 5], pa.int64()),
        "i": pa.array([7, 3_000_000_000, 7, 7, None], pa.int64()),
        "s": pa.array([-32768, 1, 40_000, 1, 1], pa.int32()),
        "f": pa.array([0.5, 0.5, 0.5, 0.1, float("nan")], pa.float64()),
        "op": ["+I"] * 5}), d / "log-000001.parquet")
    res = read_changes(spark, str(d), format="changelog", changelog_file_format="parquet",
                       schema="id INT, i INT, s SMALLINT, f FLOAT", primary_key=["id"])
    changes, invalid, _ = outputs(res)
    assert [c[:4] + (str(c[4]),) for c in changes] == [
        ("+I", 1, 7, -32768, "0.5"), ("+I", 5, None, 1, "NaN")]
    assert invalid == [(2, "field 'i': value 3000000000 is not an INT (in record)"),
                       (3, "field 's': value 40000 is not a SMALLINT (in record)"),
                       (4, "field 'f': value 0.1 is not a FLOAT (in record)")]
    pq.write_table(pa.table({"id": pa.array([1], pa.int64()), "op": ["+I"],
                             "d": pa.array([Decimal("12345678901234.5678")], pa.decimal128(20, 4))}),
                   d / "log-000001.parquet")
    res = read_changes(spark, str(d), format="changelog", changelog_file_format="parquet",
                       schema="id BIGINT, d DECIMAL(10, 2)", primary_key=["id"])
    with pytest.raises(Exception) as e:
        res.changes.collect()
    from spark_changelog.errors import as_user_error
    assert as_user_error(e.value).what == (
        f"{d}/log-000001.parquet: column 'd' is stored as FIXED_LEN_BYTE_ARRAY in the file and "
        "cannot be read as the table's DECIMAL(10,2) without changing values")


# ----------------------------------------------------------------- streaming


def test_streaming_yields_the_same_rows_as_batch(spark, tmp_path):
    debezium_dir = tmp_path / "debezium"
    debezium_dir.mkdir()
    for sub in ("changes", "positions"):
        for f in (FIXTURES / "debezium" / sub).iterdir():
            shutil.copy(f, debezium_dir / f.name)
    parquet_dir = tmp_path / "parquet"
    parquet_dir.mkdir()
    for n, ops in ((1, ["+I", "-U"]), (2, ["+U", "?"])):
        pq.write_table(pa.table({"id": pa.array([1, 1], pa.int32()), "name": ["a", "b"], "op": ops,
                                 "seq": pa.array([2 * n, 2 * n + 1], pa.int64())}), parquet_dir / f"p-{n}.parquet")
    cases = {
        "debezium": dict(path=str(debezium_dir), format="debezium-json", schema="id BIGINT, name STRING"),
        "canal": dict(path=str(FIXTURES / "canal"), format="canal-json", schema="id INT, price DECIMAL(10,2)"),
        "parquet": dict(path=str(parquet_dir), format="changelog", schema="id INT, name STRING",
                        changelog_file_format="parquet", seq_column="seq"),
        "csv": dict(path=str(FIXTURES / "changelog" / "csv"), format="changelog", schema="id INT, name STRING",
                    changelog_file_format="csv"),
    }
    queries = {}
    for name, kw in cases.items():
        res = read_changes(spark, primary_key=["id"], streaming=True, max_files_per_trigger=1, **kw)
        assert res.tombstones_skipped is None and res.changes.isStreaming
        queries[name] = (_all_outputs(res).writeStream.format("memory").queryName(f"readers_stream_{name}")
                         .option("checkpointLocation", str(tmp_path / "ck" / name))
                         .trigger(availableNow=True).start())
    for name, kw in cases.items():
        queries[name].awaitTermination(120)
        streamed = sorted(map(tuple, spark.table(f"readers_stream_{name}").collect()))
        batch = sorted(map(tuple, _all_outputs(read_changes(spark, primary_key=["id"], **kw)).collect()))
        assert streamed == batch, name
        assert {part for part, _ in batch} >= {"changes"}, name
    assert queries["debezium"].lastProgress["batchId"] == 1  # two files, one per micro-batch


def test_streaming_strict_and_raise_if_invalid(spark, tmp_path):
    d = copy_dir(FIXTURES / "debezium" / "bad", tmp_path / "bad")
    res = read_changes(spark, str(d), format="debezium-json", schema=PRODUCTS, primary_key=["id"],
                       streaming=True, strict=True)
    seen: list[str] = []

    def check(batch, batch_id):
        try:
            raise_if_invalid(batch)
        except InvalidChangeError as e:
            seen.append(str(e))
            raise

    strict_changes = (res.changes.writeStream.format("memory").queryName("readers_strict")
                      .option("checkpointLocation", str(tmp_path / "ck1")).trigger(availableNow=True).start())
    per_batch = (res.invalid.writeStream.foreachBatch(check)
                 .option("checkpointLocation", str(tmp_path / "ck2")).trigger(availableNow=True).start())
    for q in (strict_changes, per_batch):
        with pytest.raises(Exception) as err:
            q.awaitTermination(120)
        assert "bad-000001.json line 2: field 'price': value \"abc\" is not a DOUBLE" in str(err.value)
    assert len(seen) == 1 and "bad-000001.json line 2" in seen[0]


def test_raise_if_invalid_accepts_pandas():
    frame = pd.DataFrame({"raw": ["{}", "x"], "file": ["f2", "f1"], "line": [1, 7],
                          "reason": ["field 'op': missing", "malformed JSON: the record does not parse"]})
    assert first_invalid(frame.iloc[0:0]) is None
    raise_if_invalid(frame.iloc[0:0])
    with pytest.raises(InvalidChangeError, match="f1 line 7: malformed JSON"):
        raise_if_invalid(frame)


# ----------------------------------------------------------------- dead letter


def test_dead_letter_is_idempotent_per_batch(spark, tmp_path):
    res = read_debezium(spark, str(FIXTURES / "debezium" / "bad"), PRODUCTS, ["id"])
    out = str(tmp_path / "dlq")
    assert count_dead_letter(out) == 0
    n = write_dead_letter(res.invalid, out, batch_id=0)
    assert n == 13  # the 14 bad lines of the fixture minus line 10 (no ts column here)
    frame = pd.DataFrame(read_dead_letter(out))
    assert list(frame.columns) == ["raw", "file", "line", "reason"]
    assert write_dead_letter(frame, out, batch_id=0) == n          # replay of batch 0 overwrites
    assert count_dead_letter(out) == n
    assert write_dead_letter(frame.iloc[:3], out, batch_id=1) == 3
    assert write_dead_letter(frame.iloc[:2], out) == 2                # no batch id: named by content
    assert write_dead_letter(frame.iloc[:2], out) == 2
    assert count_dead_letter(out) == n + 3 + 2
    assert write_dead_letter(frame.iloc[0:0], out, batch_id=1) == 0   # empty replay clears batch 1
    assert count_dead_letter(out) == n + 2
    assert sorted(os.listdir(out))[:1] == ["batch-000000000000.jsonl"]
    first = read_dead_letter(out)[0]
    assert first["line"] == 2 and first["reason"].startswith("field 'price'")


def test_temporal_strings_numeric_strings_bom(spark, tmp_path):
    d = tmp_path / "ts"
    d.mkdir()
    (d / "x-1.json").write_text(  # with a byte-order mark and CRLF
        '\ufeff{"op":"c","after":{"id":"7","at":"2024-05-06 07:08:09","day":"2024-05-06","n":"12.5"},"ts_ms":5}\r\n',
        encoding="utf-8")
    res = read_debezium(spark, str(d), "id INT, at TIMESTAMP, day DATE, n DOUBLE", ["id"])
    row = res.changes.first()
    assert row["id"] == 7 and row["n"] == 12.5
    assert row["at"] == utc(2024, 5, 6, 7, 8, 9)
    assert str(row["day"]) == "2024-05-06"
    assert row["_seq"] == seq(ts_line(5, 1), A)
