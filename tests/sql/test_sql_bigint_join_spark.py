"""BIGINT values beyond 2**53 through a regular join on Spark (docs/operators.md,
"BIGINT beyond 2**53"): inner, left, right and full outer joins of two CDC
tables whose non-key BIGINT columns carry 2**53 + 1 and -(2**62) - 3, in
streaming over three micro-batches (the join's rows and state through the
state store, null-padded rows in every outer join) and batch; the print
sink's changelog keeps every digit."""
from __future__ import annotations

import io
from collections import defaultdict

import pytest

from long_variants import LONG
from sql_inputs import source_options, write_changelog
from spark_changelog.sql.runner import run_script
from spark_changelog.sql.script import parse_script

B1, B2, B3 = 2**53 + 1, -(2**62) - 3, -(2**62) - 5
JOINS = {"inner": "JOIN", "left": "LEFT JOIN", "right": "RIGHT JOIN", "full": "FULL JOIN"}


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    base = tmp_path_factory.mktemp("bigint")
    # one file per micro-batch and side; a join key gets rows of one side per batch
    write_changelog(base / "l", ["id", "k", "a"], ["BIGINT", "BIGINT", "BIGINT"],
                    [[("+I", [1, 1, B1], 1), ("+I", [2, 2, B2], 2)],
                     [("-D", [2, 2, B2], 5)],
                     [("-U", [1, 1, B1], 8), ("+U", [1, 1, B3], 9)]])
    write_changelog(base / "r", ["id", "k", "b"], ["BIGINT", "BIGINT", "BIGINT"],
                    [[("+I", [30, 3, B1], 3)],
                     [("+I", [10, 1, B2], 4), ("+I", [11, 1, B1 + 2], 6), ("-D", [30, 3, B1], 7)],
                     [("+I", [40, 4, B1], 10)]])
    return base


def script(base):
    src = lambda t: source_options(base / t) + ", 'source.max-files-per-trigger' = '1'"  # noqa: E731
    sinks = "".join(f"""
CREATE TABLE {how}_out (lk BIGINT, a BIGINT, rk BIGINT, b BIGINT)
  WITH ('connector' = 'print', 'print-identifier' = '{how}');""" for how in JOINS)
    inserts = "".join(f"""
INSERT INTO {how}_out SELECT l.k, l.a, r.k, r.b FROM l {join} r ON l.k = r.k;""" for how, join in JOINS.items())
    return parse_script(f"""
CREATE TABLE l (id BIGINT, k BIGINT, a BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ({src('l')});
CREATE TABLE r (id BIGINT, k BIGINT, b BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ({src('r')});
{sinks}
EXECUTE STATEMENT SET BEGIN
{inserts}
END;
""", "bigint.sql")


def L(kind, lk, a, rk, b):
    """A print sink line: ``kind[lk, a, rk, b]``."""
    return f"{kind}[{', '.join('null' if v is None else str(v) for v in (lk, a, rk, b))}]"


#: per join type and join key, the changelog of the streaming run (three
#: micro-batches), in order (Flink's StreamingJoinOperator)
STREAMING = {
    "inner": {1: [L("+I", 1, B1, 1, B2), L("+I", 1, B1, 1, B1 + 2),
                  L("-U", 1, B1, 1, B2), L("-U", 1, B1, 1, B1 + 2),
                  L("+U", 1, B3, 1, B2), L("+U", 1, B3, 1, B1 + 2)]},
    "left": {1: [L("+I", 1, B1, None, None),
                 L("-D", 1, B1, None, None), L("+I", 1, B1, 1, B2), L("+I", 1, B1, 1, B1 + 2),
                 L("-D", 1, B1, 1, B2), L("-D", 1, B1, 1, B1 + 2),
                 L("+I", 1, B3, 1, B2), L("+I", 1, B3, 1, B1 + 2)],
             2: [L("+I", 2, B2, None, None), L("-D", 2, B2, None, None)]},
    "right": {1: [L("+I", 1, B1, 1, B2), L("+I", 1, B1, 1, B1 + 2),
                  L("-U", 1, B1, 1, B2), L("+I", None, None, 1, B2),
                  L("-U", 1, B1, 1, B1 + 2), L("+I", None, None, 1, B1 + 2),
                  L("-D", None, None, 1, B2), L("+I", 1, B3, 1, B2),
                  L("-D", None, None, 1, B1 + 2), L("+I", 1, B3, 1, B1 + 2)],
              3: [L("+I", None, None, 3, B1), L("-D", None, None, 3, B1)],
              4: [L("+I", None, None, 4, B1)]},
    "full": {1: [L("+I", 1, B1, None, None),
                 L("-D", 1, B1, None, None), L("+I", 1, B1, 1, B2), L("+I", 1, B1, 1, B1 + 2),
                 L("-D", 1, B1, 1, B2), L("+I", None, None, 1, B2),
                 L("-D", 1, B1, 1, B1 + 2), L("+I", None, None, 1, B1 + 2),
                 L("-D", None, None, 1, B2), L("+I", 1, B3, 1, B2),
                 L("-D", None, None, 1, B1 + 2), L("+I", 1, B3, 1, B1 + 2)],
             2: [L("+I", 2, B2, None, None), L("-D", 2, B2, None, None)],
             3: [L("+I", None, None, 3, B1), L("-D", None, None, 3, B1)],
             4: [L("+I", None, None, 4, B1)]},
}
#: per join type, the final table (both runs)
FINAL = {
    "inner": [L("+I", 1, B3, 1, B2), L("+I", 1, B3, 1, B1 + 2)],
    "left": [L("+I", 1, B3, 1, B2), L("+I", 1, B3, 1, B1 + 2)],
    "right": [L("+I", 1, B3, 1, B2), L("+I", 1, B3, 1, B1 + 2), L("+I", None, None, 4, B1)],
    "full": [L("+I", 1, B3, 1, B2), L("+I", 1, B3, 1, B1 + 2), L("+I", None, None, 4, B1)],
}


@pytest.fixture(scope="module", params=[False, True], ids=["streaming", "batch"])
def printed(request, spark, src, tmp_path_factory):
    """(batch, per join type and join key the printed lines in order)."""
    batch, tmp_path, out = request.param, tmp_path_factory.mktemp("out"), io.StringIO()
    run_script(spark, script(src), batch=batch, checkpoint=None if batch else str(tmp_path / "ck"),
               key_groups=2, show_progress=False, out=out)
    by_key = {how: defaultdict(list) for how in JOINS}
    for line in out.getvalue().splitlines():
        how, row = line.split("> ", 1)
        lk, _, rk, _ = row[3:-1].split(", ")
        by_key[how][int(lk if lk != "null" else rk)].append(row)
    return batch, {how: dict(keys) for how, keys in by_key.items()}


def final_table(lines):
    table = []
    for line in lines:
        row = "+I" + line[2:]
        if line[:2] in ("+I", "+U"):
            table.append(row)
        else:
            table.remove(row)
    return sorted(table)


@pytest.mark.parametrize("how", list(JOINS))
def test_join_keeps_bigint_digits_in_its_changelog(printed, how):
    batch, got = printed
    if not batch:
        assert got[how] == STREAMING[how]
    assert final_table([r for rows in got[how].values() for r in rows]) == sorted(FINAL[how])
