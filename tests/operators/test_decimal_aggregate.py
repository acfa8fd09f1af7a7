"""DECIMAL and BIGINT aggregates against Flink 2.3 (tests/fixtures/flink/decimal.json,
docs/operators.md, "DECIMAL"): result types, exact values step by step (the state
through an Arrow round trip after every step, as the runtime stores it), and the
overflow cases, where Flink wraps a BIGINT around or emits null for a DECIMAL and
we stop with an error naming the group."""
from __future__ import annotations

import decimal
import re

import pyarrow as pa
import pytest

from changelog_data import load_fixture, schema_of, to_frame, to_rows
from spark_changelog.operators.aggregate.accumulators import AggregateOverflow
from spark_changelog.operators.aggregate.group_aggregate import GroupAggregate
from spark_changelog.runtime.local import LocalRunner

FLINK = {c["name"]: c for c in load_fixture("flink/decimal.json")["cases"]}
ALL = ["sum", "avg", "min", "max", "count"]

#: per case: the input columns and their types (the query's CASTs of the STRING
#: column ``v``), the group key, the calls (function, column, output)
CASES = {
    "DEC1_sum_avg_decimal_10_2_retract": ({"k": "STRING", "d": (10, 2)}, ["k"], ALL),
    "DEC2_decimal_38_10": ({"k": "STRING", "d": (38, 10)}, ["k"], ALL),
    "DEC3_sum_precision_overflow": ({"k": "STRING", "d": (38, 0)}, ["k"], ["sum", "count*"]),
    "DEC4_avg_precision_overflow": ({"k": "STRING", "d": (38, 0)}, ["k"], ["avg", "count*"]),
    "DEC5_scales_and_sum_of_small_precision": ({"k": "STRING", "d5": (5, 2), "d20": (20, 8)},
                                               ["k"], None),
    "DEC6_group_by_decimal_key": ({"d": (10, 2)}, ["d"], ["count*"]),
    "DEC7_bigint_sum_overflow": ({"k": "STRING", "d": "BIGINT"}, ["k"], ["sum", "avg"]),
}
#: where Flink changes a value and we stop instead: (case, step)
OVERFLOW_AT = {"DEC3_sum_precision_overflow": 1, "DEC4_avg_precision_overflow": 0,
               "DEC7_bigint_sum_overflow": 1}


def arrow_type(t):
    if isinstance(t, tuple):
        return pa.decimal128(*t)
    return {"STRING": pa.string(), "BIGINT": pa.int64()}[t]


def flink_type(t: pa.DataType) -> str:
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision}, {t.scale})"
    return {pa.int64(): "BIGINT", pa.string(): "STRING"}[t]


def cast_input(value, t):
    """The query's ``CAST(v AS DECIMAL(p, s))`` of the recorded STRING input."""
    if value is None or not isinstance(t, tuple):
        return value
    with decimal.localcontext(prec=80, rounding=decimal.ROUND_HALF_UP):
        return decimal.Decimal(value).quantize(decimal.Decimal(1).scaleb(-t[1]))


def setup(name):
    columns, key, funcs = CASES[name]
    value_cols = [c for c in columns if c not in key] or list(columns)
    if funcs is None:       # DEC5: SUM(d5), AVG(d20), SUM(d20)
        calls = [("sum", "d5", "s5"), ("avg", "d20", "a20"), ("sum", "d20", "s20")]
    else:
        out = {"sum": "s", "avg": "a", "min": "mn", "max": "mx", "count": "c", "count*": "c"}
        calls = [("count", None if f == "count*" else value_cols[0], out[f]) if f.startswith("count")
                 else (f, value_cols[0], out[f]) for f in funcs]
    schema = schema_of(list(columns), [arrow_type(t) for t in columns.values()])
    return columns, key, calls, schema


def as_text(row):
    return [decimal.Decimal(v) if isinstance(v, str) and re.fullmatch(r"-?[0-9.]+", v) else v
            for v in row]


