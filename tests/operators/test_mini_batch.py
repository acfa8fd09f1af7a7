"""Micro-batch folding (docs/operators.md, "Micro-batch folding"): a keep-last
operator with ``fold_batch`` emits each key's net change per micro-batch
(nothing, ``+I``, ``-U old``/``+U new``, ``-D old``).  Data tests of the
emitted changelog, and property tests that folding never changes the final
table (local runtime, random micro-batch splits; the Spark runs are in
tests/test_normalize_spark.py)."""
from __future__ import annotations

import collections

import pyarrow as pa
from hypothesis import given, settings, strategies as st

from changelog_data import batches_of, schema_of, to_frame, to_rows
from spark_changelog.api import ChangelogStream
from spark_changelog.operators.deduplicate import RowTimeKeepLast
from spark_changelog.operators.kernels import concat_frames
from spark_changelog.operators.normalize import ChangelogNormalize
from spark_changelog.plan.explain import explain_plan
from spark_changelog.plan.nodes import Deduplicate, Normalize, Source
from spark_changelog.plan.rules import fold_micro_batches
from spark_changelog.model import ChangelogMode
from spark_changelog.runtime.local import LocalRunner

COLS = ["id", "name", "v"]
SCHEMA = schema_of(COLS, [pa.int64(), pa.string(), pa.int64()])


def normalize(**kw):
    return ChangelogNormalize(SCHEMA, ["id"], **kw)


def run(op, batches):
    runner = LocalRunner(op)
    return [to_rows(runner.run_batch(to_frame(b, COLS), processing_time_ms=0), COLS)
            for b in batches]


# -- the emitted changelog, written out -------------------------------------------------
def test_new_key_updated_twice_in_one_batch_is_one_insert_of_its_last_version():
    batch = [["+I", [1, "a", 1], 10], ["-U", [1, "a", 1], 11], ["+U", [1, "b", 2], 12],
             ["-U", [1, "b", 2], 13], ["+U", [1, "c", 3], 14]]
    assert run(normalize(fold_batch=True), [batch]) == [[["+I", [1, "c", 3]]]]
    assert run(normalize(), [batch]) == [[
        ["+I", [1, "a", 1]], ["-U", [1, "a", 1]], ["+U", [1, "b", 2]],
        ["-U", [1, "b", 2]], ["+U", [1, "c", 3]]]]


def test_stored_key_updated_twice_is_one_update_from_the_stored_row():
    batches = [[["+I", [1, "a", 1], 10]],
               [["+U", [1, "b", 2], 20], ["+U", [1, "c", 3], 21]]]
    assert run(normalize(fold_batch=True), batches) == [
        [["+I", [1, "a", 1]]],
        [["-U", [1, "a", 1]], ["+U", [1, "c", 3]]]]
    # without update-before (an upsert consumer): only the +U
    assert run(normalize(fold_batch=True, generate_update_before=False), batches) == [
        [["+I", [1, "a", 1]]], [["+U", [1, "c", 3]]]]


def test_inserted_and_deleted_within_the_batch_emits_nothing():
    batch = [["+I", [2, "x", 5], 10], ["+U", [2, "y", 6], 11], ["-D", [2, None, None], 12]]
    runner = LocalRunner(normalize(fold_batch=True))
    assert to_rows(runner.run_batch(to_frame(batch, COLS), processing_time_ms=0), COLS) == []
    assert runner.metrics.counters["folded"] == 2


def test_stored_key_updated_then_deleted_is_one_delete_of_the_stored_row():
    batches = [[["+I", [3, "a", 1], 10]],
               [["+U", [3, "b", 2], 20], ["-D", [3, None, None], 21]]]
    assert run(normalize(fold_batch=True), batches) == [
        [["+I", [3, "a", 1]]], [["-D", [3, "a", 1]]]]


def test_deleted_and_reinserted_with_the_stored_value_emits_nothing():
    batches = [[["+I", [4, "a", 1], 10]],
               [["-D", [4, "a", 1], 20], ["+I", [4, "a", 1], 21]],
               [["-D", [4, "a", 1], 30], ["+I", [4, "z", 9], 31]]]
    assert run(normalize(fold_batch=True), batches) == [
        [["+I", [4, "a", 1]]], [], [["-U", [4, "a", 1]], ["+U", [4, "z", 9]]]]


def test_superseded_changes_are_dropped_before_folding():
    batches = [[["+I", [5, "new", 2], 50]],
               [["+U", [5, "old", 1], 40], ["-D", [5, "old", 1], 45]]]
    runner = LocalRunner(normalize(fold_batch=True))
    outs = [to_rows(runner.run_batch(to_frame(b, COLS), processing_time_ms=0), COLS)
            for b in batches]
    assert outs == [[["+I", [5, "new", 2]]], []]
    assert runner.metrics.counters["superseded"] == 2


# -- property: folding keeps the final table ---------------------------------------------
@st.composite
def changelogs(draw):
    """A valid changelog per key (insert, updates as -U/+U or +U only, deletes,
    re-inserts), interleaved over keys, in sequence order."""
    rows, seq = [], 0
    alive = {}
    for _ in range(draw(st.integers(0, 40))):
        k = draw(st.integers(0, 4))
        seq += 1
        val = [k, draw(st.sampled_from(["a", "b"])), draw(st.integers(0, 2))]
        if k not in alive:
            rows.append(["+I", val, seq])
            alive[k] = val
        elif draw(st.integers(0, 3)) == 0:
            rows.append(["-D", [k, None, None] if draw(st.booleans()) else alive.pop(k), seq])
            alive.pop(k, None)
        else:
            if draw(st.booleans()):
                rows.append(["-U", alive[k], seq])
                seq += 1
            rows.append(["+U", val, seq])
            alive[k] = val
    return rows


