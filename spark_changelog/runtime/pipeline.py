"""Running a changelog stream into its sinks, in batch or as a streaming query.

Per micro-batch (one batch for a bounded input): where the upsert sink has a
staged writer (Delta, PostgreSQL, blackhole) the operator output stays on the
executors (``runtime.sink_writers``): each partition splits off its side rows
and changes with a null sink key, writes its part of the emitted changelog to
the optional changelog output and stages its net changes for the upsert sink;
the driver gets counts back and commits the changelog's batch (one commit
file, replacing a replayed batch's) and then the upsert sink's, which applies
the net change per key in one atomic commit that records (query id, batch
id), so a batch replayed after a crash is skipped (docs/sinks.md).  Where it
has none (print, a Delta ``MERGE``), the batch is collected as Arrow and both
are written from the driver, the same way.

Side rows (``_kind = -1``, JSON in ``_metrics``) travel with the data through
every operator, projection and join (``runtime.spark_keyed``): operator
counters, and the readers' dead letters and skipped records
(``connectors.cdc_json.finish``), so the bad input of every source of the
plan arrives here from the same single pass over the files as the data.  Per
batch, before anything of it is written: with ``strict`` the first dead
letter (by file and line) fails the run naming file, line and field;
otherwise dead letters go to the dead-letter directory (``batch-<id>.jsonl``,
overwritten on replay) and are counted, and tombstones and ignored control
records are counted.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from typing import Callable, Optional

import numpy as np
import pandas as pd
import pyarrow as pa

from ..model import KIND_COL, METRICS_COL, SEQ_COL, as_key
from ..model.errors import PathError, UserError
from .sink_writers import split_side_rows, unpack_output


@dataclasses.dataclass
class RunReport:
    """What a run did, for the summary line and for tests."""

    streaming: bool
    table: Optional[str] = None
    changelog: Optional[str] = None
    dead_letter: Optional[str] = None
    batches: int = 0
    replayed_batches: int = 0
    #: how the upsert sink committed the batches (e.g. ``merge``, ``append:
    #: empty table``; docs/sinks.md) -> number of batches
    sink_writes: dict = dataclasses.field(default_factory=dict)
    changes_out: int = 0
    upserted: int = 0
    deleted: int = 0
    invalid: int = 0
    tombstones_skipped: int = 0
    ignored_skipped: int = 0
    seconds: float = 0.0
    counters: dict = dataclasses.field(default_factory=dict)          # summed over operators
    operators: dict = dataclasses.field(default_factory=dict)         # operator -> its counters
    warnings: list = dataclasses.field(default_factory=list)
    state_rows: int = 0
    late_rows: int = 0              # window rows past their window (the late output)
    late_output: Optional[str] = None
    #: the latest own-watermark state of event-time operators (windows):
    #: watermark, per-partition watermarks, idle partitions, newest event
    event_time: dict = dataclasses.field(default_factory=dict)
    watermark_ms: Optional[int] = None   # the latest event-time watermark an operator saw
    plan: str = ""   # the planner's explain text (ChangelogStream.write_upsert)
    #: what the sink does with the changes: ``table`` (an upsert table),
    #: ``print`` or ``blackhole`` (the summary's sink line)
    sink_kind: str = "table"
    #: True when Ctrl-C stopped a streaming run at a micro-batch boundary
    interrupted: bool = False
    #: live sources' positions after the latest batch (a PostgreSQL slot and
    #: its lag in bytes: docs/sources.md), by source
    sources: dict = dataclasses.field(default_factory=dict)
    #: (operator, instance, key group) -> its state rows after the latest batch that touched it
    _group_state: dict = dataclasses.field(default_factory=dict, repr=False)

    #: instances (``spark_keyed.operator_instance``) of the operators reading
    #: source rows directly: their input is the sources' changelog rows
    entry_instances: tuple = ()
    _entry_rows: int = dataclasses.field(default=0, repr=False)
    #: batch ids whose record was folded in (:meth:`apply_batch`)
    _applied: set = dataclasses.field(default_factory=set, repr=False)
    #: the latest batch folded in: ``batch_id``, ``committed_at`` (epoch
    #: seconds when its sink commit ended: its rows are readable from then
    #: on) and ``sink_commit_s`` (the sink's commit step alone; docs/runtime.md,
    #: "The fixed cost of a micro-batch")
    last_batch: dict = dataclasses.field(default_factory=dict)

    @property
    def rows_in(self) -> Optional[int]:
        """Changelog rows the sources produced (one per change: an update is a
        ``-U``/``+U`` pair), as received by the operators reading them; None
        when no keyed operator reads them (sources into the sink through
        projections and filters only: nothing counts them)."""
        if self.entry_instances:
            return self._entry_rows
        if "rows_in" in self.counters:
            return int(self.counters["rows_in"])
        return None

    def apply_batch(self, record: dict) -> bool:
        """Fold in one micro-batch's record (:meth:`BatchHandler.handle`);
        False when that batch was folded in already."""
        if record["batch_id"] in self._applied:
            return False
        self._applied.add(record["batch_id"])
        self.last_batch = {k: record.get(k) for k in ("batch_id", "committed_at", "sink_commit_s")}
        self.add_metrics(record["metrics"])
        if record.get("event_time"):
            self.event_time = record["event_time"]
        self.late_rows += record.get("late_rows", 0)
        if record.get("late_warning"):
            self.warnings.append(record["late_warning"])
        self.invalid += record.get("invalid", 0)
        if record.get("null_sink_key"):
            self.counters["null_sink_key"] = self.counters.get("null_sink_key", 0) + record["null_sink_key"]
        self.tombstones_skipped += record.get("tombstones_skipped", 0)
        self.ignored_skipped += record.get("ignored_skipped", 0)
        self.batches += 1
        if record.get("skipped_replay"):
            self.replayed_batches += 1
        else:
            self.changes_out += record.get("changes_out", 0)
            self.upserted += record.get("upserted", 0)
            self.deleted += record.get("deleted", 0)
            if record.get("write"):
                self.sink_writes[record["write"]] = self.sink_writes.get(record["write"], 0) + 1
        return True

    def add_metrics(self, metrics: list[dict]) -> None:
        """Sum one micro-batch's metrics rows.  State size: each key group
        reports its state rows when a batch touches it, so the report keeps the
        latest count per (operator, key group) and sums them, per operator
        (``operators[name]["state_rows"]``) and in total."""
        for m in metrics:
            name = m.get("operator", "?")
            per_op = self.operators.setdefault(name, {})
            for k, v in m.get("counters", {}).items():
                self.counters[k] = self.counters.get(k, 0) + int(v)
                per_op[k] = per_op.get(k, 0) + int(v)
            self.warnings.extend(m.get("warnings", []))
            if m.get("instance") in self.entry_instances:
                self._entry_rows += int(m.get("counters", {}).get("rows_in", 0))
            if m.get("key_group") is not None:
                group = (name, m.get("instance"), int(m["key_group"]))
                self._group_state[group] = int(m.get("state_rows", 0))
            wm = m.get("watermark_ms")
            if wm is not None and (self.watermark_ms is None or wm > self.watermark_ms):
                self.watermark_ms = int(wm)
        if self._group_state:
            per_op: dict = {}
            for (name, _, _), rows in self._group_state.items():
                per_op[name] = per_op.get(name, 0) + rows
            for name, rows in per_op.items():
                self.operators[name]["state_rows"] = rows
            self.state_rows = sum(per_op.values())

    def summary(self) -> str:
        """What the run did, in the README's words, with only the counters that
        apply: an operator's counter is shown when that operator is in the
        plan (it reported it), the sink's line says what that sink does."""
        c = self.counters
        rows_in = 'not counted (no keyed operator)' if self.rows_in is None else self.rows_in
        lines = [
            f"changelog rows in: {rows_in}   changes out: {self.changes_out}   "
            f"batches: {self.batches}" + (f" ({self.replayed_batches} replayed, skipped)"
                                          if self.replayed_batches else ""),
            self._sink_line(),
        ]
        applies = [(label, c[k]) for k, label in _OPERATOR_COUNTERS if k in c]
        if applies:
            lines.append("   ".join(f"{label}: {v}" for label, v in applies))
        bad = f"invalid rows (dead letter): {self.invalid}"
        if self.tombstones_skipped:
            bad += f"   tombstones skipped: {self.tombstones_skipped}"
        if self.ignored_skipped:
            bad += f"   DDL/control records ignored: {self.ignored_skipped}"
        lines.append(bad)
        lines.append(f"time: {self.seconds:.1f} s" + (
            f"   ({self.rows_in / self.seconds:,.0f} changelog rows/s)"
            if self.seconds > 0 and self.rows_in else ""))
        if "windows_fired" in c:
            lines.append(f"windows fired: {c['windows_fired']}   updated (allowed lateness): "
                         f"{c.get('windows_refired', 0)}   late rows: {self.late_rows}"
                         + (f" (late output: {self.late_output})"
                            if self.late_output and self.late_rows else ""))
        elif self.late_rows:
            lines.append(f"late rows: {self.late_rows}" + (f" (late output: {self.late_output})"
                                                            if self.late_output else ""))
        et = self.event_time
        if et.get("watermark_ms") is not None:
            lag = (f"   lag behind the newest event: {(et['newest_event_ms'] - et['watermark_ms']) / 1000:.3f} s"
                   if et.get("newest_event_ms") is not None else "")
            lines.append(f"window watermark: {_iso_ms(et['watermark_ms'])}{lag}   partitions: "
                         f"{len(et.get('partitions', {}))}, idle: {et.get('idle_partitions', [])}")
        if c.get("null_sink_key"):
            lines.append(f"changes with a null sink key (dead letter): {c['null_sink_key']}")
        for name, pos in self.sources.items():
            if "lag_bytes" in pos:
                lines.append(f"source {name}: slot {pos['slot']} at {pos['confirmed_lsn']}, lag "
                             f"{pos['lag_bytes']:,} bytes of WAL held on the server")
        if self.table:
            lines.append(f"upsert table: {self.table}")
        if self.changelog:
            lines.append(f"changelog: {self.changelog}")
        if self.dead_letter and self.invalid:
            lines.append(f"dead letter: {self.dead_letter}")
        for w in self.warnings[:5]:
            lines.append(f"warning: {w}")
        return "\n".join(lines)

    def _sink_line(self) -> str:
        if self.sink_kind == "print":
            return f"printed: {self.changes_out} changes"
        if self.sink_kind == "blackhole":
            return f"discarded: {self.changes_out} changes"
        return f"table: {self.upserted} upserted, {self.deleted} deleted"


