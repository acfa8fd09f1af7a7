"""Regular join (docs/semantics.md, section 4): scenarios, ordering, Flink fixtures, and the
vectorized operator against the row-at-a-time oracle (tests/reference/join.py)."""
from __future__ import annotations

import json
import pathlib
import re
from collections import Counter

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelog_data import side_changelog, to_frame
from reference.join import ReferenceJoin, norm
from spark_changelog.model import KIND_COL, SEQ_COL
from spark_changelog.operators.base import OpContext
from spark_changelog.operators.join import JoinInputLayout, RegularJoin
from spark_changelog.operators.join.regular_join import SIDE_COL
from spark_changelog.runtime.local import LocalRunner, one_row_at_a_time, sort_rows

SHORT = {0: "+I", 1: "-U", 2: "+U", 3: "-D"}
FLINK_FIXTURE = pathlib.Path(__file__).parents[1] / "fixtures" / "flink" / "joins.json"


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------
def union_of(layout: JoinInputLayout, steps, lcols, rcols) -> pd.DataFrame:
    """``steps``: ``[(side "L"/"R", kind, values)]`` in arrival order; ``_seq`` = step."""
    lrows = [[k, v, i] for i, (s, k, v) in enumerate(steps) if s == "L"]
    rrows = [[k, v, i] for i, (s, k, v) in enumerate(steps) if s == "R"]
    return layout.union_pandas(to_frame(lrows, lcols), to_frame(rrows, rcols))


def out_rows(df: pd.DataFrame, layout: JoinInputLayout) -> list:
    """Operator output as ``(kind, left tuple|None, right tuple|None)`` (all-null side -> None)."""
    res = []
    lc, rc = layout.left_columns, layout.right_columns
    for rec in df[lc + rc + [KIND_COL]].itertuples(index=False):
        vals = norm(rec[:-1])
        lv, rv = vals[:len(lc)], vals[len(lc):]
        res.append((SHORT[int(rec[-1])], None if all(v is None for v in lv) else lv,
                    None if all(v is None for v in rv) else rv))
    return res


def oracle_batch(ref: ReferenceJoin, layout: JoinInputLayout, batch: pd.DataFrame, now: int = 0):
    """The oracle over one batch, in the order the runtime hands it: (join key, _seq)."""
    out = []
    for rec in sort_rows(batch, layout.key_columns).to_dict("records"):
        side = int(rec[SIDE_COL])
        row = tuple(rec[c] for c in layout.side_columns(side))
        for kind, lrow, rrow in ref.process(side, SHORT[int(rec[KIND_COL])], row, now):
            out.append((kind, lrow, rrow))
    return out


def per_step(layout, op_factory, steps, lcols, rcols):
    """Run the steps one per batch; outputs of each step."""
    runner = LocalRunner(op_factory())
    u = union_of(layout, steps, lcols, rcols)
    res = []
    for i in range(len(steps)):
        res.append(out_rows(runner.run_batch(u[u[SEQ_COL] == i], processing_time_ms=0), layout))
    return res, runner


# --------------------------------------------------------------------------------------
# layout
# --------------------------------------------------------------------------------------
def test_layout_names_and_projection():
    ls = pa.schema([("id", pa.int64()), ("k", pa.int32()), ("id0", pa.string())])
    rs = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("w", pa.string())])
    lay = JoinInputLayout(ls, rs, ["k"], ["k"])
    assert lay.left_columns == ["id", "k", "id0"]
    assert lay.right_columns == ["id1", "k0", "w"]       # Calcite-style: first free suffix
    assert lay.union_schema.names == ["__jk0", "_side", "id", "k", "id0", "id1", "k0", "w",
                                      "_kind", "_seq"]
    assert lay.union_schema.field("__jk0").type == pa.int32()
    assert lay.output_schema.names == ["id", "k", "id0", "id1", "k0", "w", "_kind", "_seq"]
    proj = lay.side_projection(1)
    assert proj[0] == ("k", "__jk0", pa.int32())
    assert proj[1] == (1, "_side", pa.int8())
    assert [p[0] for p in proj[2:5]] == [None, None, None]
    assert [p[:2] for p in proj[5:8]] == [("id", "id1"), ("k", "k0"), ("w", "w")]
    with pytest.raises(ValueError, match="reserved"):
        JoinInputLayout(pa.schema([("_side", pa.int8())]), rs, ["_side"], ["k"])
    u = lay.union_pandas(to_frame([["+I", [1, 2, "x"], 5]], ["id", "k", "id0"]),
                         to_frame([["+I", [7, 2, "y"], 3]], ["id", "k", "w"]))
    assert list(u.columns) == lay.union_schema.names
    assert u[SIDE_COL].tolist() == [0, 1] and u["__jk0"].tolist() == [2, 2]
    assert u[SEQ_COL].tolist() == [5, 3]


