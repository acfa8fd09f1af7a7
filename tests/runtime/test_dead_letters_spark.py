"""Bad input of every source reaches the dead-letter directory and the report,
whatever operators follow (issue #8): the readers emit dead letters and skipped
records as side rows of their one pass over the files, the join carries them,
the sink handler writes and counts them before the batch's data."""
from __future__ import annotations

import json
import os

import pytest

from spark_changelog.api import read_debezium
from spark_changelog.connectors.cdc_json import InvalidChangeError
from spark_changelog.connectors.dead_letter import read_dead_letter
from spark_changelog.sinks.delta import read_table


def ev(op, before, after, lsn):
    return json.dumps({"before": before, "after": after, "op": op, "source": {"lsn": lsn}})


def write(directory, name, lines):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "w") as fh:
        fh.write("\n".join(lines) + "\n")


def make_input(root):
    """s1(id, k, name) and s2(id, attr), two files each; bad lines on both sides."""
    s1, s2 = os.path.join(root, "s1"), os.path.join(root, "s2")
    write(s1, "s1-1.json", [
        ev("c", None, {"id": 1, "k": 10, "name": "a"}, 100),
        '{"before":null,"after":{"id":2,"k":20,"na',                          # line 2: truncated
        ev("c", None, {"id": 3, "k": 10, "name": "c"}, 120),
    ])
    write(s1, "s1-2.json", [
        ev("u", {"id": 1, "k": 10, "name": "a"}, {"id": 1, "k": 20, "name": "a2"}, 200),
        "",                                                                   # line 2: tombstone
        ev("c", None, {"id": 4, "k": "x", "name": "d"}, 220),                 # line 3: wrong type
    ])
    write(s2, "s2-1.json", [
        ev("c", None, {"id": 10, "attr": "ten"}, 110),
        ev("c", None, {"id": 20, "attr": "twenty"}, 130),
        ev("c", None, {"id": None, "attr": "nokey"}, 140),                    # line 3: null key
    ])
    write(s2, "s2-2.json", [
        '{"op":"u","after":',                                                 # line 1: truncated
        ev("d", {"id": 10, "attr": "ten"}, None, 210),
    ])
    return s1, s2


EXPECTED_DEAD = [
    ("s1-1.json", 2, "malformed JSON: the record does not parse"),
    ("s1-2.json", 3, "field 'k': value \"x\" is not a BIGINT (in 'after')"),
    ("s2-1.json", 3, "field 'id': primary key is missing or null (in 'after')"),
    ("s2-2.json", 1, "malformed JSON: the record does not parse"),
]


def joined(spark, s1, s2, streaming):
    kw = dict(streaming=streaming, max_files_per_trigger=1) if streaming else {}
    left = read_debezium(spark, s1, "id BIGINT, k BIGINT, name STRING", ["id"], **kw)
    right = read_debezium(spark, s2, "id BIGINT, attr STRING", ["id"], **kw)
    return left.join(right, on=[("k", "id")]).select("id", "name", "attr")


@pytest.mark.parametrize("streaming", [False, True], ids=["batch", "streaming"])
def test_join_of_two_readers_dead_letters_each_bad_line_once(spark, tmp_path, streaming):
    s1, s2 = make_input(str(tmp_path / "in"))
    dl = str(tmp_path / "dl")
    report = joined(spark, s1, s2, streaming).write_upsert(
        str(tmp_path / "table"), key="id", dead_letter=dl, key_groups=4,
        checkpoint=str(tmp_path / "ck") if streaming else None)
    dead = sorted((os.path.basename(r["file"]), r["line"], r["reason"]) for r in read_dead_letter(dl))
    assert dead == EXPECTED_DEAD
    assert report.invalid == 4 and report.tombstones_skipped == 1 and report.ignored_skipped == 0
    raws = {(os.path.basename(r["file"]), r["line"]): r["raw"] for r in read_dead_letter(dl)}
    assert raws[("s2-2.json", 1)] == '{"op":"u","after":'
    # the good rows still join: id 1 moved to k=20 (twenty), id 3 lost k=10 (deleted)
    table = read_table(str(tmp_path / "table")).sort_values("id")
    assert table[["id", "name", "attr"]].values.tolist() == [[1, "a2", "twenty"]]


@pytest.mark.parametrize("streaming", [False, True], ids=["batch", "streaming"])
def test_strict_names_file_line_and_field_before_writing(spark, tmp_path, streaming):
    s1, s2 = make_input(str(tmp_path / "in"))
    with pytest.raises(InvalidChangeError) as err:
        joined(spark, s1, s2, streaming).write_upsert(
            str(tmp_path / "table"), key="id", strict=True, key_groups=4,
            checkpoint=str(tmp_path / "ck") if streaming else None)
    assert "s1-1.json line 2: malformed JSON" in str(err.value)
    # the first batch holds the first bad line: nothing was written
    assert not os.path.exists(str(tmp_path / "table"))