#: operator counters of the summary's third line, in the README's words
#: (shown only when an operator of the plan reports them)
_OPERATOR_COUNTERS = (
    ("superseded", "superseded (older than the key's applied change)"),
    ("unchanged", "unchanged"),
    ("retract_no_match", "deletes of unknown keys"),
    ("matches", "join matches"),
    ("duplicates", "duplicates dropped"),
)


def _iso_ms(ms: int) -> str:
    import datetime
    from ..model.watermark import END_OF_INPUT_MS
    if ms >= END_OF_INPUT_MS:
        return "end of input"
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat(
        timespec="milliseconds")


def split_metrics(table: pa.Table) -> tuple[pd.DataFrame, list[dict]]:
    """Operator output (Arrow) -> (data rows as pandas, side-row payloads)."""
    data, metrics = split_side_rows(table)
    return data.to_pandas(), metrics


@dataclasses.dataclass
class SideRows:
    """The side rows of one batch, by kind."""

    metrics: list        # operator counters
    dead_letters: pd.DataFrame   # raw, file, line, reason; ordered by (file, line)
    skipped: dict        # category -> count
    #: per dead letter: its source ignores parse errors (the run goes on without
    #: a dead-letter directory)
    ignored: Optional[np.ndarray] = None


def sort_side_rows(payloads: list[dict]) -> SideRows:
    from ..connectors.cdc_json import DEAD_LETTER, INVALID_COLUMNS, SKIPPED
    metrics, dead, skipped = [], [], {}
    for p in payloads:
        if DEAD_LETTER in p:
            dead.append(p[DEAD_LETTER])
        elif SKIPPED in p:
            cat = p[SKIPPED].get("category")
            skipped[cat] = skipped.get(cat, 0) + 1
        else:
            metrics.append(p)
    frame = pd.DataFrame(dead, columns=list(INVALID_COLUMNS) + ["ignored"])
    if len(frame):
        frame = frame.sort_values(["file", "line"], kind="stable").reset_index(drop=True)
    # eq(True): a missing flag is False (fillna on this object column warns in pandas 2.3)
    ignored = frame.pop("ignored").eq(True).to_numpy()
    return SideRows(metrics, frame, skipped, ignored)