def test_view_choice():
    ls = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("v", pa.string())])
    lay = JoinInputLayout(ls, ls, ["k"], ["k"])
    op = RegularJoin(lay, "left", left_unique_key=["k"], right_unique_key=["id"])
    assert [v.name for v in op.views] == ["JoinKeyContainsUniqueKey", "InputSideHasUniqueKey"]
    assert RegularJoin(lay).views[0].name == "InputSideHasNoUniqueKey"
    with pytest.raises(ValueError):
        RegularJoin(lay, "cross")


# --------------------------------------------------------------------------------------
# spec scenarios J1 and J2, step by step
# --------------------------------------------------------------------------------------
def test_J1_left_join_null_row_replaced_by_match():
    ls = pa.schema([("ord", pa.string()), ("lineord", pa.string()), ("addr", pa.string())])
    rs = pa.schema([("lineord", pa.string()), ("mode", pa.string())])
    lay = JoinInputLayout(ls, rs, ["lineord"], ["lineord"])
    assert lay.right_columns == ["lineord0", "mode"]
    steps = [("L", "+I", ["Ord#1", "LineOrd#2", "addr"]), ("R", "+I", ["LineOrd#2", "AIR"])]
    res, _ = per_step(lay, lambda: RegularJoin(lay, "left"), steps, ["ord", "lineord", "addr"],
                      ["lineord", "mode"])
    L1 = ("Ord#1", "LineOrd#2", "addr")
    assert res == [[("+I", L1, None)],
                   [("-D", L1, None), ("+I", L1, ("LineOrd#2", "AIR"))]]


J2_STEPS = [("L", "+I", [1, "l1"]), ("R", "+I", [1, "r10"]), ("R", "+I", [1, "r11"]),
            ("R", "-U", [1, "r10"]), ("R", "+U", [1, "r10b"]), ("R", "-D", [1, "r10b"]),
            ("R", "-D", [1, "r11"]), ("L", "-U", [1, "l1"]), ("L", "+U", [1, "l1b"]),
            ("R", "+I", [1, "r12"]), ("L", "-D", [1, "l1b"])]


def _j2_layout():
    ls = pa.schema([("id", pa.int64()), ("v", pa.string())])
    rs = pa.schema([("id", pa.int64()), ("w", pa.string())])
    return JoinInputLayout(ls, rs, ["id"], ["id"])


