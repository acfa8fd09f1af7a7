"""SinkUpsertMaterializer ``conflict="nothing"/"error"`` replayed against Flink 2.3.0's
recorded behaviour of ``INSERT ... ON CONFLICT DO NOTHING / DO ERROR``
(tests/fixtures/flink/conflict.json, recorded by tests/fixtures/flink/record.py from the
``conflict`` group of tests/fixtures/flink/cases.py; see tests/fixtures/flink/README.md).

Replay of one case, step by step, like Flink saw it:

* one input row per batch, in the case's arrival order (``_seq`` = arrival index);
* row i is processed with the watermark produced by rows ``0..i-1`` (Flink: rows 1 s
  apart, periodic watermarks every 200 ms, operators unchained, so the watermark of row
  i-1 reaches the materializer before row i), then the runtime's watermark timer runs
  with the watermark produced by rows ``0..i`` (``flush``);
* watermark after rows ``0..i`` = ``max(t) - bound`` for ``WATERMARK FOR rt AS rt -
  INTERVAL 'x' SECOND`` (bound = x seconds in ms; ``AS rt``: bound 0), over every row so
  far whatever its kind; none before any row.  Flink's table ``WatermarkAssignerOperator``
  starts at watermark 0 and only emits larger ones, so a value <= 0 is "no watermark";
* what the two calls return is compared with ``expected_steps[i]`` (kinds and values, in
  order; as multisets where the case says ``order_sensitive: false``);
* end of input: Flink sends ``MAX_WATERMARK``: ``flush`` with ``Long.MAX_VALUE``, compared
  with ``expected_after_end_of_input``;
* ``expected_error`` phase ``runtime``: the job failed at arrival ``step`` (or at the end of
  input): our operator must raise ``PrimaryKeyConstraintViolation`` there, naming the sink
  key value, after matching every earlier step; phase ``plan``: the planner refused the
  statement (no watermark): constructing the operator without a time column must fail.

A missing fixture, a case of cases.py not recorded, or a case this module cannot
translate FAILS (it is never skipped).
"""
from __future__ import annotations

import json
import pathlib
import re
import sys
from collections import Counter

import pyarrow as pa
import pytest

from changelog_data import schema_of, to_frame, to_rows
from spark_changelog.operators.sink_upsert_materializer import (PrimaryKeyConstraintViolation,
                                                                SinkUpsertMaterializer)
from spark_changelog.plan import PlanError, Sink, Source, materialize
from spark_changelog.runtime.local import LocalRunner

FLINK_DIR = pathlib.Path(__file__).parents[1] / "fixtures" / "flink"
FIXTURE = FLINK_DIR / "conflict.json"
MAX_WATERMARK = 2 ** 63 - 1          # Flink's Watermark.MAX_WATERMARK (Long.MAX_VALUE)
TYPES = {"BIGINT": pa.int64(), "INT": pa.int32(), "STRING": pa.string(), "DOUBLE": pa.float64(),
         "BOOLEAN": pa.bool_()}


def _recorded() -> dict:
    if not FIXTURE.exists():
        return {}
    return {c["name"]: c for c in json.loads(FIXTURE.read_text())["cases"]}


def _defined() -> list:
    """Names of the cases of the ``conflict`` group in cases.py (without running Flink)."""
    sys.path.insert(0, str(FLINK_DIR))
    try:
        import cases as case_defs  # tests/fixtures/flink/cases.py
        return [c["name"] for c in case_defs.groups()["conflict"][1]]
    except Exception:            # reported by test_every_defined_case_is_recorded
        return []
    finally:
        sys.path.remove(str(FLINK_DIR))


RECORDED = _recorded()
DEFINED = _defined()
NAMES = sorted(set(RECORDED) | set(DEFINED), key=lambda n: (len(n.split("_")[0]), n)) or [
    "<conflict.json missing>"]


def test_every_defined_case_is_recorded():
    assert FIXTURE.exists(), f"{FIXTURE} is missing: run record.py conflict"
    assert DEFINED, "could not read the 'conflict' group of tests/fixtures/flink/cases.py"
    missing = [n for n in DEFINED if n not in RECORDED]
    assert not missing, f"cases defined in cases.py but not recorded in conflict.json: {missing}"


# --------------------------------------------------------------------------- translation

class Untranslatable(Exception):
    pass


