"""RegularJoin through the API on Spark (``left.join(right)``), streaming and
batch, against the row-at-a-time oracle (tests/reference/join.py).

Random valid changelogs of both sides (ADD before RETRACT per row, generators
of tests/operators/test_regular_join.py) are written as several parquet files per side
(one directory per side, one file per micro-batch of its streaming source).
The emitted changelog, applied as a multiset (+I/+U add a row, -U/-D remove
one equal row), must equal the oracle's output applied the same way.

A side with a primary key gets its files out of sequence order (file
modification times in a drawn order, so the streaming source reads a later
part of the log in an earlier micro-batch): the planner's ChangelogNormalize
restores each key's order (docs/semantics.md, section 10).  A side without a
key keeps its files in order: nothing can restore per-row order without a key.
"""
from __future__ import annotations

import os
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelog_data import side_changelog, to_frame
from reference.join import ReferenceJoin, norm
from spark_changelog.api import ChangelogStream
from spark_changelog.model import KIND_COL, SEQ_COL

LCOLS, RCOLS = ["id", "k", "v"], ["id", "k", "w"]
OUT_COLS = ["id", "k", "v", "id0", "k0", "w"]
LARROW = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("v", pa.string()),
                    (KIND_COL, pa.int8()), (SEQ_COL, pa.int64())])
RARROW = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("w", pa.string()),
                    (KIND_COL, pa.int8()), (SEQ_COL, pa.int64())])
DDL = {"L": "id BIGINT, k BIGINT, v STRING, _kind TINYINT, _seq BIGINT",
       "R": "id BIGINT, k BIGINT, w STRING, _kind TINYINT, _seq BIGINT"}
PK = {"id": ["id"], "k": ["k"], "none": None}
ADD = {"+I", "+U", 0, 2}


@st.composite
def changelogs(draw):
    uniq = (draw(st.sampled_from(["id", "k", "none"])), draw(st.sampled_from(["id", "k", "none"])))
    left = draw(side_changelog(uniq[0], False))
    right = draw(side_changelog(uniq[1], False))
    sides = draw(st.permutations([0] * len(left) + [1] * len(right)))
    it = [iter(left), iter(right)]
    steps = [(s, *next(it[s])) for s in sides]          # _seq = position: one global order
    files = (draw(st.integers(1, 2)), draw(st.integers(1, 3)))
    # the order the streaming source reads each side's files in
    file_order = (draw(st.permutations(range(2))), draw(st.permutations(range(3))))
    return uniq, steps, files, file_order


def apply_multiset(changes) -> Counter:
    """``changes``: (kind, row) in emission order -> the final multiset of rows."""
    table: Counter = Counter()
    for kind, row in changes:
        if kind in ADD:
            table[row] += 1
        else:
            assert table[row] > 0, f"retraction of a row not in the table: {kind} {row}"
            table[row] -= 1
            if not table[row]:
                del table[row]
    return table


def oracle(how, uniq, steps) -> Counter:
    ref = ReferenceJoin(LCOLS, ["id0", "k0", "w"], ["k"], ["k0"], how, PK[uniq[0]],
                        [{"id": "id0", "k": "k0"}[c] for c in PK[uniq[1]] or ()])
    out = []
    for side, kind, row in steps:
        for k, lrow, rrow in ref.process(side, kind, tuple(row), 0):
            out.append((k, norm((lrow or (None,) * 3) + (rrow or (None,) * 3))))
    return apply_multiset(out)


def write_side(directory, rows, n_files, schema, cols, read_order=None):
    """rows: (kind, row, seq) in order, split into ``n_files`` consecutive files;
    ``read_order``: a permutation; file ``i`` gets the ``read_order``-th
    modification time, which is the order Spark's file stream source reads them in."""
    os.makedirs(directory, exist_ok=True)
    n_files = max(1, min(n_files, len(rows)))
    bounds = [round(i * len(rows) / n_files) for i in range(n_files + 1)]
    ranks = [r for r in (read_order or range(n_files)) if r < n_files]
    for i in range(n_files):
        part = rows[bounds[i]:bounds[i + 1]]
        frame = to_frame([[k, list(r), s] for k, r, s in part], cols)
        path = os.path.join(directory, f"part-{i:04d}.parquet")
        pq.write_table(pa.Table.from_pandas(frame, schema=schema, preserve_index=False), path)
        os.utime(path, (1_700_000_000 + 10 * ranks[i], 1_700_000_000 + 10 * ranks[i]))
    return n_files


def query(spark, base, how, uniq, streaming):
    def side(name):
        reader = (spark.readStream.option("maxFilesPerTrigger", 1) if streaming else spark.read)
        df = reader.schema(DDL[name]).parquet(os.path.join(base, name))
        return ChangelogStream.from_dataframe(df, primary_key=PK[uniq[0 if name == "L" else 1]], name=name)
    return side("L").join(side("R"), on="k", how=how, key_groups=2)


def emitted(table: pa.Table) -> list:
    rows = table.filter(pc.not_equal(table[KIND_COL], -1)).select(OUT_COLS + [KIND_COL])
    return [(r[KIND_COL], norm(tuple(r[c] for c in OUT_COLS))) for r in rows.to_pylist()]


_counter = [0]


@pytest.mark.parametrize("how", ["inner", "left"])
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(sc=changelogs().filter(lambda sc: len(sc[1]) >= 8))
def test_spark_join_final_table_equals_oracle(spark, tmp_path, how, sc):
    uniq, steps, files, file_order = sc
    _counter[0] += 1
    base = str(tmp_path / f"ex{_counter[0]}")
    lrows = [(k, r, i) for i, (s, k, r) in enumerate(steps) if s == 0]
    rrows = [(k, r, i) for i, (s, k, r) in enumerate(steps) if s == 1]
    nl = write_side(os.path.join(base, "L"), lrows, files[0], LARROW, LCOLS,
                    file_order[0] if uniq[0] != "none" else None)
    nr = write_side(os.path.join(base, "R"), rrows, files[1], RARROW, RCOLS,
                    file_order[1] if uniq[1] != "none" else None)
    want = oracle(how, uniq, steps)

    got_batch = apply_multiset(emitted(query(spark, base, how, uniq, False).df.toArrow()))
    assert got_batch == want

    batches = []
    q = (query(spark, base, how, uniq, True).df.writeStream
         .foreachBatch(lambda bdf, bid: batches.append(emitted(bdf.toArrow())))
         .option("checkpointLocation", os.path.join(base, "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    assert len(batches) >= max(nl, nr)
    got_stream = apply_multiset([c for b in batches for c in b])
    assert got_stream == want