@pytest.mark.parametrize("uks", [(None, None), (["id"], None), (None, ["w"]), (["v"], ["w"])])
def test_J2_left_join_step_by_step(uks):
    lay = _j2_layout()
    res, runner = per_step(lay, lambda: RegularJoin(lay, "left", *uks), J2_STEPS,
                           ["id", "v"], ["id", "w"])
    l1, l1b = (1, "l1"), (1, "l1b")
    r = lambda w: (1, w)  # noqa: E731
    assert res == [
        [("+I", l1, None)],
        [("-D", l1, None), ("+I", l1, r("r10"))],
        [("+I", l1, r("r11"))],
        [("-U", l1, r("r10"))],
        [("+I", l1, r("r10b"))],
        [("-D", l1, r("r10b"))],
        [("-D", l1, r("r11")), ("+I", l1, None)],
        [("-D", l1, None)],
        [("+I", l1b, None)],
        [("-D", l1b, None), ("+I", l1b, r("r12"))],
        [("-D", l1b, r("r12"))],
    ]
    # one batch gives the same sequence
    one = out_rows(LocalRunner(RegularJoin(lay, "left", *uks)).run_batch(
        union_of(lay, J2_STEPS, ["id", "v"], ["id", "w"]), processing_time_ms=0), lay)
    assert one == [o for step in res for o in step]
    assert runner.metrics.counters["retract_no_match"] == 0


def test_J2_output_seq_follows_emission_order():
    lay = _j2_layout()
    out = LocalRunner(RegularJoin(lay, "full")).run_batch(
        union_of(lay, J2_STEPS, ["id", "v"], ["id", "w"]), processing_time_ms=0)
    assert out[SEQ_COL].tolist() == list(range(len(out)))


# --------------------------------------------------------------------------------------
# ordering: matches come in arrival order of the stored rows
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("right_uk", [None, ["w"]])
@pytest.mark.parametrize("batched", [False, True])
def test_one_to_many_matches_in_arrival_order(right_uk, batched):
    lay = _j2_layout()
    ws = ["r5", "r3", "r9", "r1", "r7", "r2", "r8", "r4", "r6", "r0"]
    steps = [("R", "+I", [1, w]) for w in ws]
    steps += [("R", "-U", [1, "r3"]), ("R", "+U", [1, "r3b"])]     # r3b arrives last
    steps += [("L", "+I", [1, "l1"])]
    lc, rc = ["id", "v"], ["id", "w"]
    op = RegularJoin(lay, "inner", right_unique_key=right_uk)
    u = union_of(lay, steps, lc, rc)
    if batched:
        out = LocalRunner(op).run_batch(u, processing_time_ms=0)
    else:
        out = one_row_at_a_time(op, u, processing_time_ms=0)
    got = [r[2][1] for r in out_rows(out, lay)]
    assert got == [w for w in ws if w != "r3"] + ["r3b"]
    # and the left row leaving retracts them in the same order
    steps.append(("L", "-D", [1, "l1"]))
    out = LocalRunner(RegularJoin(lay, "inner", right_unique_key=right_uk)).run_batch(
        union_of(lay, steps, lc, rc), processing_time_ms=0)
    got = [(r[0], r[2][1]) for r in out_rows(out, lay)]
    assert got[-10:] == [("-D", w) for w in ws if w != "r3"] + [("-D", "r3b")]


def test_duplicate_rows_emitted_together_at_first_arrival():
    lay = _j2_layout()
    steps = [("R", "+I", [1, "a"]), ("R", "+I", [1, "b"]), ("R", "+I", [1, "a"]),
             ("L", "+I", [1, "l"])]
    for batched in (False, True):
        u = union_of(lay, steps, ["id", "v"], ["id", "w"])
        op = RegularJoin(lay, "inner")
        out = (LocalRunner(op).run_batch(u, processing_time_ms=0) if batched
               else one_row_at_a_time(op, u, processing_time_ms=0))
        assert [r[2][1] for r in out_rows(out, lay)] == ["a", "a", "b"]


# --------------------------------------------------------------------------------------
# retraction of a row that is not stored (Flink: still retracts the matches)
# --------------------------------------------------------------------------------------
def test_retraction_without_stored_row_follows_flink():
    lay = _j2_layout()
    steps = [("L", "+I", [1, "l1"]), ("R", "-D", [1, "ghost"]), ("R", "+I", [1, "r1"])]
    res, runner = per_step(lay, lambda: RegularJoin(lay, "left"), steps, ["id", "v"], ["id", "w"])
    l1 = (1, "l1")
    # the ghost retraction retracts [l1, ghost]; l1's associations go 0 -> -1, so the
    # next match does not retract the null row (Flink 2.3 does exactly this)
    assert res == [[("+I", l1, None)], [("-D", l1, (1, "ghost"))], [("+I", l1, (1, "r1"))]]
    assert runner.metrics.counters["retract_no_match"] == 1


