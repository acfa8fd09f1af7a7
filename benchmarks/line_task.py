"""Benchmark: the Debezium line task alone, step by step (docs/runtime.md,
"The line task, step by step").

    scripts/bench line-task [--events 1000000] [--ids 100000] [--files 4]
                            [--rounds 3] [--unpacked] [--fold] [--parsers]

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

``--parsers``: the JSON parse alone, by each candidate parser, on the
32k-line batches the task parses (the first file's), single-threaded, each
batch by every candidate in turn, mean CPU seconds per 1M events: Arrow's
reader as the task calls it (the envelope typed, other fields skipped),
with the other fields inferred instead (which finds a key repeated in them:
docs/runtime.md, "Parsed once, mostly by Arrow"), and with no field typed
at all (its tokenizer alone, a floor); then, when installed in this
interpreter (none is a dependency), polars' NDJSON reader
and arrow-rs' (``arro3-io``) with the same schema, msgspec into typed
structs, orjson per line.  Arrow's two ways are also timed on wide lines
(:func:`_wide_lines`: a Debezium PostgreSQL source block and ten columns, of
which the task reads three), where inferring the unread fields costs most.
Results: ``line-task-parsers-<time>.json``.
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


def _wide_lines(n: int) -> bytes:
    """``n`` Debezium PostgreSQL create events as Debezium writes them: the
    whole source block, ten columns in ``after`` (three of them id, g, v)."""
    import random
    rng = random.Random(1)
    out = []
    for i in range(n):
        after = {"id": i, "g": rng.randint(0, 100), "v": rng.randint(0, 10 ** 9), "name": f"customer {i}",
                 "email": f"c{i}@example.com", "created": 1700000000000 + i, "score": rng.random() * 100,
                 "active": True, "city": "Zurich", "note": None}
        source = {"version": "2.5.0.Final", "connector": "postgresql", "name": "dbserver1",
                  "ts_ms": 1700000000000 + i, "snapshot": "false", "db": "inventory",
                  "sequence": f'["1234","{i}"]', "schema": "public", "table": "customers", "txId": 500 + i,
                  "lsn": 1000000 + 40 * i, "xmin": None}
        out.append(json.dumps({"before": None, "after": after, "source": source, "op": "c",
                               "ts_ms": 1700000000000 + i, "transaction": None}, separators=(",", ":")))
    return ("\n".join(out) + "\n").encode()


def _parsers(directory: str, rounds: int) -> dict:
    """CPU seconds per 1M events of each candidate parse (``--parsers``)."""
    import importlib.util
    import io
    from typing import Optional

    import pyarrow as pa
    import pyarrow.json as pj
    from spark_changelog.connectors.debezium_arrow import DebeziumArrowParser
    from spark_changelog.connectors.lines import _BATCH_LINES
    path = os.path.join(directory, sorted(os.listdir(directory))[0])
    with open(path, "rb") as fh:
        lines = fh.read().split(b"\n")[:-1]
    batches = [b"\n".join(lines[i:i + _BATCH_LINES]) + b"\n" for i in range(0, len(lines), _BATCH_LINES)]
    parser = DebeziumArrowParser([("id", "bigint"), ("g", "bigint"), ("v", "bigint")], ["id"])
    schema = parser.json_schema                   # the envelope and the ``schema`` probe

    def arrow(explicit, behaviour):
        options = pj.ParseOptions(explicit_schema=explicit, newlines_in_values=False,
                                  unexpected_field_behavior=behaviour)
        return lambda b: pj.read_json(pa.BufferReader(b), parse_options=options, read_options=pj.ReadOptions(
            use_threads=False, block_size=len(b) + 1))

    candidates = {"pyarrow.json, envelope typed, other fields skipped (the line task)": arrow(schema, "ignore"),
                  "pyarrow.json, envelope typed, other fields inferred": arrow(schema, "infer"),
                  "pyarrow.json, no field typed (tokenizer alone)": arrow(pa.schema([]), "ignore")}
    if importlib.util.find_spec("polars"):
        import polars as pl
        image = pl.Struct({"id": pl.Int64, "g": pl.Int64, "v": pl.Int64})
        pl_schema = {"before": image, "after": image, "op": pl.String, "ts_ms": pl.Int64,
                     "source": pl.Struct({"lsn": pl.Int64, "file": pl.String, "pos": pl.Int64, "row": pl.Int64,
                                          "ts_ms": pl.Int64})}
        candidates[f"polars {pl.__version__} read_ndjson, schema"] = (
            lambda b: pl.read_ndjson(io.BytesIO(b), schema=pl_schema).to_arrow())
    if importlib.util.find_spec("arro3.io"):
        from arro3.core import Schema
        from arro3.io import read_json
        a3_schema = Schema.from_arrow(schema)
        candidates["arro3-io read_json (arrow-rs), schema"] = (
            lambda b: pa.table(read_json(io.BytesIO(b), a3_schema, batch_size=_BATCH_LINES + 1)))
    if importlib.util.find_spec("msgspec"):
        import msgspec

        image = msgspec.defstruct("Image", [(c, Optional[int], None) for c in ("id", "g", "v")])
        source = msgspec.defstruct("Source", [("lsn", Optional[int], None), ("file", Optional[str], None),
                                              ("pos", Optional[int], None), ("row", Optional[int], None),
                                              ("ts_ms", Optional[int], None)])
        envelope = msgspec.defstruct("Envelope", [("before", Optional[image], None), ("after", Optional[image], None),
                                                  ("op", Optional[str], None), ("source", Optional[source], None),
                                                  ("ts_ms", Optional[int], None)])
        decoder = msgspec.json.Decoder(list[envelope])
        candidates["msgspec into typed structs (Python objects, no Arrow)"] = (
            lambda b: decoder.decode(b"[" + b.rstrip(b"\n").replace(b"\n", b",") + b"]"))
    if importlib.util.find_spec("orjson"):
        import orjson
        candidates["orjson per line (Python objects, no Arrow)"] = (
            lambda b: [orjson.loads(x) for x in b.split(b"\n")[:-1]])
    wide = [_wide_lines(_BATCH_LINES)] * 4
    arrow_ways = {"pyarrow.json, envelope typed, other fields skipped": arrow(schema, "ignore"),
                  "pyarrow.json, envelope typed, other fields inferred": arrow(schema, "infer")}
    out = {}
    # each batch by every candidate in turn, so that a change of the machine's
    # load reaches them all alike (a best-of-rounds per candidate did not)
    for group, inputs in ((candidates, batches), ({f"wide lines: {k}": v for k, v in arrow_ways.items()}, wide)):
        per_m = 1e6 / sum(b.count(b"\n") for b in inputs)
        cpu = dict.fromkeys(group, 0.0)
        for parse in group.values():
            parse(inputs[0])                           # warm-up
        for _ in range(rounds):
            for b in inputs:
                for name, parse in group.items():
                    t = time.process_time()
                    parse(b)
                    cpu[name] += time.process_time() - t
        for name, seconds in cpu.items():
            mean = seconds / rounds
            out[name] = {"cpu_s_per_1m_events": round(mean * per_m, 3),
                         "mb_per_cpu_s": round(sum(map(len, inputs)) / mean / 1e6)}
            print(f"  {name:72s} {mean * per_m:6.3f} s  {out[name]['mb_per_cpu_s']:4d} MB/s")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    input_arguments(ap, events=1_000_000, ids=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--unpacked", action="store_true", help="the parser alone (no keyed operator after the reader)")
    ap.add_argument("--fold", action="store_true", help="the packer pre-folds (mini-batch)")
    ap.add_argument("--parsers", action="store_true", help="the JSON parse alone, by each candidate parser")
    ap.add_argument("--label", default="", help="what code ran (recorded in the results)")
    args = ap.parse_args(argv)
    if args.parsers:
        directory = cached_files(args.cache, args.events, args.ids, args.files)
        load0 = machine_load()
        print(f"the JSON parse of {directory}'s first file, 32k-line batches, each by every parser in turn, "
              f"mean CPU s per 1M events of {args.rounds} rounds:")
        parsers = _parsers(directory, args.rounds)
        when = datetime.datetime.now(datetime.timezone.utc)
        path = os.path.join(RESULTS, f"line-task-parsers-{when.strftime('%Y%m%dT%H%M%SZ')}.json")
        os.makedirs(RESULTS, exist_ok=True)
        with open(path, "w") as fh:
            json.dump({"when": when.isoformat(timespec="seconds"), "events": args.events, "label": args.label,
                       "python": sys.executable, "parsers": parsers, "load": [load0, machine_load()],
                       "argv": sys.argv[1:]}, fh, indent=2)
        print(f"load {load0}-{machine_load()}; written: {os.path.relpath(path, ROOT)}")
        return
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
