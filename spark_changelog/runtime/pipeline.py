"""Running a changelog stream into its sinks, in batch or as a streaming query.

Per micro-batch (one batch for a bounded input): the operator output is
collected as Arrow, side rows and changes with a null sink key are split off
(vectorized, the batch stays Arrow), the emitted changelog goes to the
optional changelog sink (one file per batch id, overwritten on replay) and
the batch goes as Arrow to the upsert sink (``UpsertSink.write_arrow_batch``),
which applies the net change per key in one atomic commit that records
(query id, batch id), so a batch replayed after a crash is skipped
(docs/sinks.md).

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
import pyarrow.compute as pc

from ..model import KIND_COL, SEQ_COL, as_key
from ..model.errors import PathError, UserError
from ..model.source_watermarks import is_watermark_payload
from .spark_keyed import METRICS_COL, METRICS_KIND


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
        if self.watermark_ms is not None and "watermark_timers" in c:
            lines.append(f"event-time watermark: {_iso_ms(self.watermark_ms)}   "
                         f"watermark timers fired: {c['watermark_timers']}")
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


def split_side_rows(table: pa.Table) -> tuple[pa.Table, list[dict]]:
    """Operator output (Arrow) -> (data rows, still Arrow, and the side-row
    payloads); only the few side rows are decoded."""
    if METRICS_COL not in table.column_names:
        return table, []
    is_metric = pc.fill_null(pc.equal(table[KIND_COL], METRICS_KIND), False)
    if not pc.any(is_metric).as_py():
        return table.drop_columns([METRICS_COL]), []
    # watermark rows no event-time operator consumed (a stream with a
    # watermark and no window) carry nothing for the report
    metrics = [p for p in (json.loads(s) for s in table.filter(is_metric)[METRICS_COL].to_pylist())
               if not is_watermark_payload(p)]
    return table.filter(pc.invert(is_metric)).drop_columns([METRICS_COL]), metrics


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
    """
    from ..sinks.changelog import ChangelogSink
    from ..sinks.delta import DeltaUpsertSink

    key = as_key(key)
    if not key and getattr(table, "requires_key", True):
        raise ValueError("an upsert table needs a primary key: pass key=[...]")
    schema = pa.schema([f for f in schema if f.name not in (KIND_COL, SEQ_COL, METRICS_COL)])
    streaming = bool(df.isStreaming)
    _check_outputs(table=table if isinstance(table, (str, os.PathLike)) else None,
                   checkpoint=checkpoint if streaming else None, changelog=changelog_path,
                   dead_letter=dead_letter, late_output=late_output)
    sink = DeltaUpsertSink(os.fspath(table), key, schema, keys_emitted_once=keys_emitted_once) \
        if isinstance(table, (str, os.PathLike)) else table
    log = ChangelogSink(changelog_path, changelog_format, key=key, schema=schema) if changelog_path else None
    report = RunReport(streaming=streaming,
                       table=os.fspath(table) if isinstance(table, (str, os.PathLike)) else None,
                       changelog=changelog_path, dead_letter=dead_letter,
                       late_output=late_output, entry_instances=tuple(entry_instances),
                       sink_kind={"PrintSink": "print", "BlackholeSink": "blackhole"}.get(
                           type(sink).__name__, "table"))
    t0 = time.perf_counter()

    table_name = os.fspath(table) if isinstance(table, (str, os.PathLike)) else type(table).__name__

    def handle(batch: pa.Table, batch_id: int, query_id: str) -> None:
        from ..sinks.base import split_null_keys_arrow
        data, payloads = split_side_rows(batch)
        side = sort_side_rows(payloads)
        report.add_metrics(side.metrics)
        _handle_late(side.metrics, report, late_output, batch_id)
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
                write_dead_letter(dead, dead_letter, batch_id=batch_id if report.streaming else None)
            report.invalid += len(dead)
        report.tombstones_skipped += side.skipped.get("tombstone", 0)
        report.ignored_skipped += side.skipped.get("ignored", 0)
        # a change whose sink key is null cannot be applied: dead letter (or stop),
        # before anything of the batch is written
        data, rejects = split_null_keys_arrow(data, key, table_name)
        if len(rejects):
            if strict or dead_letter is None:
                first = rejects.iloc[0]
                raise ValueError(f"{len(rejects)} change(s) with a null sink key in batch {batch_id}"
                                 f"{'' if strict else ' and no dead-letter directory'}: first: "
                                 f"{first['reason']}: {first['raw']}")
            from ..connectors.dead_letter import write_dead_letter
            write_dead_letter(rejects, dead_letter, batch_id=batch_id, prefix="sink-")
            report.invalid += len(rejects)
            report.counters["null_sink_key"] = report.counters.get("null_sink_key", 0) + len(rejects)
        if log is not None:
            log.write_batch(data.to_pandas(), batch_id=batch_id, query_id=query_id)
        result = sink.write_arrow_batch(data, query_id=query_id, batch_id=batch_id)
        report.batches += 1
        if result.get("skipped_replay"):
            report.replayed_batches += 1
        else:
            report.changes_out += len(data)
            report.upserted += int(result.get("upserted", 0))
            report.deleted += int(result.get("deleted", 0))
            if result.get("write"):
                report.sink_writes[result["write"]] = report.sink_writes.get(result["write"], 0) + 1
        for name, position in (source_positions or {}).items():
            report.sources[name] = position()
        if progress:
            progress(report)

    if not streaming:
        with operator_errors():
            output = df.toArrow()
        handle(output, 0, f"batch-{uuid.uuid4().hex}")
        report.seconds = time.perf_counter() - t0
        return report

    if not checkpoint:
        raise ValueError("a streaming run needs a checkpoint directory (checkpoint=...)")
    main_ck = os.path.join(checkpoint, "main")

    failure: list = []
    stop = threading.Event()      # set by Ctrl-C: no further micro-batch starts

    def main_batch(bdf, batch_id):
        try:
            if stop.is_set():
                # before this batch touches state or a sink: it is redone on resume
                raise _StopRequested()
            handle(bdf.toArrow(), int(batch_id), _query_id(main_ck))
        except Exception as err:    # re-raised as itself below, not as Spark's wrapper
            failure.append(err)
            raise

    writer = df.writeStream.foreachBatch(main_batch).option("checkpointLocation", main_ck)
    query = (writer.trigger(availableNow=True) if trigger is None
             else writer.trigger(processingTime=trigger)).start()
    try:
        with operator_errors(), _stop_on_ctrl_c(stop):
            try:
                if until is None:
                    query.awaitTermination()
                else:
                    while not query.awaitTermination(0.2) and not until(report):
                        pass
            except Exception as err:
                if failure and isinstance(failure[0], _StopRequested):
                    report.interrupted = True
                else:
                    from .checkpoint import reraise_damaged
                    reraise_damaged(failure[0] if failure else err, main_ck)
                    if failure:
                        raise failure[0] from err
                    raise
    finally:
        if query.isActive:
            query.stop()
    report.seconds = time.perf_counter() - t0
    return report