# --------------------------------------------------------------------------------------
# state TTL
# --------------------------------------------------------------------------------------
def test_state_ttl_expires_rows_and_counts_them():
    lay = _j2_layout()
    lc, rc = ["id", "v"], ["id", "w"]
    runner = LocalRunner(RegularJoin(lay, "left", state_ttl_ms=1000))
    runner.run_batch(union_of(lay, [("L", "+I", [1, "l1"])], lc, rc), processing_time_ms=0)
    out = runner.run_batch(union_of(lay, [("R", "+I", [1, "r1"])], lc, rc), processing_time_ms=500)
    assert out_rows(out, lay) == [("-D", (1, "l1"), None), ("+I", (1, "l1"), (1, "r1"))]
    # the match at 500 wrote l1's association count: it lives until 1500
    out = runner.run_batch(union_of(lay, [("R", "+I", [1, "r2"])], lc, rc), processing_time_ms=1400)
    assert out_rows(out, lay) == [("+I", (1, "l1"), (1, "r2"))]
    assert runner.metrics.counters["ttl_expired"] == 0
    # at 2500: l1 (written 1400) and r1 (written 500) expired, r2 (1400) too
    out = runner.run_batch(union_of(lay, [("L", "+I", [1, "l2"])], lc, rc), processing_time_ms=2500)
    assert out_rows(out, lay) == [("+I", (1, "l2"), None)]
    assert runner.metrics.counters["ttl_expired"] == 3
    # per-side TTL and retain() on compaction
    op = RegularJoin(lay, "inner", state_ttl_ms=(None, 100))
    r = LocalRunner(op)
    r.run_batch(union_of(lay, [("L", "+I", [1, "a"]), ("R", "+I", [1, "b"]),
                               ("R", "+I", [2, "c"])], lc, rc), processing_time_ms=0)
    ctx = OpContext(processing_time_ms=100)
    keep = op.retain(r.state, ctx)
    assert sorted(r.state[SIDE_COL][keep.to_numpy()].tolist()) == [0]
    assert ctx.metrics.counters["ttl_expired"] == 2


# --------------------------------------------------------------------------------------
# Flink 2.3 fixtures (recorded by tests/fixtures/flink/record.py)
# --------------------------------------------------------------------------------------
def _flink_cases():
    if not FLINK_FIXTURE.exists():
        return []
    data = json.loads(FLINK_FIXTURE.read_text())
    if isinstance(data, dict):
        data = data.get("cases", data.get("joins", []))
    return data


@pytest.mark.parametrize("case", _flink_cases(), ids=lambda c: c.get("name", "case"))
def test_flink_fixture(case):
    replay_flink_case(case)


FLINK_TYPES = {"BIGINT": pa.int64(), "INT": pa.int32(), "STRING": pa.string(),
               "DOUBLE": pa.float64(), "BOOLEAN": pa.bool_()}


