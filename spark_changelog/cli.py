"""Command line: ``spark-changelog normalize|cat|demo``."""
from __future__ import annotations

import argparse
import sys


def _session(args):
    from .runtime.session import build_session
    confs = dict(kv.split("=", 1) for kv in (args.conf or []))
    return build_session("spark-changelog", master=args.master, configs=confs)


def cmd_normalize(args) -> int:
    from .api import read_changes
    if args.streaming and not args.checkpoint:
        print("error: --streaming needs --checkpoint DIR", file=sys.stderr)
        return 2
    spark = _session(args)
    kw = {}
    if args.format == "changelog":
        kw.update(changelog_file_format=args.file_format, kind_column=args.kind_column,
                  seq_column=args.seq_column)
    stream = read_changes(spark, args.input, format=args.format, schema=args.schema,
                          primary_key=args.key, streaming=args.streaming, strict=args.strict,
                          max_files_per_trigger=args.max_files_per_trigger, **kw)
    out = stream.normalize(state_ttl_ms=args.state_ttl_ms, key_groups=args.key_groups)
    dead = args.dead_letter
    report = out.write_upsert(args.output, checkpoint=args.checkpoint, changelog_path=args.changelog,
                              dead_letter=dead, strict=args.strict)
    print(report.summary())
    return 0


def cmd_cat(args) -> int:
    from .sinks.delta import read_table
    df = read_table(args.table)
    if args.format == "csv":
        df.to_csv(sys.stdout, index=False)
    else:
        df.to_json(sys.stdout, orient="records", lines=True, date_format="iso")
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo
    return run_demo(args.output, rows=args.rows, keys=args.keys, streaming=not args.batch)


def cmd_plot_watermarks(args) -> int:
    from .runtime.late_output import plot_event_time
    print(plot_event_time(args.directory, args.output))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spark-changelog",
                                description="Flink-SQL-grade changelog processing on Apache Spark")
    p.add_argument("--master", help="Spark master URL (default: local[2], or SPARK_CHANGELOG_MASTER)")
    p.add_argument("--conf", action="append", metavar="KEY=VALUE", help="extra Spark config")
    sub = p.add_subparsers(dest="command", required=True)

    n = sub.add_parser("normalize", help="CDC files -> the final table (keep last per key) as a Delta upsert table")
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
    n.add_argument("--key-groups", type=int, default=32)
    n.add_argument("--max-files-per-trigger", type=int, default=None)
    n.set_defaults(func=cmd_normalize)

    c = sub.add_parser("cat", help="print the current rows of an upsert table")
    c.add_argument("table")
    c.add_argument("--format", default="csv", choices=["csv", "json"])
    c.set_defaults(func=cmd_cat)

    d = sub.add_parser("demo", help="the embedded default job: an out-of-order Debezium changelog "
                                    "normalized into a Delta table")
    d.add_argument("--output", default="out/demo")
    d.add_argument("--rows", type=int, default=200_000)
    d.add_argument("--keys", type=int, default=20_000)
    d.add_argument("--batch", action="store_true", help="run as a batch job instead of streaming")
    d.set_defaults(func=cmd_demo)

    w = sub.add_parser("plot-watermarks", help="PNG of event time vs watermark vs arrival (and "
                                               "late rows) of a finished window query, from its "
                                               "late-output directory")
    w.add_argument("directory", help="the query's late_output directory")
    w.add_argument("--output", "-o", default="watermarks.png")
    w.set_defaults(func=cmd_plot_watermarks)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        # the reader went away (`spark-changelog cat T | head`): not an error
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # a clear message, not a JVM stack trace
        from .connectors.cdc_json import InvalidChangeError
        if isinstance(e, (InvalidChangeError, ValueError, FileNotFoundError)):
            print(f"error: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