class _StopRequested(Exception):
    """Ctrl-C was pressed: the next micro-batch does not start."""


@contextlib.contextmanager
def _stop_on_ctrl_c(requested: threading.Event):
    """The first Ctrl-C of a streaming run lets the running micro-batch finish
    and starts no other (``requested`` is set); a second one stops at once
    (KeyboardInterrupt).  Only in the main thread (signals go there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(signum, frame):
        if requested.is_set():
            raise KeyboardInterrupt
        requested.set()
        print("stopping at the end of the current micro-batch (Ctrl-C again to stop at once)",
              file=sys.stderr, flush=True)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _handle_late(metrics: list[dict], report: RunReport, late_output: Optional[str],
                 batch_id) -> None:
    """Late rows of window operators (side-row channel) go to the late output,
    counted; without a late output they are counted and warned about.  The
    operators' watermark state goes to the report (and, per batch, next to the
    late rows, for ``spark-changelog plot-watermarks``)."""
    from .late_output import late_records, write_event_time, write_late_rows
    progress = [m["event_time"] for m in metrics if m.get("event_time")]
    if progress:
        report.event_time = progress[-1]
        if late_output is not None:
            write_event_time(progress[-1], late_output, batch_id)
    late = late_records(metrics)
    if not late:
        return
    report.late_rows += len(late)
    if late_output is not None:
        write_late_rows(late, late_output, batch_id)
    else:
        report.warnings.append(f"{len(late)} late row(s) in batch {batch_id} and no late output "
                               "directory (late_output=...): counted only")


def collect_changes(df) -> pd.DataFrame:
    """Emitted changes of a bounded changelog DataFrame, ordered by ``_seq``
    (then emission)."""
    if df.isStreaming:
        raise ValueError("collect() needs a bounded stream; write a streaming one to a sink")
    data, _ = split_metrics(df.toArrow())
    data["__pos"] = np.arange(len(data))
    return data.sort_values([SEQ_COL, "__pos"], kind="stable").drop(columns="__pos").reset_index(drop=True)