def flink_join_plan(case):
    """The operator configuration of a fixture's ``SELECT ... FROM a JOIN b ON ...``,
    or a reason why the case is out of this operator's scope."""
    import sqlglot
    from sqlglot import exp
    if case.get("config"):
        return None, f"config {case['config']} not modelled"
    q = sqlglot.parse_one(case["sql"], read="hive")
    if not isinstance(q, exp.Select) or len(q.args.get("joins") or []) != 1 \
            or any(q.args.get(a) for a in ("where", "group", "having", "order", "limit")):
        return None, "not a plain two-way join"
    join = q.args["joins"][0]
    tables = [(q.args.get("from_") or q.args.get("from")).this, join.this]
    if not all(isinstance(t, exp.Table) for t in tables):
        return None, "join input is not a table"
    names = [t.name for t in tables]
    alias = {(t.alias or t.name): t.name for t in tables}
    side_of = {names[0]: "L", names[1]: "R"}
    jt = {"": "inner", "INNER": "inner", "LEFT": "left", "RIGHT": "right", "FULL": "full"}.get(
        (join.args.get("side") or join.args.get("kind") or "").upper())
    if jt is None:
        return None, f"join kind {join.args.get('side')} {join.args.get('kind')}"
    lkeys, rkeys, rest = [], [], []
    conjuncts = list(join.args["on"].flatten()) if isinstance(join.args["on"], exp.And) \
        else [join.args["on"]]
    for c in conjuncts:
        if isinstance(c, exp.EQ) and all(isinstance(x, exp.Column) for x in (c.this, c.expression)):
            a, b = c.this, c.expression
            if side_of[alias[a.table]] == "R":
                a, b = b, a
            if side_of[alias[a.table]] == "L" and side_of[alias[b.table]] == "R":
                lkeys.append(a.name)
                rkeys.append(b.name)
                continue
        rest.append(c)
    ops = {exp.GT: "__gt__", exp.GTE: "__ge__", exp.LT: "__lt__", exp.LTE: "__le__",
           exp.EQ: "__eq__", exp.NEQ: "__ne__"}

    def operand(e):
        if isinstance(e, exp.Column):
            return (side_of[alias[e.table]], e.name)
        if isinstance(e, exp.Literal):
            return ("lit", float(e.this) if e.is_number else e.this)
        raise ValueError(e.sql())

    preds = []
    for c in rest:
        if type(c) not in ops:
            return None, f"join condition {c.sql()}"
        try:
            preds.append((ops[type(c)], operand(c.this), operand(c.expression)))
        except ValueError as e:
            return None, f"join condition operand {e}"
    select = []
    for e in q.expressions:
        if isinstance(e, exp.Star):
            select.append(("*", None))
            continue
        col = e.this if isinstance(e, exp.Alias) else e
        if not isinstance(col, exp.Column):
            return None, f"select expression {e.sql()}"
        select.append((side_of[alias[col.table]], col.name))
    return {"tables": names, "join_type": jt, "keys": (lkeys, rkeys), "select": select,
            "predicates": preds}, None


def vectorized_condition(preds, layout):
    """Conjunction of simple comparisons as a ``RegularJoin`` condition (null -> false)."""
    if not preds:
        return None

    def value(op, ldf, rdf):
        side, v = op
        if side == "lit":
            return v
        return ldf[v] if side == "L" else rdf[layout.right_rename[v]]

    def cond(ldf, rdf):
        ok = np.ones(len(ldf), dtype=bool)
        for fn, a, b in preds:
            x, y = value(a, ldf, rdf), value(b, ldf, rdf)
            res = getattr(pd.Series(x) if not isinstance(x, pd.Series) else x, fn)(y)
            ok &= pd.Series(res).fillna(False).to_numpy(dtype=bool)
            for v in (x, y):
                if isinstance(v, pd.Series):
                    ok &= v.notna().to_numpy()
        return ok
    return cond


def normalized_upsert_input(table, seqs):
    """An upsert input as Flink feeds it to the join: through ChangelogNormalize."""
    from spark_changelog.operators.normalize import ChangelogNormalize
    schema = pa.schema([(c, FLINK_TYPES[t]) for c, t in zip(table["columns"], table["types"])]
                       + [(KIND_COL, pa.int8()), (SEQ_COL, pa.int64())])
    rows = to_frame(table["rows"], table["columns"], seqs)
    return one_row_at_a_time(ChangelogNormalize(schema, table["primary_key"]), rows,
                             processing_time_ms=0)


