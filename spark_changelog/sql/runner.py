"""Run or explain a Flink SQL script (``spark-changelog run|explain``, docs/sql.md).

``run``: every ``INSERT INTO`` of the script (and of its statement sets) is
planned first, so a script with an error anywhere fails before anything is
written; then the inserts run one after the other in one Spark application,
as batch jobs or as Structured Streaming queries (trigger available-now, each
with its own checkpoint directory under ``--checkpoint``, so a second run
resumes).  ``EXPLAIN`` statements print their plan.  ``explain``: the plan of
every ``INSERT`` and ``EXPLAIN`` of the script, as text (the Python API's
explain), Graphviz dot or Mermaid.
"""
from __future__ import annotations

import dataclasses
import os
import re
import sys
import time
from typing import Callable, Optional, TextIO

from ..model.errors import Interrupted, UsageError, located
from .script import ExplainDef, QueryDef, Script
from ..runtime.keyed_rows import operator_schema_of
from .tableau import changelog_text
from .insert import PlannedInsert
from .translate import Translator

FORMATS = ("text", "dot", "mermaid")


@dataclasses.dataclass
class InsertRun:
    planned: PlannedInsert
    report: object          # runtime.pipeline.RunReport


def _header(p: PlannedInsert) -> str:
    pos = p.insert.position
    return f"== INSERT INTO {p.table.name} (line {pos.line}) =="


def _render(planned: PlannedInsert, fmt: str) -> str:
    if fmt == "text":
        return planned.explain()
    from ..plan.graph import explain_dot, explain_mermaid
    node = planned.plan()
    return explain_dot(node) if fmt == "dot" else explain_mermaid(node)


def _render_query(stream, fmt: str) -> str:
    if fmt == "text":
        return stream.explain()
    from ..plan.graph import explain_dot, explain_mermaid
    return explain_dot(stream.node) if fmt == "dot" else explain_mermaid(stream.node)


