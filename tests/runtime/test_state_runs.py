"""The key group's run stack (runtime.state_runs) behaves like one flat state."""
from __future__ import annotations

import pandas as pd
import pyarrow as pa
from hypothesis import given, settings, strategies as st

from changelog_data import schema_of, to_frame, to_rows
from spark_changelog.operators.base import OpContext
from spark_changelog.operators.normalize import ChangelogNormalize
from spark_changelog.runtime.keygroup import process_key_group
from spark_changelog.runtime.local import LocalRunner
from spark_changelog.runtime.state_runs import MappedRun, Run, RunFiles, RunStack, name_new_runs, run_schema

COLS = ["id", "v"]
SCHEMA = schema_of(COLS, [pa.int64(), pa.string()])

change = st.tuples(st.sampled_from(["+I", "+U", "-D", "-U"]), st.integers(0, 6), st.sampled_from(["a", "b", "c"]))


@settings(max_examples=40, deadline=None)
@given(batches=st.lists(st.lists(change, min_size=1, max_size=12), min_size=1, max_size=8),
       growth=st.sampled_from([0.5, 1.0, 4.0]), max_runs=st.sampled_from([2, 3, 8]),
       roundtrip=st.sampled_from(["none", "blobs", "files"]))
def test_run_stack_equals_flat_state(batches, growth, max_runs, roundtrip, tmp_path_factory):
    op = ChangelogNormalize(SCHEMA, ["id"], tombstone_retention_ms=None)
    flat = LocalRunner(op)
    stack = RunStack(["id"], growth=growth, max_runs=max_runs)
    seq = 0
    for b in batches:
        rows = []
        for kind, k, v in b:
            seq += 1
            rows.append([kind, [k, v], seq])
        df = to_frame(rows, COLS)
        expected = flat.run_batch(df, processing_time_ms=0)
        if roundtrip == "blobs":  # what a restart does: decode every run from its blob
            stack = RunStack(["id"], [Run.from_bytes(r.id, r.to_bytes(run_schema(op.state_schema)), ["id"])
                                      for r in stack.runs], growth=growth, max_runs=max_runs)
        elif roundtrip == "files":  # another worker of the executor: every run mapped from its file
            files = RunFiles(str(tmp_path_factory.mktemp("runs")))
            name_new_runs(stack.runs, "op/1", run_schema(op.state_schema))
            for r in stack.runs:
                if r.table is None:   # a run kept its table when it was encoded
                    r.to_bytes(run_schema(op.state_schema))
                files.write(r, ["id"])
            mapped = [files.read(r.id, ["id"]) for r in stack.runs]
            assert all(isinstance(m, MappedRun) for m in mapped)
            stack = RunStack(["id"], mapped, growth=growth, max_runs=max_runs)
        got = process_key_group(op, stack, df, OpContext(processing_time_ms=0))
        assert to_rows(got, COLS) == to_rows(expected, COLS)
        assert len(stack.runs) <= max_runs + 1
    everything = pd.DataFrame({"id": range(7)})
    live = stack.lookup(everything)
    flat_state = flat.state.sort_values("id").reset_index(drop=True)
    if live is None:
        assert flat_state.empty
    else:
        live = live.sort_values("id").reset_index(drop=True)
        cols = ["id", "v", "_seq", "_deleted"]
        assert (live[cols].astype(object).values.tolist()
                == flat_state[cols].astype(object).values.tolist())


def test_batch_touching_few_keys_writes_only_those():
    op = ChangelogNormalize(SCHEMA, ["id"])
    stack = RunStack(["id"], growth=1.0)
    big = to_frame([["+I", [k, "x"], k] for k in range(10_000)], COLS)
    schema = run_schema(op.state_schema)
    process_key_group(op, stack, big, OpContext(processing_time_ms=0))
    assert [r.size for r in stack.runs] == [10_000]
    name_new_runs(stack.runs, "g", schema)
    small = to_frame([["+U", [k, "y"], 20_000 + k] for k in range(10)], COLS)
    before = {r.id for r in stack.runs}
    process_key_group(op, stack, small, OpContext(processing_time_ms=0))
    written = name_new_runs(stack.runs, "g", schema)
    new = [r for r in stack.runs if r.id not in before]
    # the big run is untouched; the batch wrote a run of its 10 keys
    assert [r.size for r in stack.runs] == [10_000, 10] and [r.size for r in new] == [10]
    assert list(written) == [new[0].id]


def _history(batches, scope="op/3"):
    """The run ids and blobs a key group's stack gets over ``batches``,
    named as the Spark runtime names them."""
    op = ChangelogNormalize(SCHEMA, ["id"], tombstone_retention_ms=None)
    stack = RunStack(["id"], growth=1.0)
    written = []
    for rows in batches:
        process_key_group(op, stack, to_frame(rows, COLS), OpContext(processing_time_ms=0))
        written.append((name_new_runs(stack.runs, scope, run_schema(op.state_schema)), [r.id for r in stack.runs]))
    return written