def replay_flink_case(case):
    plan, why = flink_join_plan(case)
    if plan is None:
        pytest.fail(f"cannot replay this Flink case: {why}")
    tl, tr = (case["inputs"][n] for n in plan["tables"])
    if any(t.get("schema_extra") for t in (tl, tr)):
        pytest.fail("cannot replay this Flink case: computed columns / watermarks")
    schemas = [pa.schema([(c, FLINK_TYPES[t]) for c, t in zip(t_["columns"], t_["types"])])
               for t_ in (tl, tr)]
    layout = JoinInputLayout(schemas[0], schemas[1], *plan["keys"])
    seq = {(n, i): k for k, (n, i) in enumerate(case["arrival"])}
    frames = []
    for n, t_ in zip(plan["tables"], (tl, tr)):
        seqs = [seq[(n, i)] for i in range(len(t_["rows"]))]
        frames.append(normalized_upsert_input(t_, seqs) if t_.get("changelog_mode") == "upsert"
                      else to_frame(t_["rows"], t_["columns"], seqs))
    union = layout.union_pandas(*frames)
    op = RegularJoin(layout, plan["join_type"], tl.get("primary_key") or None,
                     tr.get("primary_key") or None,
                     condition=vectorized_condition(plan["predicates"], layout))
    # the state views are the ones Flink's planner chose
    flink_spec = {"NoUniqueKey": "InputSideHasNoUniqueKey", "HasUniqueKey": "InputSideHasUniqueKey",
                  "JoinKeyContainsUniqueKey": "JoinKeyContainsUniqueKey"}
    join_line = next((ln for ln in case.get("plan", []) if "Join(" in ln), "")
    specs = re.findall(r"(left|right)InputSpec=\[([^\]]*)\]", join_line)
    for (_, spec), view in zip(specs, op.views):
        assert view.name == flink_spec[spec], (spec, view)
    cols = []
    for side, name in plan["select"]:
        if side == "*":
            cols += layout.left_columns + layout.right_columns
        else:
            cols.append(name if side == "L" else layout.right_rename[name])
    runner = LocalRunner(op)
    for step, want in enumerate(case["expected_steps"]):
        out = runner.run_batch(union[union[SEQ_COL] == step], processing_time_ms=0)
        got = [(SHORT[int(k)], norm(v)) for k, *v in out[[KIND_COL] + cols].itertuples(index=False)]
        want = [(k, norm(v)) for k, v in want]
        if case.get("order_sensitive", True):
            assert got == want, f"step {step}: {case['arrival'][step]}"
        else:
            assert Counter(got) == Counter(want), f"step {step}: {case['arrival'][step]}"
    assert not case.get("expected_after_end_of_input")


# --------------------------------------------------------------------------------------
# property: vectorized operator == row-at-a-time oracle, any batch split
# --------------------------------------------------------------------------------------
LS = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("v", pa.string())])
RS = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("w", pa.string())])
PLAYOUT = JoinInputLayout(LS, RS, ["k"], ["k"])
PCOLS = (["id", "k", "v"], ["id", "k", "w"])


def cond_vec(l: pd.DataFrame, r: pd.DataFrame) -> np.ndarray:
    return (l["v"] <= r["w"]).to_numpy(dtype=bool)


def cond_row(l: dict, r: dict) -> bool:
    return l["v"] is not None and r["w"] is not None and l["v"] <= r["w"]


@st.composite
def scenario(draw):
    join_type = draw(st.sampled_from(["inner", "left", "right", "full"]))
    uniq = (draw(st.sampled_from(["id", "k", "none"])), draw(st.sampled_from(["id", "k", "none"])))
    spurious = draw(st.integers(0, 4)) == 0
    left = draw(side_changelog(uniq[0], spurious))
    right = draw(side_changelog(uniq[1], spurious))
    # interleave the two changelogs, keeping each side's order
    sides = draw(st.permutations([0] * len(left) + [1] * len(right)))
    it = [iter(left), iter(right)]
    steps = [(s, *next(it[s])) for s in sides]
    cuts = sorted(set(draw(st.lists(st.integers(1, max(len(steps) - 1, 1)), max_size=5))))
    condition = draw(st.integers(0, 3)) == 0
    return join_type, uniq, steps, cuts, condition


