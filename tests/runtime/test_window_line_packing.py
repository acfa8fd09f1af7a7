"""A window reading a source's watermark packs in the reader's line task
(docs/runtime.md, "Packing in the line task"): the line task computes the
source's computed event-time column (``TO_TIMESTAMP_LTZ(t, 3)``), the
source's watermark rows and the windows, and packs each key group's rows;
the packing pass passes them on.  The changelog, late rows and report equal
the unpacked run's over micro-batches with a watermark that moves, a late
row, a row without event time and a dead letter; a computed column the line
task cannot compute keeps Spark's path."""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pytest

from spark_changelog.connectors.cdc_json import ReadResult
from spark_changelog.connectors.changelog_arrow import ChangelogArrowParser
from spark_changelog.connectors.debezium_arrow import PackingParser
from spark_changelog.model import KIND_COL, PACKED_KIND, PACKED_ROWS_COL, SEQ_COL
from spark_changelog.model.windows import Tumble
from spark_changelog.model.watermark import BoundedOutOfOrderness
from spark_changelog.runtime.late_output import read_late_rows
from spark_changelog.runtime.line_columns import LineColumn
from spark_changelog.runtime.spark_event_time import WindowLinePacker
from spark_changelog.sinks.changelog import read_changelog
from spark_changelog.sql.script import parse_script
from spark_changelog.sql.translate import Translator
from tests.changelog_data import set_arrival
from tests.long_variants import long_only

#: a minute boundary (epoch ms)
T0 = 1_600_000_020_000
S = 1000

#: one file per micro-batch: the watermark (max - 10 s - 1 ms) passes the
#: first two windows in the second batch and the third in the last; the
#: second batch's click at 40 s is behind the watermark but its window has
#: not fired (added), the last batch's at 50 s is late; a click without
#: event time (late, "falls in no window") and a dead letter in the first
FILES = [
    [{"u": 1, "t": T0 + 5 * S}, {"u": 2, "t": T0 + 30 * S}, "not json", {"u": 9, "t": None},
     {"u": 1, "t": T0 + 65 * S}],
    [{"u": 3, "t": T0 + 80 * S}, {"u": 4, "t": T0 + 40 * S}, {"u": 2, "t": T0 + 135 * S}],
    [{"u": 5, "t": T0 + 50 * S}, {"u": 1, "t": T0 + 210 * S}],
]
#: (micro-batch, op, window start s, end s, users, clicks)
EXPECTED = [(1, "+I", 0, 60, 3, 3), (1, "+I", 60, 120, 2, 2), (2, "+I", 120, 180, 1, 1)]

SCRIPT = """
CREATE TABLE clicks (u BIGINT, t BIGINT, rt AS {rt},
  WATERMARK FOR rt AS rt - INTERVAL '10' SECOND)
WITH ('connector' = 'filesystem', 'path' = '{inp}', 'format' = 'json',
      'changelog.mode' = 'insert-only', 'source.max-files-per-trigger' = '1');
CREATE TABLE per_minute (window_start TIMESTAMP(3), window_end TIMESTAMP(3), users BIGINT,
  clicks BIGINT, PRIMARY KEY (window_start, window_end) NOT ENFORCED)
WITH ('connector' = 'delta', 'path' = '{out}');
SET 'spark-changelog.late-output.path' = '{late}';
INSERT INTO per_minute
SELECT window_start, window_end, COUNT(DISTINCT u) AS users, COUNT(*) AS clicks
FROM TABLE(TUMBLE(TABLE clicks, DESCRIPTOR(rt), INTERVAL '1' MINUTE))
GROUP BY window_start, window_end;
"""


