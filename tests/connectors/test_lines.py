"""Numbered lines over byte ranges (connectors/lines.py): however a file is
split, every line comes out once with its exact 1-based line number, with the
readers' normalisation (byte-order mark, CRLF, trailing blank lines)."""
from __future__ import annotations

import os

from hypothesis import given, settings, strategies as st

from spark_changelog.connectors import lines as L


class BytesFile:
    """The part of pyarrow's RandomAccessFile the range reader uses."""

    def __init__(self, data: bytes):
        self.data = data

    def read_at(self, n: int, offset: int) -> bytes:
        return self.data[offset:offset + n]


def read_all(data: bytes, split: int, batch_lines: int = 2) -> list[tuple[int, str, str]]:
    out = []
    schema = L.line_schema(True)
    for start in range(0, max(len(data), 1), split):
        for batch in L.lines_of_range(BytesFile(data), "file:/d/cdc-7.json", len(data), start,
                                      min(start + split, len(data)), True, schema, batch_lines=batch_lines):
            assert 0 < batch.num_rows <= batch_lines
            out += zip(batch.column(2).to_pylist(), batch.column(3).to_pylist(), batch.column(4).to_pylist())
    return out


def expected(data: bytes) -> list[tuple[int, str]]:
    text = data.decode()
    text = text[1:] if text.startswith("\ufeff") else text
    lines = text.replace("\r\n", "\n").split("\n")
    if text.endswith("\n"):
        lines.pop()
    if lines and lines[-1].endswith("\r"):
        lines[-1] = lines[-1][:-1]
    while lines and not lines[-1].strip(" \t\r\n"):
        lines.pop()
    return list(enumerate(lines, 1))


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.tuples(st.sampled_from(["{}", "a", "", "  ", "\r", "x\ry", "é€"]),
                                st.sampled_from(["\n", "\r\n"])), max_size=10),
       bom=st.booleans(), cut_last=st.booleans(), split=st.integers(1, 12), batch_lines=st.integers(1, 4))
def test_every_split_gives_each_line_once_with_its_number(parts, bom, cut_last, split, batch_lines):
    text = "".join(p + s for p, s in parts)
    if cut_last and text:
        text = text[:-1]
    data = (("\ufeff" if bom else "") + text).encode()
    got = read_all(data, split, batch_lines)
    assert [(n, raw) for n, raw, _ in got] == expected(data)
    first = expected(data)[0][1] if expected(data) else None
    assert all(h == first for _, _, h in got)


def test_file_number():
    assert L.file_number("file:/a/inventory.customers+0+0000000042.json") == 42
    assert L.file_number("file:/a/binlog-3.json") == 3
    assert L.file_number("file:/a/x.json.gz") == 0
    assert L.file_number("file:/a/x-1234567890123456789.json") == 1 << 62


def test_spark_reads_split_files_with_exact_line_numbers(spark, tmp_path):
    lines = [f'{{"n":{i},"pad":"{"x" * (i % 17)}"}}' for i in range(1, 501)]
    for name in ("a-1.json", "b-2.json"):
        with open(tmp_path / name, "w") as fh:
            fh.write("\n".join(lines) + "\n\n  \n")
    old = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "1000")   # ~15 ranges per file
    try:
        df = L.read_lines(spark, str(tmp_path))
        rows = df.selectExpr("file", "file_no", "line", "raw").collect()
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", old)
    got = sorted((os.path.basename(r["file"]), r["file_no"], r["line"], r["raw"]) for r in rows)
    assert got == sorted((name, no, i, raw) for name, no in (("a-1.json", 1), ("b-2.json", 2))
                         for i, raw in enumerate(lines, 1))


def test_a_files_ranges_go_to_consecutive_tasks(spark):
    """Each file is cut into one range per task and its ranges land on
    distinct tasks (Spark's hash partitioner on :func:`placement_sql`), so a
    micro-batch of two files keeps every task busy."""
    tasks = 4
    paths = [f"file:/data/cdc/customers-{i:04d}.json" for i in range(3)]
    rows = spark.createDataFrame([(p, n) for p in paths for n in range(tasks)], "path STRING, range_no INT")
    placed = rows.selectExpr("path", "range_no",
                             f"pmod(hash({L.placement_sql('path', 'range_no', tasks)}), {tasks}) AS task",
                             f"pmod(hash(path), {tasks}) AS first").collect()
    for r in placed:
        assert r.task == (r.first + r.range_no) % tasks
    for p in paths:
        assert sorted(r.task for r in placed if r.path == p) == list(range(tasks))


def test_split_size_cuts_a_file_into_one_range_per_task(spark):
    size = L.split_size_sql("length", 4, 128 << 20)
    got = spark.createDataFrame([(0,), (1000,), (8 << 20,), (52 << 20,), (1 << 30,)], "length BIGINT") \
        .selectExpr(f"{size} AS split").collect()
    assert [r.split for r in got] == [L.MIN_RANGE_BYTES, L.MIN_RANGE_BYTES, 2 << 20, 13 << 20, 128 << 20]


# ----------------------------------------------------------------- compressed files


def test_compressed_files_read_like_plain_ones_and_a_corrupt_one_is_one_dead_letter(spark, tmp_path):
    """.gz, .bz2, .zst, .xz and .deflate files are decompressed by extension
    (one range each): the Debezium reader gives the plain files' rows with the
    same _seq (file numbers ignore the extensions); a file that does not
    decompress is ONE invalid row, line 0, naming the file."""
    import bz2
    import gzip
    import lzma
    import zlib

    import pyarrow as pa

    from spark_changelog.connectors.debezium import read_debezium
    from test_readers import FIXTURES, PRODUCTS, outputs

    plain = FIXTURES / "debezium" / "changes"
    want = outputs(read_debezium(spark, str(plain), PRODUCTS, ["id"]))
    zstd = lambda b: pa.compress(b, "zstd", asbytes=True)  # noqa: E731
    packers = [(".gz", gzip.compress), (".bz2", bz2.compress), (".zst", zstd), (".xz", lzma.compress),
               (".deflate", zlib.compress)]
    files = sorted(plain.iterdir())
    for i, f in enumerate(files):            # each file with another codec
        ext, pack = packers[i % len(packers)]
        (tmp_path / "in").mkdir(exist_ok=True)
        (tmp_path / "in" / (f.name + ext)).write_bytes(pack(f.read_bytes()))
    assert outputs(read_debezium(spark, str(tmp_path / "in"), PRODUCTS, ["id"])) == want

    (tmp_path / "in" / "pg-000009.json.gz").write_bytes(b"\x1f\x8b\x08\x00 not really gzip" * 50)
    res = read_debezium(spark, str(tmp_path / "in"), PRODUCTS, ["id"])
    changes, invalid, _ = outputs(res)
    assert changes == want[0]
    assert invalid == [(0, "malformed JSON: the record does not parse")]
    raw, file = res.invalid.select("raw", "file").first()
    assert file.endswith("in/pg-000009.json.gz")
    assert raw.startswith("cannot decompress this file: .gz data is corrupt or not .gz (")
