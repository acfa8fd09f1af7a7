"""SinkUpsertMaterializer (docs/semantics.md, section 3): fixtures, batching invariance, the
row-at-a-time oracle, TTL and the ON CONFLICT modes."""
from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelog_data import load_fixture, schema_of, to_frame, to_rows
from reference.sink_upsert_materializer import (ReferenceSinkUpsertMaterializer,
                                                 ReferenceWatermarkMaterializer)
from spark_changelog.model import KIND_COL, SEQ_COL
from spark_changelog.operators.base import OpContext
from spark_changelog.operators.sink_upsert_materializer import (PrimaryKeyConstraintViolation,
                                                                SequencedAliveRows,
                                                                SinkUpsertMaterializer)
from spark_changelog.runtime.local import LocalRunner
from spark_changelog.sinks.base import net_changes_per_key

TYPES = {"int64": pa.int64(), "string": pa.string(), "float64": pa.float64()}
SCENARIOS = load_fixture("materializer/scenarios.json")
SEED_CASES = load_fixture("materializer/seed_cases.json")
TTL = load_fixture("materializer/ttl.json")
STEP_CASES = {**{f"scenario:{k}": v for k, v in SCENARIOS.items()},
              **{f"seed:{k}": v for k, v in SEED_CASES.items()}}


# --------------------------------------------------------------------------- helpers

def make_operator(fx: dict, **overrides) -> SinkUpsertMaterializer:
    schema = schema_of(fx["columns"], [TYPES[t] for t in fx["types"]])
    kw = dict(sink_key=fx["sink_key"], upsert_key=fx.get("upsert_key"),
              state_ttl_ms=fx.get("state_ttl_ms"), conflict=fx.get("conflict", "deduplicate"))
    kw.update(overrides)
    return SinkUpsertMaterializer(schema, **kw)


def key_of(values: list, fx: dict) -> tuple:
    return tuple(values[fx["columns"].index(c)] for c in fx["sink_key"])


def per_key(rows: list, fx: dict) -> dict:
    """``[kind, values]`` rows grouped by sink key, order kept."""
    out: dict = {}
    for kind, values in rows:
        out.setdefault(key_of(values, fx), []).append([kind, values])
    return out


def output_rows(out: pd.DataFrame, fx: dict) -> list:
    """Operator output in emission order (``_seq``; monotonic per key group)."""
    seqs = out[SEQ_COL].to_numpy()
    assert (np.diff(seqs) > 0).all(), "output _seq must follow emission order"
    return to_rows(out, fx["columns"])


def table_of(out: pd.DataFrame, fx: dict) -> list:
    """What an upsert sink fed with ``out`` holds, sorted by key."""
    net = net_changes_per_key(out, fx["sink_key"])
    return sorted(([v for k, v in to_rows(net, fx["columns"]) if k in ("+I", "+U")]), key=repr)


def state_lists(state: pd.DataFrame, fx: dict) -> dict:
    """Alive entries per sink key in list order (``_entry_seq``)."""
    st_ = state.sort_values(fx["sink_key"] + [SequencedAliveRows.ENTRY], kind="stable")
    st_ = st_.assign(**{KIND_COL: np.int8(0)})
    return {k: [v for _, v in rows] for k, rows in per_key(to_rows(st_, fx["columns"]), fx).items()}


def run_batches(op, frame: pd.DataFrame, cuts, **kw):
    runner = LocalRunner(op)
    bounds = [0, *sorted(set(cuts)), len(frame)]
    outs = [runner.run_batch(frame.iloc[a:b], **kw) for a, b in zip(bounds, bounds[1:]) if b > a]
    outs = [o for o in outs if len(o)]
    return runner, (pd.concat(outs, ignore_index=True) if outs else op.empty_output())


def flush(runner: LocalRunner, watermark_ms: int, processing_time_ms: int = 0) -> pd.DataFrame:
    """What a runtime's watermark timer does: fold due buffered changes of keys
    that got no rows in the batch (``SinkUpsertMaterializer.on_watermark``)."""
    return runner.advance_watermark(watermark_ms, processing_time_ms)


# --------------------------------------------------------------------------- fixtures

