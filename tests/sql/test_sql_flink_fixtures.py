"""Flink 2.3 recordings (tests/fixtures/flink/joins.json, materializer.json)
driven through SQL and through the Python API: the same explain, the same
emitted changelog, and Flink's result.

Each fixture input becomes a changelog Parquet file whose ``seq`` is the
global arrival index, declared with ``CREATE TABLE`` from the fixture's
columns, types and primary key; the fixture's own query, sink DDL (a
``print`` table) and settings run unchanged.
"""
from __future__ import annotations

import io
import re
from collections import Counter

import pytest

from changelog_data import load_fixture, to_rows
from sql_inputs import create_table, write_changelog
from spark_changelog.api import read_changes
from spark_changelog.sql.runner import run_script
from spark_changelog.sql.script import parse_script
from spark_changelog.sql.translate import Translator

JOINS = {c["name"]: c for c in load_fixture("flink/joins.json")["cases"]}
MATERIALIZER = {c["name"]: c for c in load_fixture("flink/materializer.json")["cases"]}

STD = {"id": "id", "v": "v", "rid": "id0", "w": "w"}


# a lambda travels to Spark's workers by value (a test-module function would not import there)
_greater = lambda left, right: (left["v"] > right["w"]).to_numpy()  # noqa: E731


#: the Python API form of each join case: (how, [(left col, right col)], select, condition)
API = {
    "J1_left_join": ("left", [("line_order_id", "line_order_id")],
                     {"order_id": "order_id", "line_order_id": "line_order_id", "addr": "addr",
                      "r_line_order_id": "line_order_id0", "ship_mode": "ship_mode"}, None),
    "J2_left_join_multi_match": ("left", [("id", "id")], STD, None),
    "J2b_left_join_multi_match_right_pk": ("left", [("id", "id")],
                                           {"id": "id", "v": "v", "rid": "rid", "w": "w"}, None),
    "J3_inner_join_retract_both_sides": ("inner", [("id", "id")], STD, None),
    "J4_left_join_retract_both_sides": ("left", [("id", "id")], STD, None),
    "J5_right_join": ("right", [("id", "id")], STD, None),
    "J6_full_outer_join": ("full", [("id", "id")], STD, None),
    "J7_many_to_many_inner": ("inner", [("id", "id")], STD, None),
    "J8_many_to_many_left_unique_keys": ("left", [("k", "k")],
                                         {"lid": "lid", "k": "k", "v": "v", "rid": "rid",
                                          "w": "w"}, None),
    "J9_retract_unknown_row_inner": ("inner", [("id", "id")], STD, None),
    "J10_retract_unknown_row_left": ("left", [("id", "id")], STD, None),
    "J11_inner_join_non_equi": ("inner", [("id", "id")], STD, _greater),
    "J12_left_join_non_equi": ("left", [("id", "id")], STD, _greater),
    "J13_inner_join_key_contains_unique_key": ("inner", [("id", "id")], STD, None),
    "J14_left_join_key_contains_unique_key": ("left", [("id", "id")], STD, None),
    "J15_inner_join_upsert_inputs": ("inner", [("id", "id")], STD, None),
    "J16_inner_join_duplicate_rows_no_key": ("inner", [("id", "id")], STD, None),
    "J17_left_join_duplicate_rows_no_key": ("left", [("id", "id")], STD, None),
    "J18_seed_join_s1_s2": ("inner", [("level", "id")],
                            {"id": "id", "level": "level", "attr": "attr"}, None),
}
#: cases also run on Spark (each costs two Spark jobs): outer, full, non-equi (the seed
#: join runs in test_sql_seed_spark.py)
RUN = ["J1_left_join", "J6_full_outer_join", "J11_inner_join_non_equi"]


def write_inputs(case, base) -> dict:
    """One Parquet file per input table; ``seq`` = the row's global arrival index."""
    seq = {}
    for i, (table, idx) in enumerate(case["arrival"]):
        seq[(table, idx)] = i
    paths = {}
    for name, spec in case["inputs"].items():
        rows = [(kind, vals, seq[(name, i)]) for i, (kind, vals) in enumerate(spec["rows"])]
        write_changelog(base / name, spec["columns"], spec["types"], [rows])
        paths[name] = base / name
    return paths


