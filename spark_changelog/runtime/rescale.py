"""Rescaling a stopped query's checkpoint to another key-group count
(docs/runtime.md, "Key groups and rescaling"; the command is
``spark-changelog rescale CK --key-groups N``).

A keyed operator's state lives in Spark's state store under its key group
``pmod(hash(key), G)`` (:mod:`~spark_changelog.runtime.spark_keyed`), so G is
part of the state's layout.  Spark cannot move state between grouping keys,
so the rescale rewrites it, offline:

1. the checkpoint is checked (``check_checkpoint``: logs and state files; a
   run a key group lists and the store lacks is found in step 2) and must
   not be in use (no batch started and not committed, nothing written in
   the last seconds);
2. it is copied to a sibling directory; in the copy, each keyed operator's
   state after the last committed batch is read through Spark's state data
   source, each key group's live rows are taken from its runs
   (``RunStack.live_where``), and every row goes to its key group under the
   new count (:func:`~spark_changelog.model.spark_hash.key_groups`, the
   value Spark's ``hash`` gives), stored under that group's spread id
   (``model.partitioning.spread_group_ids``), whichever ids the checkpoint
   used (docs/runtime.md, "Key groups and rescaling");
3. a one-batch streaming query writes the regrouped state, one run per key
   group, through ``transformWithStateInPandas``'s initial state
   (:class:`StateLoader`, the same state variables as ``KeyGroupProcessor``)
   into a scratch checkpoint with the same number of state partitions, as
   full RocksDB snapshots; each partition's snapshot replaces the operator's
   files of that partition as the state version the next batch loads;
4. each rewritten operator's state is read back through Spark (every key
   group records the new count, every run it lists decodes, the keys are
   the original's), the copy's files are checked again, and the copy is
   swapped with the original in one rename (``renameat2``'s exchange); the
   original is kept beside it until the caller deletes it.

A chained step (``key_group_processor.KeyedChainProcessor``) holds a
``(meta, runs)`` pair per link: each link is regrouped by the key its
``meta`` records as ``group_key`` (the chain's key, in the link's columns),
and one query writes all the pairs of the step.  Other state (keep-first's
deduplication, window operators, whose count is their own) is copied as it
is.  The whole state of one operator passes
through the driver: fine for the state of a laptop's or a small cluster's
query, a limit for very large state (docs/deploy.md, "Rescaling").
"""
from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import re
import shutil
import tempfile
import time
from typing import Callable, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql.streaming import StatefulProcessor

from ..model.errors import UserError
from ..model.partitioning import SPREAD_IDS, key_group_ids
from .checkpoint import (chain_variables, check_checkpoint, keyed_state_pairs, log_ids, query_dirs,
                         read_state_variable, state_operators, state_variables)
from ..model.spark_hash import key_groups as spark_key_groups, supports as spark_hash_supports
from .key_group_processor import BLOB_SCHEMA, META_SCHEMA, RUN_ID_SCHEMA
from .state_runs import Run, RunStack, name_new_runs

#: a checkpoint written to less than this many seconds ago may belong to a running query
QUIET_SECONDS = 10


class RescaleRefused(UserError):
    """The checkpoint cannot be rescaled as it is (docs/errors.md)."""


@dataclasses.dataclass
class OperatorRescale:
    query: str
    operator_id: int
    name: str
    key: list
    groups_before: int
    keys: int           # live state rows' distinct keys, before = after

    def __str__(self) -> str:
        return (f"{self.query}: operator {self.operator_id} ({self.name}, key {', '.join(self.key)}): "
                f"{self.groups_before} -> key groups, {self.keys:,} keys moved")


@dataclasses.dataclass
class RescaleReport:
    checkpoint: str
    key_groups: Optional[int]
    operators: list
    kept: str           # where the original checkpoint is now
    partitions: Optional[int] = None
    repartitioned: list = dataclasses.field(default_factory=list)   # query dirs

    def summary(self) -> str:
        lines = [str(o).replace("-> key groups", f"-> {self.key_groups} key groups") for o in self.operators]
        lines += [f"{q}: state repartitioned to {self.partitions} partitions" for q in self.repartitioned]
        done = ([f"{self.key_groups} key groups ({len(self.operators)} keyed operator(s))"]
                if self.key_groups is not None else [])
        if self.partitions is not None:
            done.append(f"{self.partitions} state partitions")
        lines.append(f"checkpoint {self.checkpoint}: rescaled to {' and '.join(done)}; the original is "
                     f"kept in {self.kept} (delete it once the query runs)")
        return "\n".join(lines)


