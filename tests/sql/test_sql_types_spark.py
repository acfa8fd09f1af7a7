"""DATE, TIMESTAMP_LTZ, BYTES, ARRAY, MAP and ROW columns through keyed
operators on Spark streaming (state through the state store) to the print
sink and a Delta table (docs/sql.md, "Types"): each printed line as data."""
from __future__ import annotations

import datetime as dt
import io
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from spark_changelog.sql.runner import run_script
from spark_changelog.sql.script import parse_script

UTC = dt.timezone.utc
SCHEMA = pa.schema([("id", pa.int64()), ("d", pa.date32()), ("ts", pa.timestamp("us", tz="UTC")),
                    ("b", pa.binary()), ("arr", pa.list_(pa.int32())),
                    ("m", pa.map_(pa.string(), pa.int32())),
                    ("r", pa.struct([("a", pa.int32()), ("b", pa.string())])),
                    ("op", pa.string()), ("seq", pa.int64())])
ROW1 = (1, dt.date(2024, 1, 1), dt.datetime(2024, 1, 1, 10, tzinfo=UTC), b"\x00\x01", [1, 2],
        [("x", 1)], {"a": 1, "b": "p"})
ROWS = [(*ROW1, "+I", 0),
        (2, dt.date(2024, 1, 1), dt.datetime(2024, 1, 2, 10, tzinfo=UTC), b"\xff", None, None, None,
         "+I", 1),
        (*ROW1, "-U", 2),
        (1, dt.date(2024, 1, 3), dt.datetime(2024, 1, 3, 10, 0, 0, 500000, tzinfo=UTC), b"\x02", [3],
         [("y", 2)], {"a": 2, "b": "q"}, "+U", 3)]
COLS = "id BIGINT, d DATE, ts TIMESTAMP_LTZ(3), b BYTES, arr ARRAY<INT>, m MAP<STRING, INT>, " \
       "r ROW<a INT, b STRING>"


def test_nested_and_temporal_types_through_operators_print_and_delta(spark, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({c: [r[i] for r in ROWS] for i, c in enumerate(SCHEMA.names)},
                            schema=SCHEMA), src / "part-0.parquet")
    script = parse_script(f"""
CREATE TABLE s ({COLS}, PRIMARY KEY (id) NOT ENFORCED) WITH ('connector' = 'filesystem',
  'path' = '{src}', 'format' = 'parquet', 'changelog.kind-column' = 'op',
  'changelog.seq-column' = 'seq');
CREATE TABLE t ({COLS}, PRIMARY KEY (id) NOT ENFORCED) WITH ('connector' = 'delta', 'path' = '{tmp_path}/t');
CREATE TABLE by_day (d DATE, n BIGINT, first_ts TIMESTAMP_LTZ(3), max_b BYTES)
  WITH ('connector' = 'print', 'print-identifier' = 'day');
EXECUTE STATEMENT SET BEGIN
INSERT INTO t SELECT * FROM s;
INSERT INTO by_day SELECT d, COUNT(*), MIN(ts), MAX(b) FROM s GROUP BY d;
END;""", "types.sql")
    out = io.StringIO()
    run_script(spark, script, batch=False, checkpoint=str(tmp_path / "ck"), key_groups=2,
               show_progress=False, out=out)
    assert sorted(out.getvalue().splitlines()) == [
        "day> +I[2024-01-01, 1, 2024-01-02T10:00, [-1]]",
        "day> +I[2024-01-03, 1, 2024-01-03T10:00:00.500, [2]]"]
    js = subprocess.run([sys.executable, "-m", "spark_changelog.cli", "cat", str(tmp_path / "t"),
                         "--format", "json"], capture_output=True, text=True, check=True).stdout
    assert js.splitlines() == [
        '{"id":1,"d":"2024-01-03","ts":"2024-01-03T10:00:00.500000+00:00","b":"02","arr":[3],'
        '"m":{"y":2},"r":{"a":2,"b":"q"}}',
        '{"id":2,"d":"2024-01-01","ts":"2024-01-02T10:00:00+00:00","b":"ff","arr":null,"m":null,'
        '"r":null}']
