"""Command line: ``spark-changelog run|explain|normalize|cat|demo|check``.

Exit codes (docs/errors.md): 0 done; 1 the job failed on its input, a sink,
a path or the disk (the message names row, file, table or path); 2 usage or
SQL error (the message names line and column); 3 a SQL feature that is not
supported (yet); 4 the checkpoint belongs to another query than the script's;
130 stopped by Ctrl-C.  Every failure is one message on stderr; its
traceback goes to the log file, or to the terminal with ``--verbose``."""
from __future__ import annotations

import argparse
import os
import re
import sys

from .model.errors import PathError, UsageError, located


def _session_start(args):
    """The command's session, started now and built while the command reads
    its input (runtime/session.py, ``SessionStart``): take it with
    ``.session()`` inside ``with``; an error before that ends the JVM."""
    from .runtime.session import SessionStart
    bad = [kv for kv in (args.conf or []) if "=" not in kv]
    if bad:
        raise UsageError(f"--conf {bad[0]}: expected KEY=VALUE")
    confs = dict(kv.split("=", 1) for kv in (args.conf or []))
    return SessionStart("spark-changelog", master=args.master, configs=confs, remote=args.remote,
                        command=True)


def cmd_normalize(args) -> int:
    from .runtime.paths import input_problem
    if args.streaming and not args.checkpoint:
        raise UsageError("--streaming needs --checkpoint DIR")
    with _session_start(args) as starting:
        problem = input_problem(args.input)
        if problem:
            raise PathError(f"input path {problem}", todo="give the directory of the change files")
        _check_outputs(output=args.output, checkpoint=args.checkpoint, dead_letter=args.dead_letter,
                       changelog=args.changelog)
        from .api import read_changes
        spark = starting.session()
    kw = {}
    if args.format == "changelog":
        kw.update(changelog_file_format=args.file_format, kind_column=args.kind_column,
                  seq_column=args.seq_column)
    stream = read_changes(spark, args.input, format=args.format, schema=args.schema,
                          primary_key=args.key, streaming=args.streaming, strict=args.strict,
                          max_files_per_trigger=args.max_files_per_trigger, **kw)
    key = None
    if args.scd_type == 2:
        # the history table: one row per version, keyed by key + __START_AT
        # (docs/operators.md, "SCD type 2 history")
        out = stream.history(track_history=args.track_history,
                             ignore_null_updates=args.ignore_null_updates,
                             key_groups=args.key_groups)
        key = out.traits.primary_key
    else:
        if args.track_history or args.ignore_null_updates:
            print("error: --track-history and --ignore-null-updates need --scd-type 2",
                  file=sys.stderr)
            return 2
        # the product is a table, not a changelog: fold each key's changes per
        # micro-batch (same table, fewer rows to the sink), unless the emitted
        # changelog is asked for with --changelog, which then lists every version
        out = stream.with_mini_batch(args.changelog is None).normalize(
            state_ttl_ms=args.state_ttl_ms, key_groups=args.key_groups)
    dead = args.dead_letter
    with located(f"normalize into {args.output}", checkpoint=args.checkpoint):
        from .sinks.delta import DeltaPath
        target = DeltaPath(args.output, deletion_vectors=False) if args.no_deletion_vectors else args.output
        report = out.write_upsert(target, checkpoint=args.checkpoint,
                                  changelog_path=args.changelog, dead_letter=dead,
                                  strict=args.strict, key=key)
    print(report.summary())
    return 0


def _session(args):
    """The command's session, built now."""
    with _session_start(args) as starting:
        return starting.session()


def _check_outputs(**dirs) -> None:
    """Every output directory given on the command line can be written (before
    Spark starts)."""
    from .runtime.paths import output_problem
    for option, path in dirs.items():
        problem = output_problem(path) if path else None
        if problem:
            name = option if option == "output" else "--" + option.replace("_", "-")
            raise PathError(f"{name}: {problem}", todo="give a directory that can be written")


def _script(args):
    from .sql.preflight import check_paths
    from .sql.script import read_script
    try:
        script = read_script(args.script)
    except OSError as e:
        raise PathError(f"cannot read {args.script}: {e.strerror}",
                        todo="give the path of a .sql file") from None
    check_paths(script)
    return script


