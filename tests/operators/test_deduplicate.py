"""Deduplication operators (docs/operators.md, "Deduplication") through the
local runtime: spec scenarios D1/D2, the Flink 2.3 recordings step by step,
and property tests against the row-at-a-time reference."""
from __future__ import annotations

import collections

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from changelog_data import batches_of, load_fixture, schema_of, to_frame, to_rows
from spark_changelog.operators.deduplicate import (ProcTimeKeepFirst, ProcTimeKeepLast,
                                                   RowTimeKeepFirst, RowTimeKeepLast)
from spark_changelog.operators.normalize import ChangelogNormalize
from spark_changelog.runtime.local import LocalRunner, one_row_at_a_time
from tests.reference.deduplicate import RefKeepFirst, RefKeepLast, RefRowTimeKeepFirst

TYPES = {"BIGINT": pa.int64(), "STRING": pa.string(), "DOUBLE": pa.float64(), "INT": pa.int32()}


# -- spec scenarios D1, D2 (tests/fixtures/dedup/scenarios.json) ----------------------
SCEN = load_fixture("dedup/scenarios.json")


def scenario_operator(case):
    schema = schema_of(case["columns"], [getattr(pa, t)() for t in case["types"]])
    if case["variant"] == "proctime_last":
        return ProcTimeKeepLast(schema, case["key"], state_ttl_ms=case["state_ttl_ms"])
    return RowTimeKeepLast(schema, case["key"], "t", state_ttl_ms=case["state_ttl_ms"])


@pytest.mark.parametrize("case", SCEN["cases"], ids=[c["name"] for c in SCEN["cases"]])
def test_spec_scenarios_one_batch_and_row_at_a_time(case):
    rows = to_frame(case["input"], case["columns"])
    got = LocalRunner(scenario_operator(case)).run_batch(rows, processing_time_ms=0)
    # one batch is emitted grouped by key; each key's changes keep their order
    k = case["columns"].index(case["key"][0])
    assert to_rows(got, case["columns"]) == sorted(case["expected"], key=lambda r: r[1][k])
    got = one_row_at_a_time(scenario_operator(case), rows, processing_time_ms=0)
    assert to_rows(got, case["columns"]) == case["expected"]


# -- Flink 2.3 recordings (tests/fixtures/flink/dedup.json) ----------------------------
FLINK = load_fixture("flink/dedup.json")
END_OF_INPUT = np.iinfo(np.int64).max


def flink_operator(case, schema):
    sql = case["sql"]
    ttl = 3_600_000 if "table.exec.state.ttl" in case.get("config", {}) else None
    if "ROW_NUMBER" not in sql:                       # ChangelogNormalize over an upsert source
        return ChangelogNormalize(schema, case["inputs"]["T"]["primary_key"], state_ttl_ms=ttl)
    key = ["id"] if "PARTITION BY id" in sql else ["k"]
    if "pt DESC" in sql:
        return ProcTimeKeepLast(schema, key, state_ttl_ms=ttl)
    if "pt ASC" in sql:
        return ProcTimeKeepFirst(schema, key, state_ttl_ms=ttl)
    if "rt DESC" in sql:
        return RowTimeKeepLast(schema, key, "t", state_ttl_ms=ttl)
    return RowTimeKeepFirst(schema, key, "t", state_ttl_ms=ttl)


def watermark_bound_ms(spec):
    """``rt - INTERVAL 'x' SECOND`` of the case's WATERMARK clause, in ms."""
    expr = spec.get("schema_extra", {}).get("watermark")
    if not expr:
        return None
    return int(round(float(expr[1].split("'")[1]) * 1000))


