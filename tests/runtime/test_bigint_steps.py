"""Keyed steps keep BIGINT values beyond 2**53 exact with their rows and
state passed through Arrow as the runtimes pass them (``kernels.arrow_to_pandas``;
docs/operators.md, "BIGINT beyond 2**53"): a nullable BIGINT column with
such values went to pandas as float64 and came out rounded."""
from __future__ import annotations

import pyarrow as pa
import pytest

from spark_changelog.operators.aggregate.group_aggregate import GroupAggregate
from spark_changelog.operators.base import OpContext
from spark_changelog.operators.deduplicate import ProcTimeKeepFirst, ProcTimeKeepLast
from spark_changelog.operators.kernels import arrow_to_pandas
from spark_changelog.operators.normalize import ChangelogNormalize
from spark_changelog.operators.sink_upsert_materializer import SinkUpsertMaterializer
from spark_changelog.operators.top_n import RetractableTopN
from spark_changelog.runtime.local import sort_rows

B1, B2, B3 = 2**53 + 1, -(2**62) - 3, -(2**62) - 5
SCHEMA = pa.schema([("id", pa.int64()), ("g", pa.int64()), ("v", pa.int64()),
                    ("_kind", pa.int8()), ("_seq", pa.int64())])
KINDS = {"+I": 0, "-U": 1, "+U": 2, "-D": 3}
CHANGES = [[("+I", 1, 1, B1), ("+I", 2, 1, B1 + 2), ("+I", 3, 1, None), ("+I", 4, 2, B2)],
           [("-U", 2, 1, B1 + 2), ("+U", 2, 1, B3), ("-D", 4, 2, B2), ("+I", 5, 2, B2 - 2),
            ("+I", 6, 2, None)]]
INSERTS = [[("+I", 1, 1, B1), ("+I", 3, 1, None), ("+I", 4, 2, B2)],
           [("+I", 2, 1, B1 + 2), ("+I", 6, 2, None), ("+I", 7, 1, B3)]]

#: operator, its key, its input, the exact values beyond 2**53 of its output
CASES = {
    "aggregate": (lambda: GroupAggregate(SCHEMA, ["g"], [("sum", "v", "s"), ("min", "v", "mn"),
                                                         ("max", "v", "mx")]), ["g"], CHANGES,
                  {B1, B1 + 2, 2 * B1 + 2, B1 + B3, B2, B3, B2 - 2}),
    "normalize": (lambda: ChangelogNormalize(SCHEMA, ["id"]), ["id"], CHANGES, {B1, B1 + 2, B2, B3}),
    "keep-last": (lambda: ProcTimeKeepLast(SCHEMA, ["g"]), ["g"], INSERTS, {B1, B1 + 2, B2, B3}),
    "keep-first": (lambda: ProcTimeKeepFirst(SCHEMA, ["g"]), ["g"], INSERTS, {B1, B2}),
    "top-n": (lambda: RetractableTopN(SCHEMA, ["g"], 2, [("v", False)]), ["g"], CHANGES,
              {B1, B1 + 2, B2, B3}),
    "materializer": (lambda: SinkUpsertMaterializer(SCHEMA, ["g"], upsert_key=["id"]), ["g"], CHANGES,
                     {B1, B1 + 2, B2, B3}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_step_keeps_bigint_beyond_2_53(name):
    make, key, batches, want = CASES[name]
    op = make()
    state, got, seq = op.empty_state(), set(), 0
    for i, rows in enumerate(batches):
        table = pa.table({"id": [r[1] for r in rows], "g": [r[2] for r in rows], "v": [r[3] for r in rows],
                          "_kind": pa.array([KINDS[r[0]] for r in rows], pa.int8()),
                          "_seq": list(range(seq, seq + len(rows)))}, schema=SCHEMA)
        seq += len(rows)
        state_in = arrow_to_pandas(pa.Table.from_pandas(state, schema=op.state_schema, preserve_index=False))
        state, out = op.process(state_in, sort_rows(arrow_to_pandas(table), key), OpContext(processing_time_ms=i))
        out = pa.Table.from_pandas(out, schema=op.output_schema, preserve_index=False)
        got |= {v for r in out.to_pylist() for v in r.values() if isinstance(v, int) and abs(v) > 2**53}
    assert got == want


def test_a_prefold_keeps_keys_beyond_2_53_apart():
    """The Spark runtime's pre-fold of an input partition (a folding
    ChangelogNormalize keeps each key's last change) tells a nullable
    BIGINT key 2**53 from 2**53 + 1: as float64 they were one key, and the
    older one's change was dropped."""
    from spark_changelog.runtime.spark_keyed import _fold_partition
    schema = pa.schema([("id", pa.int64()), ("v", pa.int64()), ("_kind", pa.int8()), ("_seq", pa.int64()),
                        ("_metrics", pa.string())])
    table = pa.table({"id": [2**53, 2**53 + 1, None, 2**53], "v": [1, 2, 3, 4],
                      "_kind": pa.array([0, 0, 0, 2], pa.int8()), "_seq": [0, 1, 2, 3],
                      "_metrics": pa.array([None] * 4, pa.string())}, schema=schema)
    op = ChangelogNormalize(schema.remove(schema.get_field_index("_metrics")), ["id"], fold_batch=True)
    kept = _fold_partition(table, op)
    assert [(r["id"], r["v"]) for r in kept.to_pylist() if r["_kind"] != -1] == \
        [(2**53 + 1, 2), (None, 3), (2**53, 4)]