class StateLoader(StatefulProcessor):
    """Writes the given state of each key group (the initial state of a
    one-batch query): the variables of ``KeyGroupProcessor``, or of a
    ``KeyedChainProcessor`` of ``links`` links, declared in its order, so
    the state store's column families are the same; each row's ``link``
    says whose variables it goes to."""

    def __init__(self, links: int = 1):
        self.links = links

    def init(self, handle) -> None:
        self.variables = []
        for i in range(self.links):
            meta, runs = chain_variables(i)
            self.variables.append((handle.getValueState(meta, META_SCHEMA),
                                   handle.getMapState(runs, RUN_ID_SCHEMA, BLOB_SCHEMA)))

    def handleInputRows(self, key, rows, timerValues):
        return iter([])

    def handleInitialState(self, key, initialState, timerValues) -> None:
        for _, row in initialState.iterrows():
            meta, runs = self.variables[int(row["link"])]
            runs.updateValue((row["run_id"],), (bytes(row["blob"]),))
            meta.update((row["meta"], int(row["next_seq"])))

    def close(self) -> None:
        pass


def _refuse(checkpoint: str, what: str, todo: str) -> RescaleRefused:
    return RescaleRefused(what, where=f"checkpoint {checkpoint}", todo=todo)


def _check_stopped(checkpoint: str, quiet_seconds: float) -> None:
    newest = 0.0
    for root, _, files in os.walk(checkpoint):
        for f in files:
            newest = max(newest, os.path.getmtime(os.path.join(root, f)))
    if time.time() - newest < quiet_seconds:
        raise _refuse(checkpoint, f"the checkpoint was written to {time.time() - newest:.0f} s ago: "
                                  "its query may be running",
                      "stop the query (Ctrl-C, or let it finish), then rescale")
    for q in query_dirs(checkpoint):
        offsets, commits = log_ids(os.path.join(q, "offsets")), log_ids(os.path.join(q, "commits"))
        if offsets and (not commits or offsets[-1] > commits[-1]):
            raise _refuse(checkpoint, f"{os.path.relpath(q, checkpoint)}: batch {offsets[-1]} was started "
                                      "and not committed (the query is running, or was stopped in a batch)",
                          "stop the query; if it is stopped, run it once more so the batch completes, "
                          "then rescale")


def _regroup(checkpoint: str, q: str, op: int, meta: pd.DataFrame, runs: pd.DataFrame,
             key_groups: int) -> tuple[OperatorRescale, pd.DataFrame]:
    """The operator's state as (new key group, run id, blob, meta, next_seq) rows."""
    name = os.path.relpath(q, checkpoint)
    listed = [json.loads(v["run_ids"]) for v in meta["value"]]
    described = [m for m in listed if isinstance(m, dict) and m.get("key")]
    if not described:
        raise _refuse(checkpoint, f"{name}: operator {op}: its state does not record its key (written "
                                  "by a version before rescaling existed)",
                      "run the query once with this version (one micro-batch with input), then rescale")
    key, op_name = list(described[0]["key"]), described[0].get("operator") or "keyed operator"
    # a chained operator's key groups are made by the chain's key, columns
    # its own key contains (key_group_processor.KeyedChainProcessor)
    group_key = described[0].get("group_key")
    hashed = list(group_key or key)
    before = described[0].get("key_groups")
    blobs = {(int(r["key"]["_kg"]), r["user_map_key"]["run_id"]): bytes(r["user_map_value"]["blob"])
             for _, r in runs.iterrows()}
    parts, schema = [], None
    next_seq = 0
    for (_, row), ids in zip(meta.iterrows(), listed):
        group = int(row["key"]["_kg"])
        next_seq = max(next_seq, int(row["value"]["next_seq"] or 0))
        ids = ids if isinstance(ids, list) else ids["runs"]
        loaded = []
        for rid in ids:
            blob = blobs.get((group, rid))
            if blob is None:
                raise _refuse(checkpoint, f"the checkpoint is damaged: {name}: operator {op}, key group "
                                          f"{group}: state run {rid} is listed but missing",
                              f"`spark-changelog check {checkpoint}` lists what is wrong; a damaged "
                              "checkpoint is not rescaled")
            if schema is None:
                schema = pa.ipc.open_stream(pa.BufferReader(blob)).schema
            loaded.append(Run.from_bytes(rid, blob, key))
        live = RunStack(key, loaded).live_where(lambda rows: [True] * len(rows))
        if len(live):
            parts.append(live)
    out = pd.DataFrame({"kg": pd.Series([], dtype="int32"), "run_id": [], "blob": [], "meta": [],
                        "next_seq": pd.Series([], dtype="int64")})
    info = OperatorRescale(name, op, op_name, key, before, 0)
    if not parts:
        return info, out
    rows = pd.concat(parts, ignore_index=True)
    key_table = pa.Table.from_pandas(rows[hashed], schema=pa.schema([schema.field(k) for k in hashed]),
                                     preserve_index=False)
    if not spark_hash_supports([f.type for f in key_table.schema]):
        raise _refuse(checkpoint, f"{name}: operator {op} ({op_name}): its key types "
                                  f"({', '.join(str(f.type) for f in key_table.schema)}) are not ones the "
                                  "rescale computes Spark's hash of (integers, strings)",
                      "start a new checkpoint with --key-groups N instead")
    groups = np.asarray(key_group_ids(key_groups, SPREAD_IDS))[spark_key_groups(key_table, hashed, key_groups)]
    info.keys = int(rows[key].drop_duplicates().shape[0])
    rows["_new_kg"] = groups
    records = []
    for g, members in rows.groupby("_new_kg", sort=True):
        members = members.drop(columns="_new_kg").reset_index(drop=True)
        members[schema.names[-1]] = False        # CLEARED_COL: live rows only
        run = Run.build(members[schema.names], key)
        scope = f"rescale/{op_name}/{int(g)}"
        blob = name_new_runs([run], scope, schema)
        meta_json = json.dumps({"runs": [run.id], "key_groups": key_groups, "operator": op_name,
                                "key": key, "key_group_ids": SPREAD_IDS,
                                **({"group_key": group_key} if group_key else {})})
        records.append((int(g), run.id, blob[run.id], meta_json, next_seq))
    out = pd.DataFrame(records, columns=["kg", "run_id", "blob", "meta", "next_seq"])
    return info, out


