"""Placing rows on chosen partitions: the Python hash equals Spark's."""
import pandas as pd


def test_key_group_ids_spread_over_shuffle_partitions(spark):
    """The packed key groups' ids land on distinct shuffle partitions (Spark's
    hash partitioner: ``pmod(hash(id), partitions)``), so every core gets a
    share of the operator's work; the Python hash equals Spark's."""
    from pyspark.sql import functions as F
    from spark_changelog.model.partitioning import murmur3_int, spread_group_ids
    ints = [-2**31, -7, -1, 0, 1, 2, 12, 2**31 - 1]
    got = spark.createDataFrame([(i,) for i in ints], "i INT").select(F.hash("i")).collect()
    assert [r[0] for r in got] == [murmur3_int(i) for i in ints]
    for groups, partitions in [(2, 2), (4, 2), (4, 4), (8, 2)]:
        ids = spread_group_ids(groups)
        rows = spark.createDataFrame([(i,) for i in ids], "kg INT").select(
            F.expr(f"pmod(hash(kg), {partitions})").alias("p")).collect()
        counts = pd.Series([r.p for r in rows]).value_counts().sort_index().tolist()
        assert counts == [groups // partitions] * partitions, (groups, partitions, ids)


def test_default_key_groups_follow_the_state_partitions():
    """Flink's rule (1.5 x the parallelism, a power of two) between 32 and
    32768 (docs/runtime.md, "Why key groups"): never below the partitions."""
    from spark_changelog.model.partitioning import default_key_groups
    assert [default_key_groups(p) for p in (1, 2, 4, 21, 22, 40, 200, 256, 1000, 100_000)] == \
        [32, 32, 32, 32, 64, 64, 512, 512, 2048, 32768]
    assert all(default_key_groups(p) >= p for p in range(1, 20_000, 97))