@pytest.mark.parametrize("case", FLINK["cases"], ids=[c["name"] for c in FLINK["cases"]])
def test_flink_dedup_cases_step_by_step(case):
    """One row per micro-batch in Flink's arrival order, then the watermark that
    row produced (event-time cases: it reaches the operator before the next
    row); each step's output equals Flink's for that arrival, and the end of
    input (watermark +inf) emits what Flink emitted after the last row."""
    spec = case["inputs"]["T"]
    cols = spec["columns"]
    schema = schema_of(cols, [TYPES[t] for t in spec["types"]])
    runner = LocalRunner(flink_operator(case, schema))
    bound = watermark_bound_ms(spec)
    wm, max_t = None, None
    for step, (_, idx) in enumerate(case["arrival"]):
        kind, values = spec["rows"][idx]
        out = to_rows(runner.run_batch(to_frame([[kind, values, step]], cols),
                                       processing_time_ms=step, watermark_ms=wm), cols)
        if bound is not None:
            t = values[cols.index("t")]
            max_t = t if max_t is None else max(max_t, t)
            # Flink emits a watermark only when it grows, starting above 0
            if max_t - bound > (wm if wm is not None else 0):
                wm = max_t - bound
                out += to_rows(runner.advance_watermark(wm, processing_time_ms=step), cols)
        assert out == case["expected_steps"][step], f"step {step}: {kind} {values}"
    end = to_rows(runner.advance_watermark(END_OF_INPUT, processing_time_ms=len(case["arrival"])),
                  cols) if bound is not None else []
    assert end == case["expected_after_end_of_input"]


def test_insert_only_variants_reject_a_retraction_naming_the_row():
    schema = schema_of(["k", "v"], [pa.int64(), pa.int64()])
    rows = to_frame([["+I", [1, 10]], ["-D", [1, 10]]], ["k", "v"])
    with pytest.raises(ValueError, match=r"insert-only input, got a -D row \(k=1, v=10, _seq=1\)"):
        LocalRunner(ProcTimeKeepFirst(schema, ["k"])).run_batch(rows, processing_time_ms=0)


def test_keep_first_state_ttl_forgets_the_key():
    schema = schema_of(["k", "v"], [pa.int64(), pa.int64()])
    r = LocalRunner(ProcTimeKeepFirst(schema, ["k"], state_ttl_ms=100))
    assert to_rows(r.run_batch(to_frame([["+I", [1, 10]]], ["k", "v"]), processing_time_ms=0),
                   ["k", "v"]) == [["+I", [1, 10]]]
    assert r.run_batch(to_frame([["+I", [1, 11], 1]], ["k", "v"]), processing_time_ms=50).empty
    out = r.run_batch(to_frame([["+I", [1, 12], 2]], ["k", "v"]), processing_time_ms=100)
    assert to_rows(out, ["k", "v"]) == [["+I", [1, 12]]]
    assert r.metrics.counters["ttl_expired"] == 1


def test_keep_last_without_update_before_and_insert_emits_only_update_after():
    schema = schema_of(["k", "v"], [pa.int64(), pa.int64()])
    op = ProcTimeKeepLast(schema, ["k"], generate_update_before=False, generate_insert=False)
    out = LocalRunner(op).run_batch(to_frame([["+I", [1, 10]], ["+I", [1, 11]]], ["k", "v"]),
                                    processing_time_ms=0)
    assert to_rows(out, ["k", "v"]) == [["+U", [1, 10]], ["+U", [1, 11]]]


def test_keep_last_repeat_of_the_kept_row_emits_nothing_as_flink_rocksdb():
    """Flink 2.3, ``ROW_NUMBER() OVER (PARTITION BY id ORDER BY pt DESC) = 1``
    with ``pt AS PROCTIME()`` (null in its rows), RocksDB state backend, over
    the rows below in one stream: ``+I(1,1,1) -U(1,1,1) +U(1,2,1)``; a repeat
    equal to the kept row emits nothing, in its own micro-batch too
    (docs/sql.md, "ROW_NUMBER")."""
    schema = schema_of(["id", "g", "v"], [pa.int64(), pa.int64(), pa.int64()])
    rows = [["+I", [1, 1, 1]], ["+I", [1, 1, 1]], ["+I", [1, 2, 1]], ["+I", [1, 2, 1]]]
    flink = [["+I", [1, 1, 1]], ["-U", [1, 1, 1]], ["+U", [1, 2, 1]]]
    out = LocalRunner(ProcTimeKeepLast(schema, ["id"])).run_batch(to_frame(rows, ["id", "g", "v"]),
                                                                  processing_time_ms=0)
    assert to_rows(out, ["id", "g", "v"]) == flink
    r = LocalRunner(ProcTimeKeepLast(schema, ["id"]))
    per_batch = [to_rows(r.run_batch(to_frame([[row[0], row[1], i]], ["id", "g", "v"]), processing_time_ms=i),
                         ["id", "g", "v"]) for i, row in enumerate(rows, start=1)]
    assert [c for batch in per_batch for c in batch] == flink