def _write_state(spark, state: pd.DataFrame, partitions: int, scratch: str, links: int = 1) -> str:
    """One batch of a query whose only operator writes ``state`` (initial
    state of :class:`StateLoader` with ``links`` links: its ``link`` column
    says whose variables a row goes to) as full snapshots in ``partitions``
    state partitions; returns the operator's state directory."""
    from pyspark.sql.types import (BinaryType, IntegerType, LongType, StringType, StructField,
                                   StructType)
    inp = os.path.join(scratch, "input")
    os.makedirs(inp)
    # one input row, for a key group the state does not use: the batch must run
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"_kg": pa.array([-1], pa.int32())}), os.path.join(inp, "part-0.parquet"))
    initial = spark.createDataFrame(
        state.rename(columns={"kg": "_kg"}),
        StructType([StructField("_kg", IntegerType()), StructField("run_id", StringType()),
                    StructField("blob", BinaryType()), StructField("meta", StringType()),
                    StructField("next_seq", LongType()), StructField("link", IntegerType())]))
    conf = {"spark.sql.shuffle.partitions": str(partitions),
            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "false"}
    saved = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        stream = spark.readStream.schema("_kg INT").parquet(inp)
        out = stream.groupBy("_kg").transformWithStateInPandas(
            statefulProcessor=StateLoader(links), outputStructType="_kg INT", outputMode="Append",
            timeMode="None", initialState=initial.groupBy("_kg"))
        query = (out.writeStream.format("noop").option("checkpointLocation", os.path.join(scratch, "ck"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
    finally:
        for k, v in saved.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)
    return os.path.join(scratch, "ck", "state", "0")


def _partitions(q: str) -> int:
    offsets = log_ids(os.path.join(q, "offsets"))
    with open(os.path.join(q, "offsets", str(offsets[-1])), encoding="utf-8") as fh:
        meta = json.loads(fh.read().split("\n")[1])
    return int(meta["conf"]["spark.sql.shuffle.partitions"])


_VERSION_FILE = re.compile(r"^\.?\d+\.(zip|changelog)(\.crc)?$")


def _replace_partition_state(written: str, target: str, version: int) -> None:
    """The snapshot ``written`` made (version 1) as ``version`` of the
    partition ``target``: the only state file of it from now on."""
    for f in os.listdir(target):
        if _VERSION_FILE.match(f):
            os.remove(os.path.join(target, f))
    shutil.rmtree(os.path.join(target, "SSTs"), ignore_errors=True)
    if os.path.isdir(os.path.join(written, "SSTs")):
        shutil.copytree(os.path.join(written, "SSTs"), os.path.join(target, "SSTs"))
    shutil.copyfile(os.path.join(written, "1.zip"), os.path.join(target, f"{version}.zip"))


def _verify(spark, q: str, op: int, last: int, key_groups: int, expected: OperatorRescale,
            variables: tuple = ("meta", "runs")) -> None:
    """The rewritten state of one operator (the link of a chain whose
    ``variables`` they are), read back through Spark: every key group
    records ``key_groups`` and the spread ids, is stored under its spread
    id, every run it lists is there and decodes, and it holds the keys the
    original held."""
    meta, runs = (read_state_variable(spark, q, op, last, v) for v in variables)
    listed = [json.loads(v["run_ids"]) for v in meta["value"]]
    counts = {m.get("key_groups") for m in listed}
    if counts - {key_groups}:
        raise RuntimeError(f"rescaled operator {op}: key groups recording {counts}, not {key_groups}")
    layouts = {m.get("key_group_ids") for m in listed}
    stray = {int(r["_kg"]) for r in meta["key"]} - set(key_group_ids(key_groups, SPREAD_IDS))
    if layouts - {SPREAD_IDS} or stray:
        raise RuntimeError(f"rescaled operator {op}: key groups recording ids {layouts}, "
                           f"groups {sorted(stray)} not spread ids")
    info, _ = _regroup(q, q, op, meta, runs, key_groups)
    if info.keys != expected.keys:
        raise RuntimeError(f"rescaled operator {op} holds {info.keys} keys, the original {expected.keys}")


def _exchange(a: str, b: str) -> bool:
    """Swap two directories in one step (Linux ``renameat2(RENAME_EXCHANGE)``);
    False where the system has no such call."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) != 0:
        return False
    return True


def _rewrite_key_groups(spark, copy: str, work: str, q: str, key_groups: int, done: list) -> None:
    """Steps 2 and 3 (module docstring) for the query checkpoint ``q`` of
    the ``copy``; the operators rewritten are added to ``done``."""
    commits = log_ids(os.path.join(q, "commits"))
    if not commits:
        return
    last = commits[-1]
    for op, (op_name, _) in state_operators(q).items():
        if op_name is None or "transformWithState" not in op_name:
            continue
        op_dir = os.path.join(q, "state", str(op))
        variables = state_variables(op_dir)
        # one (meta, runs) pair per keyed operator: one, or one per link of
        # a chain of keyed operators (checkpoint.chain_variables)
        pairs = keyed_state_pairs(op_dir)
        if set(variables) != {v for pair in pairs for v in pair}:
            if "meta" in variables and "runs" in variables and "timer" in variables:
                # a keyed operator of an earlier version waiting for the watermark
                raise RescaleRefused(f"{os.path.relpath(q, copy)}: operator {op} keeps timers (written by "
                                     "an earlier version): rescaling it is not supported",
                                     todo="start a new checkpoint with --key-groups N")
            continue         # an event-time operator's state: its count is its own
        links = []
        for link, (meta_var, runs_var) in enumerate(pairs):
            meta = read_state_variable(spark, q, op, last, meta_var)
            if meta.empty:
                continue
            runs = read_state_variable(spark, q, op, last, runs_var)
            info, state = _regroup(copy, q, op, meta, runs, key_groups)
            links.append((link, info, state.assign(link=link)))
        if not links:
            continue
        partitions = _partitions(q)
        scratch = os.path.join(work, f"write-{len(done)}")
        written = _write_state(spark, pd.concat([state for _, _, state in links], ignore_index=True),
                               partitions, scratch, len(pairs))
        for p in range(partitions):
            target = os.path.join(q, "state", str(op), str(p))
            os.makedirs(target, exist_ok=True)
            _replace_partition_state(os.path.join(written, str(p)), target, last + 1)
        shutil.rmtree(scratch)
        for link, info, _ in links:
            _verify(spark, q, op, last, key_groups, info, pairs[link])
            info.query = os.path.relpath(q, copy)
            done.append(info)


_BINARY = (".zip", ".sst", ".changelog", ".crc", ".parquet")


def _repartition(spark, q: str, partitions: int, copy: str, checkpoint: str) -> bool:
    """Spark's offline repartitioning of every stateful operator of ``q``
    (it commits one more batch that reads no input and holds the state in
    ``partitions`` partitions); the paths it writes into the copy's
    metadata are made the checkpoint's.  False when ``q`` already has that
    many partitions."""
    if not log_ids(os.path.join(q, "commits")) or _partitions(q) == partitions:
        return False
    manager = getattr(spark, "_streamingCheckpointManager", None) or getattr(
        spark, "streamingCheckpointManager", None)
    if manager is None:
        raise UserError("changing the number of state partitions needs Spark 4.2 or later "
                        "(its checkpoint manager's repartition)", exit_code=3)
    manager.repartition(q, partitions)
    old, new = os.fsencode(copy), os.fsencode(checkpoint)
    for root, _, files in os.walk(q):
        for f in files:
            path = os.path.join(root, f)
            if f.endswith(_BINARY):
                continue
            with open(path, "rb") as fh:
                data = fh.read()
            if old in data:
                with open(path, "wb") as fh:
                    fh.write(data.replace(old, new))
                crc = os.path.join(root, f".{f}.crc")
                if os.path.exists(crc):       # Hadoop checks a file against it
                    os.remove(crc)
    return True


def rescale_checkpoint(spark, checkpoint: str, key_groups: Optional[int] = None,
                       partitions: Optional[int] = None,
                       edit: Optional[Callable[[str, int], None]] = None,
                       quiet_seconds: float = QUIET_SECONDS) -> RescaleReport:
    """Rewrite the keyed operators' state of ``checkpoint`` to ``key_groups``
    key groups (module docstring) and/or every stateful operator's state to
    ``partitions`` state partitions (Spark's repartitioning).
    ``edit(directory, key_groups)`` is called on each directory of the copy
    that holds query checkpoints (the plan's fingerprint is kept there)
    before the copy is checked.  A checkpoint written to less than
    ``quiet_seconds`` ago is refused."""
    checkpoint = os.path.abspath(checkpoint.rstrip("/"))
    for name, value in (("--key-groups", key_groups), ("--partitions", partitions)):
        if value is not None and value < 1:
            raise UserError(f"{name} must be at least 1 (got {value})", exit_code=2)
    if key_groups is None and partitions is None:
        raise UserError("give --key-groups N, --partitions M or both", exit_code=2)
    if not os.path.isdir(checkpoint):
        raise _refuse(checkpoint, "the checkpoint does not exist", "give the --checkpoint DIR of the query")
    # the files (logs, state versions); the state's runs are read below
    report = check_checkpoint(checkpoint)
    if not report.queries:
        raise _refuse(checkpoint, "no streaming query checkpoint here", "give the --checkpoint DIR of the query")
    if not report.ok:
        raise _refuse(checkpoint, "the checkpoint is damaged: " + "; ".join(
            f.text for f in report.findings if f.problem), f"`spark-changelog check {checkpoint}` lists "
                                                           "what is wrong; a damaged checkpoint is not rescaled")
    _check_stopped(checkpoint, quiet_seconds)
    parent = os.path.dirname(checkpoint)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    work = tempfile.mkdtemp(prefix=f".{os.path.basename(checkpoint)}.rescale-", dir=parent)
    copy = os.path.join(work, "checkpoint")
    done, repartitioned = [], []
    try:
        shutil.copytree(checkpoint, copy, symlinks=True)
        for q in query_dirs(copy):
            try:
                if key_groups is not None:
                    _rewrite_key_groups(spark, copy, work, q, key_groups, done)
                if partitions is not None and _repartition(spark, q, partitions, copy, checkpoint):
                    repartitioned.append(os.path.relpath(q, copy))
            except RescaleRefused as refused:
                refused.where = f"checkpoint {checkpoint}"
                raise RescaleRefused(refused.what, where=refused.where, todo=refused.todo) from None
        if edit is not None and key_groups is not None:
            for d in sorted({os.path.dirname(q) for q in query_dirs(copy)}):
                edit(d, key_groups)
        after_check = check_checkpoint(copy)
        if not after_check.ok:
            raise RuntimeError("the rescaled copy does not pass the checkpoint check:\n" + after_check.summary())
        kept = f"{checkpoint}.before-rescale-{stamp}"
        # the swap: the copy takes the checkpoint's name in one step, the original moves aside
        if _exchange(copy, checkpoint):
            os.rename(copy, kept)
        else:
            os.rename(checkpoint, kept)
            os.rename(copy, checkpoint)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return RescaleReport(checkpoint, key_groups, done, kept, partitions, repartitioned)


__all__ = ["rescale_checkpoint", "RescaleReport", "RescaleRefused", "StateLoader", "QUIET_SECONDS"]
