"""The streaming keyed step's packed data path (docs/runtime.md, "Packed key
groups"): one Arrow pass per input partition packs each key group's rows
(pre-folded when the operator folds) into one row; the processor unpacks
them.  Many key groups, side rows mixed in, a micro-batch whose only rows are
side rows, an empty input file, one key's changes split over two partitions
of a micro-batch: the exact output and every side row."""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_changelog.model import KIND_COL, METRICS_COL, METRICS_KIND, SEQ_COL
from spark_changelog.operators.normalize import ChangelogNormalize
from spark_changelog.runtime.arrow_packing import COMPRESS_FROM_BYTES, pack, pack_groups, unpack
from spark_changelog.runtime.spark_keyed import apply_keyed

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.string()),
                    pa.field(KIND_COL, pa.int8()), pa.field(SEQ_COL, pa.int64()),
                    pa.field(METRICS_COL, pa.string())])
KINDS = {"+I": 0, "-U": 1, "+U": 2, "-D": 3}


def data(kind, id_, v, seq):
    return {"id": id_, "v": v, KIND_COL: KINDS[kind], SEQ_COL: seq, METRICS_COL: None}


def upstream(n):
    """An upstream operator's side row (passes through key group -1)."""
    payload = json.dumps({"operator": "upstream", "instance": 7, "counters": {"n": n}})
    return {"id": None, "v": None, KIND_COL: METRICS_KIND, SEQ_COL: 0, METRICS_COL: payload}


IDS = range(40)
# two files per micro-batch (maxFilesPerTrigger 2): two input partitions each
FILES = [
    # batch 1: inserts of 40 ids over both partitions, a side row in the first
    [data("+I", i, f"a{i}", i) for i in IDS if i % 2] + [upstream(1)],
    [data("+I", i, f"a{i}", i) for i in IDS if not i % 2],
    # batch 2: side rows only (key group -1 alone), and an empty file
    [upstream(2), upstream(3)],
    [],
    # batch 3: updates, deletes, and id 100 inserted and updated in two partitions
    [data("+U", i, f"b{i}", 100 + i) for i in IDS if not i % 2] + [data("+I", 100, "c", 200)]
    + [upstream(4)],
    [data("-D", i, f"a{i}", 100 + i) for i in IDS if i % 2 and i < 10]
    + [data("+U", 100, "c2", 201)],
]

FIRST = [("+I", i, f"a{i}") for i in IDS]
UPDATES = ([r for i in IDS if not i % 2 for r in (("-U", i, f"a{i}"), ("+U", i, f"b{i}"))]
           + [("-D", i, f"a{i}") for i in IDS if i % 2 and i < 10])
FOLDED = [("+I", 100, "c2")]
UNFOLDED = [("+I", 100, "c"), ("-U", 100, "c"), ("+U", 100, "c2")]


def test_pack_groups_round_trip_keeps_each_groups_rows_in_order():
    t = pa.table({"x": list(range(10)), "g": [3, -1, 3, 0, 7, -1, 0, 3, 7, 3]})
    packed = list(pack_groups(t, t.column("g").to_numpy()))
    assert [g for g, _ in packed] == [-1, 0, 3, 7]
    assert {g: unpack([b]).column("x").to_pylist() for g, b in packed} == {
        -1: [1, 5], 0: [3, 6], 3: [0, 2, 7, 9], 7: [4, 8]}
    assert unpack([packed[3][1], packed[0][1]]).column("x").to_pylist() == [4, 8, 1, 5]
    assert list(pack_groups(t.slice(0, 0), np.zeros(0, np.int32))) == []


def test_small_blobs_are_not_compressed_and_large_ones_are():
    """LZ4's fixed cost per blob is most of a small micro-batch's packing."""
    small = pa.table({"x": list(range(100))})
    large = pa.table({"x": list(range(100_000)), "s": ["same text"] * 100_000})
    assert small.nbytes < COMPRESS_FROM_BYTES <= large.nbytes
    for t in (small, large):
        blob = pack(t)
        assert unpack([blob]).equals(t)
        assert (len(blob) < t.nbytes / 2) == (t is large)     # compressed only the large one
    # a plain and a compressed blob of one key group unpack together
    big = pa.table({"x": list(range(20_000))})
    assert big.nbytes >= COMPRESS_FROM_BYTES
    assert unpack([pack(small), pack(big)]).column("x").to_pylist() == list(range(100)) + list(range(20_000))


