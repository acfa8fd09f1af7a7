"""SCD type 2 history (docs/operators.md, "SCD type 2 history") through the local runtime.

The fixtures give the history table after each micro-batch; the emitted
changelog is applied the way the upsert sinks apply it (net change per history
key by ``_seq``), so what is checked is what a history table ends up holding.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelog_data import batches_of, load_fixture, schema_of, to_frame
from spark_changelog.model import KIND_COL, SEQ_COL
from spark_changelog.operators.scd2 import ScdType2History
from spark_changelog.runtime.local import LocalRunner
from spark_changelog.sinks.base import net_changes_per_key

FIX = load_fixture("scd2/histories.json")
COLS = FIX["columns"]
SCHEMA = schema_of(COLS, [getattr(pa, t)() for t in FIX["types"]])
HISTORY = COLS + ["__START_AT", "__END_AT"]
HISTORY_KEY = ["id", "__START_AT"]


def _value(v):
    if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)):
        return None
    return v.item() if hasattr(v, "item") else v


class HistoryTable:
    """An upsert table keyed by the history key, applied like the sinks do."""

    def __init__(self):
        self.rows: dict = {}

    def apply(self, changes: pd.DataFrame) -> None:
        for rec in net_changes_per_key(changes, HISTORY_KEY).to_dict("records"):
            hk = (rec["id"], _value(rec["__START_AT"]))
            if rec[KIND_COL] in (0, 2):
                self.rows[hk] = [_value(rec[c]) for c in HISTORY]
            else:
                self.rows.pop(hk, None)

    def sorted(self) -> list:
        return [self.rows[k] for k in sorted(self.rows)]


def run(batches, **options):
    runner = LocalRunner(ScdType2History(SCHEMA, FIX["key"], **options))
    table, after = HistoryTable(), []
    for batch in batches:
        out = runner.run_batch(to_frame(batch, COLS), processing_time_ms=0)
        assert list(out.columns) == HISTORY + [KIND_COL, SEQ_COL]
        table.apply(out)
        after.append(table.sorted())
    return after, runner


@pytest.mark.parametrize("case", FIX["cases"], ids=[c["name"] for c in FIX["cases"]])
def test_history_after_each_micro_batch(case):
    after, _ = run(case["batches"], **case["options"])
    assert after == case["history"]
    # the in-order run, one change per micro-batch, ends with the same history
    in_order = sorted((r for b in case["batches"] for r in b), key=lambda r: r[2])
    final, _ = run([[r] for r in in_order], **case["options"])
    assert final[-1] == case["history"][-1]


def test_late_change_between_versions_updates_the_cut_version():
    """The emitted changelog of a split: the cut version's __END_AT moves
    (-U/+U sharing one _seq), the new version is inserted."""
    runner = LocalRunner(ScdType2History(SCHEMA, ["id"]))
    runner.run_batch(to_frame([["+I", [1, "a", "x"], 10], ["+U", [1, "c", "x"], 30]], COLS))
    out = runner.run_batch(to_frame([["+U", [1, "b", "x"], 20]], COLS))
    rows = [[k, [_value(v) for v in r]] for k, *r in
            out[[KIND_COL] + HISTORY].itertuples(index=False)]
    assert rows == [[1, [1, "a", "x", 10, 30]], [2, [1, "a", "x", 10, 20]],
                    [0, [1, "b", "x", 20, 30]]]
    assert out[SEQ_COL].iloc[0] == out[SEQ_COL].iloc[1] < out[SEQ_COL].iloc[2]


def test_sequence_of_several_columns_breaks_ties_by_the_next_field():
    cols = ["id", "v", "ts", "n"]
    schema = schema_of(cols, [pa.int64(), pa.string(), pa.int64(), pa.int64()])
    op = ScdType2History(schema, ["id"], sequence_by=["ts", "n"], columns=["id", "v"])
    out = LocalRunner(op).run_batch(to_frame(
        [["+I", [1, "b", 5, 2], 1], ["+I", [1, "a", 5, 1], 2], ["+U", [1, "c", 6, 0], 3]], cols))
    assert list(out.columns) == ["id", "v", "__START_AT_ts", "__START_AT_n", "__END_AT_ts",
                                 "__END_AT_n", KIND_COL, SEQ_COL]
    got = [[_value(v) for v in r] for r in out.drop(columns=[KIND_COL, SEQ_COL]).itertuples(
        index=False)]
    assert got == [[1, "a", 5, 1, 5, 2], [1, "b", 5, 2, 6, 0], [1, "c", 6, 0, None, None]]


def test_null_sequence_value_is_an_error_naming_the_key():
    cols = ["id", "v", "ts"]
    schema = schema_of(cols, [pa.int64(), pa.string(), pa.int64()])
    op = ScdType2History(schema, ["id"], sequence_by=["ts"])
    with pytest.raises(ValueError, match=r"'id': 7.*null sequence value \(ts\)"):
        LocalRunner(op).run_batch(to_frame([["+I", [7, "a", None], 1]], cols))


def test_superseded_counts_repeated_changes():
    _, runner = run([[["+I", [1, "a", "x"], 10]], [["+I", [1, "a", "x"], 10]]])
    assert runner.metrics.counters["superseded"] == 1


# -- any interleaving gives the in-order history ---------------------------------
_change = st.tuples(st.sampled_from(["+I", "+U", "-D"]), st.integers(1, 3),
                    st.sampled_from(["a", "b", None]), st.sampled_from(["x", "y"]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.lists(_change, min_size=1, max_size=14), data=st.data(),
       options=st.sampled_from([{}, {"track_history": ["name"]}, {"ignore_null_updates": True}]))
def test_any_interleaving_gives_the_in_order_history(changes, data, options):
    """Changes of several keys, delivered in any order (files and micro-batches
    interleave per key arbitrarily, some delivered twice), cut into any
    micro-batches: the history table equals the in-order run's."""
    rows = [[kind, [key, name, city], 10 * (i + 1)] for i, (kind, key, name, city)
            in enumerate(changes)]
    in_order, _ = run([[r] for r in rows], **options)
    arrival = data.draw(st.permutations(rows))
    repeats = data.draw(st.lists(st.sampled_from(rows), max_size=3))
    cuts = data.draw(st.lists(st.integers(0, 40), max_size=5))
    batches = [[r for _, r in b] for b in batches_of(list(arrival) + repeats, cuts)]
    got, _ = run(batches, **options)
    assert got[-1] == in_order[-1]


def test_type_1_table_with_partial_updates_out_of_order():
    """ScdType1Table: the current row per key; a late change re-fills the
    nulls of the changes after it (the in-order run's table)."""
    from spark_changelog.operators.scd2 import ScdType1Table
    runner = LocalRunner(ScdType1Table(SCHEMA, ["id"], ignore_null_updates=True))
    out1 = runner.run_batch(to_frame([["+I", [1, "a", "x"], 10], ["+U", [1, None, "y"], 30],
                                      ["+I", [2, "p", "q"], 5]], COLS))
    out2 = runner.run_batch(to_frame([["+U", [1, "b", None], 20], ["-D", [2, None, None], 7]],
                                     COLS))
    rows = lambda out: [[int(k), [_value(v) for v in r]] for k, *r in  # noqa: E731
                        out[[KIND_COL] + COLS].itertuples(index=False)]
    assert list(out1.columns) == COLS + [KIND_COL, SEQ_COL]
    assert rows(out1) == [[0, [1, "a", "y"]], [0, [2, "p", "q"]]]
    assert rows(out2) == [[1, [1, "a", "y"]], [2, [1, "b", "y"]], [3, [2, "p", "q"]]]
