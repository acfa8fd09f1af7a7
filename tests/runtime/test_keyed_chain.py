"""Chained keyed operators (docs/runtime.md, "Chained keyed operators"): the
sink upsert materializer on ``(g, id)`` after the normalize on ``id`` runs in
one keyed step on the normalize's key groups.  Its results are those of the
unchained run (streaming over two micro-batches and batch: the table, the
emitted changelog per key, the report's counters), the plan has one stateful
step for the two operators, explain says why, a checkpoint records the
layout, and a checkpoint written unchained keeps running unchained."""
from __future__ import annotations

import glob
import json
import os
import shutil

import pytest

from crash_pipelines import PIPELINES
from kill_restart import COLS as KR_COLS, EXPECTED_TABLE, Crash, write_input
from long_variants import long_only

from spark_changelog.plan import execute as execute_module
from spark_changelog.plan import fingerprint as fingerprint_module
from spark_changelog.plan.fingerprint import read_fingerprint, rescale_fingerprint
from spark_changelog.runtime import checkpoint as checkpoint_module
from spark_changelog.runtime.checkpoint import check_checkpoint, keyed_state_pairs
from spark_changelog.runtime.rescale import rescale_checkpoint
from spark_changelog.sinks.changelog import read_changelog
from spark_changelog.sinks.delta import read_table
from spark_changelog.sql.runner import run_script
from spark_changelog.sql.script import parse_script
from tests.delta_scan import scan_delta
from tests.runtime.test_operator_packing import _debezium_files

COLS = "id BIGINT, g BIGINT, v BIGINT"


def _script(src: str, out: str, sink: str = "delta") -> str:
    where = f", 'path' = '{out}/t'" if sink == "delta" else ""
    return ("SET 'table.exec.sink.upsert-materialize' = 'force';\n"
            f"CREATE TEMPORARY TABLE s ({COLS}, PRIMARY KEY (id) NOT ENFORCED) WITH ('connector' = "
            f"'filesystem', 'path' = '{src}', 'format' = 'debezium-json', 'source.max-files-per-trigger' = '1');\n"
            f"CREATE TEMPORARY TABLE t ({COLS}, PRIMARY KEY (g, id) NOT ENFORCED) "
            f"WITH ('connector' = '{sink}'{where});\n"
            "INSERT INTO t SELECT id, g, v FROM s;\n")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    src = str(tmp_path_factory.mktemp("chain") / "s")
    final = _debezium_files(src, seed=5, ids=60, per_file=200)
    return src, sorted((r["g"], r["id"], r["v"]) for r in final.values())


@pytest.fixture(scope="module")
def chained_whole(spark, source, tmp_path_factory):
    """One uninterrupted chained streaming run over ``source`` (two
    micro-batches, the default key groups): what the other runs of these
    files are compared with; its output directory last."""
    out = str(tmp_path_factory.mktemp("chained-whole"))
    return _run(spark, source[0], out, key_groups=None) + (out,)


def _unchained(monkeypatch):
    """Runs as this version runs a checkpoint written unchained (and a
    batch run inside ``keyed_chains(False)``)."""
    for module in (execute_module, fingerprint_module):
        monkeypatch.setattr(module, "checkpoint_keyed_chains", lambda checkpoint: False)
    monkeypatch.setattr(execute_module, "chaining", lambda: False)


def _run(spark, src: str, out: str, batch: bool = False, key_groups=8):
    """The SQL script streaming; in a batch run (where the planner inserts
    no normalize: a bounded input has each key's changes in order) the same
    chain through the Python API, the normalize asked for."""
    if batch:
        from spark_changelog.api import read_debezium
        stream = read_debezium(spark, src, COLS, ["id"]).normalize(key_groups=key_groups)
        r = stream.write_upsert(os.path.join(out, "t"), key=["g", "id"], materialize="force",
                                changelog_path=os.path.join(out, "log"), key_groups=key_groups)
    else:
        (run,) = run_script(spark, parse_script(_script(src, out)), batch=False,
                            checkpoint=os.path.join(out, "ck"), changelog=os.path.join(out, "log"),
                            key_groups=key_groups, show_progress=False)
        r = run.report
    table = sorted(map(tuple, scan_delta(os.path.join(out, "t")).to_pandas()[["g", "id", "v"]]
                       .itertuples(index=False)))
    log = read_changelog(os.path.join(out, "log"))
    # the order of one key's changes is defined, not the order across keys
    per_key = {}
    for _, row in log.iterrows():
        per_key.setdefault((row["g"], row["id"]), []).append((row["op"], row["v"]))
    # state_rows counts stored rows, superseded versions in older runs too:
    # how many depends on which keys share a key group's runs
    counters = {op: {k: v for k, v in c.items() if k not in ("seconds", "state_rows")}
                for op, c in r.operators.items()}
    return table, per_key, (r.batches, r.changes_out, r.upserted, r.deleted, counters), r