#: errors an operator raises on purpose, recognised in the text of the Spark
#: exception that carries them out of a Python worker
_OPERATOR_ERRORS = (
    (re.compile(r"Primary key constraint violation \(ON CONFLICT DO ERROR\):.*"),
     "PrimaryKeyConstraintViolation"),
)


@contextlib.contextmanager
def operator_errors():
    """Re-raise an operator's own error (e.g. ``ON CONFLICT DO ERROR``'s
    :class:`PrimaryKeyConstraintViolation`) as itself instead of as Spark's
    wrapper with a Python traceback inside; the Spark error stays its cause.
    The failing micro-batch reached no sink: its output is never committed."""
    try:
        yield
    except Exception as err:   # Spark's Py4J/Python/StreamingQuery exceptions
        text = str(err)
        for pattern, name in _OPERATOR_ERRORS:
            m = pattern.search(text)
            if m:
                from ..operators import sink_upsert_materializer as sum_
                raise getattr(sum_, name)(m.group(0).strip()) from err
        raise


def _check_outputs(**paths) -> None:
    """Before the job starts: every directory it will write can be written
    (docs/errors.md, "Checks before running")."""
    from .paths import output_problem
    for what, path in paths.items():
        problem = output_problem(os.fspath(path)) if path is not None else None
        if problem:
            raise PathError(f"{what.replace('_', ' ')} path {problem}",
                            todo="give a directory that can be written")


