"""GroupAggregate (docs/operators.md, "Group aggregation") through the local
runtime: the Flink 2.3 recordings step by step, and property tests against
the row-at-a-time reference on random changelogs and micro-batch splits."""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from changelog_data import batches_of, load_fixture, schema_of, to_frame, to_rows
from spark_changelog.operators.aggregate.accumulators import AggregateOverflow
from spark_changelog.operators.aggregate.group_aggregate import GroupAggregate
from spark_changelog.operators.keys import GLOBAL_KEY
from spark_changelog.operators.normalize import ChangelogNormalize
from spark_changelog.runtime.local import LocalRunner
from tests.reference.aggregate import RefGroupAggregate

TYPES = {"BIGINT": pa.int64(), "INT": pa.int32(), "STRING": pa.string(), "DOUBLE": pa.float64()}
FLINK = load_fixture("flink/aggregate.json")

#: the aggregate calls of each recorded case's SQL, as (function, column, output)
CALLS = {
    "A1_avg_bigint_is_bigint": (["k"], [("avg", "v", "a"), ("sum", "v", "s"), ("count", None, "c")]),
    "A2_retract_all_functions": (["k"], [("count", None, "c"), ("count", "v", "cv"),
                                         ("count_distinct", "v", "cd"), ("sum", "v", "s"),
                                         ("avg", "v", "a"), ("min", "v", "mn"),
                                         ("max", "v", "mx")]),
    "A3_unchanged_result_no_ttl": (["k"], [("sum", "v", "s"), ("max", "v", "mx")]),
    "A3b_unchanged_result_with_ttl": (["k"], [("sum", "v", "s"), ("max", "v", "mx")]),
    "A4_first_last_value_retract": (["k"], [("first_value", "v", "f"), ("last_value", "v", "l")]),
    "A5_seed_students_avg": (["student_id", "student_name"], [("avg", "score", "avg_score")]),
    # no GROUP BY: one global group (the SQL layer keys it by a constant; no key columns here)
    "A6_global_aggregate_last_row_retracted": ([], [("count", None, "c"), ("sum", "v", "s"),
                                                    ("max", "v", "mx")]),
    "A7_sum_of_int_is_int": (["k"], [("sum", "v", "s"), ("avg", "v", "a")]),
}
#: the step where Flink's integer sum wraps around and ours stops naming the group
OVERFLOW_AT = {"A7_sum_of_int_is_int": 1}
#: Arrow types of Flink's recorded result types
RESULT_TYPES = {"BIGINT NOT NULL": pa.int64(), "BIGINT": pa.int64(), "INT": pa.int32(),
                "STRING": pa.string()}


def fold_step(rows, n_key):
    """Flink's per-row output of one step folded per group, as one micro-batch
    emits it: a group's first retraction and last add become ``-U``/``+U``
    (or ``-D``/``+I`` alone)."""
    groups, order = {}, []
    for kind, row in rows:
        k = tuple(row[:n_key])
        if k not in groups:
            groups[k] = []
            order.append(k)
        groups[k].append((kind, row))
    out = []
    for k in order:
        seq = groups[k]
        old = seq[0][1] if seq[0][0] in ("-U", "-D") else None
        new = seq[-1][1] if seq[-1][0] in ("+I", "+U") else None
        if old is not None and new is not None:
            out += [["-U", old], ["+U", new]]
        elif old is not None:
            out.append(["-D", old])
        elif new is not None:
            out.append(["+I", new])
    return out


def operator_of(case):
    spec = case["inputs"]["T"]
    schema = schema_of(spec["columns"], [TYPES[t] for t in spec["types"]])
    key, calls = CALLS[case["name"]]
    return GroupAggregate(schema, key, calls), key + [c[2] for c in calls]


@pytest.mark.parametrize("case", [c for c in FLINK["cases"] if "result_types" in c],
                         ids=[c["name"] for c in FLINK["cases"] if "result_types" in c])
def test_result_types_are_flinks(case):
    """SUM and AVG of INT are INT (docs/operators.md, "Group aggregation")."""
    op, out_cols = operator_of(case)
    assert [op.output_schema.field(c).type for c in out_cols] == \
        [RESULT_TYPES[t] for t in case["result_types"]]


def test_int_sum_past_its_range_stops_naming_the_group_where_flink_wraps():
    """A7: 2147483000 + 700 leaves INT; Flink emits -2147483596 (wrapped), we
    raise AggregateOverflow naming the group (docs/operators.md, "Overflow")."""
    case = next(c for c in FLINK["cases"] if c["name"] == "A7_sum_of_int_is_int")
    op, out_cols = operator_of(case)
    runner = LocalRunner(op)
    rows = case["inputs"]["T"]["rows"]
    got = to_rows(runner.run_batch(to_frame([rows[0] + [0]], ["k", "v"]), processing_time_ms=0),
                  out_cols)
    assert got == case["expected_steps"][0]
    assert case["expected_steps"][1][1] == ["+U", ["a", -2147483596, 1073741850]]
    with pytest.raises(AggregateOverflow, match=r"^SUM\(v\) overflows INT in group \(k=a\)"):
        runner.run_batch(to_frame([rows[1] + [1]], ["k", "v"]), processing_time_ms=1)