@pytest.mark.parametrize("batch", [False, True], ids=["streaming", "batch"])
def test_the_chained_run_equals_the_unchained_run(spark, tmp_path, monkeypatch, source, chained_whole, batch):
    src, expected = source
    groups = 8 if batch else None
    chained = _run(spark, src, str(tmp_path / "chained"), batch, groups) if batch else chained_whole
    with monkeypatch.context() as m:
        _unchained(m)
        plain = _run(spark, src, str(tmp_path / "plain"), batch, groups)
    assert chained[0] == plain[0] == expected and len(expected) > 20
    assert chained[1] == plain[1]
    assert chained[2] == plain[2]
    assert "keyed chain: one keyed step with the ChangelogNormalize(key=[id])" in chained[3].plan
    assert "keyed chain" not in plain[3].plan
    if not batch:
        assert chained[2][0] == 2
        assert read_fingerprint(os.path.join(chained[4], "ck", "query"))["keyed_chains"] is True
        assert read_fingerprint(str(tmp_path / "plain" / "ck" / "query"))["keyed_chains"] is False


def test_the_chain_is_one_stateful_step(spark, tmp_path, source):
    """One ``transformWithStateInPandas`` for the two operators; its state
    holds each link's variables, the materializer's ``meta`` recording the
    normalize's key as its group key."""
    from spark_changelog.plan import lower as lower_module
    from spark_changelog.sql.translate import Translator
    (planned,) = [p for _, p in Translator(spark, parse_script(_script(source[0], str(tmp_path / "o"))),
                                           streaming=True).statements() if isinstance(p, list)]
    (insert,) = planned
    low = lower_module.lower(insert.plan())
    plan = low.df._jdf.queryExecution().analyzed().toString()
    assert plan.count("TransformWithStateInPySpark") == 1
    assert [op.name for op in low.operators] == ["ChangelogNormalize", "sink_upsert_materializer"]
    assert [op.name for op in low.entry] == ["ChangelogNormalize"]


def _stage(src: str, staged: str, upto: int) -> None:
    """Make the first ``upto`` files of ``src`` visible to the stream."""
    os.makedirs(staged, exist_ok=True)
    for name in sorted(os.listdir(src))[:upto]:
        if not os.path.exists(os.path.join(staged, name)):
            os.link(os.path.join(src, name), os.path.join(staged, name))


def test_a_chained_checkpoint_is_checked_and_rescaled(spark, tmp_path, monkeypatch, source, chained_whole):
    """``check`` reads every link's state (the materializer's is the step's
    second pair of variables), and ``rescale`` regroups each link by the
    chain's key: the query resumes with 4 key groups instead of 32 and its
    table and changelog are those of one uninterrupted run."""
    src, expected = source
    staged, out = str(tmp_path / "staged"), str(tmp_path / "out")
    _stage(src, staged, 1)
    assert _run(spark, staged, out, key_groups=None)[2][0] == 1
    ck = os.path.join(out, "ck")
    (query,) = checkpoint_module.query_dirs(ck)
    assert keyed_state_pairs(os.path.join(query, "state", "0")) == [("meta", "runs"), ("meta1", "runs1")]
    assert check_checkpoint(ck, spark).ok
    with monkeypatch.context() as m:
        m.setattr(checkpoint_module, "_undecodable", lambda blob: "does not decode (test)")
        problems = [f.text for f in check_checkpoint(ck, spark).findings if f.problem]
    assert any("(sink_upsert_materializer), key group" in p for p in problems)
    assert any("(ChangelogNormalize), key group" in p for p in problems)

    report = rescale_checkpoint(spark, ck, 4, edit=rescale_fingerprint, quiet_seconds=0)
    shutil.rmtree(report.kept)
    assert [(o.name, o.key, o.groups_before) for o in report.operators] == \
        [("ChangelogNormalize", ["id"], 32), ("sink_upsert_materializer", ["g", "id"], 32)]
    assert all(o.keys > 20 for o in report.operators)
    fp = read_fingerprint(os.path.join(ck, "query"))
    assert (fp["key_groups"], fp["keyed_chains"]) == (4, True)
    assert check_checkpoint(ck, spark).ok
    _stage(src, staged, 2)
    table, per_key, counts, _ = _run(spark, staged, out, key_groups=None)
    assert counts[0] == 1
    whole = chained_whole
    assert table == whole[0] == expected
    # the -U/-D of keys updated after the rescale found their moved state
    assert per_key == whole[1]


