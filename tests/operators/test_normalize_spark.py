"""ChangelogNormalize on Spark: streaming (several micro-batches, state store)
and batch give the same final table as the spec, whatever the interleaving."""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings, strategies as st

from changelog_data import set_arrival, to_frame
from spark_changelog.api import ChangelogStream
from spark_changelog.model import KIND_COL, SEQ_COL
from spark_changelog.sinks.delta import read_table

COLS = ["id", "name", "score"]
ARROW = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string()),
                   pa.field("score", pa.int64()), pa.field(KIND_COL, pa.int8()),
                   pa.field(SEQ_COL, pa.int64())])


def write_files(directory, frames):
    os.makedirs(directory, exist_ok=True)
    for i, f in enumerate(frames):
        path = os.path.join(directory, f"part-{i:04d}.parquet")
        pq.write_table(pa.Table.from_pandas(f, schema=ARROW, preserve_index=False), path)
        set_arrival(path, i)


def stream_of(spark, directory, streaming):
    from pyspark.sql.pandas.types import from_arrow_schema
    schema = from_arrow_schema(ARROW)
    if streaming:
        df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(directory)
    else:
        df = spark.read.schema(schema).parquet(directory)
    return ChangelogStream.from_dataframe(df, primary_key=["id"])


def final_table(path):
    t = read_table(path)
    return sorted(map(tuple, t[COLS].astype(object).values.tolist()))


def expected_final(rows):
    """Spec section 5 applied in ``_seq`` order: the last ADD of each key unless deleted after."""
    last = {}
    for kind, vals, seq in sorted(rows, key=lambda r: r[2]):
        if kind in ("+I", "+U"):
            last[vals[0]] = tuple(vals)
        elif kind == "-D":
            last.pop(vals[0], None)
    return sorted(last.values())


def per_key_histories(draw_keys, draw):
    """Valid changelogs per key: insert, updates, deletes, re-inserts."""
    rows, seq = [], 0
    for k in draw_keys:
        alive = None
        for step in range(draw(st.integers(1, 5))):
            seq += draw(st.integers(1, 3))
            val = [k, draw(st.sampled_from(["a", "b", "c"])), draw(st.integers(0, 3))]
            if alive is None:
                rows.append(["+I", val, seq]); alive = val
            elif draw(st.booleans()):
                rows.append(["-U", alive, seq]); rows.append(["+U", val, seq + 1]); seq += 1; alive = val
            else:
                rows.append(["-D", alive, seq]); alive = None
    return rows


@st.composite
def interleaved_files(draw):
    keys = draw(st.lists(st.integers(0, 50), min_size=1, max_size=8, unique=True))
    rows = per_key_histories(keys, draw)
    # any interleaving that keeps each key's order, cut into files (micro-batches)
    order = draw(st.permutations(range(len(rows))))
    by_key = {}
    for r in rows:
        by_key.setdefault(r[1][0], []).append(r)
    cursor = {k: 0 for k in by_key}
    slots = [rows[i][1][0] for i in order]
    arrival = []
    for k in slots:
        arrival.append(by_key[k][cursor[k]]); cursor[k] += 1
    n_files = draw(st.integers(1, 3))
    cuts = sorted(draw(st.lists(st.integers(0, len(arrival)), min_size=n_files - 1, max_size=n_files - 1)))
    bounds = [0] + cuts + [len(arrival)]
    files = [arrival[a:b] for a, b in zip(bounds, bounds[1:])]
    return rows, [f for f in files if f]


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=interleaved_files(), mini_batch=st.booleans())
def test_streaming_and_batch_give_the_spec_final_table(spark, tmp_path_factory, data, mini_batch):
    """... with and without micro-batch folding (``with_mini_batch``)."""
    rows, files = data
    base = tmp_path_factory.mktemp("norm")
    write_files(base / "in", [to_frame(f, COLS) for f in files])
    want = expected_final(rows)

    s = stream_of(spark, str(base / "in"), streaming=True).with_mini_batch(mini_batch)
    rep = s.normalize(key_groups=4).write_upsert(str(base / "stream_table"),
                                                 checkpoint=str(base / "ck"))
    assert rep.batches == len(files)
    assert final_table(base / "stream_table") == want

    b = stream_of(spark, str(base / "in"), streaming=False).with_mini_batch(mini_batch)
    b.normalize(key_groups=4).write_upsert(str(base / "batch_table"))
    assert final_table(base / "batch_table") == want


