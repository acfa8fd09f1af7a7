"""A DataFrame whose columns are NOT NULL (the key, ``_kind``, ``_seq``) runs
through every keyed operator (issue: pyarrow refused the operators' side rows,
whose data columns are null): each operator's output, written out as data."""
from __future__ import annotations

import pytest
from pyspark.sql.types import ByteType, LongType, StructField, StructType

from changelog_data import to_rows
from spark_changelog.api import ChangelogStream

SCHEMA = StructType([StructField("k", LongType(), False), StructField("v", LongType(), True),
                     StructField("_kind", ByteType(), False), StructField("_seq", LongType(), False)])
#: +I(1, 5), -U(1, 5), +U(1, null), +I(2, 7)
ROWS = [(1, 5, 0, 1), (1, 5, 1, 2), (1, None, 2, 3), (2, 7, 0, 4)]


@pytest.fixture(scope="module")
def stream(spark):
    df = spark.createDataFrame(ROWS, SCHEMA)
    return ChangelogStream.from_dataframe(df, primary_key="k", ordered=True)


def table(s, cols):
    """The final rows, sorted (the changelog's net effect)."""
    out = {}
    for kind, row in to_rows(s.collect(), cols):
        key = tuple(row)
        out[key] = out.get(key, 0) + (1 if kind in ("+I", "+U") else -1)
    return sorted(k for k, n in out.items() for _ in range(n))


def test_not_null_input_columns_through_keyed_operators(stream):
    assert table(stream.group_by("k").agg(n="COUNT(*)", s="SUM(v)"), ["k", "n", "s"]) \
        == [(1, 1, None), (2, 1, 7)]
    assert table(stream.normalize("k"), ["k", "v"]) == [(1, None), (2, 7)]
    assert table(stream.deduplicate("k", keep="last"), ["k", "v"]) == [(1, None), (2, 7)]
    assert table(stream.top_n(1, (), "k DESC"), ["k", "v"]) == [(2, 7)]
    joined = stream.join(stream.select(k="k", w="v"), on="k")
    assert table(joined, ["k", "v", "w"]) == [(1, None, None), (2, 7, 7)]