def test_a_checkpoint_written_unchained_keeps_running_unchained(spark, tmp_path, monkeypatch, source,
                                                                chained_whole):
    """The first micro-batch runs with the code before chains (no
    ``keyed_chains`` in the fingerprint, a stateful operator each); the
    second resumes the same checkpoint unchained and finds every key's
    state: the table and changelog are the chained run's."""
    src, expected = source
    staged = str(tmp_path / "staged")
    out = str(tmp_path / "old")
    _stage(src, staged, 1)
    with monkeypatch.context() as m:
        _unchained(m)
        _run(spark, staged, out)
    fp_path = os.path.join(out, "ck", "query", "plan-fingerprint.json")
    with open(fp_path) as fh:
        fp = json.load(fh)
    del fp["keyed_chains"]          # as written before the field existed
    with open(fp_path, "w") as fh:
        json.dump(fp, fh)
    _stage(src, staged, 2)
    table, per_key, counts, report = _run(spark, staged, out)
    assert counts[0] == 1 and "keyed chain" not in report.plan
    assert read_fingerprint(os.path.join(out, "ck", "query"))["keyed_chains"] is False
    chained = chained_whole
    assert table == chained[0] == expected
    assert per_key == chained[1]


# -- kill -9 and replay ---------------------------------------------------------
def _prepare_crash(d, fixture):
    write_input(d / "in")
    return [d / "in", d / "table", d / "ck", d / "log"]


#: tests/crash_pipelines.py's normalize_materialize (the normalize and the
#: materializer on (name, id), chained), killed inside micro-batch 1 after
#: its sinks committed and before Spark's commit
CRASHES = {"chain": Crash("normalize_materialize", _prepare_crash, hang_after=1)}


def _changelog(path):
    return [(r["op"], r["id"], r["name"], r["score"]) for _, r in read_changelog(path).iterrows()]


@pytest.mark.slow
@pytest.mark.shared_crash("chain")
def test_a_chain_killed_mid_batch_resumes_exactly(spark, crashed, tmp_path):
    """The resumed run replays batch 1 from the chain's state and ends with
    the table and changelog of an uninterrupted run (the materializer's
    moves between (name, id) keys are -D/+I pairs that need its state)."""
    run = crashed("chain")
    assert run.status == "committed chain 1", run.status
    report = run.resume(spark)
    assert (report.batches, report.replayed_batches) == (3, 1)
    table = sorted(map(tuple, read_table(run.directory / "table")[KR_COLS].astype(object).values.tolist()))
    assert table == EXPECTED_TABLE
    whole = tmp_path / "whole"
    write_input(whole / "in")
    PIPELINES["normalize_materialize"](spark, [str(whole / p) for p in ("in", "table", "ck", "log")])
    expected = _changelog(whole / "log")
    assert ("-D", 1, "a", 1) in expected and ("+I", 1, "a2", 2) in expected
    assert _changelog(run.directory / "log") == expected


def test_a_replayed_chain_batch_writes_byte_identical_state(spark, tmp_path):
    """The last micro-batch's commit and state files removed, the next run
    replays it from the same state: the chain's state changelog files (both
    links' variables) are written again byte for byte."""
    src = str(tmp_path / "s")
    _debezium_files(src, seed=7, ids=40, per_file=120, files=3)
    out = str(tmp_path / "out")
    assert _run(spark, src, out)[2][0] == 3
    (query,) = checkpoint_module.query_dirs(os.path.join(out, "ck"))
    version = "3"
    state = sorted(glob.glob(os.path.join(query, "state", "*", "*", f"{version}.changelog")))
    first = {p: open(p, "rb").read() for p in state}
    assert len(first) == 2 and min(len(b) for b in first.values()) > 200
    for part in glob.glob(os.path.join(query, "state", "*", "*")):
        _remove(part, version)
    _remove(os.path.join(query, "commits"), "2")
    table = _run(spark, src, out)
    assert table[3].replayed_batches == 1
    assert {p: open(p, "rb").read() for p in state} == first


