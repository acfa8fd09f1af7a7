"""Planner (spark_changelog.plan): trait inference, the materializer rule, explain.

Pure: no Spark.  Cases are data; the seed example is docs/semantics.md, section 2, checked
against Flink 2.3's EXPLAIN CHANGELOG_MODE in tests/fixtures/flink/materializer.json.
"""
from __future__ import annotations

import pytest

from changelog_data import load_fixture
from spark_changelog.model import ChangelogMode
from spark_changelog.plan import PlanError, decide, explain_plan, materialize
from spark_changelog.plan.expressions import cast_is_injective, classify, is_nondeterministic
from spark_changelog.plan.rules import optimize, order_input
from spark_changelog.plan.nodes import (Aggregate, Deduplicate, Join, Normalize, Project,
                                         ProjectItem, Sink, Source, TopN, WatermarkAssigner,
                                         join_input_specs)

R, U, I = ChangelogMode.RETRACT, ChangelogMode.UPSERT, ChangelogMode.INSERT_ONLY


def seed(mode=R):
    s1 = Source("s1", ("id", "level"), ("id",), mode)
    s2 = Source("s2", ("id", "attr"), ("id",), mode)
    j = Join(s1, s2, ("level",), ("id",))
    return Project(j, (ProjectItem.ref("id"), ProjectItem.ref("level"), ProjectItem.ref("attr")))


def traits_of(node):
    t = node.traits
    return t.mode, [list(k) for k in t.unique_keys], list(t.upsert_key or [])


# --------------------------------------------------------------------------- trait inference

S1 = Source("s1", ("id", "level"), ("id",))
S2 = Source("s2", ("id", "attr"), ("id",))
NOKEY = Source("n", ("a", "b"), ())
INS = Source("ins", ("id", "v"), ("id",), I)
INS2 = Source("ins2", ("k", "w"), ("k",), I)

TRAIT_CASES = {
    # name: (node, (mode, unique keys, upsert key))
    "source_pk": (S1, (R, [["id"]], ["id"])),
    "source_no_key": (NOKEY, (R, [], [])),
    "source_insert_only": (INS, (I, [["id"]], ["id"])),
    "project_keeps_key": (Project(S1, (ProjectItem.ref("id"), ProjectItem.ref("level"))),
                          (R, [["id"]], ["id"])),
    "project_renames_key": (Project(S1, (ProjectItem.ref("uid", "id"),)), (R, [["uid"]], ["uid"])),
    "project_drops_key": (Project(S1, (ProjectItem.ref("level"),)), (R, [], [])),
    "project_expression_of_key": (
        Project(S1, (ProjectItem("k", None, False, True, "concat(id, level)", ("id", "level")),
                     ProjectItem.ref("level"))), (R, [], [])),
    "project_narrowing_cast": (Project(S1, (ProjectItem("id", "id", False, True, "CAST(id AS INT)"),)),
                               (R, [], [])),
    "project_widening_cast": (Project(S1, (ProjectItem("id", "id", True, True, "CAST(id AS BIGINT)"),)),
                              (R, [["id"]], ["id"])),
    "normalize": (Normalize(NOKEY, ("a",)), (R, [["a"]], ["a"])),
    "normalize_no_update_before": (Normalize(NOKEY, ("a",), False), (U, [["a"]], ["a"])),
    # the seed: s1 shuffled by level loses its upsert key; s2 is unique on its join key
    "seed_join": (Join(S1, S2, ("level",), ("id",)), (R, [["id"]], [])),
    "seed_select": (seed(), (R, [["id"]], [])),
    # both sides joined on their keys: the upsert key survives
    "join_on_both_keys": (Join(S1, S2, ("id",), ("id",)), (R, [["id"], ["id0"]], ["id"])),
    "join_insert_only_inner": (Join(INS, INS2, ("id",), ("k",)), (I, [["id"], ["k"]], ["id"])),
    "join_insert_only_left_is_retract": (Join(INS, INS2, ("id",), ("k",), "left"),
                                         (R, [["id"]], ["id"])),
    "join_no_keys": (Join(NOKEY, S2, ("a",), ("id",)), (R, [], [])),
    # many-to-many on non-key columns: only the combination is unique
    "join_many_to_many": (Join(S1, Source("x", ("xid", "level"), ("xid",)), ("level",), ("level",)),
                          (R, [["id", "xid"]], [])),
    # deduplication, aggregation, Top-N (docs/operators.md)
    "dedup_keep_first_insert_only": (Deduplicate(INS, ("v",), "first"), (I, [["id"], ["v"]], ["v"])),
    "dedup_keep_last": (Deduplicate(INS, ("v",), "last"), (R, [["id"], ["v"]], ["v"])),
    "dedup_keep_last_no_update_before": (Deduplicate(INS, ("v",), "last", None, False),
                                         (U, [["id"], ["v"]], ["v"])),
    "group_aggregate_key": (Aggregate(S1, ("level",), (("count", None, "n"),)),
                            (R, [["level"]], ["level"])),
    "group_aggregate_no_key_input": (Aggregate(NOKEY, ("a", "b"), (("sum", "b", "s"),)),
                                     (R, [["a", "b"]], ["a", "b"])),
    "top_n_with_rank": (TopN(S1, ("level",), 3, (("id", False),), "rn"),
                        (R, [["id"], ["level", "rn"]], ["level", "rn"])),
    "top_n_without_rank": (TopN(S1, ("level",), 3, (("id", False),)), (R, [["id"]], [])),
    # no partition (a global Top-N): the rank alone is unique
    "top_n_global_with_rank": (TopN(S1, (), 3, (("id", False),), "rn"),
                               (R, [["id"], ["rn"]], ["rn"])),
    "dedup_global_keep_first": (Deduplicate(INS, (), "first"), (I, [["id"]], [])),
}