@pytest.mark.parametrize("case", [c for c in FLINK["cases"] if c["name"] not in OVERFLOW_AT],
                         ids=[c["name"] for c in FLINK["cases"] if c["name"] not in OVERFLOW_AT])
def test_flink_group_aggregate_cases_step_by_step(case):
    """One input row per micro-batch in Flink's arrival order; each step's output
    equals Flink's (A5: per group folded, as a micro-batch emits it, because a
    ChangelogNormalize in front turns one update into -U/+U in the same batch)."""
    spec = case["inputs"]["T"]
    cols = spec["columns"]
    types = [TYPES[t] for t in spec["types"]]
    key, calls = CALLS[case["name"]]
    out_cols = key + [c[2] for c in calls]
    if not key:     # a global aggregate: one constant key, as the lowering adds it
        cols, types, key = cols + [GLOBAL_KEY], types + [pa.int64()], [GLOBAL_KEY]
    schema = schema_of(cols, types)
    ttl = 3_600_000 if "table.exec.state.ttl" in case.get("config", {}) else None
    agg = LocalRunner(GroupAggregate(schema, key, calls, state_ttl_ms=ttl))
    norm = LocalRunner(ChangelogNormalize(schema, spec["primary_key"])) \
        if spec["changelog_mode"] == "upsert" else None
    for step, (_, idx) in enumerate(case["arrival"]):
        kind, values = spec["rows"][idx]
        rows = to_frame([[kind, values + [0] * (len(cols) - len(values)), step]], cols)
        if norm is not None:
            rows = norm.run_batch(rows, processing_time_ms=step)
        got = to_rows(agg.run_batch(rows, processing_time_ms=step), out_cols)
        want = case["expected_steps"][step]
        if norm is not None:
            want = fold_step(want, len(key))
        assert got == want, f"step {step}: {kind} {values}"


def test_avg_over_bigint_has_the_bigint_type():
    schema = schema_of(["k", "v", "d"], [pa.string(), pa.int64(), pa.float64()])
    op = GroupAggregate(schema, ["k"], [("avg", "v", "a"), ("avg", "d", "ad"), ("count", "v", "c")])
    assert op.output_schema.field("a").type == pa.int64()
    assert op.output_schema.field("ad").type == pa.float64()
    assert op.output_schema.field("c").type == pa.int64()


def test_large_integer_sums_survive_the_state_exactly():
    """Integer state columns hold no nulls, so an Arrow round trip keeps them int64."""
    schema = schema_of(["k", "v"], [pa.int64(), pa.int64()])
    op = GroupAggregate(schema, ["k"], [("sum", "v", "s"), ("max", "v", "mx")])
    r = LocalRunner(op)
    big = 2 ** 62 + 1
    r.run_batch(to_frame([["+I", [1, big]]], ["k", "v"]), processing_time_ms=0)
    r.state = pa.Table.from_pandas(r.state, schema=op.state_schema,
                                   preserve_index=False).to_pandas()
    out = r.run_batch(to_frame([["+I", [1, 1], 1]], ["k", "v"]), processing_time_ms=0)
    assert to_rows(out, ["k", "s", "mx"]) == [["-U", [1, big, big]], ["+U", [1, big + 1, big]]]


# -- property tests --------------------------------------------------------------
COLS = ["k", "v", "s"]
SCHEMA = schema_of(COLS, [pa.int64(), pa.int64(), pa.string()])
AGGS = [("count", None, "c"), ("count", "v", "cv"), ("count_distinct", "v", "cd"),
        ("sum", "v", "sm"), ("avg", "v", "av"), ("min", "v", "mn"), ("max", "s", "mx"),
        ("first_value", "v", "fv"), ("last_value", "s", "lv")]
REF_AGGS = [(f, None if c is None else COLS.index(c), c == "v") for f, c, _ in AGGS]
OUT = ["k"] + [a[2] for a in AGGS]

row_st = st.tuples(st.sampled_from(["+I", "+I", "+U", "-U", "-D"]), st.integers(0, 2),
                   st.one_of(st.none(), st.integers(-2, 3)),
                   st.one_of(st.none(), st.sampled_from(["a", "b", "c"])))


@settings(max_examples=60, deadline=None)
@given(st.lists(row_st, max_size=30), st.lists(st.integers(0, 30), max_size=6),
       st.booleans(), st.booleans())
def test_group_aggregate_equals_reference_on_random_micro_batches(rows, cuts, ub, unchanged):
    op = GroupAggregate(SCHEMA, ["k"], AGGS, generate_update_before=ub, emit_unchanged=unchanged)
    runner = LocalRunner(op)
    ref = RefGroupAggregate([0], REF_AGGS, generate_update_before=ub, emit_unchanged=unchanged)
    for batch in batches_of(rows, cuts):
        frame = to_frame([[kind, [k, v, s], i] for i, (kind, k, v, s) in batch], COLS)
        got = to_rows(runner.run_batch(frame, processing_time_ms=0), OUT)
        want = ref.run_batch([(kind, (k, v, s)) for _, (kind, k, v, s) in batch])
        assert got == [[kind, list(row)] for kind, row in want]
    assert runner.metrics.counters["retract_no_match"] == ref.ignored_retractions
