"""Top-N (docs/operators.md, "Top-N") through the local runtime: the Flink 2.3
recordings step by step and property tests against the row-at-a-time
reference on random changelogs and micro-batch splits."""
from __future__ import annotations

import collections

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from changelog_data import batches_of, load_fixture, schema_of, to_frame, to_rows
from spark_changelog.operators.top_n import AppendOnlyTopN, RetractableTopN
from spark_changelog.runtime.local import LocalRunner
from tests.reference.top_n import RefTopN

TYPES = {"BIGINT": pa.int64(), "STRING": pa.string()}
FLINK = load_fixture("flink/topn.json")


#: the global case (no PARTITION BY) runs in tests/sql/test_global_top_n.py
PARTITIONED = [c for c in FLINK["cases"] if "PARTITION BY p" in c["sql"]]


@pytest.mark.parametrize("case", PARTITIONED, ids=[c["name"] for c in PARTITIONED])
def test_flink_top_n_cases_step_by_step(case):
    spec = case["inputs"]["T"]
    cols = spec["columns"]
    schema = schema_of(cols, [TYPES[t] for t in spec["types"]])
    n = int(case["sql"].split("rn <= ")[1].split()[0])
    with_rank = case["sql"].startswith("SELECT p, id, score, rn")
    cls = AppendOnlyTopN if spec["changelog_mode"] == "insert_only" else RetractableTopN
    runner = LocalRunner(cls(schema, ["p"], n, [("score", False)],
                             rank_column="rn" if with_rank else None))
    out_cols = cols + (["rn"] if with_rank else [])
    for step, (_, idx) in enumerate(case["arrival"]):
        kind, values = spec["rows"][idx]
        got = runner.run_batch(to_frame([[kind, values, step]], cols), processing_time_ms=step)
        assert to_rows(got, out_cols) == case["expected_steps"][step], f"step {step}: {kind} {values}"


def test_append_only_top_n_keeps_only_the_top_rows_and_rejects_retractions():
    schema = schema_of(["p", "x"], [pa.int64(), pa.int64()])
    runner = LocalRunner(AppendOnlyTopN(schema, ["p"], 2, [("x", True)]))
    runner.run_batch(to_frame([["+I", [1, v]] for v in (5, 3, 9, 1)], ["p", "x"]),
                     processing_time_ms=0)
    assert sorted(runner.state["x"].tolist()) == [1, 3]
    with pytest.raises(ValueError, match="insert-only input, got a -D row"):
        runner.run_batch(to_frame([["-D", [1, 3], 9]], ["p", "x"]), processing_time_ms=0)


COLS = ["p", "x", "y"]
SCHEMA = schema_of(COLS, [pa.int64(), pa.int64(), pa.int64()])
row_st = st.tuples(st.sampled_from(["+I", "+I", "+U", "-U", "-D"]), st.integers(0, 1),
                   st.one_of(st.none(), st.integers(0, 4)), st.integers(0, 2))


def per_partition(out):
    d = collections.defaultdict(list)
    for kind, row in out:
        d[row[0]].append((kind, tuple(row)))
    return dict(d)


@settings(max_examples=60, deadline=None)
@given(st.lists(row_st, max_size=30), st.lists(st.integers(0, 30), max_size=6),
       st.integers(1, 3), st.booleans(), st.booleans(), st.booleans())
def test_top_n_equals_reference_on_random_micro_batches(rows, cuts, n, asc, with_rank,
                                                        insert_only):
    if insert_only:
        rows = [("+I",) + r[1:] for r in rows]
    cls = AppendOnlyTopN if insert_only else RetractableTopN
    op = cls(SCHEMA, ["p"], n, [("x", asc)], rank_column="rn" if with_rank else None)
    runner, ref = LocalRunner(op), RefTopN([0], n, [(1, asc)], with_rank)
    out_cols = COLS + (["rn"] if with_rank else [])
    for batch in batches_of(rows, cuts):
        frame = to_frame([[kind, [p, x, y], i] for i, (kind, p, x, y) in batch], COLS)
        got = [(k, tuple(v)) for k, v in to_rows(runner.run_batch(frame, processing_time_ms=0),
                                                out_cols)]
        want = ref.run_batch([(kind, (p, x, y)) for _, (kind, p, x, y) in batch])
        assert per_partition(got) == per_partition(want)
    assert runner.metrics.counters["retract_no_match"] == ref.ignored