def cmd_run(args) -> int:
    if args.batch and args.checkpoint:
        raise UsageError("--batch and --checkpoint exclude each other (a batch job has no "
                         "checkpoint)")
    with _session_start(args) as starting:
        script = _script(args)
        batch = args.batch
        if not batch and not args.checkpoint:
            mode = _runtime_mode(script)
            if mode == "batch":
                batch = True
            else:
                raise UsageError("give --batch (one batch job) or --checkpoint DIR (a resumable "
                                 "streaming query)")
        if args.trigger is not None:
            if batch:
                raise UsageError("--trigger keeps a streaming query running: give --checkpoint "
                                 "DIR, not --batch")
            if not _TRIGGER.match(args.trigger):
                raise UsageError(f"--trigger {args.trigger!r} is not an interval",
                                 todo="write it as a number and a unit, e.g. --trigger '1 second', "
                                      "'500 milliseconds' or '0 seconds' (back to back)")
        _check_outputs(checkpoint=args.checkpoint, dead_letter=args.dead_letter,
                       late_output=args.late_output, changelog=args.changelog)
        from .sql.runner import print_summary, run_script
        spark = starting.session()
    run_script(spark, script, batch=batch, checkpoint=args.checkpoint,
               dead_letter=args.dead_letter, strict=args.strict,
               show_progress=not args.no_progress, late_output=args.late_output,
               changelog=args.changelog, trigger=args.trigger, on_finished=print_summary)
    return 0


#: a processing-time interval as Spark reads it ("1 second", "500 milliseconds")
_TRIGGER = re.compile(r"^\s*\d+\s*(milliseconds?|seconds?|minutes?|hours?)\s*$",
                      re.IGNORECASE)


def _runtime_mode(script):
    from .sql.script import SetOption
    modes = [s.value.lower() for s in script.statements
             if isinstance(s, SetOption) and s.key == "execution.runtime-mode"]
    return modes[-1] if modes else None


def cmd_explain(args) -> int:
    with _session_start(args) as starting:
        script = _script(args)
        from .sql.runner import explain_script
        spark = starting.session()
    print(explain_script(spark, script, args.format, batch=args.batch))
    return 0


def cmd_cat(args) -> int:
    """Print an upsert table's rows, or a changelog output's changes (batch,
    op, _seq, values; by batch, then emission order: docs/sinks.md)."""
    from .runtime.paths import delta_table_problem
    from .sinks.changelog import is_changelog_output
    from .sinks.text import csv_ready, json_lines
    if os.path.isdir(args.table) and is_changelog_output(args.table) \
            and not os.path.isdir(os.path.join(args.table, "_delta_log")):
        from .sinks.changelog import BATCH_COL, OP_COL, read_changelog, read_changelog_arrow
        from .model import SEQ_COL
        if args.format == "csv":
            log = read_changelog(args.table)
            first = [BATCH_COL, OP_COL, SEQ_COL]
            csv_ready(log[first + [c for c in log.columns if c not in first + ["_kind"]]]) \
                .to_csv(sys.stdout, index=False)
        else:
            log = read_changelog_arrow(args.table)
            first = [BATCH_COL, OP_COL, SEQ_COL]
            for line in json_lines(log.select(first + [c for c in log.column_names if c not in first])):
                sys.stdout.write(line + "\n")
        return 0
    problem = delta_table_problem(args.table)
    if problem:
        if "no _delta_log" in problem:
            problem = (f"{args.table} is neither a Delta table (no _delta_log directory) nor a "
                       "changelog output (no _schema.arrow)")
        raise PathError(f"cannot print table: {problem}",
                        todo="give the directory of a table or a --changelog output written by "
                             "spark-changelog")
    from .sinks.delta import read_arrow_table, read_table
    if args.format == "csv":
        csv_ready(read_table(args.table)).to_csv(sys.stdout, index=False)
    else:
        for line in json_lines(read_arrow_table(args.table)):
            sys.stdout.write(line + "\n")
    return 0


def cmd_compact(args) -> int:
    """Compact an upsert table, optionally vacuum it (docs/sinks.md, "Compaction and vacuum")."""
    from .runtime.paths import delta_table_problem
    from .sinks.delta import compact_table
    problem = delta_table_problem(args.table)
    if problem:
        raise PathError(f"cannot compact table: {problem}",
                        todo="give the directory of a table written by spark-changelog")
    out = compact_table(args.table, vacuum_hours=args.vacuum_hours)
    print(f"compacted {args.table}: {out['files_removed']} file(s) rewritten as {out['files_added']}"
          + (f"; vacuum: {out['vacuumed']} unreferenced file(s) older than {args.vacuum_hours} h deleted"
             if args.vacuum_hours is not None else ""))
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo
    return run_demo(args.output, rows=args.rows, keys=args.keys, streaming=not args.batch)