# -- property tests against the row-at-a-time reference -------------------------------
COLS = ["k", "v", "t"]
SCHEMA = schema_of(COLS, [pa.int64(), pa.int64(), pa.int64()])
rows_st = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 12)),
                   max_size=30)


def per_key(out, key=0):
    """Emitted rows grouped by key, each key's rows in emission order (the
    operator emits a batch grouped by key; per key the order is defined)."""
    d = collections.defaultdict(list)
    for kind, row in out:
        d[row[key]].append((kind, tuple(row)))
    return dict(d)


def frame(batch):
    return to_frame([["+I", list(r), i] for i, r in batch], COLS)


def op_rows(df):
    return [(k, tuple(v)) for k, v in to_rows(df, COLS)]


VARIANTS = {
    "proctime_first": (lambda: ProcTimeKeepFirst(SCHEMA, ["k"]), lambda: RefKeepFirst([0])),
    "proctime_last": (lambda: ProcTimeKeepLast(SCHEMA, ["k"]), lambda: RefKeepLast([0])),
    "proctime_last_ttl": (lambda: ProcTimeKeepLast(SCHEMA, ["k"], state_ttl_ms=10 ** 9),
                          lambda: RefKeepLast([0], suppress_equal=False)),
    "proctime_last_no_ub": (lambda: ProcTimeKeepLast(SCHEMA, ["k"], generate_update_before=False),
                            lambda: RefKeepLast([0], generate_update_before=False)),
    "rowtime_last": (lambda: RowTimeKeepLast(SCHEMA, ["k"], "t"),
                     lambda: RefKeepLast([0], time=2, suppress_equal=False)),
}


@settings(max_examples=40, deadline=None)
@given(rows_st, st.lists(st.integers(0, 30), max_size=6), st.sampled_from(sorted(VARIANTS)))
def test_variants_equal_reference_on_random_micro_batches(rows, cuts, variant):
    make_op, make_ref = VARIANTS[variant]
    runner, ref = LocalRunner(make_op()), make_ref()
    for batch in batches_of(rows, cuts):
        got = op_rows(runner.run_batch(frame(batch), processing_time_ms=0))
        want = ref.run_batch([r for _, r in batch])
        assert per_key(got) == per_key([(k, tuple(r)) for k, r in want])


@settings(max_examples=40, deadline=None)
@given(rows_st, st.lists(st.integers(0, 30), max_size=6), st.lists(st.integers(0, 4), max_size=8))
def test_rowtime_keep_first_equals_reference_with_watermarks(rows, cuts, steps):
    runner, ref = LocalRunner(RowTimeKeepFirst(SCHEMA, ["k"], "t")), RefRowTimeKeepFirst([0], 2)
    wm = None
    for b, batch in enumerate(batches_of(rows, cuts)):
        got = op_rows(runner.run_batch(frame(batch), processing_time_ms=0, watermark_ms=wm))
        got += op_rows(runner.advance_watermark(wm, processing_time_ms=0)) if wm is not None else []
        want = ref.run_batch([r for _, r in batch], watermark=wm)
        assert sorted(got) == sorted((k, tuple(r)) for k, r in want)
        if b < len(steps):
            wm = (wm or 0) + steps[b]
    got = op_rows(runner.advance_watermark(END_OF_INPUT, processing_time_ms=0))
    assert sorted(got) == sorted((k, tuple(r)) for k, r in ref.fire(END_OF_INPUT))


@settings(max_examples=30, deadline=None)
@given(rows_st, st.lists(st.integers(0, 30), max_size=6))
def test_folding_micro_batches_gives_the_same_final_table(rows, cuts):
    """Micro-batch folding emits only each key's net change per batch; the
    table the changelog builds is the same as without folding."""
    def final_table(op):
        runner, table = LocalRunner(op), {}
        for batch in batches_of(rows, cuts):
            for kind, row in op_rows(runner.run_batch(frame(batch), processing_time_ms=0)):
                if kind in ("+I", "+U"):
                    table[row[0]] = row
                else:
                    assert table.pop(row[0]) == row
        return table
    assert final_table(ProcTimeKeepLast(SCHEMA, ["k"], fold_batch=True)) == \
        final_table(ProcTimeKeepLast(SCHEMA, ["k"]))
