"""Streaming keep first (seen keys in Spark's dedup state, docs/runtime.md "Keep
first on processing time") across a restart from its checkpoint: keys seen
before the restart stay seen, the table is exact, nothing is emitted twice."""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq

from spark_changelog.api import ChangelogStream
from spark_changelog.model import ChangelogMode
from spark_changelog.sinks.delta import read_table

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("_kind", pa.int8()), ("_seq", pa.int64())])


def _write(directory, name, rows):
    os.makedirs(directory, exist_ok=True)
    k, v, seq = zip(*rows)
    pq.write_table(pa.table({"k": list(k), "v": list(v), "_kind": [0] * len(rows), "_seq": list(seq)},
                            schema=SCHEMA), os.path.join(directory, name))


def _run(spark, tmp_path, source="in", checkpoint="ck"):
    df = (spark.readStream.schema("k BIGINT, v BIGINT, _kind TINYINT, _seq BIGINT")
          .option("maxFilesPerTrigger", 1).parquet(str(tmp_path / source)))
    stream = ChangelogStream.from_dataframe(df, mode=ChangelogMode.INSERT_ONLY, name="in")
    return stream.deduplicate("k", keep="first").write_upsert(
        str(tmp_path / "table"), checkpoint=str(tmp_path / checkpoint), key=["k"])


def test_keep_first_restarted_from_its_checkpoint_keeps_the_seen_keys(spark, tmp_path):
    _write(tmp_path / "in", "part-0.parquet", [(1, 10, 2), (2, 20, 3), (1, 11, 1)])
    # (files of equal modification time may be read in either order: no key in both)
    _write(tmp_path / "in", "part-1.parquet", [(3, 30, 4), (3, 32, 5)])
    first = _run(spark, tmp_path)
    assert (first.batches, first.changes_out) == (2, 3)
    # each key once, one writer: appended (docs/sinks.md, "Appends instead of MERGE")
    once = "append: keys emitted once, only writer"
    assert first.sink_writes == {"append: empty table": 1, once: 1}
    # after the restart: keys 1 and 3 were seen (dropped), 4 is new
    _write(tmp_path / "in", "part-2.parquet", [(1, 12, 0), (4, 40, 7), (3, 31, 6), (4, 41, 8)])
    second = _run(spark, tmp_path)
    assert (second.batches, second.changes_out) == (1, 1)
    assert second.sink_writes == {once: 1}     # the same query (checkpoint): still the only writer
    table = read_table(tmp_path / "table")
    assert table[["k", "v"]].astype(int).values.tolist() == [[1, 11], [2, 20], [3, 30], [4, 40]]
    # another query (a new checkpoint, so its keys are new to it) into the same
    # table: it is not the table's only writer, so it upserts (deletion vectors;
    # an append would leave key 1 twice)
    _write(tmp_path / "other", "part-0.parquet", [(1, 99, 1), (5, 50, 2)])
    other = _run(spark, tmp_path, source="other", checkpoint="ck-other")
    assert other.sink_writes == {"deletion vectors": 1}
    table = read_table(tmp_path / "table")
    assert table[["k", "v"]].astype(int).values.tolist() == [[1, 99], [2, 20], [3, 30], [4, 40],
                                                             [5, 50]]