def _remove(directory, stem: str) -> None:
    """The files named ``stem.*`` or ``stem`` and their hidden ``.crc`` siblings."""
    for name in os.listdir(directory):
        if name.lstrip(".").split(".")[0] == stem:
            os.remove(os.path.join(directory, name))


# -- two normalizes and the join --------------------------------------------------
def _join_script(s1: str, s2: str, out: str) -> str:
    src = ("CREATE TEMPORARY TABLE {n} ({c}, PRIMARY KEY (id) NOT ENFORCED) WITH ('connector' = 'filesystem', "
           "'path' = '{p}', 'format' = 'debezium-json', 'source.max-files-per-trigger' = '1');\n")
    return (src.format(n="s1", c=COLS, p=s1) + src.format(n="s2", c=COLS, p=s2)
            + f"CREATE TEMPORARY TABLE j (id BIGINT, g BIGINT, v BIGINT, g2 BIGINT, v2 BIGINT, "
              f"PRIMARY KEY (id) NOT ENFORCED) WITH ('connector' = 'delta', 'path' = '{out}/j');\n"
            + "INSERT INTO j SELECT s1.id, s1.g, s1.v, s2.g AS g2, s2.v AS v2 FROM s1 JOIN s2 ON s1.id = s2.id;\n")


def _run_join(spark, s1: str, s2: str, out: str, batch: bool = False, key_groups=8):
    """The join script streaming; batch through the Python API with the
    normalizes asked for (a batch plan inserts none)."""
    if batch:
        from spark_changelog.api import read_debezium
        left, right = (read_debezium(spark, s, COLS, ["id"]).normalize(key_groups=8) for s in (s1, s2))
        joined = left.join(right, on=["id"], key_groups=8).select(id="id", g="g", v="v", g2="g0", v2="v0")
        r = joined.write_upsert(os.path.join(out, "j"), key=["id"], changelog_path=os.path.join(out, "log"),
                                key_groups=8)
    else:
        (run,) = run_script(spark, parse_script(_join_script(s1, s2, out)), batch=False,
                            checkpoint=os.path.join(out, "ck"), changelog=os.path.join(out, "log"),
                            key_groups=key_groups, show_progress=False)
        r = run.report
    table = scan_delta(os.path.join(out, "j")).to_pandas()
    cols = sorted(table.columns)
    rows = sorted(map(tuple, table[cols].itertuples(index=False)))
    per_key = {}
    for _, row in read_changelog(os.path.join(out, "log")).iterrows():
        per_key.setdefault(row["id"], []).append(tuple(row[c] for c in ["op"] + cols))
    counters = {op: {k: v for k, v in c.items() if k not in ("seconds", "state_rows")}
                for op, c in r.operators.items()}
    return rows, per_key, (r.batches, r.changes_out, r.upserted, r.deleted, counters), r


@pytest.fixture
def join_sources(tmp_path):
    s1, s2 = str(tmp_path / "s1"), str(tmp_path / "s2")
    final1 = _debezium_files(s1, seed=11, ids=50, per_file=150)
    final2 = _debezium_files(s2, seed=12, ids=50, per_file=150)
    expected = sorted((r["g"], final2[i]["g"], i, r["v"], final2[i]["v"])
                      for i, r in final1.items() if i in final2)
    return s1, s2, expected


@pytest.mark.parametrize("batch", [False, True], ids=["streaming", "batch"])
def test_the_chained_join_equals_the_unchained_join(spark, tmp_path, monkeypatch, join_sources, batch):
    """Both normalizes and the join in one keyed step: the table (columns
    in name order: g, g2, id, v, v2), every key's changelog and the
    counters are the unchained run's."""
    s1, s2, expected = join_sources
    chained = _run_join(spark, s1, s2, str(tmp_path / "chained"), batch)
    with monkeypatch.context() as m:
        _unchained(m)
        plain = _run_join(spark, s1, s2, str(tmp_path / "plain"), batch)
    assert chained[0] == plain[0] == expected and len(expected) > 15
    assert chained[1] == plain[1]
    assert chained[2] == plain[2]
    assert "keyed chain: one keyed step with the ChangelogNormalize(key=[id]) and" in chained[3].plan
    assert "keyed chain" not in plain[3].plan