def test_out_of_order_files_stream_then_resume(spark, tmp_path):
    """A newer change arrives in an earlier file than an older one: the older is
    superseded; a second run resumes from the checkpoint with new files only."""
    first = [
        [["+I", [1, "new", 2], 50], ["+I", [2, "b", 1], 10]],
        [["+I", [1, "old", 1], 40], ["-D", [2, "b", 1], 20]],
    ]
    write_files(tmp_path / "in", [to_frame(f, COLS) for f in first])
    s = stream_of(spark, str(tmp_path / "in"), True).normalize(key_groups=2)
    rep = s.write_upsert(str(tmp_path / "t"), checkpoint=str(tmp_path / "ck"),
                         changelog_path=str(tmp_path / "log"))
    assert rep.counters["superseded"] == 1 and rep.batches == 2
    assert final_table(tmp_path / "t") == [(1, "new", 2)]
    # resume: only the new file is read; key 1 updated, key 2 re-inserted
    pq.write_table(pa.Table.from_pandas(to_frame([["+U", [1, "newer", 3], 60], ["+I", [2, "c", 5], 30]], COLS),
                                        schema=ARROW, preserve_index=False), tmp_path / "in" / "part-0009.parquet")
    rep2 = stream_of(spark, str(tmp_path / "in"), True).normalize(key_groups=2).write_upsert(
        str(tmp_path / "t"), checkpoint=str(tmp_path / "ck"), changelog_path=str(tmp_path / "log"))
    assert rep2.batches == 1 and rep2.rows_in == 2
    assert final_table(tmp_path / "t") == [(1, "newer", 3), (2, "c", 5)]
    from spark_changelog.sinks.changelog import read_changelog
    log = read_changelog(tmp_path / "log")
    assert [(r["op"], r["id"], r["name"]) for _, r in log.iterrows()] == [
        ("+I", 2, "b"), ("+I", 1, "new"),          # batch 0, in _seq order
        ("-D", 2, "b"),                            # batch 1: the older key-1 insert is superseded
        ("+I", 2, "c"), ("-U", 1, "new"), ("+U", 1, "newer"),   # batch 2
    ]


def test_mini_batch_emits_each_keys_net_change_per_micro_batch(spark, tmp_path):
    """Folding, streaming over three micro-batches and batch: the emitted
    changelog holds one net change per key and batch; the tables are equal."""
    files = [
        [["+I", [1, "a", 1], 10], ["+U", [1, "b", 2], 11], ["+U", [1, "c", 3], 12],
         ["+I", [2, "x", 1], 13], ["-D", [2, "x", 1], 14]],
        [["+U", [1, "d", 4], 20], ["+U", [1, "e", 5], 21], ["+I", [3, "p", 1], 22]],
        [["+U", [3, "q", 2], 30], ["-D", [3, "q", 2], 31], ["-D", [1, "e", 5], 32],
         ["+I", [1, "f", 6], 33]],
    ]
    write_files(tmp_path / "in", [to_frame(f, COLS) for f in files])
    from spark_changelog.sinks.changelog import read_changelog
    s = stream_of(spark, str(tmp_path / "in"), True).with_mini_batch().normalize(key_groups=2)
    assert "miniBatch=[true]" in s.explain()
    rep = s.write_upsert(str(tmp_path / "t"), checkpoint=str(tmp_path / "ck"),
                         changelog_path=str(tmp_path / "log"))
    assert rep.batches == 3 and rep.counters["folded"] == 6
    log = read_changelog(tmp_path / "log")
    assert [(r["op"], r["id"], r["name"]) for _, r in log.iterrows()] == [
        ("+I", 1, "c"),                                            # batch 0; key 2 came and went
        ("-U", 1, "c"), ("+U", 1, "e"), ("+I", 3, "p"),            # batch 1
        ("-D", 3, "p"), ("-U", 1, "e"), ("+U", 1, "f"),            # batch 2 (_seq order)
    ]
    assert final_table(tmp_path / "t") == [(1, "f", 6)]
    b = stream_of(spark, str(tmp_path / "in"), False).with_mini_batch().normalize(key_groups=2)
    b.write_upsert(str(tmp_path / "bt"), changelog_path=str(tmp_path / "blog"))
    assert [(r["op"], r["id"], r["name"]) for _, r in read_changelog(tmp_path / "blog").iterrows()] \
        == [("+I", 1, "f")]
    assert final_table(tmp_path / "bt") == [(1, "f", 6)]