def translate(case: dict) -> dict:
    """The operator's configuration and the replay parameters of a recorded case."""
    if len(case["inputs"]) != 1:
        raise Untranslatable("expected exactly one input table")
    (name, table), = case["inputs"].items()
    m = re.search(r"ON CONFLICT DO (NOTHING|ERROR)\s*$", case["sql"])
    if not m:
        raise Untranslatable(f"no ON CONFLICT DO NOTHING/ERROR in {case['sql']!r}")
    conflict = m.group(1).lower()
    extra = table.get("schema_extra") or {}
    computed = {col: expr for col, expr in extra.get("computed", [])}
    wm = extra.get("watermark")
    time_column = bound_ms = None
    if wm:
        rowtime, expr = wm
        tm = re.fullmatch(r"TO_TIMESTAMP_LTZ\((\w+), 3\)", computed.get(rowtime, ""))
        if not tm:
            raise Untranslatable(f"rowtime {rowtime} is not TO_TIMESTAMP_LTZ(<ms column>, 3)")
        time_column = tm.group(1)
        if expr.strip() == rowtime:
            bound_ms = 0
        else:
            bm = re.fullmatch(r"%s - INTERVAL '([0-9.]+)' SECOND" % re.escape(rowtime), expr.strip())
            if not bm:
                raise Untranslatable(f"watermark expression {expr!r}")
            bound_ms = round(float(bm.group(1)) * 1000)
    sink = case["sink"]
    missing = [c for c in sink["columns"] if c not in table["columns"]]
    if missing or not re.search(r"SELECT %s FROM %s " % (", ".join(sink["columns"]), name),
                                case["sql"]):
        raise Untranslatable("the query must select the sink columns from the input unchanged")
    for ty in table["types"]:
        if ty not in TYPES:
            raise Untranslatable(f"type {ty}")
    return {"input": name, "columns": table["columns"],
            "schema": schema_of(table["columns"], [TYPES[t] for t in table["types"]]),
            "sink_columns": sink["columns"], "sink_key": sink["primary_key"],
            "upsert_key": table["primary_key"] or None, "conflict": conflict,
            "time_column": time_column, "bound_ms": bound_ms}


def make_operator(tr: dict) -> SinkUpsertMaterializer:
    return SinkUpsertMaterializer(tr["schema"], sink_key=tr["sink_key"], upsert_key=tr["upsert_key"],
                                  conflict=tr["conflict"])


def flush(runner: LocalRunner, watermark_ms: int, processing_time_ms: int = 0):
    """What a runtime's watermark timer does (``LocalRunner.advance_watermark``)."""
    return runner.advance_watermark(watermark_ms, processing_time_ms)


# --------------------------------------------------------------------------- replay

def replay(case: dict, tr: dict) -> tuple[list, object]:
    """Our operator's output per arrival step plus one entry for the end of input;
    stops at the first exception, returned as the second value (with its step)."""
    op = make_operator(tr)
    runner = LocalRunner(op)
    rows = case["inputs"][tr["input"]]["rows"]
    ti = tr["columns"].index(tr["time_column"])
    max_t, watermark = None, None
    steps = []
    for i, (_, idx) in enumerate(case["arrival"]):
        kind, values = rows[idx]
        frame = to_frame([[kind, values]], tr["columns"], seqs=[i])
        try:
            out = runner.run_batch(frame, processing_time_ms=0, watermark_ms=watermark)
            got = to_rows(out, tr["sink_columns"])
            if values[ti] is not None:
                max_t = values[ti] if max_t is None else max(max_t, values[ti])
            if max_t is not None and max_t - tr["bound_ms"] > 0:
                watermark = max_t - tr["bound_ms"] if watermark is None else max(
                    watermark, max_t - tr["bound_ms"])
            if watermark is not None:
                got += to_rows(flush(runner, watermark), tr["sink_columns"])
        except Exception as ex:      # noqa: BLE001 - compared with expected_error
            return steps, (i, ex)
        steps.append(got)
    try:
        steps.append(to_rows(flush(runner, MAX_WATERMARK), tr["sink_columns"]))
    except Exception as ex:          # noqa: BLE001
        return steps, ("end_of_input", ex)
    return steps, None


#: cases where we differ from Flink 2.3 on purpose: the step outputs we emit
#: instead of Flink's, and why (the operator's docstring and the closing notes say so)
DELIBERATE_DIFFERENCES = {
    "C11_nothing_keeps_retracted_previous": {
        "steps": {3: [["+U", [2, 1, "b", 100]]]},
        "why": "Flink keeps the previous value a although the fold retracted it (its source row "
               "was deleted): the sink would keep a deleted row. DO NOTHING keeps the first row "
               "of the folded list (docs/semantics.md, section 3): b.",
    },
}


def _same(a: list, b: list, ordered: bool) -> bool:
    if ordered:
        return a == b
    return Counter(json.dumps(x) for x in a) == Counter(json.dumps(x) for x in b)