def test_the_chained_join_is_one_stateful_step_read_packed(spark, tmp_path, join_sources):
    """One ``transformWithStateInPandas`` for the three operators, and each
    source's line task packs its rows for it (one read plan per source)."""
    from spark_changelog.plan import lower as lower_module
    from spark_changelog.sql.translate import Translator
    s1, s2, _ = join_sources
    (planned,) = [p for _, p in Translator(spark, parse_script(_join_script(s1, s2, str(tmp_path / "o"))),
                                           streaming=True).statements() if isinstance(p, list)]
    (insert,) = planned
    low = lower_module.lower(insert.plan())
    plan = low.df._jdf.queryExecution().analyzed().toString()
    assert plan.count("TransformWithStateInPySpark") == 1
    assert plan.count("_packed_rows") >= 2
    assert [op.name for op in low.operators] == ["ChangelogNormalize", "ChangelogNormalize", "RegularJoin"]


@long_only("two streaming runs of the join chain, a rescale of its three links and a whole run")
def test_a_chained_join_checkpoint_rescaled_resumes_exactly(spark, tmp_path, join_sources):
    """The rescale regroups each of the three links by its own group key
    (the left normalize's ``id``, the right one's ``id``, the join's
    ``__jk0``), and the resumed join ends as one uninterrupted run."""
    s1, s2, expected = join_sources
    staged = {n: str(tmp_path / f"staged-{n}") for n in ("s1", "s2")}
    out = str(tmp_path / "out")
    for n, src in (("s1", s1), ("s2", s2)):
        _stage(src, staged[n], 1)
    assert _run_join(spark, staged["s1"], staged["s2"], out, key_groups=None)[2][0] == 1
    ck = os.path.join(out, "ck")
    report = rescale_checkpoint(spark, ck, 4, edit=rescale_fingerprint, quiet_seconds=0)
    shutil.rmtree(report.kept)
    assert [(o.name, o.key) for o in report.operators] == \
        [("ChangelogNormalize", ["id"]), ("ChangelogNormalize", ["id"]), ("RegularJoin", ["__jk0"])]
    assert check_checkpoint(ck, spark).ok
    for n, src in (("s1", s1), ("s2", s2)):
        _stage(src, staged[n], 2)
    rows, per_key, counts, _ = _run_join(spark, staged["s1"], staged["s2"], out, key_groups=None)
    assert counts[0] == 1
    whole = _run_join(spark, s1, s2, str(tmp_path / "whole"), key_groups=None)
    assert rows == whole[0] == expected
    assert per_key == whole[1]


