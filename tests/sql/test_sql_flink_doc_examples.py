"""Every example query of Flink's documentation pages for deduplication,
Top-N, window aggregation and regular joins (dev/table/sql/queries), run
unchanged but for the tables' ``WITH`` options, gives the rows Flink 2.3
returned (tests/fixtures/flink/docs_examples.json, recorded by
``record_docs.py``; the window-agg page prints its Bid table and its TUMBLE,
HOP and CUMULATE results, the recording agrees).  Inputs are plain JSON files
(insert-only rows, as Flink reads them); each query runs in batch, and the
emitted changelog folded to its final rows is compared with Flink's final
rows.  The window aggregation page's GROUPING SETS, ROLLUP and CUBE
examples are pinned the same way with Flink 2.3's rows recorded by
record_sql_cases.py (sql_cases.json, ``window_*``); its cascading window
aggregation is test_sql_cascading_windows.py's."""
from __future__ import annotations

import decimal
import json

import pandas as pd
import pytest

from changelog_data import load_fixture
from spark_changelog.sql.errors import UnsupportedFeature
from spark_changelog.sql.script import parse_script
from spark_changelog.sql.translate import Translator

FIXTURE = load_fixture("flink/docs_examples.json")
TABLES = FIXTURE["tables"]


def ddl(key: str, path) -> str:
    spec = TABLES[key]
    cols = [f"`{c}` {t}" for c, t in spec["columns"]] + list(spec["extra"])
    return (f"CREATE TABLE {spec.get('name', key)} (\n  " + ",\n  ".join(cols) +
            f"\n) WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'json')")


def plain(v):
    if v is None or (not isinstance(v, str) and pd.isna(v)):
        return None
    if isinstance(v, pd.Timestamp):
        return (v.tz_convert(None) if v.tzinfo else v).isoformat(sep=" ", timespec="seconds")
    if isinstance(v, decimal.Decimal):
        return str(v)
    if hasattr(v, "item"):
        return v.item()
    return v


def final_rows(changes: pd.DataFrame) -> list:
    """The emitted changelog folded to its final rows (a multiset)."""
    columns = [c for c in changes.columns if not c.startswith("_")]
    table: list = []
    for kind, *row in zip(changes["_kind"], *(changes[c] for c in columns)):
        values = [plain(v) for v in row]
        if int(kind) in (0, 2):      # +I, +U
            table.append(values)
        else:
            table.remove(values)
    return sorted(table, key=repr)


def stream(spark, tmp_path, example: dict):
    parts = []
    for key in example["tables"]:
        spec = TABLES[key]
        d = tmp_path / key
        d.mkdir()
        names = [c for c, _ in spec["columns"]]
        (d / "data.json").write_text("".join(json.dumps(dict(zip(names, r))) + "\n"
                                             for r in spec["rows"]))
        parts.append(ddl(key, d))
    script = parse_script(";\n".join(parts) + f";\nEXPLAIN {example['query']};", example["name"])
    (_, s), = [x for x in Translator(spark, script, key_groups=2).statements()
               if x[1] is not None]
    return s


@pytest.mark.parametrize("example", FIXTURE["examples"], ids=lambda e: e["name"])
def test_flink_doc_example_gives_flinks_rows(spark, tmp_path, example):
    changes = stream(spark, tmp_path, example).collect()
    assert final_rows(changes) == [list(r) for r in example["expected"]]


GROUPING = ["window_grouping_sets", "window_rollup", "window_cube"]


@pytest.mark.parametrize("name", GROUPING)
def test_window_grouping_sets_give_flinks_rows(spark, tmp_path, name):
    """One window aggregate per grouping set, the other columns NULL, in one
    UNION ALL (Flink 2.3's rows; its timestamps without the milliseconds)."""
    case = load_fixture("flink/sql_cases.json")["cases"][name]
    s = stream(spark, tmp_path, {"name": name, "tables": ["Bid"], "query": case["query"]})
    expected = [[v[:-len(".000")] if isinstance(v, str) and v.endswith(".000") else v
                 for v in row] for row in case["expected"]]
    assert final_rows(s.collect()) == sorted(expected, key=repr)


def test_window_grouping_sets_over_session_windows_are_a_clear_error(spark, tmp_path):
    example = {"name": "session_sets", "tables": ["Bid"],
               "query": "SELECT window_start, window_end, SUM(price) AS total_price\n"
                        "  FROM TABLE(SESSION(TABLE Bid PARTITION BY supplier_id, "
                        "DESCRIPTOR(bidtime), INTERVAL '5' MINUTES))\n"
                        "  GROUP BY window_start, window_end, ROLLUP (supplier_id)"}
    with pytest.raises(UnsupportedFeature, match="not supported over SESSION"):
        stream(spark, tmp_path, example)


def test_group_window_aggregation_gives_flinks_rows(spark, tmp_path):
    """The page's deprecated group window example (``GROUP BY TUMBLE(ts,
    size), user`` with ``TUMBLE_START``) plans as the window table function
    aggregation it means; Flink 2.3's rows (sql_cases.json)."""
    case = load_fixture("flink/sql_cases.json")["cases"]["group_window_tumble"]
    (tmp_path / "data.json").write_text("".join(json.dumps(r) + "\n" for r in case["rows"]))
    script = parse_script(case["ddl"].format(path=tmp_path) + f";\nEXPLAIN {case['query']};",
                          "group_window.sql")
    (_, s), = [x for x in Translator(spark, script, key_groups=2).statements() if x[1] is not None]
    assert "WindowAggregate(groupBy=[user], window=[TUMBLE(size=24 h)]" in s.explain(), s.explain()
    expected = [[v[:-len(".000")] if isinstance(v, str) and v.endswith(".000") else v
                 for v in row] for row in case["expected"]]
    assert final_rows(s.collect()) == sorted(expected, key=repr)


@pytest.mark.parametrize("query, plan", [
    ("SELECT user, HOP_START(order_time, INTERVAL '1' HOUR, INTERVAL '1' DAY) AS s, SUM(amount) "
     "FROM Orders GROUP BY HOP(order_time, INTERVAL '1' HOUR, INTERVAL '1' DAY), user",
     "WindowAggregate(groupBy=[user], window=[HOP(slide=1 h, size=24 h)]"),
    ("SELECT user, SESSION_ROWTIME(order_time, INTERVAL '1' HOUR) AS r, COUNT(*) AS n FROM Orders "
     "GROUP BY SESSION(order_time, INTERVAL '1' HOUR), user",
     "WindowAggregate(groupBy=[user], window=[SESSION(gap=1 h)], select=[COUNT(*) AS n], "
     "allowedLateness=[0 ms], lateRows=[late output], rowtime=[window_time])"),
    ("SELECT o.user, TUMBLE_END(o.order_time, INTERVAL '1' DAY) AS e, COUNT(*) AS n FROM Orders o "
     "GROUP BY TUMBLE(o.order_time, INTERVAL '1' DAY), o.user HAVING COUNT(*) > 0",
     "Project(select=[user, window_end AS e, n])"),
], ids=["hop", "session", "qualified_having"])
def test_group_window_forms_plan_as_window_tvfs(spark, tmp_path, query, plan):
    case = load_fixture("flink/sql_cases.json")["cases"]["group_window_tumble"]
    script = parse_script(case["ddl"].format(path=tmp_path) + f";\nEXPLAIN {query};", "gw.sql")
    (_, s), = [x for x in Translator(spark, script, key_groups=2).statements() if x[1] is not None]
    assert plan in s.explain(), s.explain()