def explain_script(spark, script: Script, fmt: str = "text", *, batch: bool = False) -> str:
    """The plans of the script's INSERTs and EXPLAINs (nothing runs), as
    ``run`` would execute them: streaming (the default, as Flink's), or with
    ``batch`` as ``run --batch`` (a bounded run needs no reordering and keeps no
    state across runs, so its plan can differ)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    out = []
    for stmt, planned in Translator(spark, script, streaming=not batch).statements():
        if planned is None or isinstance(planned, str):
            continue
        if isinstance(stmt, QueryDef):
            out.append(f"== SELECT (line {stmt.position.line}) ==\n{_render_query(planned, fmt)}")
            continue
        if isinstance(stmt, ExplainDef):
            head = f"== EXPLAIN (line {stmt.position.line}) =="
            if isinstance(planned, list):
                out.extend(f"{head}\n{_render(p, fmt)}" for p in planned)
            else:   # a bare SELECT: its plan without a sink
                out.append(f"{head}\n{_render_query(planned, fmt)}")
            continue
        for p in planned:
            out.append(f"{_header(p)}\n{_render(p, fmt)}")
    if not out:
        raise UsageError(f"{script.path or 'the script'} has no INSERT INTO or EXPLAIN statement",
                         todo="add an INSERT INTO ... SELECT ... to explain")
    return "\n\n".join(out)


def _prestart_forks(spark) -> None:
    """The driver's fork server for the stateful operators' pre-init
    processes (runtime/driver_worker_forks.py) started before the script is
    translated, not just before its query starts: its imports then run on
    the other core while the JVM builds the first job's plans, and it is
    ready when the first query's planning asks for it (docs/runtime.md,
    "From the process's start to the first job's query").  Not for a Spark
    Connect client (the server's driver is not this process's)."""
    from ..connectors.session_info import is_connect
    if is_connect(spark):
        return
    from ..runtime.driver_worker_forks import prestart
    from ..runtime.worker_launcher import launcher
    prestart(spark, launcher())


def run_script(spark, script: Script, *, batch: bool, checkpoint: Optional[str] = None,
               dead_letter: Optional[str] = None, strict: bool = False,
               key_groups: Optional[int] = None, show_progress: bool = True,
               out: Optional[TextIO] = None, late_output: Optional[str] = None,
               changelog: Optional[str] = None, trigger: Optional[str] = None,
               on_finished: Optional[Callable[[InsertRun], None]] = None,
               on_batch: Optional[Callable] = None) -> list[InsertRun]:
    """Plan the whole script, then run its INSERTs (see the module docstring).
    ``out``: where EXPLAIN output and print sinks write (default: stdout).
    ``changelog``: also write each INSERT's emitted changes there (Parquet,
    one file per micro-batch; a subdirectory per INSERT when there are several).
    ``trigger``: a processing-time interval (``"1 second"``, ``"0 seconds"``)
    that keeps the script's one streaming INSERT running, fed as files arrive,
    until Ctrl-C (docs/runtime.md, "Freshness: what bounds it, and the trigger").
    ``on_finished``: called with each INSERT's run as soon as it finishes
    (``print_summary`` prints its summary); ``on_batch``: with the running
    INSERT's report after each of its micro-batches reached the sinks, inside
    the batch (``write_upsert``'s ``progress``).  A failing INSERT's error says
    which INSERTs had already written their tables; Ctrl-C stops a streaming
    INSERT at a micro-batch boundary and raises :class:`Interrupted` saying
    how to resume."""
    sink_out, out = out, out or sys.stdout
    if not batch and not checkpoint:
        raise UsageError("a streaming run needs --checkpoint DIR (or run it with --batch)")
    if not batch:
        _prestart_forks(spark)
    translator = Translator(spark, script, streaming=not batch, strict=strict,
                            key_groups=key_groups)
    inserts: list[PlannedInsert] = []
    explains: list[str] = []
    selects: list = []
    for stmt, planned in translator.statements():
        if planned is None:
            continue
        if isinstance(planned, str):            # SHOW TABLES, DESCRIBE: printed as they come
            explains.append(planned)
        elif isinstance(stmt, QueryDef):        # a bare SELECT: run after planning, printed
            selects.append((stmt, planned, translator.settings.max_rows))
        elif isinstance(stmt, ExplainDef):
            text = planned.explain() if not isinstance(planned, list) else \
                "\n".join(p.explain() for p in planned)
            explains.append(f"== EXPLAIN (line {stmt.position.line}) ==\n{text}")
        else:
            inserts.extend(planned)
    for text in explains:
        out.write(text + "\n\n")
    if selects and not batch:
        # a bare SELECT prints the changes of the files present: its bounded (batch) plan
        bounded = {id(st): plan for st, plan in Translator(
            spark, script, streaming=False, strict=strict, key_groups=key_groups).statements()
            if isinstance(st, QueryDef)}
        selects = [(st, bounded[id(st)], rows) for st, _, rows in selects]
    for stmt, stream, max_rows in selects:
        where = f"SELECT ({script.path or 'script'} line {stmt.position.line})"
        with located(where):
            frame = stream.collect()
        schema = operator_schema_of(stream.df)
        out.write(changelog_text(frame, list(stream.schema.columns), max_rows, schema) + "\n\n")
    if translator.settings.ignored:
        print(f"note: SET option(s) without effect here: {', '.join(translator.settings.ignored)}",
              file=sys.stderr)
    if trigger is not None and len(inserts) > 1:
        raise UsageError(f"--trigger keeps one streaming INSERT running, and "
                         f"{script.path or 'the script'} has {len(inserts)}",
                         todo="put each INSERT INTO in its own script and run each with "
                              "--trigger (each with its own --checkpoint)")
    runs = []
    for i, p in enumerate(inserts):
        sub = f"{i:02d}-{_safe(p.table.name)}" if len(inserts) > 1 else ""
        ck = os.path.join(checkpoint, sub or "query") if checkpoint else None
        dl = os.path.join(dead_letter, sub) if dead_letter and sub else dead_letter
        late = os.path.join(late_output, sub) if late_output and sub else late_output
        log = os.path.join(changelog, sub) if changelog and sub else changelog
        where = f"INSERT INTO {p.table.name} ({script.path or 'script'} line {p.insert.position.line})"
        progress = _Progress(p, enabled=show_progress, on_batch=on_batch)
        try:
            with located(where, checkpoint=ck), progress:
                report = p.run(checkpoint=ck, dead_letter=dl, strict=strict,
                               progress=progress.update, out=sink_out, late_output=late,
                               changelog_path=log, trigger=trigger)
        except KeyboardInterrupt:
            _cancel_jobs(spark)
            raise Interrupted("stopped by Ctrl-C", where=where,
                              todo=_resume_hint(checkpoint, batch),
                              detail=_written(runs, progress.report, batch)) from None
        except Exception as err:
            if len(inserts) > 1 or (progress.report is not None and progress.report.batches):
                err._written = _written(runs, progress.report, batch)
            raise
        run = InsertRun(p, report)
        if on_finished is not None:
            on_finished(run)
        if report.interrupted:
            raise Interrupted(f"stopped by Ctrl-C after {report.batches} micro-batch(es), at a "
                              "micro-batch boundary", where=where,
                              todo=_resume_hint(checkpoint, batch),
                              detail=_written(runs, report, batch))
        runs.append(run)
    return runs


def print_summary(run: InsertRun, file: Optional[TextIO] = None) -> None:
    """An INSERT's summary, as it finishes: its header, the report, warnings."""
    file = file or sys.stderr
    print(f"== INSERT INTO {run.planned.table.name} ==", file=file)
    print(run.report.summary(), file=file)
    shown = set(run.report.warnings[:5])
    for w in run.report.warnings:
        if w not in shown:
            print(f"warning: {w}", file=file)
    file.flush()


def _written(runs: list, current, batch: bool) -> str:
    """What a stopped or failed script had written: whole INSERTs, and the
    micro-batches of the one that stopped."""
    lines = [f"already written: INSERT INTO {r.planned.table.name} (line "
             f"{r.planned.insert.position.line}), finished" for r in runs]
    if current is not None and not batch and current.batches:
        lines.append(f"this INSERT committed {current.batches} micro-batch(es) before it "
                     "stopped (each whole); a second run resumes after them")
    else:
        lines.append("nothing of this INSERT was written")
    return "\n".join(lines)


def _resume_hint(checkpoint: Optional[str], batch: bool) -> str:
    if batch:
        return "run the same command again (a batch INSERT writes its table in one commit)"
    return (f"run the same command again (same --checkpoint {checkpoint}) to resume; finished "
            "INSERTs are not redone")


def _cancel_jobs(spark) -> None:
    from ..connectors.session_info import is_connect
    try:
        if is_connect(spark):
            spark.interruptAll()
        else:
            spark.sparkContext.cancelAllJobs()
    except Exception:   # noqa: BLE001 -- the JVM may already be gone
        pass


def _iso(ms: int) -> str:
    import datetime
    try:
        return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat(
            timespec="milliseconds")
    except (OverflowError, ValueError, OSError):
        return "end of input" if ms > 0 else str(ms)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


class _Progress:
    """A live display on the terminal (stderr) while an INSERT runs: batches,
    rows in and out, per-operator rows, state rows and the watermark.  Off
    when stderr is not a terminal (the summary is printed either way)."""

    def __init__(self, planned: PlannedInsert, enabled: bool = True, on_batch=None):
        self.planned = planned
        self.enabled = enabled and sys.stderr.isatty()
        self.on_batch = on_batch
        self.report = None
        self.t0 = time.perf_counter()
        self._live = None

    def __enter__(self):
        if self.enabled:
            from rich.console import Console
            from rich.live import Live
            self._live = Live(self._render(), console=Console(stderr=True),
                              refresh_per_second=4, transient=False, redirect_stderr=False,
                              get_renderable=self._render)
            self._live.__enter__()
        return self

    def update(self, report) -> None:
        self.report = report
        if self.on_batch:
            self.on_batch(report)

    def _render(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text
        t = Table(title=f"INSERT INTO {self.planned.table.name}", title_justify="left",
                  show_header=True, header_style="bold")
        t.add_column("operator")
        t.add_column("rows in", justify="right")
        t.add_column("rows out", justify="right")
        t.add_column("state rows", justify="right")
        r = self.report
        operators = r.operators if r is not None else {}
        # window operators count their late rows; deduplication its superseded
        # and unchanged rows: a column each when some operator has them
        extra = [(k, label) for k, label in (("late_rows", "late"), ("superseded", "superseded"),
                                             ("unchanged", "unchanged"))
                 if any(c.get(k) for c in operators.values())]
        for _, label in extra:
            t.add_column(label, justify="right")
        for name, counters in operators.items():
            state = counters.get("state_rows")
            t.add_row(name, f"{counters.get('rows_in', 0):,}", f"{counters.get('rows_out', 0):,}",
                      "-" if state is None else f"{state:,}",
                      *(f"{counters.get(k, 0):,}" for k, _ in extra))
        elapsed = time.perf_counter() - self.t0
        if r is None:
            return Group(t, Text(f"{elapsed:.1f} s   planning / first batch ..."))
        wm = "" if r.watermark_ms is None else f"   watermark {_iso(r.watermark_ms)}"
        status = (f"{elapsed:.1f} s   batches {r.batches}   changes out {r.changes_out:,}   "
                  f"state rows {r.state_rows:,}{wm}")
        lines = [Text(status)]
        et = r.event_time or {}
        if et.get("watermark_ms") is not None or r.late_rows:
            window = f"window watermark {_iso(et['watermark_ms'])}" \
                if et.get("watermark_ms") is not None else "window watermark -"
            if et.get("newest_event_ms") is not None and et.get("watermark_ms") is not None:
                window += f" ({(et['newest_event_ms'] - et['watermark_ms']) / 1000:.1f} s behind)"
            idle = et.get("idle_partitions") or []
            lines.append(Text(f"{window}   late rows {r.late_rows:,}"
                              + (f"   idle partitions {len(idle)}" if idle else "")))
        return Group(t, *lines)

    def __exit__(self, *exc):
        if self._live is not None:
            self._live.__exit__(*exc)
        return False


__all__ = ["run_script", "explain_script", "print_summary", "InsertRun", "FORMATS"]
