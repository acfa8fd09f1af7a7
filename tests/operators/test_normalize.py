"""ChangelogNormalize (docs/semantics.md, section 5) through the local runtime."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from changelog_data import load_fixture, schema_of, to_frame, to_rows
from spark_changelog.operators.normalize import ChangelogNormalize
from spark_changelog.runtime.local import LocalRunner, one_row_at_a_time

FIX = load_fixture("normalize/scenarios.json")
COLS = FIX["columns"]
SCHEMA = schema_of(COLS, [getattr(pa, t)() for t in FIX["types"]])


def make(**kw):
    return ChangelogNormalize(SCHEMA, FIX["key"], **kw)


@pytest.mark.parametrize("case", FIX["cases"], ids=[c["name"] for c in FIX["cases"]])
def test_scenarios_one_batch_and_row_at_a_time(case):
    rows = to_frame(case["input"], COLS)
    assert to_rows(LocalRunner(make()).run_batch(rows, processing_time_ms=0), COLS) == case["expected"]
    assert to_rows(one_row_at_a_time(make(), rows, processing_time_ms=0), COLS) == case["expected"]


def test_older_change_in_later_batch_is_superseded_and_counted():
    r = LocalRunner(make())
    out1 = r.run_batch(to_frame([["+I", [1, "new", 2.0], 50]], COLS), processing_time_ms=0)
    out2 = r.run_batch(to_frame([["+I", [1, "old", 1.0], 40]], COLS), processing_time_ms=1)
    assert to_rows(out1, COLS) == [["+I", [1, "new", 2.0]]]
    assert to_rows(out2, COLS) == []
    assert r.metrics.counters["superseded"] == 1
    assert to_rows(r.state.assign(_kind=np.int8(0)), COLS) == [["+I", [1, "new", 2.0]]]


def test_tombstone_blocks_late_older_insert_until_retention_ends():
    r = LocalRunner(make(tombstone_retention_ms=1000))
    r.run_batch(to_frame([["+I", [1, "a", 1.0], 10], ["-D", [1, "a", 1.0], 20]], COLS), processing_time_ms=0)
    late = to_frame([["+I", [1, "a", 1.0], 15]], COLS)
    assert to_rows(r.run_batch(late, processing_time_ms=500), COLS) == []
    assert r.metrics.counters["superseded"] == 1
    # after the retention the tombstone is gone: the same late row is a new insert
    assert to_rows(r.run_batch(late, processing_time_ms=5000), COLS) == [["+I", [1, "a", 1.0]]]
    assert r.metrics.counters["tombstones_expired"] == 1


def test_state_ttl_emits_equal_rows_and_expires_state():
    """D1's rule: with TTL on, an equal row still emits -U/+U (docs/semantics.md, section 5)."""
    r = LocalRunner(make(state_ttl_ms=100))
    out = r.run_batch(to_frame([["+I", [1, "a", 1.0], 1], ["+I", [1, "a", 1.0], 2]], COLS), processing_time_ms=0)
    assert to_rows(out, COLS) == [["+I", [1, "a", 1.0]], ["-U", [1, "a", 1.0]], ["+U", [1, "a", 1.0]]]
    out = r.run_batch(to_frame([["+U", [1, "b", 1.0], 3]], COLS), processing_time_ms=1000)
    assert to_rows(out, COLS) == [["+I", [1, "b", 1.0]]]
    assert r.metrics.counters["ttl_expired"] == 1


def test_without_update_before():
    out = LocalRunner(make(generate_update_before=False)).run_batch(
        to_frame([["+I", [1, "a", 1.0], 1], ["+U", [1, "b", 1.0], 2]], COLS), processing_time_ms=0)
    assert to_rows(out, COLS) == [["+I", [1, "a", 1.0]], ["+U", [1, "b", 1.0]]]


# -- cases recorded from Flink 2.3 (tests/fixtures/flink/normalize.json) ----------
FLINK = load_fixture("flink/normalize.json")
NORMALIZE_CASES = [c for c in FLINK["cases"] if c["name"][:3] in {f"N{i}_" for i in range(1, 9)}]
_TYPES = {"BIGINT": pa.int64(), "STRING": pa.string(), "DOUBLE": pa.float64(), "INT": pa.int32()}


@pytest.mark.parametrize("case", NORMALIZE_CASES, ids=[c["name"] for c in NORMALIZE_CASES])
def test_flink_changelog_normalize_cases_step_by_step(case):
    """One input row per micro-batch in Flink's arrival order; each step's output
    equals what Flink emitted right after that arrival."""
    (name, spec), = case["inputs"].items()
    cols = spec["columns"]
    schema = schema_of(cols, [_TYPES[t] for t in spec["types"]])
    ttl = 3_600_000 if "table.exec.state.ttl" in case.get("config", {}) else None
    runner = LocalRunner(ChangelogNormalize(schema, spec["primary_key"], state_ttl_ms=ttl))
    for step, (_, idx) in enumerate(case["arrival"]):
        kind, values = spec["rows"][idx]
        out = runner.run_batch(to_frame([[kind, values, step]], cols), processing_time_ms=step)
        assert to_rows(out, cols) == case["expected_steps"][step], f"step {step}: {kind} {values}"