def cmd_check(args) -> int:
    """Verify a streaming checkpoint without running its query
    (docs/runtime.md, "A damaged checkpoint"); exit 1 when it is damaged."""
    from .runtime.checkpoint import check_checkpoint
    spark = None if args.files_only else _session(args)
    report = check_checkpoint(args.checkpoint, spark)
    print(report.summary())
    return 0 if report.ok else 1


def cmd_rescale(args) -> int:
    """Rewrite a stopped query's checkpoint to another key-group count
    (docs/runtime.md, "Key groups and rescaling")."""
    from .plan.fingerprint import rescale_fingerprint
    from .runtime.rescale import rescale_checkpoint
    spark = _session(args)
    report = rescale_checkpoint(spark, args.checkpoint, args.key_groups, args.partitions,
                                edit=rescale_fingerprint)
    print(report.summary())
    return 0


def cmd_package(args) -> int:
    """The package as a zip for a cluster's executors (docs/deploy.md)."""
    from .runtime.py_files import write_package_zip
    modules = write_package_zip(args.output, bytecode=not args.no_bytecode)
    version = "%d.%d" % sys.version_info[:2]
    kind = "source only" if args.no_bytecode else f"with bytecode for Python {version}"
    print(f"{args.output}: {modules} modules, {kind}; ship it with --conf spark.submit.pyFiles=...")
    return 0


def cmd_relocate(args) -> int:
    """Make a checkpoint of a project moved from OLD to NEW resume there
    (docs/errors.md, "A moved project")."""
    from .model.errors import EXIT_USAGE
    from .plan.fingerprint import relocate_fingerprint
    from .runtime.checkpoint import path_pattern, query_dirs, relocate_checkpoint
    old, new = os.path.abspath(args.old), os.path.abspath(args.new)
    try:
        changed = relocate_checkpoint(args.checkpoint, old, new)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    fingerprints = sum(relocate_fingerprint(os.path.dirname(q), path_pattern(old), new)
                       for q in query_dirs(args.checkpoint))
    if not changed and not fingerprints:
        print(f"error: {args.checkpoint}: no file of the checkpoint names {old} (not where the "
              "project was, or relocated already)", file=sys.stderr)
        return EXIT_USAGE
    print(f"relocated {args.checkpoint}: {len(changed)} Spark log file(s) and {fingerprints} plan "
          f"fingerprint(s) now name {new} instead of {old}; run the same command as before "
          "(same --checkpoint) to resume")
    return 0


def cmd_plot_watermarks(args) -> int:
    from .runtime.late_output import plot_event_time
    print(plot_event_time(args.directory, args.output))
    return 0