def _local(file: str) -> str:
    return file[len("file:"):] if file.startswith("file:") else file


def _query_id(checkpoint: str) -> str:
    """Spark's query id, stable across restarts from the same checkpoint."""
    with open(os.path.join(checkpoint, "metadata")) as f:
        return json.loads(f.readline())["id"]


def run_to_sink(df, table, *, key, schema: pa.Schema, checkpoint: Optional[str] = None,
                changelog_path: Optional[str] = None, changelog_format: str = "parquet",
                dead_letter: Optional[str] = None, strict: bool = False,
                progress: Optional[Callable[[RunReport], None]] = None,
                late_output: Optional[str] = None, entry_instances: tuple = (),
                keys_emitted_once: bool = False, source_positions: dict = None,
                trigger: Optional[str] = None,
                until: Optional[Callable[[RunReport], bool]] = None) -> RunReport:
    """Run the changelog ``df`` (the lowered plan) into ``table`` keyed by ``key``.

    ``schema``: the data columns (Arrow) the sinks store.  The bad input and
    skipped records of every source leaf arrive in ``df`` as side rows;
    late rows of window operators go to ``late_output`` (docs/windows.md).
    ``keys_emitted_once``: the planner proved that ``df`` is insert-only and
    emits each value of ``key`` at most once over the query's life (keep first
    without TTL on a key inside ``key``); a Delta table given as a path may
    then append while this query is its only writer (docs/sinks.md).
    ``source_positions``: source name -> a callable giving its position (a
    replication slot's lag), recorded in the report after every batch.
    ``trigger``: None runs what the sources hold now, in micro-batches, and
    stops (Spark's available-now trigger); an interval (``"1 second"``, ``"0
    seconds"``: back to back) keeps the query running with that processing-time
    trigger until ``until(report)`` is true (checked every 0.2 s) or it fails.

    The report travels as one small record per micro-batch (docs/runtime.md,
    "Sink writers on the executors, and the run report"): the batch handler
    (:class:`BatchHandler`, which may run in another process: a Spark Connect
    server) builds it and, streaming,
    writes it to ``<checkpoint>/reports``; the report folds it in.
    """
    from ..sinks.changelog import ChangelogSink
    from ..sinks.delta import DeltaPath, DeltaUpsertSink

    key = as_key(key)
    if not key and getattr(table, "requires_key", True):
        raise ValueError("an upsert table needs a primary key: pass key=[...]")
    schema = pa.schema([f for f in schema if f.name not in (KIND_COL, SEQ_COL, METRICS_COL)])
    streaming = bool(df.isStreaming)
    _check_outputs(table=table if isinstance(table, (str, os.PathLike)) else None,
                   checkpoint=checkpoint if streaming else None, changelog=changelog_path,
                   dead_letter=dead_letter, late_output=late_output)
    sink = DeltaUpsertSink(os.fspath(table), key, schema, keys_emitted_once=keys_emitted_once,
                           **(table.options if isinstance(table, DeltaPath) else {})) \
        if isinstance(table, (str, os.PathLike)) else table
    log = ChangelogSink(changelog_path, changelog_format, key=key, schema=schema) if changelog_path else None
    report = RunReport(streaming=streaming,
                       table=os.fspath(table) if isinstance(table, (str, os.PathLike)) else None,
                       changelog=changelog_path, dead_letter=dead_letter,
                       late_output=late_output, entry_instances=tuple(entry_instances),
                       sink_kind={"PrintSink": "print", "BlackholeSink": "blackhole"}.get(
                           type(sink).__name__, "table"))
    t0 = time.perf_counter()
    run_id = uuid.uuid4().hex
    handler = BatchHandler(
        sink=sink, changelog=log, key=key, strict=strict, dead_letter=dead_letter,
        late_output=late_output, streaming=streaming, run_id=run_id,
        table_name=os.fspath(table) if isinstance(table, (str, os.PathLike)) else type(table).__name__,
        checkpoint=checkpoint)

    def after_batch() -> None:
        for name, position in (source_positions or {}).items():
            report.sources[name] = position()
        if progress:
            progress(report)

    if not streaming:
        with operator_errors():
            report.apply_batch(handler.run(df, 0, f"batch-{run_id}"))
        after_batch()
        report.seconds = time.perf_counter() - t0
        return report

    if not checkpoint:
        raise ValueError("a streaming run needs a checkpoint directory (checkpoint=...)")
    remote = runs_remote(df)
    failure: list = []
    clear_batch_records(handler.reports_dir)    # a dead run's leftovers (one query per checkpoint)
    # the log files Spark reads to resume, against the checksums written
    # beside them (runtime/checkpoint.py, seal_logs)
    from .checkpoint import seal_logs, verify_logs
    verify_logs(handler.main_checkpoint, handler.main_checkpoint)

    def main_batch(bdf, batch_id):
        # classic PySpark: this runs in this process (Py4J callback), so the
        # report and the callbacks are updated inside the batch, before Spark
        # records it as done
        try:
            report.apply_batch(handler.run_batch(bdf, batch_id))
        except Exception as err:    # re-raised as itself below, not as Spark's wrapper
            failure.append(err)
            raise
        after_batch()

    # Spark Connect: the function is pickled to the server, so it carries only
    # the handler (config and sinks); the records come back through the checkpoint
    writer = df.writeStream.foreachBatch(handler if remote else main_batch) \
        .option("checkpointLocation", handler.main_checkpoint)
    writer = writer.trigger(availableNow=True) if trigger is None else writer.trigger(processingTime=trigger)
    from .session import QueryStarts
    if not remote:
        # the stateful operators' driver processes forked from a server
        # that imports while Spark plans (runtime/driver_worker_forks.py)
        from .driver_worker_forks import prestart
        from .worker_launcher import launcher
        prestart(df.sparkSession, launcher())
    starts = QueryStarts()
    query = starts.start(writer.start)

    def fold_in_records() -> None:
        if remote:
            for record in read_batch_records(handler.reports_dir, run_id):
                if report.apply_batch(record):
                    after_batch()
                remove_batch_record(handler.reports_dir, record["batch_id"])

    try:
        with operator_errors(), _stop_on_ctrl_c(handler.request_stop):
            while True:
                try:
                    while not query.awaitTermination(0.2):
                        fold_in_records()
                        if until is not None and until(report):
                            break
                        if trigger is not None and handler.stop_requested \
                                and not query.status.get("isTriggerActive"):
                            # Ctrl-C while a processing-time query waits for its
                            # next trigger: no batch would come to see the request
                            report.interrupted = True
                            break
                except Exception as err:
                    fold_in_records()
                    failure = failure or handler.failure()
                    if not failure and starts.again(err):
                        query = starts.start(writer.start)
                        continue
                    if failure and isinstance(failure[0], _StopRequested):
                        report.interrupted = True
                    else:
                        from .checkpoint import reraise_damaged
                        reraise_damaged(failure[0] if failure else err, handler.main_checkpoint)
                        if failure:
                            raise failure[0] from err
                        raise
                break
            fold_in_records()
    finally:
        if query.isActive:
            query.stop()
        handler.clear_stop()
        seal_logs(handler.main_checkpoint)      # the last batch's commit
    report.seconds = time.perf_counter() - t0
    return report