def test_the_materializer_takes_the_normalize_output_unsorted():
    """In a key group the chained materializer gets the normalize's output
    in the order it was emitted (by ``id``, then ``_seq``), not sorted by its
    key ``(g, id)``: an ``id`` that moves to another ``g`` and back has its
    sink key's rows apart, and a float column with NaN passes between the
    links without Arrow's conversion.  Over two batches each sink key's
    changelog, the final table and the state equal the unchained steps'
    (each link's rows sorted by its key)."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    from spark_changelog.model import KIND_COL, SEQ_COL
    from spark_changelog.operators.base import OpContext
    from spark_changelog.operators.normalize import ChangelogNormalize
    from spark_changelog.operators.sink_upsert_materializer import SinkUpsertMaterializer
    from spark_changelog.runtime.keyed_chain import KeyedChain, conform_rows
    from spark_changelog.runtime.keygroup import process_key_group
    from spark_changelog.runtime.state_runs import RunStack

    schema = pa.schema([("id", pa.int64()), ("g", pa.int64()), ("v", pa.float64()),
                        (KIND_COL, pa.int8()), (SEQ_COL, pa.int64())])
    norm = ChangelogNormalize(schema, ["id"])
    mat = SinkUpsertMaterializer(norm.output_schema, ["g", "id"], upsert_key=["id"])
    chain = KeyedChain.linear((norm, mat))
    # (id, g, v, kind, seq): id 1 goes g 5 -> 6 -> 5 (its rows of (5, 1) apart),
    # id 2 is deleted and comes back, v NaN on some rows
    batches = [[(1, 5, 1.0, 0, 1), (2, 7, np.nan, 0, 2), (1, 6, 2.0, 2, 3), (3, 5, 3.0, 0, 4),
                (1, 5, np.nan, 2, 5), (2, 7, np.nan, 3, 6), (2, 5, 4.0, 0, 7)],
               [(1, 6, 5.0, 2, 8), (3, 5, 3.5, 2, 9), (1, 5, 6.0, 2, 10), (2, 5, 4.0, 3, 11)]]
    chained = [RunStack(norm.key), RunStack(mat.key)]
    plain = [RunStack(norm.key), RunStack(mat.key)]
    seqs = {"chained": [0, 0], "plain": [0, 0]}
    outs = {"chained": [], "plain": []}
    for rows in batches:
        frame = pd.DataFrame(rows, columns=schema.names).astype({KIND_COL: np.int8})

        def open_link(i):
            ctx = OpContext(processing_time_ms=0, next_seq=seqs["chained"][i])
            opened[i] = ctx
            return chained[i], ctx
        opened = {}
        # the chain's input as the step gets it: Arrow
        out, ran = chain.process(pa.Table.from_pandas(frame, schema=schema, preserve_index=False), open_link)
        assert ran == [0, 1]
        for i, ctx in opened.items():
            seqs["chained"][i] = ctx.next_seq
        outs["chained"].append(out)
        mid = frame
        for i, op in enumerate((norm, mat)):
            ctx = OpContext(processing_time_ms=0, next_seq=seqs["plain"][i])
            # unchained: through Arrow, in the shuffled order the runtime sorts
            mid = process_key_group(op, plain[i], conform_rows(mid, op.input_schema).iloc[::-1], ctx)
            seqs["plain"][i] = ctx.next_seq
        outs["plain"].append(mid)

    def per_key(frames):
        out = pd.concat(frames, ignore_index=True)
        assert (np.diff(out[SEQ_COL].to_numpy()) > 0).all()
        return {k: [(int(r[KIND_COL]), None if np.isnan(r["v"]) else r["v"]) for _, r in g.iterrows()]
                for k, g in out.groupby(["g", "id"], sort=True)}

    assert per_key(outs["chained"]) == per_key(outs["plain"])
    assert per_key(outs["chained"])[(5, 1)] == [(0, 1.0), (3, 1.0), (0, None), (3, None), (0, 6.0)]

    def state(stack):
        rows = stack.lookup(pd.DataFrame({"g": [5, 5, 5, 6, 7], "id": [1, 2, 3, 1, 2]}))
        return sorted((int(r.g), int(r.id), float(r.v)) for r in rows.itertuples())

    assert state(chained[1]) == [(5, 1, 6.0), (5, 3, 3.5)]
    assert state(plain[1]) == state(chained[1])


def test_a_join_side_reads_its_rows_from_the_union_exactly():
    """A chained join's normalizes get their side's rows picked from the
    union in Arrow: BIGINT values beyond 2**53 arrive exact (the union as
    pandas held them as float64, the other side's rows being null), the
    right side's columns under its input names, in the link's types."""
    import pyarrow as pa

    from spark_changelog.operators.join.regular_join import JoinInputLayout
    from spark_changelog.runtime.keyed_chain import JoinSide

    side_schema = pa.schema([("id", pa.int64()), ("g", pa.int64()), ("_kind", pa.int8()), ("_seq", pa.int64())])
    layout = JoinInputLayout(side_schema, side_schema, ["id"], ["id"])
    big = 2 ** 53 + 1
    union = pa.table({"__jk0": [big, big, 7], "_side": pa.array([0, 1, 0], pa.int8()),
                      "id": [big, None, 7], "g": [big + 2, None, 1], "id0": [None, big, None],
                      "g0": [None, big + 4, None], "_kind": pa.array([0, 2, 0], pa.int8()),
                      "_seq": [1, 2, 3]}, schema=layout.union_schema)
    left = JoinSide(layout, 0, side_schema)(union, [])
    right = JoinSide(layout, 1, side_schema)(union, [])
    assert left.to_dict("list") == {"id": [big, 7], "g": [big + 2, 1], "_kind": [0, 0], "_seq": [1, 3]}
    assert str(left["id"].dtype) == "int64"
    assert right.to_dict("list") == {"id": [big], "g": [big + 4], "_kind": [2], "_seq": [2]}
    assert JoinSide(layout, 1, side_schema)(union.slice(0, 1), []).empty
