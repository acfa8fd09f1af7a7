"""The run summary tells the truth (docs/errors.md, "Summaries"): the sink's
line says what that sink does, and an operator's counters appear only when
that operator is in the plan."""
from __future__ import annotations

from spark_changelog.runtime.pipeline import RunReport


def report(**kw) -> RunReport:
    r = RunReport(streaming=True, batches=2, changes_out=5, seconds=2.0, **kw)
    return r


def metrics(operator, **counters):
    return {"operator": operator, "counters": counters}


def test_a_print_sink_reports_printed_changes_not_an_upserted_table():
    r = report(sink_kind="print", upserted=4, deleted=1)
    r.add_metrics([metrics("ChangelogNormalize", rows_in=6, rows_out=5, superseded=1)])
    lines = r.summary().splitlines()
    assert lines[:4] == [
        "changelog rows in: 6   changes out: 5   batches: 2",
        "printed: 5 changes",
        "superseded (older than the key's applied change): 1",
        "invalid rows (dead letter): 0"]
    assert not any(line.startswith("table:") for line in lines)


def test_a_window_job_reports_windows_fired_and_no_normalize_lines():
    r = report(upserted=3)
    r.late_rows = 1
    r.add_metrics([metrics("WindowAggregate", rows_in=9, rows_out=3, windows_fired=3,
                           windows_refired=0, late_rows=1, windows_closed=3)])
    r.watermark_ms = 60_000
    lines = r.summary().splitlines()
    assert lines[1:4] == ["table: 3 upserted, 0 deleted", "invalid rows (dead letter): 0",
                          "time: 2.0 s   (4 changelog rows/s)"]
    assert "windows fired: 3   updated (allowed lateness): 0   late rows: 1" in lines
    text = r.summary()
    assert "superseded" not in text and "tombstones" not in text and "unchanged" not in text


def test_a_join_reports_its_matches_and_no_normalize_lines():
    r = report(upserted=5)
    r.add_metrics([metrics("RegularJoin", rows_in=8, rows_out=5, matches=5)])
    lines = r.summary().splitlines()
    assert lines[2] == "join matches: 5"
    assert "superseded" not in r.summary() and "deletes of unknown keys" not in r.summary()


def test_a_normalize_job_keeps_the_readme_lines():
    r = report(upserted=4, deleted=1, tombstones_skipped=1, invalid=3)
    r.add_metrics([metrics("ChangelogNormalize", rows_in=9, rows_out=5, superseded=2,
                           unchanged=0),
                   metrics("sink_upsert_materializer", rows_in=5, rows_out=5,
                           retract_no_match=0)])
    lines = r.summary().splitlines()
    assert lines[1:4] == [
        "table: 4 upserted, 1 deleted",
        "superseded (older than the key's applied change): 2   unchanged: 0   "
        "deletes of unknown keys: 0",
        "invalid rows (dead letter): 3   tombstones skipped: 1"]