def runs_remote(df) -> bool:
    """``df`` belongs to a Spark Connect session: foreachBatch functions run
    in the server's Python process, not in this one."""
    return type(df).__module__.startswith("pyspark.sql.connect")


#: directory of the per-batch report records, inside a streaming checkpoint
REPORTS_DIR = "reports"


def _record_path(directory: str, batch_id: int) -> str:
    return os.path.join(directory, f"{batch_id:09d}.json")


def write_batch_record(directory: str, record: dict) -> None:
    """One micro-batch's report record, ``<batch id>.json``, written whole
    (temp file + rename); a replayed batch overwrites its record.  The client
    removes it once folded in (:func:`remove_batch_record`)."""
    os.makedirs(directory, exist_ok=True)
    path = _record_path(directory, record["batch_id"])
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, default=str)
    os.replace(path + ".tmp", path)


def read_batch_records(directory: str, run_id: str) -> list[dict]:
    """The report records the run ``run_id`` wrote, by batch id."""
    out = []
    if os.path.isdir(directory):
        for name in sorted(os.listdir(directory)):
            if name.endswith(".json") and name[:-5].isdigit():
                with open(os.path.join(directory, name)) as f:
                    record = json.load(f)
                if record.get("run") == run_id:
                    out.append(record)
    return out


