"""Mistakes a person makes, and what they get back (docs/errors.md): for each,
the exact first line of the message, the exit code, and what is on disk
afterwards (nothing half-written).

One table, three groups by cost: mistakes caught before Spark starts (most),
mistakes that need the test session (planning, a batch run, a streaming
checkpoint), and Ctrl-C sent to a real ``spark-changelog run`` process during
a micro-batch."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable

import pytest

from long_variants import LONG
from spark_changelog.cli import main

# --------------------------------------------------------------------------- inputs

LINES = [
    {"before": None, "after": {"id": 1, "name": "ann", "amount": 10}, "op": "c", "source": {"lsn": 1}},
    {"before": None, "after": {"id": 2, "name": "bob", "amount": 20}, "op": "c", "source": {"lsn": 2}},
    {"before": {"id": 1, "name": "ann", "amount": 10}, "after": {"id": 1, "name": "ann", "amount": 15},
     "op": "u", "source": {"lsn": 3}},
]
BAD_LINE = '{"before": null, "after": {"id": 3, "name": "cy", "amount": 1}, "op": "x", "source": {"lsn": 4}}'


def debezium_input(d, lines=LINES, extra=()) -> str:
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "part-0.json"), "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
        for raw in extra:
            f.write(raw + "\n")
    return str(d)


def source_ddl(path, name="src") -> str:
    return (f"CREATE TABLE {name} (id BIGINT, name STRING, amount BIGINT, PRIMARY KEY (id) NOT "
            f"ENFORCED)\n  WITH ('connector' = 'filesystem', 'path' = '{path}', "
            "'format' = 'debezium-json');\n")


def delta_ddl(path, columns="id BIGINT, name STRING, amount BIGINT", key="id", name="out") -> str:
    return (f"CREATE TABLE {name} ({columns}, PRIMARY KEY ({key}) NOT ENFORCED)\n"
            f"  WITH ('connector' = 'delta', 'path' = '{path}');\n")


def script(tmp, text: str, name="job.sql") -> str:
    p = os.path.join(tmp, name)
    with open(p, "w") as f:
        f.write(text)
    return p


def tree(path) -> list:
    """Every file under ``path`` (relative), for "nothing was written"."""
    if not os.path.exists(path):
        return []
    if os.path.isfile(path):
        return ["<file>"]
    return sorted(os.path.relpath(os.path.join(d, f), path)
                  for d, _, files in os.walk(path) for f in files)


# --------------------------------------------------------------------------- the table


@dataclasses.dataclass
class Mistake:
    name: str
    #: tmp -> (argv, {placeholder: value} for the expected line, check of the disk afterwards)
    setup: Callable
    first_line: str
    exit_code: int
    spark: bool = False
    root_only: bool = False
    #: more lines the output must contain (e.g. what was already written)
    also: tuple = ()


def _with_input(tmp):
    return debezium_input(os.path.join(tmp, "in"))


def missing_script(tmp):
    return ["run", f"{tmp}/nope.sql", "--batch"], {}, None


def no_mode(tmp):
    p = script(tmp, source_ddl(_with_input(tmp)) + delta_ddl(f"{tmp}/out")
               + "INSERT INTO out SELECT * FROM src;\n")
    return ["run", p], {}, lambda: tree(f"{tmp}/out") == []


def sql_syntax(tmp):
    p = script(tmp, "CREATE TABLE a (id INT) WITH ('connector' = 'print');\n"
                    "INSERT INTO a SELECT id FROM b ON CONFLICT DO UPDATE;\n")
    return ["run", p, "--batch"], {"p": p}, None


def unknown_connector(tmp):
    p = script(tmp, "CREATE TABLE a (id INT) WITH ('connector' = 'rabbitmq');\n")
    return ["explain", p], {"p": p}, None


def filesystem_without_path(tmp):
    p = script(tmp, "CREATE TABLE a (id INT) WITH ('connector' = 'filesystem', "
                    "'format' = 'json');\n")
    return ["explain", p], {"p": p}, None


def wrong_input_path(tmp):
    p = script(tmp, source_ddl(f"{tmp}/nope") + delta_ddl(f"{tmp}/out")
               + "INSERT INTO out SELECT * FROM src;\n")
    return ["run", p, "--batch"], {"p": p, "tmp": tmp}, lambda: tree(f"{tmp}/out") == []


def wrong_input_path_explain(tmp):
    p = script(tmp, source_ddl(f"{tmp}/nope") + delta_ddl(f"{tmp}/out")
               + "INSERT INTO out SELECT * FROM src;\n")
    return ["explain", p], {"p": p, "tmp": tmp}, None


def sink_path_is_a_file(tmp):
    with open(f"{tmp}/out", "w") as f:
        f.write("keep me")
    p = script(tmp, source_ddl(_with_input(tmp)) + delta_ddl(f"{tmp}/out")
               + "INSERT INTO out SELECT * FROM src;\n")
    return (["run", p, "--batch"], {"p": p, "tmp": tmp},
            lambda: open(f"{tmp}/out").read() == "keep me")


def sink_path_under_a_file(tmp):
    with open(f"{tmp}/afile", "w") as f:
        f.write("x")
    p = script(tmp, source_ddl(_with_input(tmp)) + delta_ddl(f"{tmp}/afile/out")
               + "INSERT INTO out SELECT * FROM src;\n")
    return ["run", p, "--batch"], {"p": p, "tmp": tmp}, lambda: tree(f"{tmp}/afile") == ["<file>"]


def checkpoint_is_a_file(tmp):
    with open(f"{tmp}/ck", "w") as f:
        f.write("x")
    p = script(tmp, source_ddl(_with_input(tmp)) + delta_ddl(f"{tmp}/out")
               + "INSERT INTO out SELECT * FROM src;\n")
    return ["run", p, "--checkpoint", f"{tmp}/ck"], {"tmp": tmp}, \
        lambda: tree(f"{tmp}/out") == []


def dead_letter_is_a_file(tmp):
    with open(f"{tmp}/bad", "w") as f:
        f.write("x")
    p = script(tmp, source_ddl(_with_input(tmp)) + delta_ddl(f"{tmp}/out")
               + "INSERT INTO out SELECT * FROM src;\n")
    return ["run", p, "--batch", "--dead-letter", f"{tmp}/bad"], {"tmp": tmp}, \
        lambda: tree(f"{tmp}/out") == []


def late_output_is_a_file(tmp):
    with open(f"{tmp}/late", "w") as f:
        f.write("x")
    p = script(tmp, source_ddl(_with_input(tmp)) + delta_ddl(f"{tmp}/out")
               + "INSERT INTO out SELECT * FROM src;\n")
    return ["run", p, "--batch", "--late-output", f"{tmp}/late"], {"tmp": tmp}, None


def conf_without_value(tmp):
    p = script(tmp, source_ddl(_with_input(tmp)) + delta_ddl(f"{tmp}/out")
               + "INSERT INTO out SELECT * FROM src;\n")
    return ["--conf", "spark.sql.shuffle.partitions", "run", p, "--batch"], {}, \
        lambda: tree(f"{tmp}/out") == []


def cat_missing_table(tmp):
    return ["cat", f"{tmp}/nope"], {"tmp": tmp}, None


def cat_not_a_table(tmp):
    os.makedirs(f"{tmp}/plain")
    return ["cat", f"{tmp}/plain"], {"tmp": tmp}, None


def normalize_missing_input(tmp):
    return (["normalize", f"{tmp}/nope", f"{tmp}/out", "--format", "debezium-json", "--key", "id",
             "--schema", "id BIGINT"], {"tmp": tmp}, lambda: tree(f"{tmp}/out") == [])


def normalize_streaming_without_checkpoint(tmp):
    return (["normalize", _with_input(tmp), f"{tmp}/out", "--format", "debezium-json", "--key",
             "id", "--schema", "id BIGINT", "--streaming"], {}, None)


def normalize_output_is_a_file(tmp):
    with open(f"{tmp}/out", "w") as f:
        f.write("x")
    return (["normalize", _with_input(tmp), f"{tmp}/out", "--format", "debezium-json", "--key",
             "id", "--schema", "id BIGINT"], {"tmp": tmp}, lambda: tree(f"{tmp}/out") == ["<file>"])


def read_only_sink(tmp):
    """A sink on a read-only file system (a tmpfs mounted read-only)."""
    mnt = f"{tmp}/ro"
    os.makedirs(mnt)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", mnt], check=True)
    p = script(tmp, source_ddl(_with_input(tmp)) + delta_ddl(f"{mnt}/out")
               + "INSERT INTO out SELECT * FROM src;\n")
    return ["run", p, "--batch"], {"p": p, "tmp": tmp}, lambda: tree(mnt) == []


def full_disk_sink(tmp):
    """A sink on a full disk (a 1 MB tmpfs filled up)."""
    mnt = f"{tmp}/full"
    os.makedirs(mnt)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt], check=True)
    with open(f"{mnt}/filler", "wb") as f:
        try:
            f.write(b"\0" * (2 << 20))
        except OSError:
            pass
    p = script(tmp, source_ddl(_with_input(tmp)) + delta_ddl(f"{mnt}/out")
               + "INSERT INTO out SELECT * FROM src;\n")
    return ["run", p, "--batch"], {"p": p, "tmp": tmp}, lambda: tree(mnt) == ["filler"]


PRE_SPARK = [
    Mistake("script file missing", missing_script,
            "error: cannot read {tmp}/nope.sql: No such file or directory", 1),
    Mistake("run without --batch or --checkpoint", no_mode,
            "error: give --batch (one batch job) or --checkpoint DIR (a resumable streaming query)",
            2),
    Mistake("SQL syntax", sql_syntax,
            "error: {p}:2:47: Expected DEDUPLICATE, ERROR or NOTHING after ON CONFLICT DO", 2),
    Mistake("unknown connector", unknown_connector,
            "not supported: {p}:1:31: table a: unknown connector 'rabbitmq': expected one of "
            "filesystem, kafka, postgres-cdc, delta, jdbc, postgres, print, blackhole", 3),
    Mistake("filesystem source without a path", filesystem_without_path,
            "error: {p}:1:31: table a: connector 'filesystem' needs 'path'", 2),
    Mistake("wrong input path", wrong_input_path,
            "error: {p}:2:46: table src: input path {tmp}/nope does not exist (nearest existing "
            "directory: {tmp}) (check the table's 'path')", 1),
    Mistake("wrong input path, explain", wrong_input_path_explain,
            "error: {p}:2:46: table src: input path {tmp}/nope does not exist (nearest existing "
            "directory: {tmp}) (check the table's 'path')", 1),
    Mistake("sink path is a file", sink_path_is_a_file,
            "error: {p}:4:41: table out: sink path {tmp}/out is a file, not a directory (give the "
            "table a 'path' that can be written)", 1),
    Mistake("sink path under a file", sink_path_under_a_file,
            "error: {p}:4:41: table out: sink path {tmp}/afile/out cannot be created: "
            "{tmp}/afile is a file, not a directory (give the table a 'path' that can be written)",
            1),
    Mistake("checkpoint is a file", checkpoint_is_a_file,
            "error: --checkpoint: {tmp}/ck is a file, not a directory", 1),
    Mistake("dead-letter directory is a file", dead_letter_is_a_file,
            "error: --dead-letter: {tmp}/bad is a file, not a directory", 1),
    Mistake("late-output directory is a file", late_output_is_a_file,
            "error: --late-output: {tmp}/late is a file, not a directory", 1),
    Mistake("--conf without a value", conf_without_value,
            "error: --conf spark.sql.shuffle.partitions: expected KEY=VALUE", 2),
    Mistake("cat of a missing table", cat_missing_table,
            "error: cannot print table: {tmp}/nope does not exist (nearest existing directory: "
            "{tmp})", 1),
    Mistake("cat of a directory that is no table", cat_not_a_table,
            "error: cannot print table: {tmp}/plain is neither a Delta table (no _delta_log "
            "directory) nor a changelog output (no _schema.arrow)", 1),
    Mistake("normalize: missing input", normalize_missing_input,
            "error: input path {tmp}/nope does not exist (nearest existing directory: {tmp})", 1),
    Mistake("normalize --streaming without --checkpoint", normalize_streaming_without_checkpoint,
            "error: --streaming needs --checkpoint DIR", 2),
    Mistake("normalize: output is a file", normalize_output_is_a_file,
            "error: output: {tmp}/out is a file, not a directory", 1),
    Mistake("sink on a read-only file system", read_only_sink,
            "error: {p}:4:41: table out: sink path {tmp}/ro/out cannot be created: {tmp}/ro is "
            "on a read-only file system (give the table a 'path' that can be written)", 1,
            root_only=True),
    Mistake("sink on a full disk", full_disk_sink,
            "error: {p}:4:41: table out: sink path {tmp}/full/out is on a full disk (0 bytes free "
            "on the device of {tmp}/full) (give the table a 'path' that can be written)", 1,
            root_only=True),
]


@pytest.fixture
def tmp(tmp_path):
    yield str(tmp_path)
    for mnt in ("ro", "full"):
        if os.path.ismount(tmp_path / mnt):
            subprocess.run(["umount", str(tmp_path / mnt)], check=False)


def check(m: Mistake, tmp, capsys) -> str:
    if m.root_only and os.geteuid() != 0:
        pytest.skip("mounts a tmpfs (needs root)")
    argv, values, disk = m.setup(tmp)
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    # the message starts at its label (summaries of finished INSERTs come first)
    lines = [line for line in err.splitlines()
             if line.startswith(("error: ", "not supported: ", "interrupted: "))]
    assert lines, err
    assert lines[0] == m.first_line.format(**{"tmp": tmp, **values}), err
    assert code == m.exit_code, err
    assert "Traceback" not in err
    for line in m.also:
        assert line.format(**{"tmp": tmp, **values}) in err.splitlines(), err
    if disk is not None:
        assert disk(), f"on disk after {m.name!r}: unexpected state"
    return err


@pytest.mark.parametrize("m", PRE_SPARK, ids=[m.name for m in PRE_SPARK])
def test_mistake_caught_before_spark_starts(m, tmp, capsys):
    check(m, tmp, capsys)


# --------------------------------------------------------------------------- with Spark

INSERT_ALL = "INSERT INTO out SELECT id, name, amount FROM src;\n"


def string_into_bigint(tmp, command="run"):
    p = script(tmp, source_ddl(_with_input(tmp)) + delta_ddl(f"{tmp}/out", "id BIGINT, name BIGINT")
               + "INSERT INTO out SELECT id, name FROM src;\n")
    argv = ["run", p, "--batch"] if command == "run" else ["explain", p]
    return argv, {"p": p}, lambda: tree(f"{tmp}/out") == []


def unknown_table(tmp):
    p = script(tmp, source_ddl(_with_input(tmp)) + delta_ddl(f"{tmp}/out")
               + "INSERT INTO out SELECT id, name, amount FROM srcs;\n")
    return ["run", p, "--batch"], {"p": p}, lambda: tree(f"{tmp}/out") == []


def unknown_column(tmp):
    p = script(tmp, source_ddl(_with_input(tmp)) + delta_ddl(f"{tmp}/out")
               + "INSERT INTO out SELECT id, nam, amount FROM src;\n")
    return ["run", p, "--batch"], {"p": p}, lambda: tree(f"{tmp}/out") == []


def cast_fails_at_run_time(tmp):
    p = script(tmp, source_ddl(_with_input(tmp)) + delta_ddl(f"{tmp}/out")
               + "INSERT INTO out SELECT id, name, CAST(name AS BIGINT) AS amount FROM src;\n")
    return ["run", p, "--batch"], {"p": p}, lambda: tree(f"{tmp}/out") == []


def strict_bad_record(tmp):
    src = debezium_input(f"{tmp}/in", extra=[BAD_LINE])
    p = script(tmp, source_ddl(src) + delta_ddl(f"{tmp}/out") + INSERT_ALL)
    return ["run", p, "--batch", "--strict"], {"src": src}, lambda: tree(f"{tmp}/out") == []


def bad_record_without_dead_letter(tmp):
    src = debezium_input(f"{tmp}/in", extra=[BAD_LINE])
    p = script(tmp, source_ddl(src) + delta_ddl(f"{tmp}/out") + INSERT_ALL)
    return ["run", p, "--batch"], {"p": p, "src": src}, lambda: tree(f"{tmp}/out") == []


def existing_table_of_other_columns(tmp):
    import pandas as pd
    from deltalake import write_deltalake
    write_deltalake(f"{tmp}/out", pd.DataFrame({"id": [9], "label": ["x"]}))
    before = tree(f"{tmp}/out")
    p = script(tmp, source_ddl(_with_input(tmp)) + delta_ddl(f"{tmp}/out") + INSERT_ALL)
    return ["run", p, "--batch"], {"p": p}, lambda: tree(f"{tmp}/out") == before


def second_insert_fails(tmp):
    import pandas as pd
    from deltalake import write_deltalake
    write_deltalake(f"{tmp}/b", pd.DataFrame({"id": [9], "label": ["x"]}))
    before = tree(f"{tmp}/b")
    p = script(tmp, source_ddl(_with_input(tmp)) + delta_ddl(f"{tmp}/a", name="a")
               + delta_ddl(f"{tmp}/b", name="b")
               + "INSERT INTO a SELECT id, name, amount FROM src;\n"
               + "INSERT INTO b SELECT id, name, amount FROM src;\n")
    return (["run", p, "--batch", "--no-progress"], {"p": p},
            lambda: tree(f"{tmp}/b") == before and "_delta_log/00000000000000000000.json"
            in tree(f"{tmp}/a"))


def explain_without_insert(tmp):
    p = script(tmp, source_ddl(_with_input(tmp)))
    return ["explain", p], {"p": p}, None


def postgres_unreachable(tmp):
    p = script(tmp, source_ddl(_with_input(tmp))
               + "CREATE TABLE out (id BIGINT, name STRING, amount BIGINT, PRIMARY KEY (id) NOT "
                 "ENFORCED)\n  WITH ('connector' = 'jdbc', 'url' = "
                 "'jdbc:postgresql://127.0.0.1:9/nodb', 'username' = 'u', 'sink.max-retries' = '1');\n"
               + INSERT_ALL)
    return ["run", p, "--batch"], {"p": p}, None


def value_not_a_bigint(tmp):
    line = {"before": None, "after": {"id": 3, "name": "cy", "amount": 50.5}, "op": "c",
            "source": {"lsn": 4}}
    src = debezium_input(f"{tmp}/in", lines=LINES + [line])
    p = script(tmp, source_ddl(src) + delta_ddl(f"{tmp}/out") + INSERT_ALL)
    return ["run", p, "--batch", "--strict"], {"src": src}, lambda: tree(f"{tmp}/out") == []


def sum_overflows(tmp):
    big = 9_000_000_000_000_000_000
    src = debezium_input(f"{tmp}/in", lines=[
        {"before": None, "after": {"id": i, "name": "ann", "amount": big}, "op": "c",
         "source": {"lsn": i}} for i in (1, 2)])
    p = script(tmp, source_ddl(src) + GROUPED.format(out=f"{tmp}/out"))
    return ["run", p, "--batch"], {"p": p}, lambda: tree(f"{tmp}/out") == []


WITH_SPARK = [
    Mistake("50.5 into a BIGINT column under --strict", value_not_a_bigint,
            "error: invalid change record in file:{src}/part-0.json line 4: field 'amount': "
            "value 50.5 is not a BIGINT (in 'after'); record: {{\"before\": null, \"after\": "
            "{{\"id\": 3, \"name\": \"cy\", \"amount\": 50.5}}, \"op\": \"c\", \"source\": "
            "{{\"lsn\": 4}}}}", 1, spark=True),
    Mistake("SUM over BIGINT overflows", sum_overflows,
            "error: INSERT INTO totals ({p} line 5): SUM(amount) overflows BIGINT in group "
            "(name=ann): the result does not fit its type (Flink would wrap an integer around or "
            "emit null for a DECIMAL; we stop rather than change the value, docs/operators.md, "
            "\"DECIMAL\")", 1, spark=True,
            also=("  what to do: CAST the argument to a wider type (BIGINT for an INT, "
                  "DECIMAL(38, 0) for a BIGINT) so the result fits, or filter the rows",)),
    Mistake("STRING into a BIGINT sink column", string_into_bigint,
            "error: {p}:5:1: INSERT INTO out: column name is STRING in the query but BIGINT in "
            "the table, and STRING values cannot be stored as BIGINT (CAST it in the SELECT, or "
            "declare the column STRING)", 2, spark=True),
    Mistake("STRING into a BIGINT sink column, explain",
            lambda tmp: string_into_bigint(tmp, "explain"),
            "error: {p}:5:1: INSERT INTO out: column name is STRING in the query but BIGINT in "
            "the table, and STRING values cannot be stored as BIGINT (CAST it in the SELECT, or "
            "declare the column STRING)", 2, spark=True),
    Mistake("unknown table", unknown_table,
            "error: {p}:5:46: unknown table or view 'srcs' (defined: src, out)", 2, spark=True),
    Mistake("unknown column", unknown_column,
            "error: {p}:5:28: unknown column 'nam' (available: src.id, src.name, src.amount)", 2, spark=True),
    Mistake("a CAST that fails at run time", cast_fails_at_run_time,
            "error: INSERT INTO out ({p} line 5): CAST(`name` AS BIGINT) failed: the STRING "
            "value 'ann' is not a valid BIGINT", 1, spark=True,
            also=("  what to do: fix the input, or write TRY_CAST(... AS BIGINT) to get NULL for "
                  "values that cannot be cast",)),
    Mistake("an invalid record under --strict", strict_bad_record,
            "error: invalid change record in file:{src}/part-0.json line 4: field 'op': unknown "
            "value \"x\" (expected c, r, u or d); record: "
            + BAD_LINE.replace("{", "{{").replace("}", "}}"), 1, spark=True),
    Mistake("an invalid record and no --dead-letter", bad_record_without_dead_letter,
            "error: INSERT INTO out ({p} line 5): 1 invalid input row(s) and no dead-letter "
            "directory; the first: {src}/part-0.json:4: field 'op': unknown value \"x\" "
            "(expected c, r, u or d)", 1, spark=True),
    Mistake("a sink table not written by spark-changelog", existing_table_of_other_columns,
            "error: INSERT INTO out ({p} line 5): Delta table at '{tmp}/out' has no primary key "
            "recorded (table property 'spark_changelog.primary_key'); it was not created by "
            "DeltaUpsertSink. Pass adopt_existing=True to record key ['id'] in it.", 1,
            spark=True),
    Mistake("the second INSERT fails", second_insert_fails,
            "error: INSERT INTO b ({p} line 8): Delta table at '{tmp}/b' has no primary key "
            "recorded (table property 'spark_changelog.primary_key'); it was not created by "
            "DeltaUpsertSink. Pass adopt_existing=True to record key ['id'] in it.", 1,
            spark=True, also=("== INSERT INTO a ==", "table: 2 upserted, 0 deleted",
                              "  already written: INSERT INTO a (line 7), finished",
                              "  nothing of this INSERT was written")),
    Mistake("explain of a script without INSERT", explain_without_insert,
            "error: {p} has no INSERT INTO or EXPLAIN statement", 2, spark=True),
    Mistake("PostgreSQL sink unreachable", postgres_unreachable,
            "error: INSERT INTO out ({p} line 5): cannot reach PostgreSQL: connection failed: "
            "connection to server at \"127.0.0.1\", port 9 failed: Connection refused", 1,
            spark=True),
]


@pytest.mark.parametrize("m", WITH_SPARK, ids=[m.name for m in WITH_SPARK])
def test_mistake_with_spark(m, spark, tmp, capsys):
    check(m, tmp, capsys)


# --------------------------------------------------------------------------- checkpoints

FILTERED = "INSERT INTO out SELECT id, name, amount FROM src WHERE amount > {bound};\n"
GROUPED = ("CREATE TABLE totals (name STRING, total BIGINT, PRIMARY KEY (name) NOT ENFORCED)\n"
           "  WITH ('connector' = 'delta', 'path' = '{out}');\n"
           "INSERT INTO totals SELECT name, SUM(amount) AS total FROM src GROUP BY name;\n")


def streaming_project(tmp, bound=0):
    """A streaming job run once: its checkpoint and table exist."""
    src = _with_input(tmp)
    p = script(tmp, source_ddl(src) + delta_ddl(f"{tmp}/out") + FILTERED.format(bound=bound))
    assert main(["run", p, "--checkpoint", f"{tmp}/ck", "--no-progress"]) == 0
    return p


def checkpoint_state_changed(tmp):
    """The same checkpoint, now a GROUP BY: its state cannot follow."""
    streaming_project(tmp)
    before = tree(f"{tmp}/out")
    p = script(tmp, source_ddl(f"{tmp}/in") + GROUPED.format(out=f"{tmp}/out"), "v2.sql")
    return (["run", p, "--checkpoint", f"{tmp}/ck", "--no-progress"], {},
            lambda: tree(f"{tmp}/out") == before)


def checkpoint_moved(tmp):
    """A project directory (inputs, checkpoint, table) copied elsewhere."""
    os.makedirs(f"{tmp}/a")
    streaming_project(f"{tmp}/a")
    shutil.copytree(f"{tmp}/a", f"{tmp}/b")
    shutil.rmtree(f"{tmp}/a")
    p = script(f"{tmp}/b", source_ddl(f"{tmp}/b/in") + delta_ddl(f"{tmp}/b/out")
               + FILTERED.format(bound=0))
    before = tree(f"{tmp}/b/out")
    return (["run", p, "--checkpoint", f"{tmp}/b/ck", "--no-progress"], {"p": p},
            lambda: tree(f"{tmp}/b/out") == before)


#: the stateful lines of CLICKS_DEDUP's plan fingerprint as spark-changelog
#: wrote them before event-time deduplication folded the sources' watermark
#: rows (commit 24ab69c; recorded from a run of the code before it)
EARLIER_DEDUP_STATE = [
    "Sink(table=[*], primaryKey=[u], upsertMaterialize=[false]) input columns=[['u', 'url', 't']] "
    "key groups=32",
    "Deduplicate(keep=[FirstRow], key=[u], order=[ROWTIME(rt)]) input columns=[['u', 'url', 't', "
    "'rt']]",
    "Source(name=[clicks], fields=[u, url, t], primaryKey=[]) columns=['u', 'url', 't']"]
#: the same for CLICKS_CONFLICT (planned by the code before 24ab69c)
EARLIER_CONFLICT_STATE = [
    "Sink(table=[*], primaryKey=[u], upsertMaterialize=[true], conflictStrategy=[NOTHING]) input "
    "columns=[['u', 'url', 't']]",
    "SinkUpsertMaterializer(key=[u], upsertKey=[u, url], conflictStrategy=[NOTHING]) input "
    "columns=[['u', 'url', 't']]",
    "GroupAggregate(groupBy=[u, url], select=[u, url, MAX(t) AS t]) input columns=[['u', 'url', "
    "'t', 'rt']]",
    "Source(name=[clicks], fields=[u, url, t], primaryKey=[]) columns=['u', 'url', 't']"]
CLICKS = """CREATE TABLE clicks (u STRING, url STRING, t BIGINT, rt AS TO_TIMESTAMP_LTZ(t, 3),
  WATERMARK FOR rt AS rt - INTERVAL '1' SECOND
) WITH ('connector' = 'filesystem', 'path' = '{tmp}/in', 'format' = 'json');
CREATE TABLE out (u STRING, url STRING, t BIGINT, PRIMARY KEY (u) NOT ENFORCED)
  WITH ('connector' = 'delta', 'path' = '{tmp}/out');
