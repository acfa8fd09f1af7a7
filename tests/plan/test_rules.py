"""Planner rules over the tree and expressions read from sqlglot trees
(docs/plan.md).  Pure: no Spark."""
from __future__ import annotations

import pyarrow as pa
import pytest

from spark_changelog.model import ChangelogMode, join_output_names
from spark_changelog.operators.join import JoinInputLayout
from spark_changelog.plan import PlanError, explain_plan
from spark_changelog.plan.expressions import classify, is_nondeterministic, parse
from spark_changelog.plan.nodes import (Filter, Join, Materialize, Normalize, Project, ProjectItem,
                                        Source, WatermarkAssigner, source_leaves)
from spark_changelog.plan.rules import optimize, plan_sink

R, U, I = ChangelogMode.RETRACT, ChangelogMode.UPSERT, ChangelogMode.INSERT_ONLY
S1 = Source("s1", ("id", "level"), ("id",))
S2 = Source("s2", ("id", "attr"), ("id",))


def test_optimize_normalizes_upsert_join_inputs_once():
    up = Source("u", ("id", "level"), ("id",), U)
    j = Join(up, S2, ("level",), ("id",))
    planned = optimize(j)
    assert planned is optimize(j)                       # memoized: one tree per stream
    assert isinstance(planned.left, Normalize) and planned.left.input is up
    assert planned.right is S2                          # bounded retract input: as it is
    assert optimize(S1) is S1


def test_optimize_rewrites_below_projections():
    stream = Source("s", ("id", "level"), ("id",), R, streaming=True)
    p = Project(Join(stream, S2, ("level",), ("id",)), (ProjectItem.ref("id"),))
    planned = optimize(p)
    assert isinstance(planned, Project) and isinstance(planned.input.left, Normalize)
    assert "join needs each key's changes in source-sequence order" in planned.input.left.label()


@pytest.mark.parametrize("mode,streaming,inserted", [(U, False, True), (R, False, False),
                                                     (R, True, False), (I, True, False)])
def test_filter_input(mode, streaming, inserted):
    src = Source("s", ("id", "v"), ("id",), mode, streaming=streaming)
    f = optimize(Filter(src, parse("v < 10"), "v < 10"))
    assert isinstance(f.input, Normalize) is inserted
    if inserted:
        assert f.input.generate_update_before and "filter" in f.input.inserted_because
    assert f.traits.upsert_key == ("id",)
    assert f.label() == "Calc(where=[v < 10])"


def test_upsert_input_without_key_cannot_be_filtered():
    with pytest.raises(PlanError, match="input of a filter"):
        optimize(Filter(Source("s", ("a",), (), U), parse("a > 1"), "a > 1"))


def test_plan_sink_orders_then_materializes():
    stream = Source("s", ("id", "email"), ("id",), R, streaming=True)
    sink = plan_sink(stream, ("email",), table="t", materializer_ttl_ms=5, key_groups=3)
    m = sink.input
    assert isinstance(m, Materialize) and (m.state_ttl_ms, m.key_groups) == (5, 3)
    assert isinstance(m.input, Normalize) and m.input.generate_update_before
    keyed = plan_sink(stream, ("id",), table="t")
    assert isinstance(keyed.input, Normalize) and not keyed.input.generate_update_before
    assert not keyed.decision.inserted


def test_source_leaves_and_traits_of_event_time():
    w = WatermarkAssigner(Project(S1, (ProjectItem.ref("id"), ProjectItem.ref("ts", "level"))),
                          "ts", 10)
    j = Join(w, Join(S2, S1, ("id",), ("id",)), ("id",), ("id",))
    assert source_leaves(j) == [S1, S2]
    t = w.traits
    assert (t.time_attribute, t.watermark.column, t.watermark.bound_ms) == ("ts", "ts", 10)
    renamed = Project(w, (ProjectItem.ref("id"), ProjectItem.ref("event", "ts")))
    assert (renamed.traits.time_attribute, renamed.traits.watermark.column) == ("event", "event")
    assert Project(w, (ProjectItem.ref("id"),)).traits.time_attribute is None


def test_one_join_renaming_rule():
    """The planner's names and the operator's layout come from one function."""
    left = pa.schema([("id", pa.int64()), ("id0", pa.int64()), ("v", pa.string())])
    right = pa.schema([("id", pa.int64()), ("v", pa.string()), ("w", pa.string())])
    layout = JoinInputLayout(left, right, ["id"], ["id"])
    assert layout.right_rename == join_output_names(left.names, right.names) == {
        "id": "id1", "v": "v0", "w": "w"}
    j = Join(Source("l", tuple(left.names), ("id",)), Source("r", tuple(right.names), ("id",)),
             ("id",), ("id",))
    assert j.traits.columns == ("id", "id0", "v", "id1", "v0", "w")
    assert "where=[id = id1]" in explain_plan(j)