def ddl(case, paths) -> str:
    return ";\n".join(create_table(n, spec, paths[n]) for n, spec in case["inputs"].items())


def sql_stream(spark, case, paths):
    script = parse_script(f"{ddl(case, paths)};\nEXPLAIN {case['sql']};", case["name"])
    (_, stream), = [x for x in Translator(spark, script, key_groups=2).statements()
                    if x[1] is not None]
    return stream


def api_stream(spark, case, paths):
    how, on, select, condition = API[case["name"]]
    (lname, lspec), (rname, rspec) = case["inputs"].items()

    def side(name, spec):
        schema = ", ".join(f"`{c}` {t}" for c, t in zip(spec["columns"], spec["types"]))
        return read_changes(spark, str(paths[name]), format="changelog",
                            changelog_file_format="parquet", kind_column="op", seq_column="seq",
                            schema=schema, primary_key=spec["primary_key"] or None, name=name)
    joined = side(lname, lspec).join(side(rname, rspec), on=on, how=how, condition=condition,
                                     key_groups=2)
    return joined.select(**select)


def final(changes) -> Counter:
    table: Counter = Counter()
    for kind, row in changes:
        row = tuple(row)
        if kind in ("+I", "+U"):
            table[row] += 1
        else:
            table[row] -= 1
            if not table[row]:
                del table[row]
    return table


@pytest.mark.parametrize("name", sorted(API))
def test_join_case_sql_and_api_explain_alike(spark, tmp_path, name):
    case = JOINS[name]
    paths = write_inputs(case, tmp_path)
    sql = sql_stream(spark, case, paths)
    api = api_stream(spark, case, paths)
    assert sql.explain() == api.explain()
    assert sql.schema.columns == api.schema.columns


@pytest.mark.parametrize("name", RUN)
def test_join_case_sql_and_api_emit_flinks_changes(spark, tmp_path, name):
    case = JOINS[name]
    paths = write_inputs(case, tmp_path)
    sql = sql_stream(spark, case, paths)
    cols = list(sql.schema.columns)
    got_sql = to_rows(sql.collect(), cols)
    got_api = to_rows(api_stream(spark, case, paths).collect(), cols)
    assert got_sql == got_api
    as_multiset = Counter((k, tuple(v)) for k, v in got_sql)
    assert as_multiset == Counter((k, tuple(v)) for k, v in case["expected"])
    assert final(got_sql) == final(case["expected"])


MAT_CASES = ["M1_seed_case1_order", "M2_seed_case2_order", "M3_seed_case3_order",
             "M2n_seed_case2_order_no_materializer", "S1_no_upsert_key", "S2_upsert_key_field1",
             "S3_retract_in_arbitrary_order"]
LINE = re.compile(r"^(?P<id>\S+)> (?P<kind>[+-][IUD])\[(?P<vals>.*)\]$")


def test_materializer_cases_through_sql_print_sink(spark, tmp_path):
    """The fixture's sink DDL (a print table with a primary key), settings and
    INSERT ... ON CONFLICT run unchanged; one statement set of all cases, the
    print sink's lines equal Flink's output in order."""
    parts, statements, expected = [], [], {}
    for name in MAT_CASES:
        case = MATERIALIZER[name]
        (src, spec), = case["inputs"].items()
        renamed = f"{src}_{name}"
        paths = write_inputs(case, tmp_path / name)
        parts.append(create_table(renamed, spec, paths[src]))
        sink = case["ddl"][0].replace("TABLE t1 ", f"TABLE t1_{name} ")
        parts.append(sink)
        stmt = case["sql"].replace("INSERT INTO t1 ", f"INSERT INTO t1_{name} ")
        stmt = re.sub(rf"\bFROM {src}\b", f"FROM {renamed}", stmt)
        mode = (case.get("config") or {}).get("table.exec.sink.upsert-materialize", "AUTO")
        statements.append(f"SET 'table.exec.sink.upsert-materialize' = '{mode}';\n{stmt}")
        identifier = re.search(r"'print-identifier' = '([^']+)'", sink).group(1)
        expected[identifier] = [[k, [str(v) for v in vals]] for k, vals in case["expected"]]
    script = parse_script(";\n".join(parts) + ";\n" + ";\n".join(statements) + ";", "mat.sql")
    out = io.StringIO()
    runs = run_script(spark, script, batch=True, key_groups=2, show_progress=False, out=out)
    assert len(runs) == len(MAT_CASES)
    got: dict = {}
    for line in out.getvalue().splitlines():
        m = LINE.match(line)
        assert m, line
        got.setdefault(m["id"], []).append([m["kind"], m["vals"].split(", ")])
    assert got == expected
    decisions = {r.planned.table.name: "upsert materializer: inserted" in r.report.plan
                 for r in runs}
    assert decisions["t1_M2n_seed_case2_order_no_materializer"] is False
    assert decisions["t1_S1_no_upsert_key"] is True


