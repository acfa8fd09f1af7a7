"""Packing in the operator before (docs/runtime.md, "Packing in the operator
before"): a keyed operator reading another keyed operator's output as it is
(a normalize feeding an aggregate; two normalizes feeding a join, in its
union layout; the join feeding the upsert materializer) gets it packed per
key group by that operator, so no row of it crosses to the JVM and back.
The tables and the report are those of the unpacked run, over two
micro-batches, and a checkpoint whose first micro-batch ran unpacked
continues packed.  The runs here keep the keyed operators unchained (as a
checkpoint written before chains runs): chained, the join and its two
normalizes are one step (tests/runtime/test_keyed_chain.py)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from spark_changelog.plan import execute as execute_module
from spark_changelog.plan import fingerprint as fingerprint_module
from spark_changelog.plan import lower as lower_module
from spark_changelog.plan.chains import keyed_chains
from spark_changelog.sql.runner import run_script
from spark_changelog.sql.script import parse_script
from tests.changelog_data import set_arrival
from tests.delta_scan import scan_delta
from tests.long_variants import long_only

COLS = "id BIGINT, g BIGINT, v BIGINT"


def _debezium_files(directory, seed: int, ids: int = 60, per_file: int = 150, files: int = 2) -> dict:
    """Creates, updates (some moving to another ``g``) and deletes over ``ids``
    ids, in log order, ``files`` files (one micro-batch each); returns the
    final row of each live id."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory)
    alive, lsn = {}, 0
    for f in range(files):
        lines = []
        for _ in range(per_file):
            i = int(rng.integers(0, ids))
            lsn += 1
            new = {"id": i, "g": int(rng.integers(0, 5)), "v": int(rng.integers(0, 1000))}
            if i not in alive:
                op, before, after = "c", None, new
            elif rng.random() < 0.15:
                op, before, after = "d", alive[i], None
            else:
                op, before, after = "u", alive[i], new
            if after is None:
                del alive[i]
            else:
                alive[i] = after
            lines.append(json.dumps({"before": before, "after": after, "op": op, "source": {"lsn": lsn}}))
        path = os.path.join(directory, f"part-{f}.json")
        with open(path, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        set_arrival(path, f)
    return alive


def _script(s1: str, s2: str, out: str) -> str:
    src = ("CREATE TEMPORARY TABLE {n} ({c}, PRIMARY KEY (id) NOT ENFORCED) WITH ('connector' = 'filesystem', "
           "'path' = '{p}', 'format' = 'debezium-json', 'source.max-files-per-trigger' = '1');\n")
    return (src.format(n="s1", c=COLS, p=s1) + src.format(n="s2", c=COLS, p=s2)
            + f"CREATE TEMPORARY TABLE agg (g BIGINT, c BIGINT, sv BIGINT, PRIMARY KEY (g) NOT ENFORCED) "
              f"WITH ('connector' = 'delta', 'path' = '{out}/agg');\n"
            + f"CREATE TEMPORARY TABLE j (id BIGINT, g BIGINT, v BIGINT, g2 BIGINT, v2 BIGINT, "
              f"PRIMARY KEY (g, id) NOT ENFORCED) WITH ('connector' = 'delta', 'path' = '{out}/j');\n"
            + "SET 'table.exec.sink.upsert-materialize' = 'force';\n"
            + "INSERT INTO agg SELECT g, COUNT(*) AS c, SUM(v) AS sv FROM s1 GROUP BY g;\n"
            + "INSERT INTO j SELECT s1.id, s1.g, s1.v, s2.g AS g2, s2.v AS v2 FROM s1 JOIN s2 ON s1.id = s2.id;\n")


def _run(spark, tmp_path, name: str, s1: str, s2: str, unpacked: bool, monkeypatch) -> tuple:
    out = str(tmp_path / name)
    with monkeypatch.context() as m:
        for module in (execute_module, fingerprint_module):
            m.setattr(module, "checkpoint_keyed_chains", lambda checkpoint: False)
        if unpacked:
            step = lower_module.keyed_step
            m.setattr(lower_module, "keyed_step", lambda *a, **k: (step(*a, **k)[0], None))
        runs = run_script(spark, parse_script(_script(s1, s2, out)), batch=False,
                          checkpoint=os.path.join(out, "ck"), dead_letter=os.path.join(out, "dead"),
                          show_progress=False)
    tables = {t: sorted(map(tuple, scan_delta(os.path.join(out, t)).to_pandas().sort_index(axis=1)
                            .itertuples(index=False))) for t in ("agg", "j")}
    reports = [(r.report.batches, r.report.changes_out, r.report.upserted, r.report.deleted,
                {op: {k: v for k, v in c.items() if k not in ("seconds",)} for op, c in r.report.operators.items()})
               for r in runs]
    return tables, reports


@pytest.fixture
def inputs(tmp_path):
    s1, s2 = str(tmp_path / "s1"), str(tmp_path / "s2")
    final1, final2 = _debezium_files(s1, seed=3), _debezium_files(s2, seed=4)
    return s1, s2, _expected(final1, final2)


def _expected(final1: dict, final2: dict) -> dict:
    """The two tables from the sources' final rows (columns in name order)."""
    agg = {}
    for r in final1.values():
        c, sv = agg.get(r["g"], (0, 0))
        agg[r["g"]] = (c + 1, sv + r["v"])
    return {"agg": sorted((c, g, sv) for g, (c, sv) in agg.items()),
            "j": sorted((r["g"], final2[i]["g"], i, r["v"], final2[i]["v"])
                        for i, r in final1.items() if i in final2)}


def test_operator_packed_run_equals_the_unpacked_run(spark, tmp_path, monkeypatch, inputs):
    s1, s2, expected = inputs
    packed_tables, packed_reports = _run(spark, tmp_path, "packed", s1, s2, False, monkeypatch)
    plain_tables, plain_reports = _run(spark, tmp_path, "plain", s1, s2, True, monkeypatch)
    assert packed_tables == plain_tables == expected
    assert len(expected["agg"]) == 5 and len(expected["j"]) > 20
    assert packed_reports == plain_reports
    assert [r[0] for r in packed_reports] == [2, 2]


def test_the_operator_before_emits_packed_rows_only(spark, tmp_path, inputs):
    """The aggregate's input is the normalize's output as packed rows: the
    normalize's step outputs only the packed columns (the data columns are
    added as nulls after it), the join's two normalizes likewise."""
    from spark_changelog.sql.translate import Translator
    planned = [p for _, p in Translator(spark, parse_script(_script(*inputs[:2], str(tmp_path / "o"))),
                                        streaming=True).statements() if isinstance(p, list)]
    for inserts in planned:
        for insert in inserts:
            with keyed_chains(False):
                df = lower_module.lower(insert.plan()).df
            plan = df._jdf.queryExecution().analyzed().toString()
            steps = plan.count("TransformWithStateInPySpark")
            assert steps >= 2
            # every step but the last outputs [_kind, _packed_kg, _packed_rows]
            assert plan.count("_packed_rows") >= steps - 1


@long_only("two more streaming runs of two queries")
def test_a_checkpoint_written_unpacked_continues_packed(spark, tmp_path, monkeypatch, inputs):
    """The first micro-batch runs unpacked, the second (same checkpoint)
    packed: every key's state is found, the tables are the sources' result."""
    s1, s2, expected = inputs
    staged = {n: str(tmp_path / f"staged-{n}") for n in ("s1", "s2")}
    for n, src in (("s1", s1), ("s2", s2)):
        os.makedirs(staged[n])
        os.link(os.path.join(src, "part-0.json"), os.path.join(staged[n], "part-0.json"))
    _run(spark, tmp_path, "restarted", staged["s1"], staged["s2"], True, monkeypatch)
    for n, src in (("s1", s1), ("s2", s2)):
        os.link(os.path.join(src, "part-1.json"), os.path.join(staged[n], "part-1.json"))
    restarted, _ = _run(spark, tmp_path, "restarted", staged["s1"], staged["s2"], False, monkeypatch)
    assert restarted == expected