def remove_batch_record(directory: str, batch_id: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(_record_path(directory, batch_id))


def clear_batch_records(directory: str) -> None:
    """Remove what earlier runs left in the reports directory (records, stop
    requests, failures)."""
    if os.path.isdir(directory):
        for name in os.listdir(directory):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(directory, name))


class BatchHandler:
    """What happens to one micro-batch, from its output to the sinks' commit,
    as a picklable object (config and sinks, no client state): Spark Connect
    runs it in the server's Python process.  It returns the batch's report
    record (:meth:`RunReport.apply_batch`); called by foreachBatch it also
    writes the record to ``<checkpoint>/reports``."""

    def __init__(self, *, sink, changelog, key, strict, dead_letter, late_output, streaming,
                 run_id, table_name, checkpoint):
        self.sink, self.changelog, self.key = sink, changelog, key
        self.strict, self.dead_letter, self.late_output = strict, dead_letter, late_output
        self.streaming, self.run_id, self.table_name = streaming, run_id, table_name
        self.main_checkpoint = os.path.join(checkpoint, "main") if checkpoint else None
        self.reports_dir = os.path.join(checkpoint, REPORTS_DIR) if checkpoint else None

    # -- the stop request and the failure, shared through the checkpoint ------
    @property
    def _stop_path(self) -> str:
        return os.path.join(self.reports_dir, f"stop-{self.run_id}")

    @property
    def _failure_path(self) -> str:
        return os.path.join(self.reports_dir, f"failure-{self.run_id}.pickle")

    def request_stop(self) -> None:
        """No further micro-batch starts (Ctrl-C)."""
        os.makedirs(self.reports_dir, exist_ok=True)
        open(self._stop_path, "w").close()

    @property
    def stop_requested(self) -> bool:
        return os.path.exists(self._stop_path)

    def clear_stop(self) -> None:
        for path in (self._stop_path, self._failure_path):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)

    def failure(self) -> list:
        """The error the handler raised in another process, as itself."""
        import pickle
        try:
            with open(self._failure_path, "rb") as f:
                return [pickle.load(f)]
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
            return []

    def __call__(self, bdf, batch_id) -> dict:
        """foreachBatch in another process (Spark Connect): the batch, then its
        record in the checkpoint for the client to fold in."""
        record = self.run_batch(bdf, batch_id)
        write_batch_record(self.reports_dir, record)
        return record

    def run_batch(self, bdf, batch_id) -> dict:
        """One micro-batch -> its record; a stop request stops before it."""
        try:
            if self.stop_requested:
                # before this batch touches state or a sink: it is redone on resume
                raise _StopRequested()
            # checksums of the logs Spark wrote for this batch and the one before
            from .checkpoint import seal_logs
            seal_logs(self.main_checkpoint)
            return self.run(bdf, int(batch_id), _query_id(self.main_checkpoint))
        except Exception as err:
            self._save_failure(err)
            raise

    def _save_failure(self, err: Exception) -> None:
        import pickle
        try:
            data = pickle.dumps(err)
        except Exception:
            return
        os.makedirs(self.reports_dir, exist_ok=True)
        with open(self._failure_path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(self._failure_path + ".tmp", self._failure_path)

    def run(self, df, batch_id: int, query_id: str) -> dict:
        """The batch ``df`` (a micro-batch, or the whole bounded output) ->
        its record.  A sink may stage this batch on the executors (its
        ``stage_batch`` gives a stage) or not (``None``: collected, and the
        changelog output is then written from here too)."""
        log_stage = self.changelog.stage_batch(query_id, batch_id) if self.changelog is not None else None
        if self.changelog is None or log_stage is not None:
            stage = self.sink.stage_batch(query_id, batch_id) if hasattr(self.sink, "stage_batch") else None
            if stage is not None:
                return self.handle_distributed(df, stage, batch_id, query_id, log_stage)
        return self.handle(df.toArrow(), batch_id, query_id)

    def handle(self, batch: pa.Table, batch_id: int, query_id: str) -> dict:
        """One batch's output collected as Arrow (side rows in it) into the sinks -> its record."""
        from ..sinks.base import split_null_keys_arrow
        data, payloads = split_side_rows(unpack_output(batch))
        data, rejects = split_null_keys_arrow(data, self.key, self.table_name)
        record = self._side_rows(payloads, rejects, batch_id)
        from .session import native_stderr_to_log
        with native_stderr_to_log():
            if self.changelog is not None:
                self.changelog.write_arrow_batch(data, batch_id=batch_id, query_id=query_id)
            started = time.time()
            result = self.sink.write_arrow_batch(data, query_id=query_id, batch_id=batch_id)
        return self._with_result(record, result, data.num_rows, started)

    def handle_distributed(self, df, stage, batch_id: int, query_id: str, log_stage=None) -> dict:
        """The batch stays on the executors: the sink writers write the
        changelog output's parts (``log_stage``) and stage the sink's batch
        (``runtime.sink_writers``), only side rows, null-key rejects and counts
        come back; then the changelog's batch is committed, then the sink's,
        each in one step.  Nothing of a batch that fails before is visible."""
        from .sink_writers import write_partitions
        stages = [s for s in (log_stage, stage) if s is not None]
        written: list = [[] for _ in stages]
        try:
            payloads, rejects, written = write_partitions(df, stages, self.key, self.table_name)
            rejects = pd.DataFrame(rejects, columns=["raw", "file", "line", "reason"])
            record = self._side_rows(payloads, rejects, batch_id)
            if log_stage is not None:
                log_stage.commit(written[0])
        except BaseException:
            for s, w in zip(stages, written):
                s.drop(w)       # nothing of the batch reached the table (nor the changelog)
            raise
        started = time.time()
        result = stage.commit(written[-1])
        return self._with_result(record, result, sum(w["rows"] for w in written[-1]), started)

    @staticmethod
    def _with_result(record: dict, result: dict, changes: int, commit_started: float) -> dict:
        committed_at = time.time()
        record.update(changes_out=changes, skipped_replay=bool(result.get("skipped_replay")),
                      upserted=int(result.get("upserted", 0)), deleted=int(result.get("deleted", 0)),
                      write=result.get("write"), committed_at=committed_at,
                      sink_commit_s=committed_at - commit_started)
        return record

    def _side_rows(self, payloads: list[dict], rejects: pd.DataFrame, batch_id: int) -> dict:
        """The batch's side rows and null-key rejects: counted, dead letters
        written (or the run stops), late rows to the late output -> the record
        without the sink's counts.  Runs before anything of the batch is written."""
        dead_letter, strict = self.dead_letter, self.strict
        side = sort_side_rows(payloads)
        record = {"run": self.run_id, "batch_id": batch_id, "invalid": 0, "null_sink_key": 0,
                  **_late_record(side.metrics, self.late_output, batch_id),
                  # late rows went to the late output: the report counts them
                  "metrics": [{k: v for k, v in m.items() if k != "side"} for m in side.metrics]}
        # bad input first: strict stops before anything of the batch is written
        dead = side.dead_letters
        if len(dead):
            if strict:
                from ..connectors.cdc_json import raise_if_invalid
                raise_if_invalid(dead)
            if dead_letter is None:
                # rows of a source with ignore-parse-errors are counted and passed
                # over (docs/sql.md, "Format options"); any other stops the run
                fatal = dead[~side.ignored]
                if len(fatal):
                    first = fatal.iloc[0]
                    raise UserError(
                        f"{len(fatal)} invalid input row(s) and no dead-letter directory; the first: "
                        f"{_local(first['file'])}:{first['line']}: {first['reason']}",
                        todo="give --dead-letter DIR (dead_letter=...) to set invalid rows aside "
                             "and go on, or fix the input")
            else:
                from ..connectors.dead_letter import write_dead_letter
                # a batch run is named by content (a second run does not overwrite it)
                write_dead_letter(dead, dead_letter, batch_id=batch_id if self.streaming else None)
            record["invalid"] += len(dead)
        record["tombstones_skipped"] = side.skipped.get("tombstone", 0)
        record["ignored_skipped"] = side.skipped.get("ignored", 0)
        # a change whose sink key is null cannot be applied: dead letter (or stop),
        # before anything of the batch is written
        if len(rejects):
            if strict or dead_letter is None:
                first = rejects.iloc[0]
                raise ValueError(f"{len(rejects)} change(s) with a null sink key in batch {batch_id}"
                                 f"{'' if strict else ' and no dead-letter directory'}: first: "
                                 f"{first['reason']}: {first['raw']}")
            from ..connectors.dead_letter import write_dead_letter
            write_dead_letter(rejects, dead_letter, batch_id=batch_id, prefix="sink-")
            record["invalid"] += len(rejects)
            record["null_sink_key"] = len(rejects)
        return record


class _StopRequested(Exception):
    """Ctrl-C was pressed: the next micro-batch does not start."""


@contextlib.contextmanager
def _stop_on_ctrl_c(request_stop: Callable[[], None]):
    """The first Ctrl-C of a streaming run lets the running micro-batch finish
    and starts no other (``request_stop()``); a second one stops at once
    (KeyboardInterrupt).  Only in the main thread (signals go there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    requested = threading.Event()

    def on_sigint(signum, frame):
        if requested.is_set():
            raise KeyboardInterrupt
        requested.set()
        request_stop()
        print("stopping at the end of the current micro-batch (Ctrl-C again to stop at once)",
              file=sys.stderr, flush=True)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _late_record(metrics: list[dict], late_output: Optional[str], batch_id) -> dict:
    """Late rows of window operators (side-row channel) go to the late output,
    counted; without a late output they are counted and warned about.  The
    operators' watermark state goes to the record (and, per batch, next to the
    late rows, for ``spark-changelog plot-watermarks``)."""
    from .late_output import late_records, write_event_time, write_late_rows
    out: dict = {"late_rows": 0, "late_warning": None, "event_time": None}
    progress = [m["event_time"] for m in metrics if m.get("event_time")]
    if progress:
        out["event_time"] = progress[-1]
        if late_output is not None:
            write_event_time(progress[-1], late_output, batch_id)
    late = late_records(metrics)
    if not late:
        return out
    out["late_rows"] = len(late)
    if late_output is not None:
        write_late_rows(late, late_output, batch_id)
    else:
        out["late_warning"] = (f"{len(late)} late row(s) in batch {batch_id} and no late output "
                               "directory (late_output=...): counted only")
    return out


def collect_changes(df) -> pd.DataFrame:
    """Emitted changes of a bounded changelog DataFrame, ordered by ``_seq``
    (then emission)."""
    if df.isStreaming:
        raise ValueError("collect() needs a bounded stream; write a streaming one to a sink")
    data, _ = split_metrics(df.toArrow())
    data["__pos"] = np.arange(len(data))
    return data.sort_values([SEQ_COL, "__pos"], kind="stable").drop(columns="__pos").reset_index(drop=True)