@pytest.mark.parametrize("name", sorted(TRAIT_CASES))
def test_traits(name):
    node, want = TRAIT_CASES[name]
    mode, uks, up = want
    assert traits_of(node) == (mode, uks, up)


def test_seed_join_specs_and_state_keys_match_flink():
    j = Join(S1, S2, ("level",), ("id",))
    # Flink 2.3: leftInputSpec=[HasUniqueKey], rightInputSpec=[JoinKeyContainsUniqueKey]
    plan = load_fixture("flink/materializer.json")["explains"][0]["explain_changelog_mode"]
    assert any("leftInputSpec=[HasUniqueKey], rightInputSpec=[JoinKeyContainsUniqueKey]" in line
               for line in plan)
    left, right = join_input_specs(j)
    assert (left.label, right.label) == ("HasUniqueKey", "JoinKeyContainsUniqueKey")
    assert (left.view, left.unique_key) == ("InputSideHasUniqueKey", ("id",))
    assert (right.view, right.unique_key) == ("JoinKeyContainsUniqueKey", ("id",))
    assert j.traits.columns == ("id", "level", "id0", "attr")


def test_upsert_input_of_a_join_gets_normalize():
    up = Source("u", ("id", "v"), ("id",), U)
    prepared = order_input(up, "join")
    assert isinstance(prepared, Normalize) and prepared.auto and prepared.key == ("id",)
    assert prepared.traits.mode is R
    assert order_input(S1, "join") is S1
    text = explain_plan(Join(prepared, S2, ("v",), ("id",)))
    assert "ChangelogNormalize(key=[id], inserted: upsert input of a join" in text


# --------------------------------------------------------------------------- order guarantee
# (docs/semantics.md, section 10): (source facts, consumer, update_before) ->
# (normalize inserted?, its key, generate_update_before)
ORDER_CASES = [
    # a streaming CDC source is not ordered: every order-sensitive consumer gets a normalize
    (dict(mode=R, streaming=True), "join", True, (True, ("id",), True)),
    (dict(mode=R, streaming=True), "upsert sink", False, (True, ("id",), False)),
    (dict(mode=R, streaming=True), "sink upsert materializer", True, (True, ("id",), True)),
    # bounded: the runtime sorts each key's changes by _seq, nothing to restore
    (dict(mode=R, streaming=False), "join", True, (False, None, None)),
    # insert-only: nothing to retract, order cannot change the result
    (dict(mode=I, streaming=True), "join", True, (False, None, None)),
    # the user vouches for the order: no normalize (explain warns)
    (dict(mode=R, streaming=True, declared_ordered=True), "join", True, (False, None, None)),
    # an upsert source is normalized before a join even when bounded (needs -U)
    (dict(mode=U, streaming=False), "join", True, (True, ("id",), True)),
]


@pytest.mark.parametrize("facts,consumer,ub,want", ORDER_CASES)
def test_order_input_rule(facts, consumer, ub, want):
    src = Source("s1", ("id", "level"), ("id",), **facts)
    node = order_input(src, consumer, update_before=ub)
    inserted, key, gub = want
    assert isinstance(node, Normalize) is inserted
    if inserted:
        assert (node.key, node.generate_update_before, node.input) == (key, gub, src)
        assert node.traits.ordered
    else:
        assert node is src