"""
CLICKS_DEDUP = CLICKS + """INSERT INTO out SELECT u, url, t FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY u ORDER BY rt ASC) AS rn FROM clicks) WHERE rn = 1;
"""
CLICKS_CONFLICT = CLICKS + """INSERT INTO out SELECT u, url, MAX(t) AS t FROM clicks
  GROUP BY u, url ON CONFLICT DO NOTHING;
"""


def _earlier_event_time_checkpoint(tmp, text: str, stateful: list):
    """A checkpoint of the same script, written by the version whose
    event-time operators kept their state in Spark's event-time timers: its
    fingerprint as that version wrote it, one committed batch."""
    import hashlib
    os.makedirs(f"{tmp}/in")
    with open(f"{tmp}/in/part-0.json", "w") as f:
        f.write(json.dumps({"u": "u1", "url": "/a", "t": 10000}) + "\n")
    p = script(tmp, text.format(tmp=tmp))
    ck = f"{tmp}/ck/query"
    os.makedirs(f"{ck}/main/commits")
    with open(f"{ck}/main/commits/0", "w") as f:
        f.write("v1\n{}\n")
    with open(f"{ck}/plan-fingerprint.json", "w") as f:
        state = hashlib.sha256("\n".join(stateful).encode()).hexdigest()
        json.dump({"version": 1, "state": state, "full": state, "stateful": stateful,
                   "plan": []}, f)
    return (["run", p, "--checkpoint", f"{tmp}/ck", "--no-progress"], {},
            lambda: not os.path.exists(f"{tmp}/out"))


def checkpoint_of_earlier_event_time_dedup(tmp):
    return _earlier_event_time_checkpoint(tmp, CLICKS_DEDUP, EARLIER_DEDUP_STATE)


def checkpoint_of_earlier_on_conflict(tmp):
    return _earlier_event_time_checkpoint(tmp, CLICKS_CONFLICT, EARLIER_CONFLICT_STATE)


EARLIER_EVENT_TIME = (
    "error: checkpoint {tmp}/ck/query: it was written by an earlier spark-changelog whose "
    "event-time deduplication and ON CONFLICT DO ERROR/NOTHING kept their state in "
    "Spark's event-time timers; this version folds the sources' watermarks itself "
    "(docs/runtime.md, \"Event time: the sources' watermarks\") and cannot resume that state")
EARLIER_TODO = ("  what to do: start a new --checkpoint DIR, which reads all input again (write "
                "to a new table, or empty this one first: its rows stay); or finish this "
                "checkpoint's input with the version that wrote it")


WITH_CHECKPOINT = [
    Mistake("checkpoint of an earlier event-time deduplication",
            checkpoint_of_earlier_event_time_dedup, EARLIER_EVENT_TIME, 4, spark=True,
            also=("  in the checkpoint: Deduplicate(keep=[FirstRow], key=[u], order=[ROWTIME(rt)])"
                  " input columns=[['u', 'url', 't', 'rt']]", EARLIER_TODO)),
    Mistake("checkpoint of an earlier ON CONFLICT DO NOTHING", checkpoint_of_earlier_on_conflict,
            EARLIER_EVENT_TIME, 4, spark=True,
            also=("  in the checkpoint: SinkUpsertMaterializer(key=[u], upsertKey=[u, url], "
                  "conflictStrategy=[NOTHING]) input columns=[['u', 'url', 't']]", EARLIER_TODO)),
    Mistake("checkpoint of another query (state changed)", checkpoint_state_changed,
            "error: checkpoint {tmp}/ck/query: the query changed in a way its state cannot "
            "follow (a stateful operator, its key or its input columns changed)", 4, spark=True,
            also=("  in the script, not in the checkpoint: GroupAggregate(groupBy=[name], "
                  "select=[name, SUM(amount) AS total]) input columns=[['id', 'name', 'amount']]",
                  "  what to do: either run the script that wrote this checkpoint (its plan is "
                  "in {tmp}/ck/query/plan-fingerprint.json); or start a new --checkpoint DIR, "
                  "which reads all input again (write to a new table, or empty this one first: "
                  "its rows stay); or delete the checkpoint and the table and run again")),
    Mistake("checkpoint moved with its project", checkpoint_moved,
            "error: INSERT INTO out ({p} line 5): the checkpoint lists input files it read at "
            "{tmp}/a/in, which is not where the source is now (the directory was moved or "
            "copied)", 4, spark=True,
            also=("  what to do: if the project moved, run `spark-changelog relocate {tmp}/b/ck/query "
                  "{tmp}/a {tmp}/b`, then this command again: it resumes where it stopped; or "
                  "start a new --checkpoint DIR here: the query then reads all input again and "
                  "upserts the same final rows into the table",)),
]


def test_a_moved_project_resumes_after_relocate(spark, tmp, capsys):
    """docs/errors.md, "A moved project": `spark-changelog relocate CK OLD NEW`
    rewrites the checkpoint's paths; the run then reads only the input not
    yet read and keeps the state (the group's sum goes on from 15)."""
    from spark_changelog.sinks.delta import read_table
    os.makedirs(f"{tmp}/a")
    first = script(f"{tmp}/a", source_ddl(_with_input(f"{tmp}/a"))
                   + GROUPED.format(out=f"{tmp}/a/out"))
    assert main(["run", first, "--checkpoint", f"{tmp}/a/ck", "--no-progress"]) == 0
    shutil.move(f"{tmp}/a", f"{tmp}/b")
    p = script(f"{tmp}/b", source_ddl(f"{tmp}/b/in") + GROUPED.format(out=f"{tmp}/b/out"))
    before = sorted(map(tuple, read_table(f"{tmp}/b/out").values.tolist()))
    with open(f"{tmp}/b/in/part-1.json", "w") as f:
        f.write(json.dumps({"before": None, "after": {"id": 9, "name": "ann", "amount": 100},
                            "op": "c", "source": {"lsn": 900}}) + "\n")
    capsys.readouterr()
    assert main(["relocate", f"{tmp}/b/ck", f"{tmp}/a", f"{tmp}/b"]) == 0
    assert capsys.readouterr().out.startswith(f"relocated {tmp}/b/ck: 3 Spark log file(s)")
    assert main(["run", p, "--checkpoint", f"{tmp}/b/ck", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "changelog rows in: 1 " in captured.out + captured.err, captured
    after = sorted(map(tuple, read_table(f"{tmp}/b/out").values.tolist()))
    assert after == [(n, t + 100 if n == "ann" else t) for n, t in before]
    # a second relocate finds nothing to rewrite
    assert main(["relocate", f"{tmp}/b/ck", f"{tmp}/a", f"{tmp}/b"]) == 2


@pytest.mark.parametrize("m", WITH_CHECKPOINT, ids=[m.name for m in WITH_CHECKPOINT])
def test_mistake_with_a_checkpoint(m, spark, tmp, capsys):
    check(m, tmp, capsys)


def test_a_changed_filter_is_allowed_with_a_warning_of_what_is_not_redone(spark, tmp, capsys):
    from spark_changelog.sinks.delta import read_table
    streaming_project(tmp, bound=0)
    p = script(tmp, source_ddl(f"{tmp}/in") + delta_ddl(f"{tmp}/out") + FILTERED.format(bound=12),
               "v2.sql")
    capsys.readouterr()
    assert main(["run", p, "--checkpoint", f"{tmp}/ck", "--no-progress"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "warning: the query changed since this checkpoint was written (was Calc(where=[`amount` "
        "> 0]); now Calc(where=[`amount` > 12])): the state is kept and only input not yet read "
        "goes through the new query; rows already written are not redone (rows a new filter "
        "excludes stay in the table); for the new query over all input, start a new "
        "--checkpoint and a new table")
    # ann (15) and bob (20) were written under the old filter and stay
    assert read_table(f"{tmp}/out")[["id", "amount"]].values.tolist() == [[1, 15], [2, 20]]
    with open(f"{tmp}/ck/query/plan-fingerprint.json") as f:
        assert any("`amount` > 12" in line for line in json.load(f)["plan"])


# --------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_during_a_micro_batch_stops_at_its_end_with_how_to_resume(spark, tmp, capsys):
    """SIGINT to a real ``spark-changelog run`` while a micro-batch runs (its
    offsets are logged, its commit is not): that batch finishes and is
    committed whole, no other starts, the process says how to resume and exits
    130 without a traceback; the second run resumes and the table is exact."""
    from spark_changelog.sinks.delta import read_table
    src = f"{tmp}/in"
    files = 4
    os.makedirs(src)
    for i in range(files):      # one file per micro-batch, in this order
        with open(f"{src}/part-{i}.json", "w") as f:
            for k in range(3):
                f.write(json.dumps({"before": None, "after": {"id": 10 * i + k, "name": f"n{i}",
                                                              "amount": k},
                                    "op": "c", "source": {"lsn": 10 * i + k}}) + "\n")
        os.utime(f"{src}/part-{i}.json", (1_000_000 + i, 1_000_000 + i))
    p = script(tmp, source_ddl(src).replace("'format' = 'debezium-json'",
                                            "'format' = 'debezium-json', "
                                            "'source.max-files-per-trigger' = '1'")
               + delta_ddl(f"{tmp}/out") + INSERT_ALL)
    env = dict(os.environ, SPARK_CHANGELOG_LOG=f"{tmp}/spark.log")
    exe = os.path.join(os.path.dirname(sys.executable), "spark-changelog")
    argv = [exe, "run", p, "--checkpoint", f"{tmp}/ck", "--no-progress"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    second = f"{tmp}/ck/query/main/offsets/1"    # batch 1 has started
    deadline = time.time() + 240
    while not os.path.exists(second) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    lines = err.splitlines()
    assert lines[0] == "stopping at the end of the current micro-batch (Ctrl-C again to stop at once)"
    # batch 1 finished if its sink step had begun, else it is redone on resume
    committed = sorted(int(n) for n in os.listdir(f"{tmp}/ck/query/main/commits")
                       if n.isdigit())
    n = len(committed)
    assert committed == list(range(n)) and n in (1, 2), committed
    assert lines[-3] == (f"interrupted: INSERT INTO out ({p} line 5): stopped by Ctrl-C after {n} "
                         "micro-batch(es), at a micro-batch boundary")
    assert lines[-2] == (f"  this INSERT committed {n} micro-batch(es) before it stopped (each "
                         "whole); a second run resumes after them")
    assert lines[-1] == (f"  what to do: run the same command again (same --checkpoint {tmp}/ck) "
                         "to resume; finished INSERTs are not redone")
    # whole micro-batches only: the first n files' rows
    assert sorted(read_table(f"{tmp}/out")["id"].tolist()) == [10 * i + k for i in range(n)
                                                               for k in range(3)]
    # resumed in this process (the test session)
    assert main(argv[1:]) == 0, capsys.readouterr().err
    assert sorted(read_table(f"{tmp}/out")["id"].tolist()) == [10 * i + k for i in range(files)
                                                               for k in range(3)]


# --------------------------------------------------------------------------- the log, --verbose


def test_the_traceback_goes_to_the_log_file_or_with_verbose_to_the_terminal(tmp, capsys,
                                                                            monkeypatch):
    monkeypatch.setenv("SPARK_CHANGELOG_LOG", f"{tmp}/spark.log")
    assert main(["cat", f"{tmp}/nope"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    with open(f"{tmp}/spark.log") as f:
        log = f.read()
    assert f"==== spark-changelog cat {tmp}/nope failed at " in log
    assert "Traceback (most recent call last)" in log and "PathError" in log
    for argv in (["--verbose", "cat", f"{tmp}/nope"], ["cat", f"{tmp}/nope", "-v"]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith("Traceback (most recent call last)")
        assert err.splitlines()[-2].startswith("error: cannot print table: ")


# --------------------------------------------------------------------------- sorting


def sorted_as(err):
    from spark_changelog.errors import as_user_error
    e = as_user_error(err)
    return e.render().splitlines()[0], e.exit_code


def test_errors_of_the_disk_and_the_libraries_are_sorted_in_one_place():
    import errno
    # a full disk during a write (deltalake reports the OS error in its text)
    assert sorted_as(OSError(errno.ENOSPC, "No space left on device", "/data/t/part-0.parquet")) \
        == ("error: no space left on the device: /data/t/part-0.parquet", 1)
    assert sorted_as(OSError("Generic LocalFileSystem error: IO error for operation on "
                             "/t/_delta_log: Not a directory (os error 20)")) == \
        ("error: a path component is a file, not a directory: /t/_delta_log", 1)
    assert sorted_as(OSError(errno.EROFS, "Read-only file system", "/mnt/t")) == \
        ("error: the file system is read-only: /mnt/t", 1)
    # deltalake's own error class around the OS error (a full disk during a Delta write)
    from deltalake.exceptions import DeltaError
    assert sorted_as(DeltaError("Failed to parse parquet: External: Generic LocalFileSystem "
                                "error: Unable to copy data to file: No space left on device "
                                "(os error 28)")) == ("error: no space left on the device", 1)
    # ANSI colour codes of a library's message never reach the terminal
    assert sorted_as(ValueError("\x1b[31m↳\x1b[0m bad value")) == ("error: ↳ bad value", 1)
    # a Python worker's error inside Spark's text: its last line, not the JVM's trace
    text = ("org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
            '  File "x.py", line 1, in f\n'
            "spark_changelog.operators.sink_upsert_materializer.PrimaryKeyConstraintViolation: "
            "Primary key constraint violation (ON CONFLICT DO ERROR): key (1)\n"
            "\tat org.apache.spark.Foo(Foo.scala:1)")
    from spark_changelog.errors import _python_worker_error
    found = _python_worker_error(text)
    assert (found.render().splitlines()[0], found.exit_code) == (
        "error: Primary key constraint violation (ON CONFLICT DO ERROR): key (1)", 1)
    # a bug of ours says so and where its traceback is
    first, code = sorted_as(KeyError("x"))
    assert first == "error: internal error: KeyError: 'x'" and code == 1


def test_the_python_api_checks_its_sink_path_before_the_job(spark, tmp):
    from spark_changelog import ChangelogStream
    from spark_changelog.model.errors import PathError
    with open(f"{tmp}/t", "w") as f:
        f.write("keep me")
    df = spark.createDataFrame([(1, "a", 0, 1)], "id BIGINT, v STRING, _kind TINYINT, _seq BIGINT")
    with pytest.raises(PathError) as e:
        ChangelogStream.from_dataframe(df, primary_key=["id"]).write_upsert(f"{tmp}/t")
    assert str(e.value).splitlines()[0] == f"error: table path {tmp}/t is a file, not a directory"
    assert open(f"{tmp}/t").read() == "keep me"


def test_spark_errors_inside_a_failed_streaming_query_are_sorted_by_their_own_class():
    from spark_changelog.errors import _sort_spark

    from pyspark.errors import PySparkException
    text = ("[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
            "[STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA] Streaming stateful "
            "operator name does not match with the operator in state metadata. SQLSTATE: 42K03")
    # the shape of StreamingQueryException (its own message, no JVM needed)
    err = type("StreamFailed", (PySparkException,), {"getCondition": lambda self: "STREAM_FAILED",
                                                     "__str__": lambda self: text})(message=text)
    found = _sort_spark(err, "INSERT INTO out (job.sql line 5)", {"checkpoint": "ck/query"})
    assert found.exit_code == 4
    assert found.render().splitlines() == [
        "error: INSERT INTO out (job.sql line 5): the checkpoint's state does not fit this query "
        "([STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA] Streaming stateful operator "
        "name does not match with the operator in state metadata.)",
        "  what to do: run the script that wrote ck/query, or start a new --checkpoint DIR (the "
        "query then reads its sources again from the start)"]


@pytest.mark.skipif(not LONG or os.geteuid() != 0,
                    reason="long variant (SPARK_CHANGELOG_LONG_TESTS=1) that mounts a tmpfs "
                           "(root)")
def test_a_disk_that_fills_up_during_the_write_leaves_no_rows(spark, tmp, capfd):
    """The preflight sees 1.1 MB free; the Delta write of ~1.6 MB fills the
    disk: one message, exit 1, and the table holds no row of the batch."""
    import random
    import string
    from spark_changelog.sinks.delta import read_table
    rnd = random.Random(1)
    debezium_input(f"{tmp}/in", lines=[
        {"before": None, "after": {"id": i, "name": "".join(rnd.choices(string.ascii_letters,
                                                                         k=64)), "amount": i},
         "op": "c", "source": {"lsn": i}} for i in range(25_000)])
    mnt = f"{tmp}/full"
    os.makedirs(mnt)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", mnt], check=True)
    with open(f"{mnt}/filler", "wb") as f:
        f.write(b"\0" * (900 << 10))
    p = script(tmp, source_ddl(f"{tmp}/in") + delta_ddl(f"{mnt}/out") + INSERT_ALL)
    capfd.readouterr()
    assert main(["run", p, "--batch", "--no-progress"]) == 1
    # the process's stderr (file descriptor 2, where deltalake's Rust runtime
    # would print its panic line) holds our message and nothing else
    err = capfd.readouterr().err.splitlines()
    assert err[0] == f"error: INSERT INTO out ({p} line 5): no space left on the device", err
    assert not [line for line in err if "panicked" in line or "tokio" in line], err
    # the table was created (version 0, no rows) before the data write failed
    assert len(read_table(f"{mnt}/out")) == 0
