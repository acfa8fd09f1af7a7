"""CDC from snapshots: successive full snapshots of a table as a changelog
(docs/operators.md, "CDC from snapshots").

Databricks' ``create_auto_cdc_from_snapshot_flow`` compares each snapshot of
a table with the one before it, key by key.  Here the comparison is one Spark
job over all snapshots at once: the snapshots are unioned with their position,
and a window per key, ordered by position, sees each key's row in the
previous and the next snapshot (``lag``/``lead``).  A key's row

* absent from the previous snapshot: ``+I`` at this snapshot's sequence;
* present and different: ``-U`` (the previous row) and ``+U`` (this row);
* absent from the next snapshot: ``-D`` (this row) at the next one's sequence.

Every snapshot is read once and no snapshot is ever held in the driver; the
rows of one key meet in one task of the window's shuffle.  The changelog's
``_seq`` is the snapshot's sequence (its Delta version, or the given value),
so the history of a key over snapshots has ``__START_AT`` at the snapshot
where a version first appeared.
"""
from __future__ import annotations

from typing import Optional, Sequence

from ..model import KIND_COL, SEQ_COL, RowKind

_POS = "__snapshot"


def snapshot_changelog(snapshots: Sequence, key: Sequence[str],
                       sequence: Optional[Sequence[int]] = None):
    """The changelog DataFrame (data columns, ``_kind``, ``_seq``) of the
    successive ``snapshots`` (DataFrames with the same columns, oldest first)
    keyed by ``key``; ``sequence``: each snapshot's sequence value (default
    0, 1, ...), increasing."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    snapshots = list(snapshots)
    if not snapshots:
        raise ValueError("no snapshots to compare")
    seqs = list(range(len(snapshots))) if sequence is None else [int(s) for s in sequence]
    if len(seqs) != len(snapshots) or any(b <= a for a, b in zip(seqs, seqs[1:])):
        raise ValueError(f"snapshot sequence values must increase, one per snapshot: {seqs}")
    columns = list(snapshots[0].columns)
    missing = [k for k in key if k not in columns]
    if missing:
        raise ValueError(f"key column(s) {missing} not among the snapshot's columns {columns}")
    for i, s in enumerate(snapshots[1:], 1):
        if sorted(s.columns) != sorted(columns):
            raise ValueError(f"snapshot {i} has columns {s.columns}, the first one {columns}")
    union = None
    for i, s in enumerate(snapshots):
        part = s.select(*columns).withColumn(_POS, F.lit(i))
        union = part if union is None else union.unionByName(part)
    seq_of = F.element_at(F.array(*[F.lit(v).cast("bigint") for v in seqs]), F.col(_POS) + 1)
    next_seq = F.element_at(F.array(*[F.lit(v).cast("bigint") for v in seqs]), F.col(_POS) + 2)
    per_key = Window.partitionBy(*key).orderBy(_POS)
    row = F.struct(*[F.col(c) for c in columns])
    union = (union.withColumn("__row", row)
             .withColumn("__prev", F.lag("__row").over(per_key))
             .withColumn("__prev_pos", F.lag(_POS).over(per_key))
             .withColumn("__next_pos", F.lead(_POS).over(per_key)))
    had = F.col("__prev_pos") == F.col(_POS) - 1
    last = len(snapshots) - 1

    def change(kind: RowKind, values, seq):
        return F.struct(values.alias("r"), F.lit(int(kind)).cast("tinyint").alias("k"),
                        seq.alias("s"))

    changes = F.array(
        F.when(~F.coalesce(had, F.lit(False)), change(RowKind.INSERT, F.col("__row"), seq_of)),
        F.when(had & ~F.col("__prev").eqNullSafe(F.col("__row")),
               change(RowKind.UPDATE_BEFORE, F.col("__prev"), seq_of)),
        F.when(had & ~F.col("__prev").eqNullSafe(F.col("__row")),
               change(RowKind.UPDATE_AFTER, F.col("__row"), seq_of)),
        F.when((F.col(_POS) < last)
               & ~F.coalesce(F.col("__next_pos") == F.col(_POS) + 1, F.lit(False)),
               change(RowKind.DELETE, F.col("__row"), next_seq)))
    out = union.select(F.explode(F.filter(changes, lambda c: c.isNotNull())).alias("c"))
    return out.select(*[F.col(f"c.r.{c}").alias(c) for c in columns],
                      F.col("c.k").alias(KIND_COL), F.col("c.s").alias(SEQ_COL))


def delta_snapshots(spark, path: str, versions: Optional[Sequence[int]] = None,
                    storage_options: Optional[dict] = None):
    """``(snapshots, versions)``: the table's state at each of ``versions``
    (default: every version), each read by Spark from the Parquet files that
    version lists (the Delta log is read here; the data never is)."""
    import pyarrow as pa
    from deltalake import DeltaTable
    latest = DeltaTable(path, storage_options=storage_options).version()
    versions = list(range(latest + 1)) if versions is None else [int(v) for v in versions]
    frames = []
    for v in versions:
        dt = DeltaTable(path, version=v, storage_options=storage_options)
        schema = pa.schema(dt.schema().to_arrow())
        files = dt.file_uris()
        if files:
            frames.append(_without_deleted_rows(spark, dt, spark.read.parquet(*files), schema.names))
        else:
            from pyspark.sql.pandas.types import from_arrow_schema
            frames.append(spark.createDataFrame([], from_arrow_schema(schema)))
    return frames, versions


def _without_deleted_rows(spark, dt, rows, names):
    """The rows of a version's files less those its deletion vectors delete
    (docs/sinks.md, "Updates and deletes: deletion vectors"): an anti join
    on (file name, row position in the file); the deleted positions come
    from delta-rs' selection vectors."""
    import numpy as np
    import pyarrow as pa
    from pyspark.sql import functions as F
    if "deletionVectors" not in (dt.protocol().reader_features or []):
        return rows.select(*names)
    deleted = [(r["filepath"].rsplit("/", 1)[-1], int(i))
               for r in pa.table(dt.deletion_vectors()).to_pylist()
               for i in np.flatnonzero(~np.asarray(r["selection_vector"], dtype=bool))]
    if not deleted:
        return rows.select(*names)
    dead = spark.createDataFrame(deleted, "__file string, __row long")
    located = rows.select(*names, F.element_at(F.split(F.col("_metadata.file_path"), "/"), -1).alias("__file"),
                          F.col("_metadata.row_index").alias("__row"))
    return located.join(F.broadcast(dead), ["__file", "__row"], "left_anti").select(*names)


__all__ = ["snapshot_changelog", "delta_snapshots"]
