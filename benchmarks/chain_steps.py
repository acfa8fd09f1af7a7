"""Diagnostic: the suite's materializer job's keyed step, one key group at a
time, in one process, step by step (docs/runtime.md, "Chained keyed
operators": the materializer's step in the chain).

    scripts/bench chain-steps [--groups 4] [--repeat 3] [--label TEXT]

The 1M-event Debezium files of the suite (``whole_job.cached_files``), as
the reader's changes (``+I``; ``-U``/``+U`` of an update sharing the
event's position; ``-D``), in ``--groups`` of the 32 key groups Spark gives
them (``pmod(hash(id), 32)``).  Each key group goes through the chain the
keyed step runs (``ChangelogNormalize(id)`` then the
``SinkUpsertMaterializer`` on ``(g, id)`` with upsert key ``id``), from
empty state, each link's steps timed apart: sorting its rows, their
distinct keys, the operator's rule, recording the batch's run, the run's
blob and its file index, and the conversion of the normalize's output for
the materializer.  Times are CPU milliseconds of the process per key group
(``time.process_time``, median over ``--repeat``), not wall time: the
Python work of a keyed stage's tasks without Spark's part (the state
store's round trips, the shuffle, the output's packing).  ``--label`` says
what code ran (run it on other code with ``PYTHONPATH``).  Writes
``benchmarks/results/chain-steps-<time>.json`` with the machine's load.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.json as pj

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(ROOT, "benchmarks", "results")
sys.path.insert(0, HERE)
from whole_job import cached_files  # noqa: E402

KEY_GROUPS = 32


def changes(path: str) -> pd.DataFrame:
    """The files' changes as the Debezium reader emits them (its ``_seq``:
    the event's position times two, plus one for the after image)."""
    parts = []
    for name in sorted(os.listdir(path)):
        t = pj.read_json(os.path.join(path, name))
        op = np.asarray(t.column("op").to_pylist())
        pos = t.column("source").combine_chunks().field("lsn").to_numpy().astype(np.int64)
        for image, kinds, plus in (("before", {"u": 1, "d": 3}, 0), ("after", {"c": 0, "u": 2}, 1)):
            col = t.column(image).combine_chunks()
            for o, kind in kinds.items():
                take = np.flatnonzero(op == o)
                parts.append(pd.DataFrame({
                    "id": col.field("id").to_numpy(zero_copy_only=False)[take].astype(np.int64),
                    "g": col.field("g").to_numpy(zero_copy_only=False)[take].astype(np.int64),
                    "v": col.field("v").to_numpy(zero_copy_only=False)[take].astype(np.int64),
                    "_kind": np.full(len(take), kind, dtype=np.int8),
                    "_seq": pos[take] * 2 + plus}))
    return pd.concat(parts, ignore_index=True)


def run_group(chain, rows: pd.DataFrame, cpu: dict) -> int:
    from spark_changelog.operators.base import OpContext
    from spark_changelog.runtime.keygroup import sort_rows
    from spark_changelog.runtime.keyed_chain import conform_rows
    from spark_changelog.runtime.state_runs import RunStack, name_new_runs, run_index, run_schema
    from spark_changelog.operators.keys import distinct_keys

    def timed(step, f, *args):
        t = time.process_time()
        out = f(*args)
        cpu[step] = cpu.get(step, 0.0) + time.process_time() - t
        return out

    out = rows
    for i, (op, feed) in enumerate(zip(chain.operators, chain.feeds)):
        name = "normalize" if i == 0 else "materializer"
        if i:
            out = timed(f"{name}: conversion between the links", conform_rows, out, op.input_schema)
        ordered = getattr(feed, "ordered", False) and getattr(op, "orders_own_rows", False)
        if not ordered:
            out = timed(f"{name}: sort", sort_rows, out, op.key)
        touched = timed(f"{name}: distinct keys", distinct_keys, out, op.key)
        stack = RunStack(op.key)
        ctx = OpContext(processing_time_ms=1, next_seq=0)
        new_state, emitted = timed(f"{name}: rule", op.process, op.empty_state(), out, ctx)
        run = timed(f"{name}: record the run", stack.new_run, touched, new_state)
        stack.push(run)
        timed(f"{name}: blob and index", lambda: (name_new_runs(stack.runs, "bench", run_schema(op.state_schema)),
                                                  run_index(stack.runs[-1].table, op.key)))
        out = emitted
    return len(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=4, help=f"how many of the {KEY_GROUPS} key groups")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--label", default="", help="what code ran (recorded in the results)")
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "spark-changelog-bench"))
    args = ap.parse_args(argv)

    import pyarrow as pa
    from spark_changelog.model.spark_hash import key_groups
    from spark_changelog.operators.normalize import ChangelogNormalize
    from spark_changelog.operators.sink_upsert_materializer import SinkUpsertMaterializer
    from spark_changelog.runtime.keyed_chain import KeyedChain

    rows = changes(cached_files(args.cache, 1_000_000, 100_000, 4))
    group = key_groups(pa.table({"id": rows["id"].to_numpy()}), ["id"], KEY_GROUPS)
    schema = pa.schema([("id", pa.int64()), ("g", pa.int64()), ("v", pa.int64()),
                        ("_kind", pa.int8()), ("_seq", pa.int64())])
    normalize = ChangelogNormalize(schema, ["id"])
    chain = KeyedChain.linear((normalize, SinkUpsertMaterializer(normalize.output_schema, ["g", "id"],
                                                                 upsert_key=["id"])))
    # each group's rows in a shuffled arrival order, as a shuffle hands them over
    rng = np.random.default_rng(1)
    groups = [rows.iloc[rng.permutation(np.flatnonzero(group == k))].reset_index(drop=True)
              for k in range(args.groups)]
    run_group(chain, groups[0], {})           # imports and first calls, not measured
    runs = []
    out_rows = 0
    for _ in range(args.repeat):
        cpu: dict = {}
        out_rows = sum(run_group(chain, g, cpu) for g in groups)
        runs.append({k: 1000 * v / len(groups) for k, v in cpu.items()})
    steps = {k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]}
    links = {}
    for k, v in steps.items():
        links[k.split(":")[0]] = round(links.get(k.split(":")[0], 0.0) + v, 2)
    when = datetime.datetime.now(datetime.timezone.utc)
    result = {"when": when.isoformat(timespec="seconds"), "label": args.label,
              "load_1min": os.getloadavg()[0], "key_groups_measured": args.groups,
              "changes_per_key_group": round(sum(len(g) for g in groups) / len(groups)),
              "materializer_rows_out_per_key_group": round(out_rows / len(groups)),
              "cpu_ms_per_key_group": steps, "cpu_ms_per_key_group_by_link": links,
              "cpu_s_per_1m_events_by_link": {k: round(v * KEY_GROUPS / 1000, 3) for k, v in links.items()}}
    for k, v in steps.items():
        print(f"{k:45s} {v:7.2f} ms")
    for k, v in links.items():
        print(f"{k:45s} {v:7.2f} ms per key group ({v * KEY_GROUPS / 1000:.2f} CPU s per 1M events)")
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"chain-steps-{when.strftime('%Y%m%dT%H%M%SZ')}.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=2)
    print(f"wrote {path} (load {result['load_1min']:.2f})")


if __name__ == "__main__":
    main()