@pytest.mark.parametrize("text,nondeterministic", [
    ("rand()", True), ("RAND(42)", True), ("coalesce(a, uuid())", True),
    ("unix_timestamp()", True), ("unix_timestamp(ts)", False),
    ("'rand()'", False), ("nowhere(x)", False), ("now()", True),
    ("CASE WHEN a > 1 THEN current_date() END", True), ("a + 1", False),
])
def test_nondeterminism_is_read_from_the_tree(text, nondeterministic):
    assert is_nondeterministic(text) is nondeterministic


@pytest.mark.parametrize("text,source,injective,reads", [
    ("`we ird`", "we ird", True, ("we ird",)),
    ("(id)", "id", True, ("id",)),
    ("CAST(id AS DECIMAL(20, 0)) AS d", "id", True, ("id",)),
    ("CAST(id AS DECIMAL(5, 0)) AS d", "id", False, ("id",)),
    ("id + level AS s", None, False, ("id", "level")),
    ("transform(arr, x -> x + id) AS t", None, False, ("arr", "id")),
])
def test_key_preservation_is_read_from_the_tree(text, source, injective, reads):
    types = {"id": "int", "level": "bigint", "we ird": "string", "arr": "array<int>"}
    it = classify(text, None, types)
    assert (it.source, it.injective, it.inputs) == (source, injective, reads)


def test_state_warning_names_every_stateful_node_without_ttl_in_streaming_plans():
    stream = Source("s", ("id", "level"), ("id",), R, streaming=True)
    sink = plan_sink(Join(stream, S2, ("level",), ("id",)), ("level",), table="t")
    text = explain_plan(sink)
    warning = [line for line in text.splitlines() if line.startswith("WARNING: the state of")]
    assert warning == ["WARNING: the state of ChangelogNormalize, Join, SinkUpsertMaterializer grows "
                       "without bound in a streaming run: per-key rows stay until they are "
                       "retracted, and no state TTL is set (`state_ttl_ms=` in the Python API, SET "
                       "'table.exec.state.ttl' in SQL). A TTL bounds it; a TTL shorter than the "
                       "time between a row and its retraction leaves stale rows (counted and "
                       "warned about at run time)"]
    # a TTL on the join covers the normalize inserted for it; the materializer's its own
    with_ttl = plan_sink(Join(stream, S2, ("level",), ("id",), state_ttl_ms=60_000), ("level",),
                         table="t", materializer_ttl_ms=60_000)
    assert with_ttl.input.input.left.state_ttl_ms == 60_000      # Materialize > Join > Normalize
    assert "WARNING: the state of" not in explain_plan(with_ttl)
    # bounded inputs keep no state across runs: nothing to warn about
    assert "WARNING: the state of" not in explain_plan(plan_sink(Join(S1, S2, ("level",), ("id",)),
                                                                 ("level",), table="t"))


# ------------------------------------------------- sink keys emitted once (Delta appends)
def _keep_first(**kw):
    from spark_changelog.plan.nodes import Deduplicate
    src = Source("s", ("k", "g", "v"), (), I, streaming=True)
    return Deduplicate(src, ("k",), **kw)


@pytest.mark.parametrize("node, sink_key, once", [
    (_keep_first(), ("k",), True),
    (_keep_first(), ("k", "g"), True),                      # the sink key contains the dedup key
    (_keep_first(), ("g",), False),                         # another key: a MERGE decides
    (_keep_first(state_ttl_ms=1000), ("k",), False),        # a TTL forgets keys: emitted again
    (_keep_first(keep="last"), ("k",), False),              # updates
    (_keep_first(order_by="v"), ("k",), False),             # event time: not claimed
    (Filter(_keep_first(), parse("v > 1"), "v > 1"), ("k",), True),
    (Project(_keep_first(), (ProjectItem.ref("id", "k"), ProjectItem.ref("v"))), ("id",), True),
    (Project(_keep_first(), (ProjectItem.ref("v"),)), ("v",), False),   # the key is gone
])
def test_sink_keys_emitted_once(node, sink_key, once):
    from spark_changelog.plan.rules import sink_keys_emitted_once
    sink = plan_sink(node, sink_key, table="t")
    assert sink_keys_emitted_once(sink) is once


def test_history_keys_and_the_note_when_its_sequence_may_not_compare():
    """History (docs/operators.md, "SCD type 2 history"): the key plus
    __START_AT is the unique, upsert and primary key; ordered by the input's
    sequence over an input keyed otherwise, explain notes the risk."""
    from spark_changelog.plan.nodes import History, Source
    src = Source("s", ("id", "k", "v"), ("id",))
    h = History(src, ("id",))
    assert h.traits.upsert_key == h.traits.primary_key == ("id", "__START_AT")
    assert h.traits.columns == ("id", "k", "v", "__START_AT", "__END_AT")
    assert h.traits.notes == ()
    assert "not comparable" in History(src, ("k",)).traits.notes[0]
    assert History(src, ("k",), sequence_by=("v",)).traits.notes == ()
    assert History(src, ("id",), scd_type=1).traits.upsert_key == ("id",)
