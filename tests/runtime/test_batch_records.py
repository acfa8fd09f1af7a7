"""The run report's per-batch records (docs/runtime.md, "Sink writers on the
executors, and the run report"): the batch handler pickles with its sinks
(Spark Connect runs it in the server's Python process), its records are read
back by run id, and a record folds into the report once."""
from __future__ import annotations

import pickle
import time

import pyarrow as pa
import pytest

from spark_changelog.runtime.pipeline import (BatchHandler, RunReport, clear_batch_records, read_batch_records,
                                              remove_batch_record, write_batch_record)
from spark_changelog.sinks.delta import DeltaUpsertSink

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def handler(sink, checkpoint, run_id="run-1"):
    return BatchHandler(sink=sink, changelog=None, key=("id",), strict=False, dead_letter=None,
                        late_output=None, streaming=True, run_id=run_id, table_name="t",
                        checkpoint=str(checkpoint))


def batch(rows):
    return pa.table({"id": pa.array([r[0] for r in rows], pa.int64()),
                     "name": pa.array([r[1] for r in rows], pa.string()),
                     "_kind": pa.array([r[2] for r in rows], pa.int8()),
                     "_seq": pa.array([r[3] for r in rows], pa.int64())})


def test_the_handler_pickles_with_an_open_delta_sink_and_still_writes(tmp_path):
    sink = DeltaUpsertSink(str(tmp_path / "t"), ["id"], SCHEMA)
    sink.write_arrow_batch(batch([(1, "a", 0, 1)]), query_id="q", batch_id=0)   # the table is open
    copy = pickle.loads(pickle.dumps(handler(sink, tmp_path / "ck")))
    before = time.time()
    record = copy.handle(batch([(2, "b", 0, 2), (1, "a", 3, 3)]), 1, "q")
    assert (record["changes_out"], record["upserted"], record["deleted"], record["skipped_replay"]) == \
        (2, 1, 1, False)
    assert sink.last_batch_id("q") == 1
    # when the batch became readable, and what the sink's commit step took
    # (scripts/bench freshness reports it beside the latency)
    assert before <= record["committed_at"] - record["sink_commit_s"] <= record["committed_at"] <= time.time()
    report = RunReport(streaming=True)
    report.apply_batch(record)
    assert report.last_batch == {"batch_id": 1, "committed_at": record["committed_at"],
                                 "sink_commit_s": record["sink_commit_s"]}


def test_records_are_read_back_by_run_and_fold_in_once(tmp_path):
    h = handler(None, tmp_path / "ck")
    base = {"metrics": [{"operator": "ChangelogNormalize", "instance": "n1",
                         "counters": {"rows_in": 5, "superseded": 1}}],
            "invalid": 1, "changes_out": 4, "upserted": 3, "deleted": 1, "write": "merge"}
    write_batch_record(h.reports_dir, {"run": "run-0", "batch_id": 0, **base})   # an earlier run's
    write_batch_record(h.reports_dir, {"run": "run-1", "batch_id": 1, **base})
    write_batch_record(h.reports_dir, {"run": "run-1", "batch_id": 2, **base, "skipped_replay": True})
    records = read_batch_records(h.reports_dir, "run-1")
    assert [r["batch_id"] for r in records] == [1, 2]
    report = RunReport(streaming=True)
    assert [report.apply_batch(r) for r in records + records] == [True, True, False, False]
    assert (report.batches, report.replayed_batches, report.changes_out, report.upserted, report.deleted,
            report.invalid, report.counters["superseded"], report.sink_writes) == \
        (2, 1, 4, 3, 1, 2, 2, {"merge": 1})
    remove_batch_record(h.reports_dir, 1)      # folded in: the client removes it
    assert [r["batch_id"] for r in read_batch_records(h.reports_dir, "run-1")] == [2]
    clear_batch_records(h.reports_dir)         # a new run starts clean
    assert read_batch_records(h.reports_dir, "run-0") == []


def test_a_stop_request_and_a_failure_travel_through_the_checkpoint(tmp_path):
    from spark_changelog.model.errors import UserError
    h = handler(None, tmp_path / "ck")
    h.request_stop()
    remote = pickle.loads(pickle.dumps(h))
    with pytest.raises(Exception) as err:
        remote(None, 3)       # before the batch is touched
    assert type(err.value).__name__ == "_StopRequested"
    assert type(h.failure()[0]).__name__ == "_StopRequested"
    remote._save_failure(UserError("bad row at f.json:3"))
    assert isinstance(h.failure()[0], UserError) and "f.json:3" in str(h.failure()[0])
    h.clear_stop()
    assert h.failure() == []