def _table(case, flink_steps, ours, error) -> str:
    """Both outputs side by side, for the failure message."""
    rows = case["inputs"][next(iter(case["inputs"]))]["rows"]
    lines = []
    for i, (_, idx) in enumerate(case["arrival"]):
        f = flink_steps[i] if i < len(flink_steps) else "(not reached)"
        o = ours[i] if i < len(ours) else "(not reached)"
        mark = "  " if f == o else "!!"
        lines.append(f"{mark} step {i} in {rows[idx]}: flink {f} | ours {o}")
    n = len(case["arrival"])
    f_end = case.get("expected_after_end_of_input")
    o_end = ours[n] if len(ours) > n else "(not reached)"
    lines.append(f"{'  ' if f_end == o_end else '!!'} end of input: flink {f_end} | ours {o_end}")
    if case.get("expected_error"):
        lines.append(f"flink error: {case['expected_error']}")
    if error is not None:
        lines.append(f"our error at step {error[0]}: {type(error[1]).__name__}: {error[1]}")
    return "\n".join(lines)


def _key_parts(message: str) -> list:
    """``Conflicting key: [pk=1, k2=x]`` -> [("pk", "1"), ("k2", "x")]."""
    m = re.search(r"Conflicting key: \[(.*?)\]", message)
    assert m, f"no 'Conflicting key: [...]' in Flink's message {message!r}"
    return [tuple(p.split("=", 1)) for p in m.group(1).split(", ")]


@pytest.mark.parametrize("name", NAMES)
def test_conflict_against_flink(name):
    assert name in RECORDED, f"case {name} is not recorded in {FIXTURE}"
    case = RECORDED[name]
    assert case.get("source") == "flink-2.3.0 run", "only Flink-recorded cases are replayed"
    try:
        tr = translate(case)
    except Untranslatable as ex:
        pytest.fail(f"{name}: cannot translate the case: {ex}")
    err = case.get("expected_error")

    if err and err["phase"] == "plan":
        # Flink refuses the statement: no source watermark for DO NOTHING/ERROR
        assert tr["time_column"] is None, "a plan-time error case must have no watermark"
        assert "watermark" in err["message"]
        # our planner refuses it too (plan.rules), with the same advice
        source = Source("X", tuple(tr["columns"]), tuple(tr["upsert_key"] or ()),
                        has_watermark=False)
        with pytest.raises(PlanError) as ex:
            materialize(Sink(source, "t1", tuple(tr["sink_key"]), "auto", tr["conflict"]))
        assert f"ON CONFLICT DO {tr['conflict'].upper()}" in str(ex.value)
        assert "watermark" in str(ex.value)
        return

    if tr["time_column"] is None:
        pytest.fail(f"{name}: no watermark, but Flink ran the job")
    ours, error = replay(case, tr)
    ordered = case.get("order_sensitive", True)
    flink_steps = [list(x) for x in case["expected_steps"]]
    deliberate = DELIBERATE_DIFFERENCES.get(name)
    if deliberate:
        for i, ours_i in deliberate["steps"].items():
            assert flink_steps[i] != ours_i, f"{name}: Flink now agrees at step {i}; drop the entry"
            flink_steps[i] = ours_i
    report = _table(case, flink_steps, ours, error)
    n = len(case["arrival"])

    if err:
        assert err["phase"] == "runtime", err
        at = err["step"]
        last = n if at == "end_of_input" else at
        for i in range(last):
            assert i < len(ours), f"{name}: we failed at step {error[0]}, Flink at {at}\n{report}"
            assert _same(ours[i], flink_steps[i], ordered), \
                f"{name}: step {i} differs before Flink's failure at {at}\n{report}"
        assert error is not None, f"{name}: Flink failed at step {at}, we did not fail\n{report}"
        assert error[0] == at, f"{name}: Flink failed at step {at}, we at {error[0]}\n{report}"
        assert isinstance(error[1], PrimaryKeyConstraintViolation), report
        ours_msg = str(error[1])
        assert "primary key constraint violation" in ours_msg.lower()
        for col, value in _key_parts(err["message"]):
            assert re.search(r"%s='?%s'?" % (re.escape(col), re.escape(value)), ours_msg), \
                f"{name}: our message does not name {col}={value}: {ours_msg}"
        if at != "end_of_input":
            # what Flink emitted at the failing step before failing (nothing in practice)
            assert flink_steps[at] == [], report
        return

    assert error is None, f"{name}: we failed, Flink did not\n{report}"
    assert len(flink_steps) == n, f"{name}: expected_steps has {len(flink_steps)} steps, {n} rows"
    bad = [i for i in range(n) if not _same(ours[i], flink_steps[i], ordered)]
    end_ok = _same(ours[n], case["expected_after_end_of_input"], ordered)
    assert not bad and end_ok, (f"{name}: differs from Flink at step(s) {bad}"
                                f"{'' if end_ok else ' and at the end of input'}\n{report}")
