"""``spark_hash``: Spark's ``hash(...)`` and key groups computed in a Python
task equal Spark's own, for every type the line task packs."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from spark_changelog.model.spark_hash import key_groups, spark_hash, supports

STRINGS = ["", "a", "ab", "abc", "abcd", "abcde", "héllo", "日本語テキスト", "x" * 37]


def _table(n: int = 600) -> pa.Table:
    rng = np.random.default_rng(3)
    return pa.table({
        "i": pa.array(list(rng.integers(-2**31, 2**31, n - 3)) + [None, -2**31, 2**31 - 1], pa.int32()),
        "l": pa.array(list(rng.integers(-2**63, 2**63 - 1, n - 2, dtype=np.int64)) + [None, 0], pa.int64()),
        "d": pa.array(list(rng.normal(size=n - 4)) + [None, -0.0, float("nan"), float("inf")], pa.float64()),
        "b": pa.array([bool(x) for x in rng.integers(0, 2, n - 1)] + [None], pa.bool_()),
        # every length mod 4, multi-byte UTF-8 (bytes above 0x7f hash as negative ints), nulls
        "s": pa.array([None if i % 11 == 0 else STRINGS[i % len(STRINGS)] + str(i) * (i % 3)
                       for i in range(n)], pa.string()),
    })


def test_spark_hash_equals_sparks_hash_for_every_packed_type(spark):
    table = _table()
    df = spark.createDataFrame(table)
    for cols in (["i"], ["l"], ["d"], ["b"], ["s"], ["l", "s"], ["s", "i", "b", "d"]):
        expected = np.array([r[0] for r in df.selectExpr(f"hash({', '.join(cols)})").collect()], dtype=np.int32)
        assert spark_hash([table.column(c) for c in cols]).tolist() == expected.tolist(), cols


def test_key_groups_equal_sparks_pmod_of_the_hash(spark):
    table = _table(300)
    df = spark.createDataFrame(table)
    expected = [r[0] for r in df.selectExpr("pmod(hash(l, s), 32)").collect()]
    assert key_groups(table, ["l", "s"], 32).tolist() == expected


def test_other_types_are_not_hashed_here():
    assert not supports([pa.timestamp("us", tz="UTC")])
    assert key_groups(pa.table({"t": pa.array([1], pa.date32())}), ["t"], 8) is None
