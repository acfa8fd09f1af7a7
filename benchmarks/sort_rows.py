"""Micro benchmark: the key-group sort with the tie-breaker (docs/runtime.md,
"Replay is deterministic") against the sort before it (stable on key and
``_seq``, ties left in arrival order), in the same process, alternating.

    scripts/bench sort-rows [--rows 100000] [--keys 20000] [--repeat 7]

Shapes of one key group's input (key ``k``, ``_seq``, ``_kind`` and three
data columns: bigint, string, double):

* ``sorted``: already in key/``_seq`` order, no ties (the batch path, or a
  shuffle that happened to keep the order): both only check the order;
* ``shuffled``: arrival order, no ties (a source: ``_seq`` unique per key);
* ``join ties 10%``: arrival order, 10% of the rows tie with another on key
  and ``_seq`` (a materializer behind a join: rows of one sink key from two
  join keys, whose ``_seq`` counters are separate);
* ``all tied``: every row ties with another (-U/+U pairs sharing a ``_seq``,
  the worst case).

Times are CPU seconds of the process (median), not wall time.  Prints a
table and writes ``benchmarks/results/sort-rows-<time>.json`` with
the machine load.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time

import numpy as np
import pandas as pd

from spark_changelog.model import SEQ_COL
from spark_changelog.operators.kernels import stable_order
from spark_changelog.runtime.keygroup import sort_rows, sorted_ties


def arrival_order_sort(rows: pd.DataFrame, key) -> pd.DataFrame:
    """The sort before the tie-breaker (main before issue #26's last part)."""
    columns = list(key) + [SEQ_COL]
    if sorted_ties(rows, columns) is not None:
        return rows.reset_index(drop=True)
    return rows.take(stable_order(rows, columns)).reset_index(drop=True)


def shape(name: str, n: int, keys: int, seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    k = np.sort(rng.integers(0, keys, n))
    seq = np.arange(n, dtype=np.int64)
    if name == "join ties 10%":
        tie = np.flatnonzero(rng.random(n - 1) < 0.1)
        tie = tie[k[tie + 1] == k[tie]]
        seq[tie + 1] = seq[tie]
    elif name == "all tied":
        seq = seq // 2
        k[1::2] = k[::2][:len(k[1::2])]
    kind = np.where(seq % 2 == 0, 0, 2).astype(np.int8)
    if name == "all tied":
        kind = np.tile(np.array([1, 2], dtype=np.int8), n // 2 + 1)[:n]
    df = pd.DataFrame({"k": k, "v": rng.integers(0, 1000, n),
                       "s": pd.Series(rng.integers(0, 5000, n)).map("name-{}".format).astype(object),
                       "x": rng.random(n), "_kind": kind, SEQ_COL: seq})
    if name != "sorted":
        df = df.take(rng.permutation(n)).reset_index(drop=True)
    return df


def timed(fn, df, repeat: int) -> float:
    """Median CPU time of this process per call: on a shared, loaded machine
    wall time mostly measures the neighbours."""
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn(df, ["k"])
        times.append(time.process_time() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--keys", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    load_before = os.getloadavg()
    results = []
    print(f"{'shape':<16}{'rows':>9}{'before CPU ms':>15}{'tie-breaker CPU ms':>20}{'ratio':>8}")
    for name in ("sorted", "shuffled", "join ties 10%", "all tied"):
        for n in (1_000, args.rows):
            df = shape(name, n, max(1, args.keys * n // args.rows))
            ties = sorted_ties(arrival_order_sort(df, ["k"]), ["k", SEQ_COL])
            old, new = [], []
            for _ in range(3):           # alternate, so load changes hit both
                old.append(timed(arrival_order_sort, df, args.repeat))
                new.append(timed(sort_rows, df, args.repeat))
            o, w = statistics.median(old) * 1e3, statistics.median(new) * 1e3
            results.append({"shape": name, "rows": n, "tied_rows": int(ties.sum()),
                            "before_cpu_ms": round(o, 3), "tie_breaker_cpu_ms": round(w, 3)})
            print(f"{name:<16}{n:>9}{o:>15.3f}{w:>20.3f}{w / o:>8.2f}")
    load_after = os.getloadavg()
    print(f"load average (1, 5, 15 min) before {load_before}, after {load_after}")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H%M%S+0000")
    out = os.path.join(os.path.dirname(__file__), "results", f"sort-rows-{stamp}.json")
    with open(out, "w") as fh:
        json.dump({"command": "scripts/bench sort-rows", "args": vars(args), "utc": stamp,
                   "load_before": load_before, "load_after": load_after, "results": results}, fh, indent=1)
    print(f"written {out}")


if __name__ == "__main__":
    main()