EXPLAINS = {e["name"]: e for e in load_fixture("flink/materializer.json")["explains"]}
#: where we deliberately differ from Flink 2.3 (docs/sql.md, "Differences from Flink")
OURS = {
    # no ON CONFLICT: Flink 2.3 requires it by default; we follow the seeds (auto materializer)
    "seed_no_on_conflict": "plans",
    # materialize NONE + DO DEDUPLICATE: Flink ignores the clause silently (FLINK-41007)
    "seed_none_do_deduplicate": "FLINK-41007",
}


@pytest.mark.parametrize("name", [n for n in EXPLAINS if n != "seed_select_only"])
def test_recorded_seed_explains_through_sql(spark, tmp_path, name):
    """Flink's EXPLAIN CHANGELOG_MODE of the seed query under each setting:
    the same materializer decision and conflict strategy, or the same refusal."""
    from spark_changelog.sql.errors import SqlError
    e = EXPLAINS[name]
    case = MATERIALIZER["M0_seed_join_into_pk_sink"]
    paths = write_inputs(case, tmp_path)
    sets = "".join(f"SET '{k}' = '{v}';\n" for k, v in e["config"].items())
    text = f"{ddl(case, paths)};\n{e['ddl'][0]};\n{sets}{e['statement']};"

    def explain():
        (_, planned), = [x for x in Translator(spark, parse_script(text, name)).statements()
                         if x[1] is not None]
        return planned[0].explain()
    if e.get("error") and OURS.get(name) != "plans":
        words = re.search(r"(requires all source tables to define watermarks|upsert key that "
                          r"differs from the primary key)", e["error"])
        with pytest.raises(SqlError, match=words.group(1).replace("source tables", "sources")):
            explain()
        return
    if OURS.get(name) == "FLINK-41007":
        with pytest.raises(SqlError, match="FLINK-41007"):
            explain()
        return
    flink_sink = next(line for line in e.get("explain_changelog_mode", [])
                      if line.startswith("Sink(")) if "explain_changelog_mode" in e else \
        "upsertMaterialize=[true]"
    ours = explain().splitlines()[0]
    assert ("upsertMaterialize=[true]" in ours) == ("upsertMaterialize=[true]" in flink_sink)
    strategy = re.search(r"conflictStrategy=\[(\w+)\]", flink_sink)
    if strategy:
        assert f"conflictStrategy=[{strategy.group(1)}]" in ours


def test_strict_on_conflict_setting_refuses_like_flink(spark, tmp_path):
    e = EXPLAINS["seed_no_on_conflict"]
    case = MATERIALIZER["M0_seed_join_into_pk_sink"]
    paths = write_inputs(case, tmp_path)
    text = (f"{ddl(case, paths)};\n{e['ddl'][0]};\n"
            f"SET 'table.exec.sink.require-on-conflict' = 'true';\n{e['statement']};")
    from spark_changelog.sql.errors import SqlError
    with pytest.raises(SqlError, match="upsert key that differs from the primary key") as err:
        list(Translator(spark, parse_script(text, "strict.sql")).statements())
    assert err.value.line == 5
