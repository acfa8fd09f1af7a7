"""The embedded default job (README: ``./run demo``).

Generates a Debezium (PostgreSQL connector) changelog whose events arrive out
of order across files, normalizes it with a Structured Streaming query (several
micro-batches, checkpointed) into a Delta upsert table plus the emitted
changelog, checks the table against the expected final state computed
independently from the generated events, and prints a summary.
"""
from __future__ import annotations

import json
import os
import shutil
import time

import numpy as np
import pandas as pd

SCHEMA = "id BIGINT, name STRING, balance DOUBLE, updated_at BIGINT"


def generate_debezium(directory: str, rows: int, keys: int, files: int = 8, seed: int = 7,
                      bad_lines: int = 3) -> pd.DataFrame:
    """Write ``rows`` events over ``keys`` keys into ``files`` files, shuffled
    across files (each file's lines in random order too).  Returns the expected
    final table (the last version of every key that is not deleted)."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    key = rng.integers(0, keys, rows)
    lsn = np.arange(rows, dtype=np.int64) * 16 + 1_000_000
    # a key's first event inserts; later ones update (85%) or delete (15%);
    # after a delete the next event re-inserts
    order = np.lexsort((lsn, key))
    k_sorted = key[order]
    first = np.ones(rows, dtype=bool)
    first[1:] = k_sorted[1:] != k_sorted[:-1]
    r = rng.random(rows)
    op_sorted = np.where(first, "c", np.where(r < 0.15, "d", "u")).astype(object)
    prev_d = np.zeros(rows, dtype=bool)
    prev_d[1:] = (op_sorted[:-1] == "d") & ~first[1:]
    op_sorted[prev_d & (op_sorted == "d")] = "c"
    op_sorted[prev_d & (op_sorted == "u")] = "c"
    op = np.empty(rows, dtype=object)
    op[order] = op_sorted
    balance = np.round(rng.random(rows) * 1000, 2)
    names = np.array([f"customer-{k}" for k in range(keys)], dtype=object)

    events = pd.DataFrame({"id": key, "op": op, "lsn": lsn, "balance": balance})
    events["name"] = names[key]
    events["updated_at"] = 1_700_000_000_000 + lsn // 16
    # previous image per key, for before of u/d
    ev = events.iloc[order].reset_index(drop=True)
    prev_bal = ev["balance"].shift(1)
    prev_ts = ev["updated_at"].shift(1)
    same_key = ~pd.Series(first)
    lines = []
    for i, e in enumerate(ev.itertuples(index=False)):
        after = {"id": int(e.id), "name": e.name, "balance": float(e.balance), "updated_at": int(e.updated_at)}
        before = ({"id": int(e.id), "name": e.name, "balance": float(prev_bal[i]),
                   "updated_at": int(prev_ts[i])} if same_key[i] else None)
        src = {"version": "2.7.0", "connector": "postgresql", "name": "demo", "db": "shop",
               "schema": "public", "table": "customers", "lsn": int(e.lsn), "ts_ms": int(e.updated_at)}
        if e.op == "c":
            env = {"before": None, "after": after, "op": "c"}
        elif e.op == "u":
            env = {"before": before, "after": after, "op": "u"}
        else:
            env = {"before": before, "after": None, "op": "d"}
        env.update(source=src, ts_ms=int(e.updated_at) + 5)
        lines.append(json.dumps(env))
    lines = np.array(lines, dtype=object)
    file_of = rng.integers(0, files, rows)
    for f in range(files):
        chunk = lines[file_of == f]
        rng.shuffle(chunk)
        with open(os.path.join(directory, f"customers-{f:04d}.json"), "w") as out:
            for ln in chunk:
                out.write(ln + "\n")
            if f == files - 1:
                out.write("\n")          # a Kafka-style tombstone (no value)
                for b in range(bad_lines):
                    out.write('{"op": "u", "after": {"id": "not-a-number"' + "}" * (b % 2) + "\n")
    last = ev.groupby("id", sort=True).tail(1)
    alive = last[last["op"] != "d"]
    return alive[["id", "name", "balance", "updated_at"]].sort_values("id").reset_index(drop=True)


def run_demo(output: str, rows: int = 200_000, keys: int = 20_000, streaming: bool = True) -> int:
    from .api import read_debezium
    from .runtime.session import SessionStart
    from .sinks.delta import read_table

    # the session starts while the events are generated (runtime/session.py)
    with SessionStart("spark-changelog-demo", command=True) as starting:
        shutil.rmtree(output, ignore_errors=True)
        src_dir = os.path.join(output, "cdc")
        t = time.perf_counter()
        expected = generate_debezium(src_dir, rows, keys)
        print(f"generated {rows:,} Debezium events over {keys:,} keys in 8 shuffled files "
              f"({time.perf_counter() - t:.1f} s): {src_dir}")
        spark = starting.session()
    stream = read_debezium(spark, src_dir, schema=SCHEMA, primary_key=["id"], streaming=streaming,
                           max_files_per_trigger=2 if streaming else None)
    table = os.path.join(output, "customers")
    report = stream.normalize().write_upsert(
        table, checkpoint=os.path.join(output, "checkpoint") if streaming else None,
        changelog_path=os.path.join(output, "changelog"),
        dead_letter=os.path.join(output, "dead_letter"))
    print(report.summary())
    got = read_table(table)[["id", "name", "balance", "updated_at"]].sort_values("id").reset_index(drop=True)
    ok = got.equals(expected.astype(got.dtypes.to_dict()))
    print(f"check: final table has {len(got):,} rows; expected {len(expected):,}: "
          + ("identical" if ok else "DIFFERENT"))
    replayed, changes = replay_changelog(os.path.join(output, "changelog"))
    log_ok = replayed.equals(got.astype(replayed.dtypes.to_dict()))
    print(f"check: the changelog's {changes:,} changes replayed per key give the table: "
          + ("identical" if log_ok else "DIFFERENT"))
    print(f"read it with: .venv/bin/spark-changelog cat {table} | head   "
          f"(its changes: cat {os.path.join(output, 'changelog')})")
    return 0 if ok and log_ok else 1


def replay_changelog(path: str) -> "tuple[pd.DataFrame, int]":
    """The table a changelog output gives when its changes are applied one
    by one in the order it is read (batch, then emission order): each key's
    last change, kept if it is an addition -> (that table by id, changes read)."""
    from .sinks.changelog import read_changelog
    log = read_changelog(path)
    last = log.drop_duplicates("id", keep="last")
    table = last[last["op"].isin(["+I", "+U"])][["id", "name", "balance", "updated_at"]]
    return table.sort_values("id").reset_index(drop=True), len(log)
