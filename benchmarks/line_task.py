"""Benchmark: the Debezium line task alone, step by step (docs/runtime.md,
"The line task, step by step").

    scripts/bench line-task [--events 1000000] [--ids 100000] [--files 4]
                            [--rounds 3] [--unpacked] [--fold]

The Python task of the reader stage (``lines.RangeReader`` with a
``debezium_arrow.PackingParser`` and a normalize's ``spark_keyed.LinePacker``,
32 key groups, as the suite's normalize job runs it) over the byte ranges a
2-core run gives it (each file cut in two), in this process, without Spark:
the same code the Python workers run, its CPU seconds split into the steps
below by a profiler whose clock is this process's CPU time.  ``--unpacked``:
the parser alone, as a job whose reader feeds no keyed operator (the
scan-only ceiling); ``--fold``: the packer pre-folds (mini-batch).

Steps: reading and cutting a range into lines; the candidate checks (lines
that may be one JSON object, rare strings); Arrow's JSON parse
(``debezium_arrow._read``); finishing (positions, op, key checks, the change
rows); packing (Spark's key group, pre-fold, per-group Arrow IPC); assembling
the output batches.  The first round warms the caches and is not counted;
the best round is reported (CPU seconds per 1M events).  Results:
``benchmarks/results/line-task-<time>.json``.
"""
from __future__ import annotations

import argparse
import cProfile
import datetime
import json
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from whole_job import cached_files, input_arguments, machine_load  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
RESULTS = os.path.join(ROOT, "benchmarks", "results")

#: step -> (functions whose cumulative CPU it is, functions whose own CPU it is), by dotted name
STEPS = {
    "JSON parse (pyarrow.json)": ((), ("debezium_arrow._read",)),
    "finishing (position, op, keys, change rows)": (("debezium_arrow.DebeziumArrowParser._rows",), ()),
    "packing (key group, fold, IPC per group)": (("spark_keyed.LinePacker.__call__",), ()),
    "candidate and rare-string checks": (("debezium_arrow._Substrings.__call__", "debezium_arrow._blank_out"),
                                         ("debezium_arrow.parse_objects",)),
    "reading and cutting lines, output batches": ((), ("lines.lines_of_range", "lines.RangeReader.read_range",
                                                        "lines._find_newline", "lines._count_newlines",
                                                        "lines._some_strings", "lines._string_array")),
}


def _code_key(dotted: str) -> tuple:
    """pstats' key (file, first line, name) of a function named module.qualname."""
    import importlib
    module, _, qualname = dotted.partition(".")
    for package in ("spark_changelog.connectors", "spark_changelog.runtime"):
        try:
            obj = importlib.import_module(f"{package}.{module}")
            break
        except ImportError:
            continue
    for part in qualname.split("."):
        obj = getattr(obj, part)
    code = obj.__code__
    return code.co_filename, code.co_firstlineno, code.co_name


def _parser(unpacked: bool, fold: bool):
    import pyarrow as pa
    from spark_changelog.connectors.debezium_arrow import DebeziumArrowParser, PackingParser
    from spark_changelog.operators.normalize import ChangelogNormalize
    from spark_changelog.runtime.spark_keyed import LinePacker
    columns = [("id", "bigint"), ("g", "bigint"), ("v", "bigint")]
    parser = DebeziumArrowParser(columns, ["id"])
    if unpacked:
        return parser
    rows = pa.schema([("id", pa.int64()), ("g", pa.int64()), ("v", pa.int64()), ("_kind", pa.int8()),
                      ("_seq", pa.int64())])
    schema = pa.schema([f.with_nullable(True) for f in rows] + ([pa.field("_metrics", pa.string())] if fold else []))
    return PackingParser(parser, LinePacker(ChangelogNormalize(rows, ["id"], fold_batch=fold), 32, schema))


def _ranges(directory: str, tasks: int = 2) -> list[tuple[str, int, int, int]]:
    """Each file cut into ``tasks`` ranges, as ``lines.split_size_sql`` cuts it on a 2-core run."""
    out = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        length = os.path.getsize(path)
        split = max(1 << 20, -(-length // tasks))
        out += [("file://" + path, length, s, min(s + split, length)) for s in range(0, length, split)]
    return out


def _steps(stats: pstats.Stats, total: float) -> dict[str, float]:
    out = {}
    for step, (cumulative, own) in STEPS.items():
        out[step] = (sum(stats.stats.get(_code_key(f), (0, 0, 0, 0))[3] for f in cumulative)
                     + sum(stats.stats.get(_code_key(f), (0, 0, 0, 0))[2] for f in own))
    out["the rest (glue, Arrow arrays)"] = max(0.0, total - sum(out.values()))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    input_arguments(ap, events=1_000_000, ids=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--unpacked", action="store_true", help="the parser alone (no keyed operator after the reader)")
    ap.add_argument("--fold", action="store_true", help="the packer pre-folds (mini-batch)")
    ap.add_argument("--label", default="", help="what code ran (recorded in the results)")
    args = ap.parse_args(argv)
    from spark_changelog.connectors.lines import RangeReader
    directory = cached_files(args.cache, args.events, args.ids, args.files)
    reader = RangeReader(False, _parser(args.unpacked, args.fold))
    ranges = _ranges(directory)
    load0 = machine_load()

    def one_round() -> int:
        return sum(b.num_rows for r in ranges for b in reader.read_range(*r))

    one_round()                                       # warm-up: page cache, imports
    best = None
    for _ in range(args.rounds):
        prof = cProfile.Profile(time.process_time)
        t = time.process_time()
        prof.enable()
        rows = one_round()
        prof.disable()
        cpu = time.process_time() - t
        if best is None or cpu < best[0]:
            best = (cpu, rows, pstats.Stats(prof))
    cpu, rows, stats = best
    per_m = 1e6 / args.events
    steps = {k: round(v * per_m, 3) for k, v in _steps(stats, cpu).items()}
    when = datetime.datetime.now(datetime.timezone.utc)
    result = {"when": when.isoformat(timespec="seconds"), "events": args.events, "ranges": len(ranges),
              "mode": "unpacked" if args.unpacked else ("packed, folded" if args.fold else "packed"),
              "label": args.label, "rows_out": rows, "cpu_s_per_1m_events": round(cpu * per_m, 3), "steps_cpu_s_per_1m_events": steps,
              "load": [load0, machine_load()], "argv": sys.argv[1:]}
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"line-task-{when.strftime('%Y%m%dT%H%M%SZ')}.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=2)
    print(f"line task, {result['mode']}: {args.events:,} events in {len(ranges)} ranges, "
          f"{result['cpu_s_per_1m_events']:.2f} CPU s per 1M events (best of {args.rounds}; load {load0}-{machine_load()})")
    for step, seconds in steps.items():
        print(f"  {step:48s} {seconds:6.3f} s  {100 * seconds / max(cpu * per_m, 1e-9):4.0f}%")
    print(f"written: {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    main()
