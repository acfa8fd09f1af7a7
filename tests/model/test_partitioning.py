"""Placing rows on chosen partitions: the Python hash equals Spark's."""
import numpy as np
import pandas as pd


def test_key_group_ids_spread_over_shuffle_partitions(spark):
    """The packed key groups' ids land on distinct shuffle partitions (Spark's
    hash partitioner: ``pmod(hash(id), partitions)``), so every core gets a
    share of the operator's work; the Python hash equals Spark's."""
    from pyspark.sql import functions as F
    from spark_changelog.model.partitioning import spread_group_ids
    from spark_changelog.model.spark_hash import hash_ints
    ints = [-2**31, -7, -1, 0, 1, 2, 12, 2**31 - 1]
    got = spark.createDataFrame([(i,) for i in ints], "i INT").select(F.hash("i")).collect()
    assert [r[0] for r in got] == hash_ints(np.array(ints)).tolist()
    # (32, 2): a keyed operator's default on local[2]; (512, 256): on a cluster
    for groups, partitions in [(2, 2), (4, 2), (4, 4), (8, 2), (32, 2), (32, 4), (512, 256)]:
        ids = spread_group_ids(groups)
        rows = spark.createDataFrame([(i,) for i in ids], "kg INT").select(
            F.expr(f"pmod(hash(kg), {partitions})").alias("p")).collect()
        counts = pd.Series([r.p for r in rows]).value_counts().sort_index().tolist()
        assert counts == [groups // partitions] * partitions, (groups, partitions, ids)


def test_default_key_groups_follow_the_state_partitions():
    """At least 1.5 x the parallelism and 32, a multiple of the partitions,
    at most 32768 (docs/runtime.md, "Why key groups"): never below the
    partitions, and with the spread ids every partition gets as many key
    groups as any other."""
    from spark_changelog.model.partitioning import default_key_groups, spread_group_ids
    from spark_changelog.model.spark_hash import hash_ints
    assert [default_key_groups(p) for p in (1, 2, 3, 4, 21, 22, 40, 200, 256, 1000, 100_000)] == \
        [32, 32, 33, 32, 42, 44, 80, 400, 512, 2000, 32768]
    assert all(default_key_groups(p) >= p for p in range(1, 20_000, 97))
    for partitions in list(range(1, 70)) + [96, 100, 200, 256, 300]:
        groups = default_key_groups(partitions)
        per_partition = [0] * partitions
        for h in hash_ints(np.array(spread_group_ids(groups))).tolist():
            per_partition[h % partitions] += 1
        assert per_partition == [groups // partitions] * partitions, partitions