@pytest.mark.parametrize("name", sorted(STEP_CASES))
def test_steps_one_row_per_batch(name):
    fx = STEP_CASES[name]
    op = make_operator(fx)
    runner = LocalRunner(op)
    frame = to_frame([s["in"] for s in fx["steps"]], fx["columns"])
    for i, step in enumerate(fx["steps"]):
        out = runner.run_batch(frame.iloc[[i]], processing_time_ms=0)
        assert to_rows(out, fx["columns"]) == step["out"], f"step {i}: {step['in']}"
    lists = state_lists(runner.state, fx)
    assert sorted((v[-1] for v in lists.values()), key=repr) == sorted(fx["final_table"], key=repr)


@pytest.mark.parametrize("name", sorted(STEP_CASES))
@pytest.mark.parametrize("split", ["one_batch", "random_1", "random_2"])
def test_steps_any_batching(name, split):
    fx = STEP_CASES[name]
    frame = to_frame([s["in"] for s in fx["steps"]], fx["columns"])
    n = len(frame)
    if split == "one_batch":
        cuts = []
    else:                       # one row per batch: test_steps_one_row_per_batch
        rnd = random.Random(f"{name}/{split}")
        cuts = rnd.sample(range(1, n), rnd.randint(1, n - 1))
    # rows of a batch arrive in any order: only _seq orders them
    shuffled = frame.sample(frac=1.0, random_state=len(cuts))
    frame = pd.concat([shuffled.loc[(shuffled.index >= a) & (shuffled.index < b)]
                       for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), n])])
    op = make_operator(fx)
    runner, out = run_batches(op, frame, cuts, processing_time_ms=0)
    expected = [row for s in fx["steps"] for row in s["out"]]
    assert per_key(output_rows(out, fx), fx) == per_key(expected, fx)
    assert table_of(out, fx) == sorted(fx["final_table"], key=repr)


@pytest.mark.parametrize("case", ["case1", "case2", "case3"])
def test_seed_cases_end_with_the_new_row(case):
    fx = SEED_CASES[case]
    op = make_operator(fx)
    _, out = run_batches(op, to_frame([s["in"] for s in fx["steps"]], fx["columns"]), [])
    assert table_of(out, fx) == [[1, 20, "b1"]]


def test_equal_seq_retraction_before_addition():
    """-U and +U of one update share a _seq: the retraction goes first whatever
    the arrival order (model.schema)."""
    fx = SEED_CASES["case3"]
    frame = to_frame([["+I", [1, 10, "a1"], 0], ["+U", [1, 20, "b1"], 1], ["-U", [1, 10, "a1"], 1]],
                     fx["columns"])
    _, out = run_batches(make_operator(fx), frame, [])
    assert to_rows(out, fx["columns"]) == [["+I", [1, 10, "a1"]], ["-D", [1, 10, "a1"]],
                                           ["+I", [1, 20, "b1"]]]


# --------------------------------------------------------------------------- TTL

@pytest.mark.parametrize("name", sorted(TTL))
def test_ttl(name):
    fx = TTL[name]
    op = make_operator(fx)
    runner = LocalRunner(op)
    outs = []
    for b in fx["batches"]:
        out = runner.run_batch(to_frame(b["rows"], fx["columns"]),
                               processing_time_ms=b["processing_time_ms"])
        assert to_rows(out, fx["columns"]) == b["out"]
        outs.append(out)
    counters = {k: v for k, v in runner.metrics.counters.items() if v}
    assert counters == fx["metrics"]
    assert len(runner.metrics.warnings) == len(fx["warnings"])
    for text, parts in zip(runner.metrics.warnings, fx["warnings"]):
        for part in parts:
            assert part in text
    assert table_of(pd.concat(outs, ignore_index=True), fx) == sorted(fx["final_table"], key=repr)
    if "retain" in fx:
        ctx = OpContext(processing_time_ms=fx["retain"]["processing_time_ms"])
        keep = op.retain(runner.state, ctx)
        kept = runner.state[keep.to_numpy()].assign(**{KIND_COL: np.int8(0)})
        assert [v for _, v in to_rows(kept, fx["columns"])] == fx["retain"]["kept"]
        assert ctx.metrics.counters["ttl_expired"] == fx["retain"]["ttl_expired"]