def test_order_rule_through_projection_and_explain():
    src = Source("s1", ("id", "level"), ("id",), R, streaming=True)
    assert not src.traits.ordered
    p = Project(src, (ProjectItem.ref("id"), ProjectItem.ref("level", "level")))
    assert not p.traits.ordered
    j = Join(order_input(p, "join"), order_input(S2, "join"), ("level",), ("id",))
    assert j.traits.ordered
    text = explain_plan(j)
    assert ("ChangelogNormalize(key=[id], inserted: join needs each key's changes in "
            "source-sequence order") in text
    # a streaming changelog that lost its key cannot be put back in order: explain
    # and the sink's plan warnings say so
    dropped = Project(src, (ProjectItem.ref("level"),))
    assert order_input(dropped, "join") is dropped
    j2 = Join(dropped, S2, ("level",), ("id",))
    assert ("note: left input is a streaming changelog without a key: its per-row order cannot "
            "be restored") in explain_plan(j2)
    d = decide(dropped.traits, ("level",))
    assert any("per-row order cannot be restored" in w for w in d.warnings)


def test_ops_explain_and_order_rules():
    """Explain shows the new nodes and when a choice waits for the watermark;
    an unordered streaming input gets a ChangelogNormalize in front; a group
    key sink needs no materializer, another key does."""
    src = Source("s1", ("id", "level"), ("id",), R, streaming=True)
    agg = optimize(Aggregate(src, ("level",), (("count", None, "n"), ("avg", "id", "a"))))
    text = explain_plan(agg)
    assert "GroupAggregate(groupBy=[level], select=[level, COUNT(*) AS n, AVG(id) AS a])" in text
    assert "ChangelogNormalize(key=[id], inserted: group aggregate needs" in text
    assert not decide(agg.traits, ("level",)).inserted
    assert decide(agg.traits, ("n",)).inserted
    ev = WatermarkAssigner(Source("e", ("k", "t"), (), I), "t", 0)
    text = explain_plan(Deduplicate(ev, ("k",), "first", "t"))
    # the watermark shown as a window's: the source's, per partition, idleness
    assert ("Deduplicate(keep=[FirstRow], key=[k], order=[ROWTIME(t)], watermark=[generated at "
            "the source: e: t - 0 ms, the minimum over the source partitions, no idleness])") in text
    idle = WatermarkAssigner(Source("e", ("k", "t"), (), I), "t", 0, "k", idle_timeout_ms=5)
    assert ("order=[ROWTIME(t)], watermark=[generated at the source: e per partition of k: t - 0 ms, "
            "the minimum over the source partitions, idle after 5 ms])") in \
        explain_plan(Deduplicate(idle, ("k",), "first", "t"))
    assert "waits for the watermark" in text
    assert ("Rank(strategy=[RetractStrategy], rankType=[ROW_NUMBER], rankRange=[rankStart=1, "
            "rankEnd=3], partitionBy=[level], orderBy=[id DESC], select=[*, rn])") in \
        explain_plan(TopN(S1, ("level",), 3, (("id", False),), "rn"))


def test_declared_ordered_source_explains_the_risk():
    src = Source("s1", ("id", "level"), ("id",), R, streaming=True, declared_ordered=True)
    text = explain_plan(src)
    assert "Source(name=[s1], fields=[id, level], primaryKey=[id], ordered=[declared])" in text
    assert "note: declared ordered: each key's changes are applied in arrival order" in text
    assert "keep stale rows or lose rows" in text


def test_nondeterminism_propagates_and_normalize_clears_it():
    ts = ProjectItem("ts", None, False, False, "current_timestamp() AS ts")
    p = Project(S1, (ProjectItem.ref("id"), ProjectItem.ref("level"), ts))
    assert p.traits.nondeterministic == {"ts"}
    p2 = Project(p, (ProjectItem.ref("t2", "ts"), ProjectItem.ref("id")))
    assert p2.traits.nondeterministic == {"t2"}
    assert Normalize(p, ("id",)).traits.nondeterministic == frozenset()


# --------------------------------------------------------------------------- materializer rule

MATERIALIZE_CASES = {
    # name: (input node, sink key, strategy, conflict, inserted, unsafe, reason contains)
    "seed_auto": (seed(), ("id",), "auto", None, True, False, "it has no upsert key"),
    "seed_auto_dedup": (seed(), ("id",), "auto", "deduplicate", True, False, "no upsert key"),
    "seed_force": (seed(), ("id",), "force", None, True, False, "forced"),
    "seed_none": (seed(), ("id",), "none", None, False, True, "UNSAFE"),
    "sink_key_contains_upsert_key": (Normalize(NOKEY, ("a",)), ("a", "b"), "auto", None, False,
                                     False, "contains the input's upsert key [a]"),
    "sink_key_is_upsert_key": (S1, ("id",), "auto", None, False, False, "contains"),
    "upsert_key_not_in_sink_key": (S1, ("level",), "auto", None, True, False,
                                   "upsert key [id] is not contained in the sink key [level]"),
    "insert_only": (INS, ("v",), "auto", None, False, False, "insert-only"),
    "insert_only_force": (INS, ("v",), "force", None, True, False, "forced"),
    "none_not_needed": (S1, ("id",), "none", None, False, False, "not needed"),
    "no_sink_key": (seed(), (), "force", None, False, False, "no primary key"),
}


