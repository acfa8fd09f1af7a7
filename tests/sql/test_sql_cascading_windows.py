"""Cascading window aggregation, the example of Flink's window aggregation
page unchanged but for the ``WITH`` options (docs/windows.md, "Cascading
windows"): a 5-minute TUMBLE per supplier whose ``window_time`` (selected as
``rowtime``) is the event-time attribute of a 10-minute TUMBLE over the
view.  Rows as Flink 2.3 gives them (tests/fixtures/flink/sql_cases.json,
``cascading_window_*``, recorded by record_sql_cases.py).

Streaming reads one file per micro-batch: the page's six bids (watermark
08:16:59: the 5-minute windows up to 08:15 fire, and in the same batch the
watermark rows they pass on fire the 10-minute window [08:00, 08:10)), then
one later bid at 08:31 (not in Flink's recording: it only moves the
watermark to 08:30:59, which fires [08:15, 08:20) and so [08:10, 08:20);
its own windows stay open, as a stream never ends).  Flink emitted the same
two rows in the same order at the end of its bounded input."""
from __future__ import annotations

import json
import os

from changelog_data import load_fixture
from spark_changelog.sinks.changelog import read_changelog
from spark_changelog.sql.script import parse_script
from spark_changelog.sql.translate import Translator

CASES = load_fixture("flink/sql_cases.json")["cases"]
SINK = """;
CREATE TABLE totals (window_start TIMESTAMP(3), window_end TIMESTAMP(3), total_price DECIMAL(38, 2),
  PRIMARY KEY (window_start, window_end) NOT ENFORCED)
  WITH ('connector' = 'delta', 'path' = '{out}');
"""
LATER_BID = {"bidtime": "2020-04-15 08:31:00", "price": 7.0, "item": "G", "supplier_id": "supplier3"}


def plan(spark, tmp_path, streaming: bool):
    case = CASES["cascading_window_streaming" if streaming else "cascading_window_batch"]
    files = [case["rows"]] + ([[LATER_BID]] if streaming else [])
    (tmp_path / "in").mkdir()
    for i, rows in enumerate(files):
        f = tmp_path / "in" / f"part-{i:04d}.json"
        f.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.utime(f, (1_600_000_000 + i, 1_600_000_000 + i))     # read in this order
    ddl = case["ddl"].replace("'format' = 'json'",
                              "'format' = 'json', 'source.max-files-per-trigger' = '1'")
    script = (ddl.format(path=tmp_path / "in") + SINK.format(out=tmp_path / "out") +
              ";\n".join(case["views"]) + ";\nINSERT INTO totals\n" + case["query"] + ";\n")
    (p,), = [p for _, p in Translator(spark, parse_script(script, "cascade.sql"),
                                      streaming=streaming, key_groups=2).statements() if p]
    return case, p


def emitted(tmp_path) -> list:
    """(micro-batch, kind, window_start, window_end, total_price) in order."""
    log = read_changelog(str(tmp_path / "log"))
    kinds = {0: "INSERT", 1: "UPDATE_BEFORE", 2: "UPDATE_AFTER", 3: "DELETE"}

    def ts(v):
        return v.tz_convert(None).isoformat(sep=" ", timespec="milliseconds") \
            if v.tzinfo else v.isoformat(sep=" ", timespec="milliseconds")
    return [(int(b), kinds[int(k)], [ts(s), ts(e), str(p)])
            for b, k, s, e, p in zip(log["_batch"], log["_kind"], log["window_start"],
                                     log["window_end"], log["total_price"])]


def test_cascading_windows_streaming_per_micro_batch(spark, tmp_path):
    case, p = plan(spark, tmp_path, streaming=True)
    text = p.explain()
    # the second window waits for the watermark generated at Bid, carried
    # through the first window aggregate and the view's projection
    assert ("WindowAggregate(groupBy=[supplier_id], window=[TUMBLE(size=5 min)], "
            "select=[SUM(price) AS partial_price], allowedLateness=[0 ms], "
            "lateRows=[late output], rowtime=[window_time])") in text, text
    assert ("WindowTableFunction(window=[TUMBLE(size=10 min)], rowtime=[rowtime], "
            "watermark=[generated at the source: Bid: bidtime - 999 ms, the minimum over the "
            "source partitions, no idleness])") in text, text
    report = p.run(checkpoint=str(tmp_path / "ck"), changelog_path=str(tmp_path / "log"))
    got = emitted(tmp_path)
    assert [(b, k) for b, k, _ in got] == [(0, "INSERT"), (1, "INSERT")]
    assert [[k, row] for _, k, row in got] == case["expected"]
    assert report.late_rows == 0


def test_cascading_windows_batch_is_flinks(spark, tmp_path):
    case, p = plan(spark, tmp_path, streaming=False)
    p.run(changelog_path=str(tmp_path / "log"))
    assert sorted((row for _, _, row in emitted(tmp_path)), key=repr) == case["expected"]
