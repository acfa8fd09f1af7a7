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


def write_event_time(record: dict, directory: str, batch_id: Optional[int]) -> str:
    """The watermark state after a micro-batch (``event-<batch id>.json``)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"event-{batch_id if batch_id is not None else 0:06d}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(dict(record, batch=batch_id), f)
    os.replace(path + ".tmp", path)
    return path


def read_event_time(directory: str) -> pd.DataFrame:
    """Per micro-batch: batch time, watermark before and after, newest event."""
    rows = []
    if os.path.isdir(directory):
        for name in sorted(os.listdir(directory)):
            if name.startswith("event-") and name.endswith(".json"):
                with open(os.path.join(directory, name)) as f:
                    rows.append(json.load(f))
    return pd.DataFrame(rows)


def plot_event_time(directory: str, out_png: str) -> str:
    """A PNG of event time (y) against arrival (x, batch time): the newest
    event seen, the watermark after each micro-batch, and every late row at
    its arrival, from what a run wrote to its late-output ``directory``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    ev = read_event_time(directory)
    if ev.empty:
        raise ValueError(f"{directory}: no event-time records (event-*.json); write a window "
                         "query with late_output=DIR first")
    late = read_late_rows(directory)

    def ts(ms):
        return pd.to_datetime(pd.Series(ms, dtype="float64"), unit="ms", utc=True)

    ev = ev.sort_values("batch")
    fig, ax = plt.subplots(figsize=(9, 5))
    x = ts(ev["batch_time_ms"])
    ax.step(x, ts(ev["newest_event_ms"]), where="post", label="newest event time seen")
    ax.step(x, ts(ev["watermark_ms"]), where="post", label="watermark (after the batch)")
    if len(late) and "event_time_ms" in late:
        late = late[late["event_time_ms"].notna()]
    if len(late) and "event_time_ms" in late:
        arrival = ev.set_index("batch")["batch_time_ms"]
        lx = ts(late["batch"].map(arrival))
        ax.scatter(lx, ts(late["event_time_ms"]), marker="x", color="red",
                   label=f"late rows ({len(late)})")
    ax.set_xlabel("arrival (micro-batch time)")
    ax.set_ylabel("event time")
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    ax.yaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


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


def event_time_progress(out=None):
    """A ``progress=`` callback for ``write_upsert`` that keeps one status line
    up to date while a window query runs: micro-batches, rows in and out, the
    window watermark and its lag, late rows, idle partitions."""
    import sys
    out = out or sys.stderr
    tty = hasattr(out, "isatty") and out.isatty()

    def show(report) -> None:
        et = report.event_time
        wm = et.get("watermark_ms")
        wm_text = "-" if wm is None else pd.Timestamp(wm, unit="ms", tz="UTC").isoformat()
        lag = ("" if wm is None or et.get("newest_event_ms") is None
               else f" (lag {(et['newest_event_ms'] - wm) / 1000:.1f} s)")
        rows_in = "-" if report.rows_in is None else f"{report.rows_in:,}"
        line = (f"batch {report.batches}: rows in {rows_in}, out {report.changes_out:,}, "
                f"watermark {wm_text}{lag}, late rows {report.late_rows:,}, idle partitions "
                f"{len(et.get('idle_partitions', []))}")
        out.write(("\r" + line + " " * 8) if tty else line + "\n")
        out.flush()
    return show