def test_no_match_without_ttl_warns_once_per_key():
    fx = SEED_CASES["case1"]
    frame = to_frame([["-U", [1, 10, "a1"]], ["-D", [1, 11, "a1"]], ["-D", [2, 1, "x"]]],
                     fx["columns"])
    runner, out = run_batches(make_operator(fx), frame, [])
    assert out.empty
    assert runner.metrics.counters["retract_no_match"] == 3
    assert [w.split(" matched")[0] for w in runner.metrics.warnings] == [
        "sink_upsert_materializer: a -U retraction for sink key (id=1)",
        "sink_upsert_materializer: a -D retraction for sink key (id=2)"]


def test_growing_key_is_reported_once():
    """Retractions that never match (here: none at all) make a key's list grow:
    warned when it crosses the threshold, not on every batch after."""
    fx = SCENARIOS["duplicates_fifo"]
    op = make_operator(fx, entries_warn_threshold=3)
    frame = to_frame([["+I", [1, "a"]], ["+I", [1, "b"]], ["+I", [1, "c"]], ["+I", [1, "d"]],
                      ["+I", [2, "x"]]], fx["columns"])
    runner, _ = run_batches(op, frame, [2, 4])
    assert runner.metrics.counters["keys_over_entries_threshold"] == 1
    assert len(runner.metrics.warnings) == 1
    assert "sink key (pk=1) holds 4 alive rows" in runner.metrics.warnings[0]


def test_process_sorts_rows_it_is_given_unsorted():
    """The runtime sorts by key and _seq; process does not rely on it."""
    fx = SEED_CASES["case2"]
    op = make_operator(fx)
    rows = to_frame([s["in"] for s in fx["steps"]] + [["+I", [2, 1, "z"]]], fx["columns"])
    state, out = op.process(op.empty_state(), rows.iloc[::-1].reset_index(drop=True),
                            OpContext(processing_time_ms=0))
    assert per_key(output_rows(out, fx), fx) == {
        (1,): [["+I", [1, 20, "b1"]], ["+U", [1, 10, "a1"]], ["+U", [1, 20, "b1"]]],
        (2,): [["+I", [2, 1, "z"]]]}
    assert state_lists(state, fx) == {(1,): [[1, 20, "b1"]], (2,): [[2, 1, "z"]]}


# --------------------------------------------------------------------------- ON CONFLICT

# ON CONFLICT DO ERROR/NOTHING against Flink 2.3's recorded runs: test_conflict_flink.py;
# on Spark: test_conflict_spark.py; against the oracle: test_conflict_modes_match_reference


# --------------------------------------------------------------------------- property tests