def apply_changes(table, out, key=0):
    """Apply an emitted changelog to a table; a retraction must match the row."""
    for kind, row in out:
        if kind in ("+I", "+U"):
            table[row[key]] = tuple(row)
        else:
            assert table.pop(row[key]) == tuple(row)


@settings(max_examples=60, deadline=None)
@given(changelogs(), st.lists(st.integers(0, 40), max_size=6), st.booleans(),
       st.permutations(range(6)))
def test_normalize_folding_gives_the_same_table_after_every_batch(rows, cuts, update_before, perm):
    # any arrival order within a batch: the operator orders by _seq
    batches = [[r for _, r in b] for b in batches_of(rows, cuts)]
    batches = [sorted(b, key=lambda r: perm[r[2] % 6]) for b in batches]
    plain, folded = {}, {}
    r_plain = LocalRunner(normalize(generate_update_before=update_before))
    r_fold = LocalRunner(normalize(generate_update_before=update_before, fold_batch=True))
    for b in batches:
        out_plain = to_rows(r_plain.run_batch(to_frame(b, COLS), processing_time_ms=0), COLS)
        out_fold = to_rows(r_fold.run_batch(to_frame(b, COLS), processing_time_ms=0), COLS)
        apply_changes(plain, out_plain)
        apply_changes(folded, out_fold)
        assert folded == plain
        # the net change: at most one retraction and one add per key and batch
        per_key = collections.Counter(row[0] for _, row in out_fold)
        assert all(n <= 2 for n in per_key.values())
        assert len(out_fold) <= len(out_plain)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 12)), max_size=30),
       st.lists(st.integers(0, 30), max_size=6))
def test_rowtime_keep_last_folding_gives_the_same_table(rows, cuts):
    schema = schema_of(["k", "v", "t"], [pa.int64()] * 3)

    def final(op):
        runner, table = LocalRunner(op), {}
        for b in batches_of(rows, cuts):
            out = runner.run_batch(to_frame([["+I", list(r), i] for i, r in b], ["k", "v", "t"]),
                                   processing_time_ms=0)
            apply_changes(table, [(k, tuple(v)) for k, v in to_rows(out, ["k", "v", "t"])])
        return table
    assert final(RowTimeKeepLast(schema, ["k"], "t", fold_batch=True)) == \
        final(RowTimeKeepLast(schema, ["k"], "t"))


# -- the plan: with_mini_batch folds every keep-last operator, explain shows it -------------
def test_fold_micro_batches_marks_normalize_and_keep_last_dedup_only():
    src = Source("src", ("id", "v"), ("id",), ChangelogMode.INSERT_ONLY, ("id",), streaming=True,
                 declared_ordered=True)
    first = Deduplicate(src, ("id",), "first")
    last = Deduplicate(first, ("id",), "last")
    plan = Normalize(last, ("id",))
    folded = fold_micro_batches(plan)
    assert folded.fold_batch and folded.input.fold_batch and not folded.input.input.fold_batch
    assert fold_micro_batches(plan) is folded            # memoized
    text = explain_plan(folded)
    assert "ChangelogNormalize(key=[id], miniBatch=[true])" in text
    assert "Deduplicate(keep=[LastRow], key=[id], order=[PROCTIME], miniBatch=[true])" in text
    assert "Deduplicate(keep=[FirstRow], key=[id], order=[PROCTIME])," in text
    assert "note: mini-batch: each key's changes within one micro-batch are folded" in text
    assert "miniBatch" not in explain_plan(plan)


def test_with_mini_batch_is_a_job_setting_applied_when_planning():
    src = Source("a", ("id", "v"), ("id",), ChangelogMode.RETRACT, ("id",), streaming=True)
    s = ChangelogStream(None, Normalize(src, ("id",)))
    on = s.with_mini_batch()
    assert on.mini_batch and not s.mini_batch and not on.with_mini_batch(False).mini_batch
    assert on._planned().fold_batch and not s._planned().fold_batch
    # the ChangelogNormalize the planner puts in front of the sink is folded too
    sink = on.plan_sink(("id",), materialize="force")
    assert "miniBatch=[true]" in explain_plan(sink)
    assert "miniBatch" not in explain_plan(s.plan_sink(("id",), materialize="force"))


@settings(max_examples=60, deadline=None)
@given(changelogs(), st.lists(st.integers(0, 40), max_size=4), st.lists(st.integers(0, 40), max_size=4))
def test_normalize_prefold_per_part_of_a_batch_changes_nothing(rows, cuts, parts):
    """``prefold_keep`` applied to any parts of a micro-batch (as the Spark
    runtime does per input partition) leaves the output and state of a folding
    ChangelogNormalize unchanged."""
    op = normalize(fold_batch=True)
    plain, pre = LocalRunner(op), LocalRunner(normalize(fold_batch=True))
    for b in batches_of(rows, cuts):
        batch = to_frame([r for _, r in b], COLS)
        kept = []
        for part in batches_of(list(range(len(batch))), parts):
            sub = batch.iloc[[i for _, i in part]].reset_index(drop=True)
            kept.append(sub.iloc[op.prefold_keep(sub[["id", "_kind", "_seq"]])])
        reduced = concat_frames(kept) if kept else batch.iloc[:0]
        assert to_rows(pre.run_batch(reduced, processing_time_ms=0), COLS) == \
            to_rows(plain.run_batch(batch, processing_time_ms=0), COLS)
        assert pre.state.sort_values("id").drop(columns="_ts").reset_index(drop=True).equals(
            plain.state.sort_values("id").drop(columns="_ts").reset_index(drop=True))
