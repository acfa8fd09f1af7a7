"""The watermark article's example (seed 002) as SQL: nine clicks, one-minute
tumbling windows, a one-minute bound (``WATERMARK FOR rt AS rt - INTERVAL '1'
MINUTE``), distinct users per window.  Streaming with one click per
micro-batch fires the windows after the same arrivals as Flink 2.3
(tests/fixtures/flink/windows.json) and puts the late ``User5 20:44:54`` in
the late output; so do 30-second SESSION windows without PARTITION BY (one
session sequence over the whole stream); batch fires every window at the end
of input, nothing late."""
from __future__ import annotations

import datetime as dt
import os

import pytest

from changelog_data import load_fixture
from sql_inputs import source_options, write_changelog
from spark_changelog.cli import main
from spark_changelog.operators.keys import GLOBAL_KEY
from spark_changelog.runtime.late_output import read_late_rows
from spark_changelog.sinks.changelog import read_changelog
from spark_changelog.sinks.delta import read_table
from spark_changelog.sql.script import parse_script
from spark_changelog.sql.translate import Translator

FIXTURE = {c["name"]: c for c in load_fixture("flink/windows.json")["cases"]}
CASE = FIXTURE["W_seed_tumble_count_distinct"]
TUMBLE = "TUMBLE(TABLE clicks, DESCRIPTOR(rt), INTERVAL '1' MINUTE)"
#: one session sequence over the whole stream (no PARTITION BY)
SESSION = "SESSION(TABLE clicks, DESCRIPTOR(rt), INTERVAL '30' SECOND)"
CLICKS = [vals for _, vals in CASE["inputs"]["T"]["rows"]]

SCRIPT = """
CREATE TABLE clicks (
  u STRING, t BIGINT,
  rt AS TO_TIMESTAMP_LTZ(t, 3),
  WATERMARK FOR rt AS rt - INTERVAL '1' MINUTE
) WITH ({source}, 'changelog.mode' = 'insert-only', 'source.max-files-per-trigger' = '1');
CREATE TABLE per_minute (
  window_start TIMESTAMP(3), window_end TIMESTAMP(3), users BIGINT, clicks BIGINT,
  PRIMARY KEY (window_start, window_end) NOT ENFORCED
) WITH ('connector' = 'delta', 'path' = '{out}');
SET 'spark-changelog.late-output.path' = '{late}';
INSERT INTO per_minute
SELECT window_start, window_end, COUNT(DISTINCT u) AS users, COUNT(*) AS clicks
FROM TABLE({window})
GROUP BY window_start, window_end;
"""


def hm(ts) -> str:
    return ts.tz_convert(None).isoformat() if hasattr(ts, "tz_convert") else ts.isoformat()


def run(spark, tmp_path, streaming: bool, window: str = TUMBLE):
    # one click per file, so one per micro-batch as Flink's recorder fed them
    write_changelog(tmp_path / "in", ["u", "t"], ["STRING", "BIGINT"],
                    [[("+I", vals, i)] for i, vals in enumerate(CLICKS)])
    # Spark's file source reads the oldest files first: one second apart, in arrival order
    for i, f in enumerate(sorted((tmp_path / "in").iterdir())):
        os.utime(f, (1_600_000_000 + i, 1_600_000_000 + i))
    script = parse_script(SCRIPT.format(source=source_options(tmp_path / "in"), window=window,
                                        out=tmp_path / "out", late=tmp_path / "late"), "seed.sql")
    tr = Translator(spark, script, streaming=streaming, key_groups=2)
    (planned,), = [p for _, p in tr.statements() if p]
    report = planned.run(checkpoint=str(tmp_path / "ck") if streaming else None,
                         changelog_path=str(tmp_path / "log"))
    table = sorted((hm(r.window_start), hm(r.window_end), int(r.users), int(r.clicks))
                   for r in read_table(str(tmp_path / "out")).itertuples())
    return report, table


@pytest.mark.parametrize("name, window", [("W_seed_tumble_count_distinct", TUMBLE),
                                          ("W_seed_session", SESSION)],
                         ids=["tumble", "global_session"])
def test_seed_clicks_streaming_fire_after_flinks_arrivals_and_the_late_click(spark, tmp_path,
                                                                             name, window):
    case = FIXTURE[name]
    report, table = run(spark, tmp_path, streaming=True, window=window)
    log = read_changelog(str(tmp_path / "log"))
    fired = {int(b): sorted((op, hm(ws), hm(we), int(n), int(c)) for op, ws, we, n, c in zip(
        part["op"], part["window_start"], part["window_end"], part["users"], part["clicks"]))
        for b, part in log.groupby("_batch")}
    want = {i: [(k, *v) for k, v in step] for i, step in enumerate(case["expected_steps"]) if step}
    assert {b: rows for b, rows in fired.items() if rows} == want
    # streaming fires what the watermark passed: 20:44 with User1 only, 20:45 with 3 users
    # (sessions: [20:44:23, 20:44:53) and [20:45:23, 20:46:24))
    assert table == [tuple(v) for _, v in case["expected"][:2]]
    late = read_late_rows(str(tmp_path / "late"))
    assert [(r["row"]["u"], dt.datetime.fromtimestamp(r["row"]["t"] / 1000, dt.timezone.utc)
             .strftime("%H:%M:%S")) for r in late.to_dict("records")] == [("User5", "20:44:54")]
    # a global session is keyed on a hidden constant column: not part of the late row
    assert all(GLOBAL_KEY not in r["row"] for r in late.to_dict("records"))
    assert report.late_rows == 1
    assert f"WindowAggregate(groupBy=[], window=[{window.split('(')[0]}(" in report.plan


def test_seed_clicks_batch_fire_every_window_nothing_late(spark, tmp_path, capsys):
    report, table = run(spark, tmp_path, streaming=False)
    # the end of input fires every window; User5 20:44:54 is not late in batch
    assert table == [("2021-01-15T20:44:00", "2021-01-15T20:45:00", 2, 2),
                     ("2021-01-15T20:45:00", "2021-01-15T20:46:00", 3, 3),
                     ("2021-01-15T20:46:00", "2021-01-15T20:47:00", 2, 2),
                     ("2021-01-15T20:47:00", "2021-01-15T20:48:00", 2, 2)]
    assert report.late_rows == 0
    # the same through `spark-changelog run --batch --late-output DIR`
    text = SCRIPT.format(source=source_options(tmp_path / "in"), window=TUMBLE, out=tmp_path / "cli",
                         late=tmp_path / "unused")
    (tmp_path / "seed.sql").write_text(text)
    assert main(["run", str(tmp_path / "seed.sql"), "--batch", "--no-progress",
                 "--late-output", str(tmp_path / "cli-late")]) == 0
    err = capsys.readouterr().err      # the summary counts late rows: none here
    assert "late rows: 0" in err and "late output:" not in err
    assert len(read_table(str(tmp_path / "cli"))) == 4