def _write(tmp_path, files=FILES, first: int = 0) -> str:
    """``files`` as ``in/part-<i>.json`` (``i`` from ``first``), arriving in that order."""
    d = tmp_path / "in"
    d.mkdir(exist_ok=True)
    for i, lines in enumerate(files, start=first):
        path = str(d / f"part-{i}.json")
        with open(path, "w") as fh:
            fh.write("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
        set_arrival(path, i)
    return str(d)


def _planned(spark, inp: str, out: str, rt: str = "TO_TIMESTAMP_LTZ(t, 3)", streaming: bool = True):
    script = parse_script(SCRIPT.format(rt=rt, inp=inp, out=os.path.join(out, "table"),
                                        late=os.path.join(out, "late")), "w.sql")
    (p,), = [p for _, p in Translator(spark, script, streaming=streaming, key_groups=2).statements() if p]
    return p


def _run(spark, inp: str, out: str, rt: str = "TO_TIMESTAMP_LTZ(t, 3)"):
    report = _planned(spark, inp, out, rt).run(checkpoint=os.path.join(out, "ck"),
                                               changelog_path=os.path.join(out, "log"),
                                               dead_letter=os.path.join(out, "dead"))
    log = read_changelog(os.path.join(out, "log"))
    changes = [(int(b), op, (ws.value // 10**6 - T0) // S, (we.value // 10**6 - T0) // S, int(n), int(c))
               for b, op, ws, we, n, c in zip(log["_batch"], log["op"], log["window_start"],
                                               log["window_end"], log["users"], log["clicks"])]
    late = read_late_rows(os.path.join(out, "late"))
    late_rows = sorted((int(r["batch"]), r["row"]["u"], r["reason"].split(":")[0])
                       for r in late.to_dict("records"))
    return report, sorted(changes), late_rows


def _recording(monkeypatch) -> list:
    """The packers the readers' line tasks are given."""
    packers = []
    line_packed = ReadResult.packed_rows

    def recording(self, packer):
        packers.append(packer)
        return line_packed(self, packer)
    monkeypatch.setattr(ReadResult, "packed_rows", recording)
    return packers


def test_a_window_packed_in_the_line_task_gives_the_unpacked_runs_changelog(spark, tmp_path, monkeypatch):
    inp = _write(tmp_path)
    with monkeypatch.context() as m:
        packers = _recording(m)
        packed, changes, late = _run(spark, inp, str(tmp_path / "packed"))
    assert packers and all(isinstance(p, WindowLinePacker) for p in packers)
    with monkeypatch.context() as m:
        m.setattr(ReadResult, "packed_rows", lambda self, packer: None)
        plain, plain_changes, plain_late = _run(spark, inp, str(tmp_path / "plain"))
    assert changes == plain_changes == EXPECTED
    # the click without event time in the first batch, u5 at 50 s in the last
    assert late == plain_late == [(0, 9, "the event time is null"), (2, 5, "window closed")]
    assert (packed.batches, packed.late_rows, packed.invalid, packed.changes_out) == \
        (plain.batches, plain.late_rows, plain.invalid, plain.changes_out) == (3, 2, 1, 3)
    assert packed.counters == plain.counters


@long_only("two streaming queries on one checkpoint")
def test_a_checkpoint_written_without_line_packing_continues_with_it(spark, tmp_path, monkeypatch):
    """The line task gives each row the key group the packing pass gave it
    and the state is the same, so a query whose first micro-batch ran on
    Spark's path continues, on the same checkpoint, packed in the line task:
    the same changelog and late rows as a run that never packs."""
    out = str(tmp_path / "out")
    inp = _write(tmp_path, FILES[:1])
    with monkeypatch.context() as m:
        m.setattr(ReadResult, "packed_rows", lambda self, packer: None)
        _run(spark, inp, out)
    _write(tmp_path, FILES[1:], first=1)
    with monkeypatch.context() as m:
        packers = _recording(m)
        report, changes, late = _run(spark, inp, out)
    assert packers
    assert changes == EXPECTED
    assert late == [(0, 9, "the event time is null"), (2, 5, "window closed")]
    assert report.batches == 2


def test_a_computed_column_the_line_task_cannot_compute_keeps_sparks_path(spark, tmp_path, monkeypatch):
    """``t * 1`` is not a reader's column: Spark computes the event time and
    the window packs in its own pass, with the same changelog."""
    inp = _write(tmp_path)
    with monkeypatch.context() as m:
        packers = _recording(m)
        report, changes, late = _run(spark, inp, str(tmp_path / "out"), rt="TO_TIMESTAMP_LTZ(t * 1, 3)")
    assert packers == []
    assert changes == EXPECTED
    assert [(b, u) for b, u, _ in late] == [(0, 9), (2, 5)]


@pytest.mark.parametrize("rt, columns, packs", [
    ("TO_TIMESTAMP_LTZ(t, 3)", "u BIGINT, t BIGINT", True),
    ("TO_TIMESTAMP_LTZ(t, 0)", "u BIGINT, t BIGINT", True),
    ("TO_TIMESTAMP_LTZ(t, 3)", "u STRING, t INT", True),
    ("TO_TIMESTAMP_LTZ(t + 1, 3)", "u BIGINT, t BIGINT", False),
    ("TO_TIMESTAMP_LTZ(t, 0)", "u BIGINT, t DOUBLE", False),
    ("TO_TIMESTAMP(s)", "u BIGINT, t BIGINT, s STRING", False),
    ("CAST(s AS TIMESTAMP(3))", "u BIGINT, t BIGINT, s STRING", False),
], ids=["millis", "seconds", "int-millis", "an-expression", "double-seconds", "string-parse", "cast"])
def test_which_computed_columns_the_line_task_computes(spark, tmp_path, rt, columns, packs):
    """Decided per expression when the query is built: a reader's integer
    column through ``TO_TIMESTAMP_LTZ`` (Spark's ``timestamp_millis`` /
    ``timestamp_seconds``) packs in the line task; anything else keeps
    Spark's path."""
    from spark_changelog.plan.lower import _line_window_source
    from spark_changelog.plan.nodes import WatermarkAssigner
    script = SCRIPT.replace("u BIGINT, t BIGINT, rt", f"{columns}, rt")
    text = script.format(rt=rt, inp=tmp_path, out=tmp_path / "t", late=tmp_path / "l")
    (p,), = [p for _, p in Translator(spark, parse_script(text, "w.sql"), streaming=True).statements() if p]
    wm = next(n for n in _walk(p.plan()) if isinstance(n, WatermarkAssigner))
    line = _line_window_source(wm.input)
    assert (line is not None) == packs
    if packs:
        assert [c.function for c in line.line_columns if c.name == "rt"] == \
            ["timestamp_millis" if rt.endswith("3)") else "timestamp_seconds"]


def _walk(node):
    yield node
    for child in node.children:
        yield from _walk(child)


def test_a_row_whose_event_time_spark_would_fail_on_is_left_to_spark():
    """``t * 1000`` past a 64-bit integer: Spark's ``timestamp_millis`` fails
    the query (``Math.multiplyExact``), so the line task leaves that row,
    finished but not packed, for Spark's SQL to compute (and fail on); the
    other rows are packed, nulls included."""
    parser = ChangelogArrowParser([("u", "bigint"), ("t", "bigint")], (), None, None)
    row_schema = pa.schema([("u", pa.int64()), ("t", pa.int64()), ("rt", pa.timestamp("us", tz="UTC")),
                            ("window_start", pa.timestamp("us", tz="UTC")),
                            ("window_end", pa.timestamp("us", tz="UTC")), (KIND_COL, pa.int8()),
                            (SEQ_COL, pa.int64()), ("_metrics", pa.string())])
    packer = WindowLinePacker((LineColumn("u", "u"), LineColumn("t", "t"), LineColumn("rt", "t", "timestamp_millis")),
                              (BoundedOutOfOrderness("rt", 10_000), "clicks"), "rt", Tumble(60_000),
                              ("window_end",), 2, row_schema)
    big = 2 ** 62
    lines = [json.dumps({"u": 1, "t": T0}), json.dumps({"u": 2, "t": big}), json.dumps({"u": 3, "t": None}),
             json.dumps({"u": 4, "t": -big})]
    text = ("\n".join(lines) + "\n").encode()
    buf = np.frombuffer(text, dtype=np.uint8)
    ends = np.flatnonzero(buf == 10)
    starts = np.concatenate(([0], ends[:-1] + 1))
    line_of, values, needs_raw = PackingParser(parser, packer)(buf, starts, ends, 0, np.arange(1, 5))
    names = ["u", "t", KIND_COL, SEQ_COL, "_packed_kg", PACKED_ROWS_COL]
    out = pa.table(values, names=names).to_pylist()
    unpacked = [(r["u"], r["t"]) for r in out if r[KIND_COL] != PACKED_KIND]
    assert unpacked == [(2, big), (4, -big)]
    assert not needs_raw.any()        # finished: Spark's SQL takes their values, not the text
    from spark_changelog.runtime.arrow_packing import unpack
    rows = unpack([r[PACKED_ROWS_COL] for r in out if r[KIND_COL] == PACKED_KIND]).to_pylist()
    data = sorted((r["u"], r["rt"]) for r in rows if r[KIND_COL] == 0)
    assert [u for u, _ in data] == [1, 3]
    assert data[0][1].timestamp() * 1000 == T0 and data[1][1] is None
    # the watermark row of the piece: the largest event time packed - 10 s - 1 ms
    marks = [json.loads(r["_metrics"]) for r in rows if r[KIND_COL] == -1]
    assert marks == [{"watermark": {"partition": "clicks", "watermark": T0 - 10_001}}]