@st.composite
def changelogs(draw, with_time=False):
    """Random changelogs honouring the invariant of docs/semantics.md, section 2: per source
    row (a chain of versions of one upsert key) ADD before its RETRACT, in
    order; chains interleaved arbitrarily (what a shuffle does)."""
    upsert = draw(st.booleans())
    keep_uk = upsert or draw(st.booleans())     # without uk column, rows can repeat
    chains = []
    for c in range(draw(st.integers(1, 6))):
        versions = [(draw(st.integers(1, 3)), draw(st.sampled_from(["a", "b", None])))
                    + ((draw(st.integers(0, 20)),) if with_time else ())
                    for _ in range(draw(st.integers(1, 4)))]
        ops = [("+I", versions[0])]
        for old, new in zip(versions, versions[1:]):
            ops += [("-U", old), ("+U", new)]
        if draw(st.booleans()):
            ops.append(("-D", versions[-1]))
        chains.append([(k, ((c,) if keep_uk else ()) + v) for k, v in ops])
    labels = [c for c, ops in enumerate(chains) for _ in ops]
    order = draw(st.permutations(labels))
    nxt = [0] * len(chains)
    rows, seqs = [], []
    for pos, c in enumerate(order):
        kind, values = chains[c][nxt[c]]
        nxt[c] += 1
        # an update's -U/+U pair, when adjacent, may share a _seq (as Flink emits it)
        tie = (kind == "+U" and pos and order[pos - 1] == c and draw(st.booleans()))
        seqs.append(seqs[-1] if tie else pos)
        rows.append([kind, list(values)])
    columns = (["uk"] if keep_uk else []) + ["pk", "v"] + (["ts"] if with_time else [])
    types = (["int64"] if keep_uk else []) + ["int64", "string"] + (["int64"] if with_time else [])
    n = len(rows)
    cuts = draw(st.lists(st.integers(1, max(n - 1, 1)), max_size=6)) if n > 1 else []
    fx = {"columns": columns, "types": types, "sink_key": ["pk"],
          "upsert_key": ["uk"] if upsert else None}
    return fx, rows, seqs, cuts


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changelogs())
def test_matches_row_at_a_time_reference(case):
    fx, rows, seqs, cuts = case
    ref = ReferenceSinkUpsertMaterializer(fx["columns"], fx["sink_key"], fx["upsert_key"])
    expected = [[k, list(v)] for k, v in ref.run([(k, tuple(v)) for k, v in rows])]
    op = make_operator(fx)
    runner, out = run_batches(op, to_frame(rows, fx["columns"], seqs=seqs), cuts,
                              processing_time_ms=0)
    assert per_key(output_rows(out, fx), fx) == per_key(expected, fx)
    assert table_of(out, fx) == sorted([list(v) for v in ref.table().values()], key=repr)
    assert state_lists(runner.state, fx) == {k: [list(r) for r in v]
                                                 for k, v in ref.state.items()}
    assert "retract_no_match" not in runner.metrics.counters


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changelogs(with_time=True), st.sampled_from(["error", "nothing"]), st.randoms())
def test_conflict_modes_match_reference(case, conflict, rnd):
    fx, rows, seqs, cuts = case
    fx = {**fx, "conflict": conflict}
    ref = ReferenceWatermarkMaterializer(fx["columns"], fx["sink_key"], fx["upsert_key"],
                                         conflict)
    runner = LocalRunner(make_operator(fx))
    frame = to_frame(rows, fx["columns"], seqs=seqs)
    bounds = [0, *sorted(set(cuts)), len(frame)]
    watermark = -1
    for a, b in zip(bounds, bounds[1:]):
        if b <= a:
            continue
        watermark += rnd.randint(0, 8)
        for (kind, values), s in zip(rows[a:b], seqs[a:b]):
            ref.add(kind, tuple(values), s, watermark)   # stamped with the batch's watermark
        try:
            expected = ref.advance(watermark)
        except AssertionError:
            with pytest.raises(PrimaryKeyConstraintViolation):
                runner.run_batch(frame.iloc[a:b], processing_time_ms=0, watermark_ms=watermark)
                flush(runner, watermark)
            return
        out = runner.run_batch(frame.iloc[a:b], processing_time_ms=0, watermark_ms=watermark)
        out2 = flush(runner, watermark)
        got = to_rows(out, fx["columns"]) + to_rows(out2, fx["columns"])
        assert per_key(got, fx) == per_key([[k, list(v)] for k, v in expected], fx)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changelogs(), st.randoms())
def test_process_orders_any_interleaving_itself(case, rnd):
    """``orders_own_rows``: a chained materializer gets the operator
    before's output unsorted, so ``process`` itself puts any order of a
    batch's rows (a sink key's rows apart, or out of ``_seq`` order) in its
    processing order: the reference's changelog per key, table and state."""
    fx, rows, seqs, cuts = case
    ref = ReferenceSinkUpsertMaterializer(fx["columns"], fx["sink_key"], fx["upsert_key"])
    expected = [[k, list(v)] for k, v in ref.run([(k, tuple(v)) for k, v in rows])]
    op = make_operator(fx)
    assert op.orders_own_rows
    frame = to_frame(rows, fx["columns"], seqs=seqs)
    bounds = [0, *sorted(set(cuts)), len(frame)]
    state, outs, next_seq = op.empty_state(), [], 0
    for a, b in zip(bounds, bounds[1:]):
        if b <= a:
            continue
        batch = frame.iloc[a:b]
        if rnd.random() < 0.5:
            batch = batch.sample(frac=1, random_state=rnd.randrange(2 ** 31))
        ctx = OpContext(processing_time_ms=0, next_seq=next_seq)
        state, out = op.process(state, batch.reset_index(drop=True), ctx)
        next_seq = ctx.next_seq
        outs.append(out)
    out = pd.concat(outs, ignore_index=True)
    assert per_key(output_rows(out, fx), fx) == per_key(expected, fx)
    assert table_of(out, fx) == sorted([list(v) for v in ref.table().values()], key=repr)
    assert state_lists(state, fx) == {k: [list(r) for r in v] for k, v in ref.state.items()}