def _uk(u):
    return {"id": ["id"], "k": ["k"], "none": None}[u]


def _run_both(join_type, uniq, steps, cuts, condition, ttl=None, times=None):
    lc, rc = PCOLS
    ldf = to_frame([[k, list(r), i] for i, (s, k, r) in enumerate(steps) if s == 0], lc)
    rdf = to_frame([[k, list(r), i] for i, (s, k, r) in enumerate(steps) if s == 1], rc)
    union = PLAYOUT.union_pandas(ldf, rdf)
    op = RegularJoin(PLAYOUT, join_type, _uk(uniq[0]), _uk(uniq[1]),
                     condition=cond_vec if condition else None, state_ttl_ms=ttl)
    ruk = [PLAYOUT.right_rename[c] for c in _uk(uniq[1]) or ()]
    ref = ReferenceJoin(PLAYOUT.left_columns, PLAYOUT.right_columns, ["k"], ["k0"], join_type,
                        _uk(uniq[0]), ruk, cond_row if condition else None, ttl)
    runner = LocalRunner(op)
    bounds = [0] + list(cuts) + [len(steps)]
    got, want = [], []
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        batch = union[(union[SEQ_COL] >= a) & (union[SEQ_COL] < b)]
        if not len(batch):
            continue
        now = times[i] if times else 0
        got.append(out_rows(runner.run_batch(batch, processing_time_ms=now), PLAYOUT))
        want.append(oracle_batch(ref, PLAYOUT, batch, now))
    return got, want, runner, ref


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_operator_equals_row_at_a_time_oracle(sc):
    join_type, uniq, steps, cuts, condition = sc
    got, want, runner, ref = _run_both(join_type, uniq, steps, cuts, condition)
    assert got == want
    assert runner.metrics.counters["retract_no_match"] == ref.retract_no_match


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario(), st.integers(1, 4), st.lists(st.integers(0, 3), min_size=6, max_size=6))
def test_operator_equals_oracle_with_ttl(sc, ttl, gaps):
    join_type, uniq, steps, cuts, condition = sc
    times = list(np.cumsum(gaps) * 1)
    got, want, runner, ref = _run_both(join_type, uniq, steps, cuts, condition, ttl=ttl, times=times)
    assert got == want
    assert runner.metrics.counters["ttl_expired"] == ref.ttl_expired


def test_spark_union_matches_pandas_union(spark):
    lay = _j2_layout()
    ldf = to_frame([["+I", [1, "a"], 4]], ["id", "v"])
    rdf = to_frame([["-D", [1, "b"], 2]], ["id", "w"])
    sdf = lay.spark_union(spark.createDataFrame(ldf), spark.createDataFrame(rdf))
    got = sdf.toPandas()
    assert list(got.columns) == lay.union_schema.names
    want = lay.union_pandas(ldf, rdf)
    assert out_rows(got, lay) == out_rows(want, lay)
    assert got[SIDE_COL].tolist() == [0, 1]


# --------------------------------------------------------------------------------------
# BIGINT values beyond 2**53 (float64 holds them inexactly)
# --------------------------------------------------------------------------------------
BIG1, BIG2 = 2**53 + 1, -(2**62) - 3