def _columns(text: str) -> list:
    return [c.strip() for c in text.split(",") if c.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spark-changelog",
                                description="Flink-SQL-grade changelog processing on Apache Spark")
    p.add_argument("--master", help="Spark master URL (default: local[2], or SPARK_CHANGELOG_MASTER)")
    p.add_argument("--remote", metavar="sc://HOST:PORT",
                   help="run through a Spark Connect server (default: SPARK_REMOTE when no --master)")
    p.add_argument("--conf", action="append", metavar="KEY=VALUE", help="extra Spark config")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="on failure, print the traceback here too (it always goes to the log "
                        "file, $SPARK_CHANGELOG_LOG)")
    sub = p.add_subparsers(dest="command", required=True)

    n = sub.add_parser("normalize", help="CDC files -> the final table (keep last per key), or its "
                                         "history (--scd-type 2), as a Delta upsert table")
    n.add_argument("input")
    n.add_argument("output")
    n.add_argument("--format", required=True,
                   choices=["debezium-json", "canal-json", "maxwell-json", "changelog"])
    n.add_argument("--key", required=True, help="primary key column(s), comma separated")
    n.add_argument("--schema", help="user columns as a DDL string, e.g. 'id BIGINT, name STRING' "
                                    "(required for the JSON formats)")
    n.add_argument("--dead-letter", metavar="DIR", help="where invalid input rows go (with reasons)")
    n.add_argument("--streaming", action="store_true", help="run as a Structured Streaming query "
                                                            "(trigger available-now)")
    n.add_argument("--checkpoint", metavar="DIR", help="streaming checkpoint (resume from it)")
    n.add_argument("--strict", action="store_true", help="fail on the first invalid row, naming "
                                                         "file, line and field")
    n.add_argument("--changelog", metavar="DIR", help="also write the emitted changelog here (Parquet)")
    n.add_argument("--file-format", default="json", choices=["json", "csv", "parquet"],
                   help="file format of --format changelog input")
    n.add_argument("--kind-column", default="op", help="kind column of --format changelog input")
    n.add_argument("--seq-column", default=None, help="sequence column of --format changelog input")
    n.add_argument("--state-ttl-ms", type=int, default=None)
    n.add_argument("--key-groups", type=int, default=None, metavar="N",
                   help="key groups of the keyed operator: the most tasks it runs in parallel "
                        "(default: the checkpoint's count, else 256); `rescale` changes it")
    n.add_argument("--max-files-per-trigger", type=int, default=None)
    n.add_argument("--scd-type", type=int, choices=[1, 2], default=1,
                   help="1: the table (keep last per key); 2: the history, one row per version "
                        "with __START_AT/__END_AT, keyed by the key and __START_AT")
    n.add_argument("--track-history", metavar="COL,...", type=_columns, default=None,
                   help="with --scd-type 2: the columns whose change opens a version (default: "
                        "every non-key column); others are updated in place")
    n.add_argument("--ignore-null-updates", action="store_true",
                   help="with --scd-type 2: a null in an update keeps the previous value "
                        "(partial updates)")
    n.add_argument("--no-deletion-vectors", action="store_true",
                   help="create the table without Delta's deletionVectors feature (protocol 1/2, for "
                        "readers of version 1); updates are then MERGEs from the driver")
    n.set_defaults(func=cmd_normalize)

    r = sub.add_parser("run", help="run a Flink SQL script: its INSERT INTO statements, as batch "
                                   "jobs or resumable streaming queries")
    r.add_argument("script", help="the .sql file")
    mode = r.add_mutually_exclusive_group()
    mode.add_argument("--batch", action="store_true", help="one batch job per INSERT")
    mode.add_argument("--checkpoint", metavar="DIR", help="streaming (trigger available-now), "
                                                           "resumable from DIR")
    r.add_argument("--dead-letter", metavar="DIR", help="where invalid input rows go (with reasons)")
    r.add_argument("--strict", action="store_true", help="fail on the first invalid row")
    r.add_argument("--late-output", metavar="DIR", help="where window operators put late rows "
                                                        "(default: the script's "
                                                        "'spark-changelog.late-output.path')")
    r.add_argument("--changelog", metavar="DIR", help="also write the emitted changelog here "
                                                      "(Parquet, one file per micro-batch)")
    r.add_argument("--trigger", metavar="INTERVAL",
                   help="with --checkpoint: keep the query running with this processing-time "
                        "trigger ('1 second'; '0 seconds' = back to back), reading files as they "
                        "arrive, until Ctrl-C (one INSERT per script); default: the files "
                        "present, then stop")
    r.add_argument("--no-progress", action="store_true", help="no live progress display")
    r.set_defaults(func=cmd_run)

    e = sub.add_parser("explain", help="the plan of every INSERT INTO / EXPLAIN of a Flink SQL "
                                       "script: changelog modes, keys, materializers and why")
    e.add_argument("script", help="the .sql file")
    e.add_argument("--format", default="text", choices=["text", "dot", "mermaid"])
    e.add_argument("--batch", action="store_true",
                   help="the plan of `run --batch` (default: the streaming plan of `run --checkpoint`)")
    e.set_defaults(func=cmd_explain)

    c = sub.add_parser("cat", help="print the current rows of an upsert table, or every change of "
                                   "a --changelog output")
    c.add_argument("table")
    c.add_argument("--format", default="csv", choices=["csv", "json"])
    c.set_defaults(func=cmd_cat)

    o = sub.add_parser("compact", help="compact an upsert table and cluster it by its key "
                                       "(run it between micro-batches or beside the query)")
    o.add_argument("table")
    o.add_argument("--vacuum-hours", type=int, default=None, metavar="H",
                   help="then delete data files no version of the last H hours references")
    o.set_defaults(func=cmd_compact)

    d = sub.add_parser("demo", help="the embedded default job: an out-of-order Debezium changelog "
                                    "normalized into a Delta table")
    d.add_argument("--output", default="out/demo")
    d.add_argument("--rows", type=int, default=200_000)
    d.add_argument("--keys", type=int, default=20_000)
    d.add_argument("--batch", action="store_true", help="run as a batch job instead of streaming")
    d.set_defaults(func=cmd_demo)

    k = sub.add_parser("check", help="verify a streaming checkpoint without running its query: "
                                     "logs consistent, state loadable and complete, no dropped writes")
    k.add_argument("checkpoint", help="the --checkpoint directory of `run` or `normalize`")
    k.add_argument("--files-only", action="store_true",
                   help="check the files only, without reading the state through Spark")
    k.set_defaults(func=cmd_check)

    s = sub.add_parser("rescale", help="rewrite a stopped query's checkpoint to another key-group "
                                       "count or number of state partitions (the most tasks its "
                                       "keyed operators run in parallel)")
    s.add_argument("checkpoint", help="the --checkpoint directory of `run` or `normalize`")
    s.add_argument("--key-groups", type=int, metavar="N",
                   help="the new key-group count of every keyed operator")
    s.add_argument("--partitions", type=int, metavar="M",
                   help="the new number of state partitions of every stateful operator "
                        "(spark.sql.shuffle.partitions of the query from now on)")
    s.set_defaults(func=cmd_rescale)
    z = sub.add_parser("package", help="write this package as a zip for a cluster's executors "
                                       "(spark.submit.pyFiles), with bytecode for this Python")
    z.add_argument("output", nargs="?", default="spark_changelog.zip", help="the zip to write "
                   "(default: spark_changelog.zip)")
    z.add_argument("--no-bytecode", action="store_true",
                   help="source files only (the executors compile them in every new Python worker)")
    z.set_defaults(func=cmd_package)
    m = sub.add_parser("relocate", help="after moving a project directory from OLD to NEW, "
                                        "rewrite the paths its streaming checkpoint holds so "
                                        "the query resumes there")
    m.add_argument("checkpoint", help="the --checkpoint directory (already moved)")
    m.add_argument("old", help="where the project directory was")
    m.add_argument("new", help="where it is now")
    m.set_defaults(func=cmd_relocate)

    w = sub.add_parser("plot-watermarks", help="PNG of event time vs watermark vs arrival (and "
                                               "late rows) of a finished window query, from its "
                                               "late-output directory")
    w.add_argument("directory", help="the query's late_output directory")
    w.add_argument("--output", "-o", default="watermarks.png")
    w.set_defaults(func=cmd_plot_watermarks)
    for command in sub.choices.values():     # `run job.sql --verbose` as well
        command.add_argument("--verbose", "-v", action="store_true", default=argparse.SUPPRESS,
                             help="on failure, print the traceback here too")
    return p


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings (the planner's, a changed checkpoint's) as one line each;
    a library's deprecation notices are for developers: they go to the log."""
    if issubclass(category, (DeprecationWarning, PendingDeprecationWarning, FutureWarning)):
        import logging
        logging.getLogger("spark_changelog").warning("%s:%s: %s: %s", filename, lineno,
                                                     category.__name__, message)
        return
    print(f"warning: {message}", file=file or sys.stderr)


def _log_to_file() -> None:
    """The package's own log lines (e.g. a sink's retries) go to the log
    file, as Spark's do, not to the terminal."""
    import logging
    from .runtime.session import spark_log_path
    lg = logging.getLogger("spark_changelog")
    if not any(getattr(h, "_spark_changelog", False) for h in lg.handlers):
        handler = logging.FileHandler(spark_log_path(), delay=True)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler._spark_changelog = True
        lg.addHandler(handler)
    lg.propagate = False


def main(argv=None) -> int:
    import warnings
    args = build_parser().parse_args(argv)
    warnings.showwarning = _show_warning
    _log_to_file()
    try:
        return args.func(args)
    except BrokenPipeError:
        # the reader went away (`spark-changelog cat T | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (Exception, KeyboardInterrupt) as e:   # one message, not a JVM stack trace
        from .errors import report
        return report(e, verbose=args.verbose, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