def test_run_ids_are_digests_of_scope_runs_below_and_content():
    """docs/runtime.md, "Replay is deterministic": the same batches from the
    same state name and write the same runs, byte for byte; another key group,
    another content or another history below gives other ids."""
    batches = [[["+I", [1, "a"], 1], ["+I", [2, "b"], 2], ["+I", [3, "c"], 3]],
               [["+U", [1, "a2"], 4]],
               [["-D", [2, "b"], 5]]]
    first = _history(batches)
    assert _history(batches) == first
    assert all(len(rid) == 32 for _, ids in first for rid in ids)
    assert len(first[-1][1]) == 2 and first[-1][1][0] == first[0][1][0]   # the oldest run stays
    assert {r for _, ids in _history(batches, "op/4") for r in ids}.isdisjoint(
        {r for _, ids in first for r in ids})
    other = _history([batches[0], [["+U", [1, "a3"], 4]], batches[2]])
    assert other[1][1][-1] != first[1][1][-1] and other[2][1][-1] != first[2][1][-1]


def test_a_runs_bytes_follow_its_values_not_the_frames_dtypes():
    """The same rows held with other pandas dtypes (an integer column with
    nulls is object when an operator computed it, float64 after a decode: a
    worker cache hit against a miss) give the same bytes, so a replay names
    and writes the same run (issue #26: a replay's blob differed only in
    pandas' metadata)."""
    schema = run_schema(pa.schema([("id", pa.int64()), ("level", pa.int64()), ("attr", pa.string())]))
    computed = pd.DataFrame({"id": [1, 2], "level": pd.Series([10, None], dtype=object),
                             "attr": ["a", None], "__cleared": [False, False]})
    first = Run.build(computed, ["id"]).to_bytes(schema)
    decoded = Run.from_bytes("x", first, ["id"])
    assert decoded.rows["level"].dtype != computed["level"].dtype
    assert decoded.to_bytes(schema) == first
    assert Run.build(computed.assign(level=[10.0, float("nan")]), ["id"]).to_bytes(schema) == first


def test_full_merge_drops_expired_state_and_cleared_markers():
    op = ChangelogNormalize(SCHEMA, ["id"], tombstone_retention_ms=100)
    stack = RunStack(["id"], growth=1.0)
    ctx = OpContext(processing_time_ms=0)
    process_key_group(op, stack, to_frame([["+I", [1, "a"], 1], ["+I", [2, "b"], 2]], COLS), ctx)
    process_key_group(op, stack, to_frame([["-D", [1, None], 3], ["+U", [2, "c"], 4]], COLS), ctx)
    # the equal-size push merged both runs fully at t=0: the tombstone is young and stays
    assert [r.size for r in stack.runs] == [2]
    later = OpContext(processing_time_ms=1000)
    process_key_group(op, stack, to_frame([["+U", [2, "d"], 5], ["+I", [3, "e"], 6]], COLS), later)
    live = stack.lookup(pd.DataFrame({"id": [1, 2, 3]})).sort_values("id")
    assert live["id"].tolist() == [2, 3] and live["v"].tolist() == ["d", "e"]
    assert later.metrics.counters["tombstones_expired"] == 1


def test_a_mapped_run_finds_exactly_the_keys_a_decoded_run_finds(tmp_path):
    """Multi-column keys with nulls, several rows per key, absent keys, and
    a lookup whose key values come in other pandas dtypes than the run's."""
    schema = pa.schema([("k", pa.string()), ("n", pa.int64()), ("v", pa.int64()),
                        ("__cleared", pa.bool_())])
    rows = pd.DataFrame({"k": ["a", "a", None, "b", "b", "c"], "n": [1, 1, 2, None, 3, 1],
                         "v": [10, 11, 12, 13, 14, 15], "__cleared": [False] * 6})
    run = Run.build(rows, ["k", "n"])
    name_new_runs([run], "op/1", schema)
    files = RunFiles(str(tmp_path))
    files.write(run, ["k", "n"])
    mapped = files.read(run.id, ["k", "n"])
    assert isinstance(mapped, MappedRun)
    want = pd.DataFrame({"k": ["b", "a", None, "z", "c", "b"], "n": [None, 1.0, 2.0, 1.0, 2.0, 3.0]})
    decoded = RunStack(["k", "n"], [run]).lookup(want)
    found = RunStack(["k", "n"], [mapped]).lookup(want)
    def listed(df):
        df = df.sort_values(["k", "n", "v"]).astype(object)
        return df.where(df.notna(), None).values.tolist()

    assert (listed(found) == listed(decoded)
            == [["a", 1, 10], ["a", 1, 11], ["b", 3, 14], ["b", None, 13], [None, 2, 12]])
    assert mapped._run is None   # found through the index, not decoded


def test_run_files_are_a_cache_a_broken_file_is_a_miss(tmp_path):
    run = Run.build(pd.DataFrame({"id": [1, 2], "__cleared": [False, False]}), ["id"])
    name_new_runs([run], "op/1", pa.schema([("id", pa.int64()), ("__cleared", pa.bool_())]))
    files = RunFiles(str(tmp_path))
    files.write(run, ["id"])
    with open(tmp_path / f"{run.id}.arrow", "wb") as fh:
        fh.write(b"not arrow")
    assert files.read(run.id, ["id"]) is None
    files.discard(run.id)
    assert list(tmp_path.iterdir()) == []
