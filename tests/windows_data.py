"""Inputs shared by the Spark window tests and their job process
(tests/crash_pipelines.py): clicks ``(p, u, t)`` in files, one micro-batch per
file, and the local reference run of the same batches."""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq

from spark_changelog.model import KIND_COL, SEQ_COL
from spark_changelog.model.partition_watermarks import EventTimeSpec
from spark_changelog.model.watermark import BoundedOutOfOrderness
from spark_changelog.operators.window.aggregate import AggCall, WindowAggregate
from spark_changelog.model.windows import Tumble, assign_windows
from spark_changelog.runtime.event_time import LocalEventTimeRunner

S = 1000
M = 60 * S
# partition B stops after file 0 and resumes in file 2 behind the watermark,
# file 3 brings it up to date again (idle timeout 1 ms: a partition without
# rows in a micro-batch is idle in it)
IDLE_FILES = [
    [("A", "u1", 10 * S), ("B", "u2", 10 * S)],
    [("A", "u1", 70 * S), ("A", "u3", 75 * S)],
    [("B", "u2", 20 * S), ("A", "u1", 80 * S)],
    [("A", "u1", 200 * S), ("B", "u2", 150 * S)],
]
IDLE_TIMEOUT_MS = 1
ARROW = pa.schema([("p", pa.string()), ("u", pa.string()), ("t", pa.int64()),
                   (KIND_COL, pa.int8()), (SEQ_COL, pa.int64())])
SPARK_SCHEMA = "p STRING, u STRING, t BIGINT, _kind TINYINT, _seq BIGINT"


def file_tables(files):
    seq, out = 0, []
    for rows in files:
        n = len(rows)
        out.append(pa.table({"p": [r[0] for r in rows], "u": [r[1] for r in rows],
                             "t": [r[2] for r in rows], KIND_COL: pa.array([0] * n, pa.int8()),
                             SEQ_COL: pa.array(range(seq, seq + n), pa.int64())}, schema=ARROW))
        seq += n
    return out


def write_files(directory, files) -> None:
    os.makedirs(directory, exist_ok=True)
    for i, t in enumerate(file_tables(files)):
        pq.write_table(t, os.path.join(directory, f"part-{i:04d}.parquet"))


def local_reference(files, idle_timeout_ms=IDLE_TIMEOUT_MS, bound_ms=0):
    """Per micro-batch, the sorted fired rows ``(kind, u, window start s, n)``,
    and the late rows ``(batch, u, t)``, from the local event-time runner."""
    ts = pa.timestamp("us", tz="UTC")
    schema = pa.schema(list(ARROW)[:3] + [pa.field("rt", ts), pa.field("window_start", ts),
                                          pa.field("window_end", ts)] + list(ARROW)[3:])
    op = WindowAggregate(schema, ["u"], [AggCall("n", "count")])
    spec = EventTimeSpec(BoundedOutOfOrderness("rt", bound_ms), "p", idle_timeout_ms)
    run = LocalEventTimeRunner(op, spec, lambda t: assign_windows(t, "rt", Tumble(M)))
    fired, late = {}, []
    for i, t in enumerate(file_tables(files)):
        t = t.add_column(3, "rt", t.column("t").cast(pa.timestamp("ms", tz="UTC")).cast(ts))
        out = run.run_batch(t, processing_time_ms=i * 1000)
        fired[i] = fired_rows(out)
        late += [(i, r["row"]["u"], r["row"]["t"]) for r in run.late_rows[len(late):]]
    return {k: v for k, v in fired.items() if v}, late


def fired_rows(out):
    from spark_changelog.model import RowKind
    return sorted((RowKind(int(k)).short, u, int(ws.timestamp()), int(n))
                  for k, u, ws, n in zip(out[KIND_COL], out["u"], out["window_start"], out["n"]))


def window_stream(spark, directory, streaming, idle_timeout=f"{IDLE_TIMEOUT_MS} ms", bound=0,
                  key_groups=4):
    from spark_changelog.api import ChangelogStream
    from spark_changelog.model import ChangelogMode
    from spark_changelog.operators.window import tumble
    reader = spark.readStream.option("maxFilesPerTrigger", 1) if streaming else spark.read
    df = reader.schema(SPARK_SCHEMA).parquet(str(directory))
    s = (ChangelogStream.from_dataframe(df, mode=ChangelogMode.INSERT_ONLY, name="clicks")
         .with_column("rt", "timestamp_millis(t)").with_watermark("rt", bound))
    return (s.window(tumble("rt", "1 minute"), partition="p", idle_timeout=idle_timeout)
            .aggregate(by="u", n="count(*)", key_groups=key_groups))


def spark_fired(log_dir):
    """Per batch id, the sorted fired rows of a changelog directory."""
    from spark_changelog.sinks.changelog import read_changelog
    log = read_changelog(log_dir)
    out = {}
    for b, part in log.groupby("_batch"):
        out[int(b)] = sorted((op, u, int(ws.timestamp()), int(n)) for op, u, ws, n in
                             zip(part["op"], part["u"], part["window_start"], part["n"]))
    return {k: v for k, v in out.items() if v}


def spark_late(late_dir):
    from spark_changelog.runtime.late_output import read_late_rows
    late = read_late_rows(late_dir)
    return sorted((int(r["batch"]), r["row"]["u"], int(r["row"]["t"]))
                  for r in late.to_dict("records")) if len(late) else []