@pytest.mark.parametrize("how", ["inner", "left", "right", "full"])
def test_bigint_data_columns_keep_every_digit(how):
    """Non-key BIGINT columns beyond 2**53 come out exact in every join type,
    whether padded with nulls or not, from the batch's rows and from state
    (both sides' rows in one union and one state table, where a column is
    null in the other side's rows), with the rows and the state passed
    through Arrow as the runtimes pass them."""
    from spark_changelog.runtime.keyed_rows import arrow_input

    ls = pa.schema([("k", pa.int64()), ("a", pa.int64())])
    rs = pa.schema([("k", pa.int64()), ("b", pa.int64())])
    lay = JoinInputLayout(ls, rs, ["k"], ["k"])
    op = RegularJoin(lay, how)
    lcols, rcols = ["k", "a"], ["k", "b"]

    def through_arrow(df, schema):
        return arrow_input(pa.Table.from_pandas(df, schema=schema, preserve_index=False),
                           schema.names, None)

    state = op.empty_state()
    got = []
    batches = [
        # one batch with both sides: k=1 matches, k=2 left only, k=3 right only
        [("L", "+I", [1, BIG1]), ("R", "+I", [1, BIG2]), ("L", "+I", [2, BIG2]),
         ("R", "+I", [3, BIG1])],
        # from state: a second right row for k=1, then retractions of stored rows
        [("R", "+I", [1, BIG1 + 2]), ("L", "-D", [2, BIG2]), ("R", "-D", [3, BIG1]),
         ("L", "-D", [1, BIG1])],
    ]
    seq = 0
    for steps in batches:
        lrows = [[k, v, seq + i] for i, (s, k, v) in enumerate(steps) if s == "L"]
        rrows = [[k, v, seq + i] for i, (s, k, v) in enumerate(steps) if s == "R"]
        seq += len(steps)
        u = lay.union_pandas(to_frame(lrows, lcols), to_frame(rrows, rcols))
        u = through_arrow(sort_rows(u, lay.key_columns), lay.union_schema)
        ctx = OpContext(processing_time_ms=0)
        state, out = op.process(through_arrow(state, op.state_schema), u, ctx)
        out = pa.Table.from_pandas(out, schema=op.output_schema, preserve_index=False)
        got += [(SHORT[r[KIND_COL]], r["k"], r["a"], r["k0"], r["b"]) for r in out.to_pylist()]

    # [kind, left k, a, right k, b]: Flink's StreamingJoinOperator per join type
    want = {
        "inner": [("+I", 1, BIG1, 1, BIG2),
                  ("+I", 1, BIG1, 1, BIG1 + 2), ("-D", 1, BIG1, 1, BIG2), ("-D", 1, BIG1, 1, BIG1 + 2)],
        "left": [("+I", 1, BIG1, None, None), ("-D", 1, BIG1, None, None), ("+I", 1, BIG1, 1, BIG2),
                 ("+I", 2, BIG2, None, None),
                 ("+I", 1, BIG1, 1, BIG1 + 2), ("-D", 1, BIG1, 1, BIG2), ("-D", 1, BIG1, 1, BIG1 + 2),
                 ("-D", 2, BIG2, None, None)],
        "right": [("+I", 1, BIG1, 1, BIG2), ("+I", None, None, 3, BIG1),
                  ("+I", 1, BIG1, 1, BIG1 + 2), ("-D", 1, BIG1, 1, BIG2), ("+I", None, None, 1, BIG2),
                  ("-D", 1, BIG1, 1, BIG1 + 2), ("+I", None, None, 1, BIG1 + 2),
                  ("-D", None, None, 3, BIG1)],
        "full": [("+I", 1, BIG1, None, None), ("-D", 1, BIG1, None, None), ("+I", 1, BIG1, 1, BIG2),
                 ("+I", 2, BIG2, None, None), ("+I", None, None, 3, BIG1),
                 ("+I", 1, BIG1, 1, BIG1 + 2), ("-D", 1, BIG1, 1, BIG2), ("+I", None, None, 1, BIG2),
                 ("-D", 1, BIG1, 1, BIG1 + 2), ("+I", None, None, 1, BIG1 + 2),
                 ("-D", 2, BIG2, None, None), ("-D", None, None, 3, BIG1)],
    }[how]
    assert got == want
    # the state holds the right rows of k=1, exactly
    st = pa.Table.from_pandas(state, schema=op.state_schema, preserve_index=False)
    assert sorted((r["k0"], r["b"]) for r in st.to_pylist()) == [(1, BIG2), (1, BIG1 + 2)]