@pytest.mark.parametrize("fold", [True, False], ids=["folded", "every-version"])
def test_packed_streaming_output_and_side_rows_exact(spark, tmp_path, fold):
    d = tmp_path / "in"
    os.makedirs(d)
    for i, rows in enumerate(FILES):
        path = str(d / f"part-{i}.parquet")
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
        # the file source takes files oldest first: fix the order of the batches
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    from pyspark.sql.pandas.types import from_arrow_schema
    df = spark.readStream.schema(from_arrow_schema(SCHEMA)).option("maxFilesPerTrigger", 2).parquet(str(d))
    op = ChangelogNormalize(SCHEMA.remove(SCHEMA.get_field_index(METRICS_COL)), ["id"], fold_batch=fold)
    out = apply_keyed(df, op, key_groups=16)
    batches = {}

    def collect(batch, batch_id):
        batches[batch_id] = batch.toPandas()

    q = (out.writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    assert sorted(batches) == [0, 1, 2]
    names = {v: k for k, v in KINDS.items()}
    rows, ups, counters, groups = [], [], [], []
    for b in (0, 1, 2):
        pdf = batches[b]
        side = pdf[KIND_COL] == METRICS_KIND
        rows.append(sorted((names[int(k)], int(i), v) for k, i, v in
                           pdf.loc[~side, [KIND_COL, "id", "v"]].itertuples(index=False)))
        payloads = [json.loads(m) for m in pdf.loc[side, METRICS_COL]]
        ups.append(sorted(p["counters"]["n"] for p in payloads if p["operator"] == "upstream"))
        mine = [p for p in payloads if p["operator"] == "ChangelogNormalize"]
        counters.append(sum(p["counters"].get("rows_in", 0) for p in mine))
        groups.append(sorted(p["key_group"] for p in mine if "key_group" in p))
    assert rows == [sorted(FIRST), [], sorted(UPDATES + (FOLDED if fold else UNFOLDED))]
    # every upstream side row passes exactly once, in its own batch
    assert ups == [[1], [2, 3], [4]]
    # every data row counted once: by the pre-fold (the rows it drops) or the operator
    assert counters == [40, 0, 27]
    # one call per key group with rows: 16 groups hold the 40 ids, none in the side-row batch
    assert len(groups[0]) == len(set(groups[0])) == 16
    assert groups[1] == []
    # per key, the update order holds within the batch (-U before +U)
    last = batches[2][batches[2][KIND_COL] != METRICS_KIND]
    for i in (0, 2, 100):
        kinds = [names[int(k)] for k in last.loc[last["id"] == i, KIND_COL]]
        assert kinds == (["-U", "+U"] if i != 100 else (["+I"] if fold else ["+I", "-U", "+U"]))


def test_a_checkpoint_restarted_with_another_key_group_count_fails_loudly(spark, tmp_path):
    """A key's state is found by its key group: the same checkpoint read with
    another count would miss every key's state.  The run stops naming both
    counts; with the count it was written with it continues exactly."""
    d = tmp_path / "in"
    os.makedirs(d)

    def add(i, rows):
        path = str(d / f"part-{i}.parquet")
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))

    def run(key_groups):
        from pyspark.sql.pandas.types import from_arrow_schema
        df = spark.readStream.schema(from_arrow_schema(SCHEMA)).parquet(str(d))
        op = ChangelogNormalize(SCHEMA.remove(SCHEMA.get_field_index(METRICS_COL)), ["id"])
        got = []
        q = (apply_keyed(df, op, key_groups=key_groups).writeStream
             .foreachBatch(lambda b, _: got.extend(
                 (int(k), int(i), v) for k, i, v in b.filter(f"{KIND_COL} >= 0")
                 .select(KIND_COL, "id", "v").collect()))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        q.awaitTermination()
        return sorted(got)

    add(0, [data("+I", i, f"a{i}", i) for i in range(8)])
    assert run(4) == [(0, i, f"a{i}") for i in range(8)]
    add(1, [data("+U", i, f"b{i}", 10 + i) for i in range(8)])
    with pytest.raises(Exception, match="written with 4 key groups and the query now runs with 8"):
        run(8)
    assert run(4) == sorted([(1, i, f"a{i}") for i in range(8)] + [(2, i, f"b{i}") for i in range(8)])


def _batch_input(spark, tmp_path):
    d = tmp_path / "batch-in"
    os.makedirs(d)
    pq.write_table(pa.Table.from_pylist([r for rows in FILES for r in rows], schema=SCHEMA), str(d / "all.parquet"))
    from pyspark.sql.pandas.types import from_arrow_schema
    return spark.read.schema(from_arrow_schema(SCHEMA)).parquet(str(d))


def test_batch_runs_packed_key_groups_with_the_exact_output(spark, tmp_path):
    """A bounded input goes through the same packing (no row-by-row sort by
    Spark): every version of a key in ``_seq`` order, counters and upstream
    side rows exact."""
    op = ChangelogNormalize(SCHEMA.remove(SCHEMA.get_field_index(METRICS_COL)), ["id"])
    pdf = apply_keyed(_batch_input(spark, tmp_path), op, key_groups=16).toPandas()
    side = pdf[KIND_COL] == METRICS_KIND
    names = {v: k for k, v in KINDS.items()}
    got = pdf[~side].sort_values(SEQ_COL, kind="stable")
    per_key = {}
    for k, i, v in got[[KIND_COL, "id", "v"]].itertuples(index=False):
        per_key.setdefault(int(i), []).append((names[int(k)], v))
    expected = {}
    for kind, i, v in FIRST + UPDATES + UNFOLDED:
        expected.setdefault(i, []).append((kind, v))
    assert per_key == expected
    payloads = [json.loads(m) for m in pdf.loc[side, METRICS_COL]]
    assert sorted(p["counters"]["n"] for p in payloads if p["operator"] == "upstream") == [1, 2, 3, 4]
    assert sum(p["counters"].get("rows_in", 0) for p in payloads if p["operator"] == "ChangelogNormalize") == 67


@pytest.mark.parametrize("fold", [True, False], ids=["folded", "every-version"])
def test_packing_in_parts_keeps_every_row_or_its_fold(spark, tmp_path, fold):
    """An input partition packed in parts (a part ends after ~chunk_rows rows,
    at an Arrow batch boundary) loses no row; folding per part keeps each
    key's last change and counts every dropped row."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from spark_changelog.runtime.arrow_packing import PACKED_COL
    from spark_changelog.runtime.spark_keyed import pack_key_groups
    # 5 keys, each changed 8 times, interleaved: every part of 8 rows repeats keys
    everything = [data("+I" if n < 5 else "+U", n % 5, f"v{n}", n) for n in range(40)]
    path = str(tmp_path / "in.parquet")
    pq.write_table(pa.Table.from_pylist(everything, schema=SCHEMA), path)
    df = spark.read.schema(from_arrow_schema(SCHEMA)).parquet(path)
    op = ChangelogNormalize(SCHEMA.remove(SCHEMA.get_field_index(METRICS_COL)), ["id"], fold_batch=fold)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "4")
    try:
        packed, columns = pack_key_groups(df, op, 4, chunk_rows=8)
        blobs = packed.toPandas()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    rows = unpack(list(blobs[PACKED_COL])).rename_columns(columns).to_pandas()
    side = rows[KIND_COL] == METRICS_KIND
    data_rows = rows[~side]
    assert len(blobs) >= 5 * 2                     # five parts, each with its key groups
    if not fold:
        assert sorted(data_rows[SEQ_COL]) == list(range(40))
        return
    counters = [json.loads(m)["counters"] for m in rows.loc[side, METRICS_COL]]
    assert len(counters) == 5                      # one side row per part
    # each part of 8 rows keeps one change per key (5) and drops 3
    assert [c["rows_in"] for c in counters] == [3] * 5
    assert len(data_rows) == 25
    assert data_rows.groupby("id")[SEQ_COL].max().to_dict() == {k: 35 + k for k in range(5)}