def run_steps(name):
    """Yields (step, our output or the raised error, Flink's output)."""
    case = FLINK[name]
    columns, key, calls, schema = setup(name)
    op = GroupAggregate(schema, key, calls)
    runner = LocalRunner(op)
    spec = case["inputs"]["T"]
    for step, (_, idx) in enumerate(case["arrival"]):
        kind, (k, v) = spec["rows"][idx]
        values = [k if c == "k" else cast_input(v, t) for c, t in columns.items()]
        try:
            got = to_rows(runner.run_batch(to_frame([[kind, values, step]], list(columns)),
                                           processing_time_ms=step), key + [c[2] for c in calls])
        except AggregateOverflow as e:
            yield step, e, case["expected_steps"][step]
            return
        # the state as the runtime keeps it: through Arrow, in the operator's state schema
        runner.state = pa.Table.from_pandas(runner.state, schema=op.state_schema,
                                            preserve_index=False).to_pandas()
        yield step, got, case["expected_steps"][step]


@pytest.mark.parametrize("name", sorted(CASES))
def test_result_types_are_flinks(name):
    _, key, calls, schema = setup(name)
    op = GroupAggregate(schema, key, calls)
    ours = [flink_type(op.output_schema.field(c).type) for c in key + [c[2] for c in calls]]
    # Flink's COUNT is BIGINT NOT NULL; ours is BIGINT
    assert ours == [t.replace(" NOT NULL", "") for t in FLINK[name]["result_types"]]


@pytest.mark.parametrize("name", sorted(set(CASES) - set(OVERFLOW_AT)))
def test_decimal_values_step_by_step_are_flinks(name):
    _, key, calls, schema = setup(name)
    out_types = GroupAggregate(schema, key, calls).output_schema
    scales = [out_types.field(c).type.scale if pa.types.is_decimal(out_types.field(c).type)
              else None for c in key + [c[2] for c in calls]]
    for step, got, want in run_steps(name):
        assert not isinstance(got, Exception), f"step {step}: {got}"
        assert [[k, as_text(r)] for k, r in got] == [[k, as_text(r)] for k, r in want], \
            f"step {step}"
        # exact digits with the type's scale (what print and cat write)
        for _, row in got:
            for v, scale in zip(row, scales):
                if v is not None and scale is not None:
                    assert v.as_tuple().exponent == -scale, (v, scale)


@pytest.mark.parametrize("name", sorted(OVERFLOW_AT))
def test_overflow_stops_naming_the_group_where_flink_changes_the_value(name):
    """Up to the overflow our steps are Flink's; at it, Flink emits a wrapped
    BIGINT or a null DECIMAL and we raise AggregateOverflow naming the group."""
    steps = list(run_steps(name))
    *before, (step, err, flink) = steps
    assert step == OVERFLOW_AT[name]
    for s, got, want in before:
        assert [[k, as_text(r)] for k, r in got] == [[k, as_text(r)] for k, r in want]
    assert isinstance(err, AggregateOverflow)
    assert "in group (k=a)" in str(err)
    assert str(err).startswith({"DEC3_sum_precision_overflow": "SUM(d) overflows DECIMAL(38, 0)",
                                "DEC4_avg_precision_overflow": "AVG(d) overflows DECIMAL(38, 6)",
                                "DEC7_bigint_sum_overflow": "SUM(d) overflows BIGINT"}[name])
    # what Flink did instead: a null, or a negative sum of positive values
    new = [r for k, r in flink if k in ("+I", "+U")][-1]
    assert new[1] is None or int(new[1]) < 0


def test_bigint_sum_near_the_limit_without_overflow_is_exact():
    """Sums near 2^63 that stay inside take the exact check and pass; a sum
    that leaves the range and comes back within one batch is exact too."""
    schema = schema_of(["k", "v"], [pa.string(), pa.int64()])
    r = LocalRunner(GroupAggregate(schema, ["k"], [("sum", "v", "s")]))
    big = 2 ** 63 - 10
    out = r.run_batch(to_frame([["+I", ["a", big], 0], ["+I", ["a", 9], 1],
                                ["+I", ["b", -big], 2], ["+I", ["b", -2 ** 62], 3],
                                ["-D", ["b", -2 ** 62], 4]], ["k", "v"]), processing_time_ms=0)
    assert to_rows(out, ["k", "s"]) == [["+I", ["a", 2 ** 63 - 1]], ["+I", ["b", -big]]]