@pytest.mark.parametrize("name", sorted(MATERIALIZE_CASES))
def test_materializer_decision(name):
    node, key, strategy, conflict, inserted, unsafe, reason = MATERIALIZE_CASES[name]
    sink = materialize(Sink(node, "t1", key, strategy, conflict))
    d = sink.decision
    assert (d.inserted, d.unsafe) == (inserted, unsafe)
    assert reason in d.reason
    assert (type(sink.input).__name__ == "Materialize") == inserted
    text = explain_plan(sink)
    assert f"upsert materializer: {'inserted' if inserted else 'not inserted'}: " in text


@pytest.mark.parametrize("conflict", ["deduplicate", "error", "nothing"])
def test_none_with_conflict_is_rejected(conflict):
    with pytest.raises(PlanError, match="FLINK-41007"):
        materialize(Sink(seed(), "t1", ("id",), "none", conflict))


def test_conflict_error_needs_watermarks():
    with pytest.raises(PlanError, match="watermark"):
        decide(seed().traits, ("id",), "auto", "error")


def test_require_on_conflict_is_flink_23_strict_default():
    with pytest.raises(PlanError, match="upsert key that differs from the primary key"):
        decide(seed().traits, ("id",), "auto", None, require_on_conflict=True)
    assert decide(seed().traits, ("id",), "auto", "deduplicate", require_on_conflict=True).inserted


def test_bad_strategy():
    with pytest.raises(PlanError, match="materialize must be one of"):
        decide(seed().traits, ("id",), "sometimes")


def test_nondeterministic_columns_without_upsert_key_warn():
    ts = ProjectItem("ts", None, False, False, "current_timestamp() AS ts")
    base = seed()
    p = Project(base, base.items + (ts,))
    sink = materialize(Sink(p, "t1", ("id",)))
    assert sink.decision.inserted
    assert len(sink.decision.warnings) == 1 and "[ts]" in sink.decision.warnings[0]
    assert "WARNING: non-deterministic column(s) [ts]" in explain_plan(sink)
    # with an upsert key the materializer compares on it only: no warning
    keyed = Project(S1, (ProjectItem.ref("id"), ts))
    assert materialize(Sink(keyed, "t1", ("ts",))).decision.warnings == ()


def test_seed_explain_text():
    text = explain_plan(materialize(Sink(seed(), "t1", ("id",))))
    lines = text.splitlines()
    assert lines[0].startswith("Sink(table=[t1], primaryKey=[id], upsertMaterialize=[true], "
                               "conflictStrategy=[DEDUPLICATE])")
    assert "SinkUpsertMaterializer(key=[id], upsertKey=[]" in text
    assert ("Join(joinType=[InnerJoin], where=[level = id0], leftInputSpec=[HasUniqueKey], "
            "rightInputSpec=[JoinKeyContainsUniqueKey]), changelogMode=[I,UB,UA,D], "
            "uniqueKeys=[[id]], upsertKey=[]") in text
    assert "Exchange(distribution=[hash[level]]), upsertKey=[]" in text
    assert "left upsert key [id] lost: the input is shuffled by [level]" in text
    assert "Exchange(distribution=[hash[id]]), upsertKey=[id]" in text


# --------------------------------------------------------------------------- expressions

@pytest.mark.parametrize("text,name,source,injective,deterministic", [
    ("id", "id", "id", True, True),
    ("id AS uid", "uid", "id", True, True),
    ("CAST(id AS BIGINT) AS id", "id", "id", True, True),
    ("CAST(id AS TINYINT) AS id", "id", "id", False, True),
    ("CAST(id AS STRING)", "CAST(id AS STRING)", "id", True, True),
    ("concat(id, level) AS k", "k", None, False, True),
    ("current_timestamp() AS ts", "ts", None, False, False),
    ("rand(-8655071124495731839L) AS r", "r", None, False, False),
    ("uuid()", "uuid()", None, False, False),
])
def test_classify_expressions(text, name, source, injective, deterministic):
    it = classify(text, None, {"id": "int", "level": "bigint"})
    assert (it.name, it.source, it.injective, it.deterministic) == (name, source, injective,
                                                                     deterministic)


def test_cast_and_nondeterminism_helpers():
    assert cast_is_injective("int", "bigint") and not cast_is_injective("bigint", "int")
    assert cast_is_injective("bigint", "decimal(20,0)") and not cast_is_injective("bigint", "decimal(10,0)")
    assert not cast_is_injective("double", "int")
    assert is_nondeterministic("now()") and not is_nondeterministic("nowhere(x)")
