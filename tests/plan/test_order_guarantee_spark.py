"""The order guarantee (docs/semantics.md, section 10) on Spark: CDC files that
arrive out of log order, read as a stream one file per micro-batch, give the
same tables as the same changes read in order.

The planner puts a sequence-aware ChangelogNormalize in front of every
order-sensitive operator whose input does not guarantee per-key order (a
streaming source with updates); ``ordered=True`` turns that off, and the first
test shows what it then risks.
"""
from __future__ import annotations

import json
import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_changelog.api import read_debezium
from spark_changelog.sinks.delta import read_table

S1_SCHEMA = "id BIGINT, level BIGINT, name STRING"
S2_SCHEMA = "id BIGINT, attr STRING"


def dbz(op, before, after, lsn):
    return json.dumps({"before": before, "after": after, "op": op,
                       "source": {"connector": "postgresql", "lsn": lsn}})


def write_files(directory, files):
    """``files``: lists of JSON lines; file ``i`` is read ``i``-th (modification
    time order), whatever its name says about its place in the log."""
    os.makedirs(directory, exist_ok=True)
    for i, (name, lines) in enumerate(files):
        path = os.path.join(directory, name)
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.utime(path, (1_700_000_000 + 10 * i, 1_700_000_000 + 10 * i))


def table_rows(path, cols):
    t = read_table(str(path))
    return sorted(tuple(None if v != v else v for v in r) for r in t[cols].astype(object).values.tolist())


@pytest.fixture(scope="module")
def moved_key(tmp_path_factory):
    """Issue example: s1 row 4 moves from level 29 to level 30 (lsn 200), and the
    file holding that move is read before the file holding its insert (lsn 100)."""
    base = tmp_path_factory.mktemp("moved")
    write_files(base / "s2", [("part-0.json", [dbz("c", None, {"id": 29, "attr": "x"}, 10),
                                               dbz("c", None, {"id": 30, "attr": "y"}, 11)])])
    write_files(base / "s1", [
        ("part-2.json", [dbz("u", {"id": 4, "level": 29, "name": "n"},
                             {"id": 4, "level": 30, "name": "n"}, 200)]),
        ("part-1.json", [dbz("c", None, {"id": 4, "level": 29, "name": "n"}, 100),
                         dbz("c", None, {"id": 5, "level": 30, "name": "m"}, 101)]),
    ])
    return base


def seed_join(spark, base, streaming, ordered=False):
    kw = dict(streaming=streaming, max_files_per_trigger=1) if streaming else {}
    s1 = read_debezium(spark, str(base / "s1"), S1_SCHEMA, ["id"], ordered=ordered, **kw)
    s2 = read_debezium(spark, str(base / "s2"), S2_SCHEMA, ["id"], ordered=ordered, **kw)
    return s1.join(s2, on=[("level", "id")], key_groups=2).select("id", "level", "name", "attr")


WANT_MOVED = [(4, 30, "n", "y"), (5, 30, "m", "y")]


def test_out_of_order_files_into_a_join_streaming(spark, moved_key, tmp_path):
    q = seed_join(spark, moved_key, streaming=True)
    text = q.explain(key="id", table="t1")
    assert ("ChangelogNormalize(key=[id], inserted: join needs each key's changes in "
            "source-sequence order") in text
    rep = q.write_upsert(str(tmp_path / "t1"), key="id", checkpoint=str(tmp_path / "ck"))
    assert rep.batches >= 2
    assert table_rows(tmp_path / "t1", ["id", "level", "name", "attr"]) == WANT_MOVED
    # the insert of id 4 (lsn 100) came after its move (lsn 200): dropped and counted
    # (the normalize's counters travel through the join as side rows)
    assert rep.operators["ChangelogNormalize"]["superseded"] == 1
    # batch: the same table, and no normalize is needed (one batch, sorted by _seq)
    b = seed_join(spark, moved_key, streaming=False)
    assert "ChangelogNormalize" not in b.explain(key="id", table="t1")
    b.write_upsert(str(tmp_path / "bt1"), key="id")
    assert table_rows(tmp_path / "bt1", ["id", "level", "name", "attr"]) == WANT_MOVED


def test_declared_ordered_trusts_arrival_and_explain_says_so(spark, moved_key, tmp_path):
    q = seed_join(spark, moved_key, streaming=True, ordered=True)
    text = q.explain(key="id", table="t1")
    assert "ChangelogNormalize" not in text
    assert "ordered=[declared]" in text and "keep stale rows or lose rows" in text
    q.write_upsert(str(tmp_path / "t1"), key="id", checkpoint=str(tmp_path / "ck"))
    # what the check protects against: the older row of id 4 is applied last
    assert table_rows(tmp_path / "t1", ["id", "level", "name", "attr"]) == [
        (4, 29, "n", "x"), (5, 30, "m", "y")]


# --------------------------------------------------------------------------- property

@st.composite
def email_changelogs(draw):
    """Rows ``(id, email, v)``; ids get created, change email and value, and get
    deleted; an email is never reused, so the table keyed by email is determined
    by the final state.  Returns the Debezium lines in log order and the final
    ``{email: (id, email, v)}``."""
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(8, 40))
    alive, lines, version = {}, [], 0
    for lsn in range(1, n + 1):
        i = rnd.randrange(6)
        version += 1
        if i not in alive:
            alive[i] = {"id": i, "email": f"e{i}.{version}", "v": version}
            lines.append(dbz("c", None, alive[i], lsn * 10))
        elif rnd.random() < 0.25:
            lines.append(dbz("d", alive.pop(i), None, lsn * 10))
        else:
            new = {"id": i, "email": alive[i]["email"] if rnd.random() < 0.5 else f"e{i}.{version}",
                   "v": version}
            lines.append(dbz("u", alive[i], new, lsn * 10))
            alive[i] = new
    cuts = sorted(rnd.sample(range(1, len(lines)), min(3, len(lines) - 1)))
    parts = [lines[a:b] for a, b in zip([0] + cuts, cuts + [len(lines)])]
    order = draw(st.permutations(range(len(parts))))
    files = [(f"part-{j}.json", parts[j]) for j in order]          # read in a drawn order
    want = sorted((r["id"], r["email"], r["v"]) for r in alive.values())
    return files, want


_counter = [0]


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(case=email_changelogs())
def test_materializer_pipeline_any_file_order(spark, tmp_path, case):
    """A sink keyed by ``email`` (not the source key): a SinkUpsertMaterializer
    behind the inserted ChangelogNormalize gives the final table of the log
    whatever order its files are read in."""
    files, want = case
    _counter[0] += 1
    base = tmp_path / f"m{_counter[0]}"
    write_files(base / "in", files)
    src = read_debezium(spark, str(base / "in"), "id BIGINT, email STRING, v BIGINT", ["id"],
                        streaming=True, max_files_per_trigger=1)
    rep = src.write_upsert(str(base / "t"), key="email", checkpoint=str(base / "ck"))
    assert "SinkUpsertMaterializer" in rep.plan and "ChangelogNormalize" in rep.plan
    assert table_rows(base / "t", ["id", "email", "v"]) == want
    # every retraction the materializer got matched a row it had (the normalize
    # may count a delete that arrived before its insert: that one is dropped)
    assert rep.operators["sink_upsert_materializer"].get("retract_no_match", 0) == 0
