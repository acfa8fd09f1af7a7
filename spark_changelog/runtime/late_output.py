"""The late-data output of window operators (docs/windows.md, "Late rows").

Late rows leave the operator on the side-row channel (a metric row's payload,
``{"side": {"late": [...]}}``) and the pipeline writes them here: one JSON
lines file per micro-batch, ``late-<batch id>.jsonl``, written atomically and
overwritten when Spark replays the batch after a crash, so each late row is
in the output exactly once.  A record: ``row`` (the input row's columns),
``window_start_ms``/``window_end_ms``, ``watermark_ms`` (at the row's
arrival), ``seq``, ``reason``, ``operator``.
"""
from __future__ import annotations

import json
import os
from typing import Optional

import pandas as pd


def late_records(metrics: list[dict]) -> list[dict]:
    """The late-output records carried by metric payloads."""
    return [r for m in metrics for r in (m.get("side") or {}).get("late", [])]


def write_late_rows(records: list[dict], directory: str, batch_id: Optional[int]) -> str:
    os.makedirs(directory, exist_ok=True)
    name = f"late-{batch_id if batch_id is not None else 0:06d}.jsonl"
    path = os.path.join(directory, name)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for r in records:
            f.write(json.dumps(r, default=str) + "\n")
    os.replace(tmp, path)
    return path


def read_late_rows(directory: str) -> pd.DataFrame:
    """Every late row written to ``directory``, in batch order."""
    rows = []
    if os.path.isdir(directory):
        for name in sorted(os.listdir(directory)):
            if name.startswith("late-") and name.endswith(".jsonl"):
                batch = int(name[5:-6])
                with open(os.path.join(directory, name)) as f:
                    rows += [dict(json.loads(line), batch=batch) for line in f if line.strip()]
    return pd.DataFrame(rows)
