"""Checking a streaming checkpoint without running its query, and the error a
damaged one gives (docs/runtime.md, "A damaged checkpoint").

A checkpoint directory given to ``write_upsert``/``run --checkpoint`` holds
one Spark query checkpoint per query (``main``, or one per ``INSERT``): its
offset and commit logs, its sources' logs and its state (``state/<operator>/
<partition>``, RocksDB changelog files ``<version>.changelog`` and snapshots
``<version>.zip``; state version ``v`` is the state after batch ``v - 1``).
:func:`check_checkpoint` verifies what a restart will need: the logs agree,
every state partition can load the version of the last committed batch, no
write was dropped (a temporary file newer than the file it should have
replaced), and, with a Spark session, that the keyed operators' state is
readable and complete (every run a key group lists is there).
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import re
import struct
import zlib
from typing import Iterator, Optional

from ..model.errors import UserError

#: how a keyed operator's worker reports state it cannot read; the driver
#: turns it into :class:`DamagedCheckpoint` naming the checkpoint
DAMAGED_STATE = "damaged state"
_DAMAGED_RE = re.compile(DAMAGED_STATE + r": ([^\n]*)")
_V2_RE = re.compile(r"\d+_[0-9a-f-]{36}\.(?:changelog|zip)")
#: Spark's error class when a state store partition cannot load its state
_CANNOT_LOAD = "CANNOT_LOAD_STATE_STORE"
_TMP_RE = re.compile(r"^\.(?P<name>.+)\.[0-9a-f-]{36}(?:\.TID\d+)?\.tmp$")


class DamagedCheckpoint(UserError):
    """A checkpoint a query cannot resume from; the message names the
    checkpoint, the operator and the batch (docs/errors.md)."""


def damaged_state(operator: str, key_group, detail: str) -> RuntimeError:
    """The error a keyed operator raises in a worker when its state is
    inconsistent (a run listed by a key group is missing)."""
    from pyspark import TaskContext
    task = TaskContext.get()
    batch = task.getLocalProperty("streaming.sql.batchId") if task is not None else None
    where = f"batch {batch}" if batch is not None else "a batch"
    return RuntimeError(f"{DAMAGED_STATE}: operator {operator}, key group {key_group}, {where}: {detail}")


def _damaged(detail: str, checkpoint: str) -> DamagedCheckpoint:
    return DamagedCheckpoint(
        f"the checkpoint is damaged: {detail}; the query cannot resume from it",
        where=f"checkpoint {checkpoint}",
        todo=f"`spark-changelog check {checkpoint}` lists what is wrong; start a new "
             "--checkpoint DIR (the query then reads its sources again from the start)")


def reraise_damaged(err: BaseException, checkpoint: str) -> None:
    """Raise :class:`DamagedCheckpoint` if ``err`` (Spark's wrapper of a
    worker's error) reports damaged state, ours or a state file Spark cannot
    load (a changelog file whose LZ4 block fails its checksum, a snapshot
    whose zip entry fails its CRC); otherwise return."""
    text = str(err)
    m = _DAMAGED_RE.search(text)
    if m:
        raise _damaged(m.group(1).strip(), checkpoint) from err
    if _CANNOT_LOAD in text:
        causes = re.findall(r"Caused by: ([^\n]+)", text)
        cause = causes[0].strip() if causes else text.split(_CANNOT_LOAD, 1)[1].splitlines()[0].strip()
        raise _damaged(f"a stateful operator's state cannot be loaded ({cause})", checkpoint) from err


@dataclasses.dataclass
class Finding:
    query: str
    problem: bool          # False: a note (harmless, e.g. a batch the next run replays)
    text: str

    def __str__(self) -> str:
        return f"{'error' if self.problem else 'note'}: {self.query}: {self.text}"


@dataclasses.dataclass
class CheckReport:
    checkpoint: str
    queries: list
    findings: list
    last_batches: dict     # query -> last committed batch (None: none yet)

    @property
    def ok(self) -> bool:
        return not any(f.problem for f in self.findings)

    def summary(self) -> str:
        lines = [str(f) for f in self.findings]
        for q in self.queries:
            last = self.last_batches.get(q)
            lines.append(f"{q}: {'no batch committed' if last is None else f'last committed batch {last}'}")
        n = sum(f.problem for f in self.findings)
        lines.append(f"checkpoint {self.checkpoint}: " + ("ok" if not n else f"{n} problem(s)"))
        return "\n".join(lines)


def query_dirs(checkpoint: str) -> list[str]:
    """The Spark query checkpoints under ``checkpoint`` (directories with
    ``offsets`` and ``commits``), sorted."""
    found = []
    for root, dirs, _ in os.walk(checkpoint):
        if "offsets" in dirs and "commits" in dirs:
            found.append(root)
            dirs.clear()
    return sorted(found)


def log_ids(directory: str) -> list[int]:
    try:
        return sorted(int(n) for n in os.listdir(directory) if n.isdigit())
    except FileNotFoundError:
        return []


def _check_log_file(path: str) -> Optional[str]:
    """What is wrong with one offset/commit log file, or None."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().split("\n")
    except OSError as e:
        return f"{path} cannot be read: {e.strerror}"
    if not lines or not re.fullmatch(r"v\d+", lines[0]):
        return f"{path} is not a Spark log file (no version line)"
    for line in lines[1:]:
        if line.strip():
            try:
                json.loads(line)
            except ValueError:
                return f"{path} holds a line that is not JSON (a torn write)"
    return None


def _check_logs(q: str, name: str, findings: list) -> Optional[int]:
    """Offsets and commits agree; returns the last committed batch."""
    offsets, commits = log_ids(os.path.join(q, "offsets")), log_ids(os.path.join(q, "commits"))
    for log, ids in (("offsets", offsets), ("commits", commits)):
        for i in ids:
            bad = _check_log_file(os.path.join(q, log, str(i)))
            if bad:
                findings.append(Finding(name, True, bad))
        if ids and ids != list(range(ids[0], ids[-1] + 1)):
            missing = sorted(set(range(ids[0], ids[-1] + 1)) - set(ids))
            findings.append(Finding(name, True, f"{log} log misses batch(es) {missing}"))
    orphans = sorted(set(commits) - set(offsets))
    if orphans and offsets and orphans[-1] > offsets[-1]:
        findings.append(Finding(name, True, f"batch {orphans[-1]} is committed but has no offsets"))
    last = commits[-1] if commits else None
    ahead = [i for i in offsets if last is None or i > last]
    if len(ahead) > 1:
        findings.append(Finding(name, True, f"batches {ahead} have offsets but no commit (Spark "
                                            "starts at most one batch ahead of its commits)"))
    elif ahead:
        findings.append(Finding(name, False, f"batch {ahead[0]} was started and not committed: "
                                             "the next run replays it"))
    return last


def _check_temporary_files(q: str, name: str, findings: list) -> None:
    for root, _, files in os.walk(q):
        for f in files:
            m = _TMP_RE.match(f)
            if not m:
                continue
            tmp = os.path.join(root, f)
            final = os.path.join(root, m.group("name"))
            rel = os.path.relpath(tmp, q)
            if os.path.exists(final) and os.path.getmtime(tmp) > os.path.getmtime(final):
                findings.append(Finding(name, True, (
                    f"{rel}: a later write of {m.group('name')} was never moved into place "
                    "(a replayed micro-batch's file dropped by a checkpoint manager that does "
                    "not replace files)")))
            else:
                findings.append(Finding(name, False, f"{rel}: temporary file of a write that "
                                                     "was killed before its end (harmless)"))


def state_operators(q: str) -> dict:
    """operator id -> (Spark operator name or None, partition dirs)."""
    state = os.path.join(q, "state")
    out = {}
    for op in sorted(os.listdir(state), key=lambda x: (len(x), x)) if os.path.isdir(state) else []:
        if not op.isdigit():
            continue
        d = os.path.join(state, op)
        parts = sorted((p for p in os.listdir(d) if p.isdigit()), key=int)
        out[int(op)] = (_operator_name(d), [os.path.join(d, p) for p in parts])
    return out


def state_variables(op_dir: str) -> list:
    """The state variables a ``transformWithState`` operator declared (its
    operator metadata); empty when it has none."""
    for meta in log_ids(os.path.join(op_dir, "_metadata", "v2")):
        with open(os.path.join(op_dir, "_metadata", "v2", str(meta)), encoding="utf-8") as fh:
            for line in fh:
                if "operatorPropertiesJson" in line:
                    props = json.loads(json.loads(line)["operatorPropertiesJson"])
                    return [v["stateName"] for v in props.get("stateVariables", [])]
    return []


def chain_variables(link: int) -> tuple[str, str]:
    """The names of the ``meta`` and ``runs`` variables of link ``link`` of
    a keyed step (``key_group_processor``): a chain of keyed operators has a
    pair per link, and the first link's are an unchained operator's, so its
    state reads as one's."""
    return ("meta", "runs") if link == 0 else (f"meta{link}", f"runs{link}")


def keyed_state_pairs(op_dir: str) -> list[tuple[str, str]]:
    """The ``(meta, runs)`` variable pairs of a keyed step's state, in link
    order (:func:`chain_variables`): one for an operator, one per link of a
    chain of keyed operators; the first pair when the operator metadata
    does not list them."""
    names = set(state_variables(op_dir))
    pairs = list(itertools.takewhile(lambda pair: set(pair) <= names, map(chain_variables, itertools.count())))
    return pairs or [chain_variables(0)]


def read_state_variable(spark, q: str, op: int, batch: int, variable: str):
    """State variable ``variable`` of operator ``op`` of query checkpoint
    ``q`` after ``batch``, through Spark's state data source (pandas)."""
    return (spark.read.format("statestore").option("operatorId", op).option("stateVarName", variable)
            .option("batchId", batch).load(q).toPandas())


def _operator_name(op_dir: str) -> Optional[str]:
    for meta in (os.path.join(op_dir, "_metadata", "v2", "0"), os.path.join(op_dir, "_metadata", "metadata")):
        try:
            with open(meta, encoding="utf-8") as fh:
                for line in fh:
                    if "operatorName" in line:
                        return json.loads(line)["operatorInfo"]["operatorName"]
        except (OSError, ValueError, KeyError):
            continue
    return None


def _check_state_files(q: str, name: str, last: Optional[int], findings: list) -> None:
    """Every state partition can load the version the next run needs
    (``last + 1``): a snapshot at or below it and every changelog after."""
    if last is None:
        return
    version = last + 1
    for op, (op_name, parts) in state_operators(q).items():
        for part in parts:
            names = os.listdir(part)
            if any(_V2_RE.fullmatch(n) for n in names):
                findings.append(Finding(name, False, (
                    f"state of operator {op}: checkpoint format v2 (files named by unique ids, "
                    "chained through the commit log): its files are not checked")))
                break
            changelogs = {int(n.split(".")[0]) for n in names if re.fullmatch(r"\d+\.changelog", n)}
            snapshots = {int(n.split(".")[0]) for n in names if re.fullmatch(r"\d+\.zip", n)}
            if not changelogs and not snapshots:
                continue    # a partition that never held state (HDFS-backed stores keep .delta files)
            base = max((s for s in snapshots if s <= version), default=0)
            missing = [v for v in range(base + 1, version + 1) if v not in changelogs]
            if missing:
                findings.append(Finding(name, True, (
                    f"state of operator {op} ({op_name or 'unknown'}), partition "
                    f"{os.path.basename(part)}: the state after batch {last} cannot be loaded: "
                    f"changelog file(s) {missing} missing")))
                continue
            needed = ([f"{base}.zip"] if base else []) + [f"{v}.changelog" for v in range(base + 1, version + 1)]
            for f in needed:
                problem = _state_file_problem(os.path.join(part, f))
                if problem:
                    findings.append(Finding(name, True, (
                        f"state of operator {op} ({op_name or 'unknown'}), partition "
                        f"{os.path.basename(part)}: the state after batch {last} cannot be loaded: "
                        f"{f} {problem}")))


#: lz4-java's block stream (Spark's default state store codec): each block
#: ``LZ4Block``, a token (method | level), compressed and original length
#: and a checksum (little-endian ints), then the block; an empty block ends it
_LZ4_MAGIC = b"LZ4Block"
_LZ4_HEADER = 21


def _state_file_problem(path: str) -> Optional[str]:
    """What a files-only look finds wrong with a state file the next run
    loads: a snapshot's zip entries against their CRCs, a changelog's LZ4
    block framing (a cut or torn file; the blocks' own checksums are
    verified when Spark reads them, ``check`` with Spark)."""
    import zipfile
    try:
        if path.endswith(".zip"):
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()
            return f"is damaged (zip entry {bad} fails its CRC)" if bad else None
        with open(path, "rb") as fh:
            data = fh.read()
    except (OSError, zipfile.BadZipFile, EOFError, zlib.error) as e:
        return f"is damaged ({e})"
    if not data.startswith(_LZ4_MAGIC):
        return None                     # another codec: not looked into
    pos, ended = 0, False
    while pos < len(data):
        if len(data) - pos < _LZ4_HEADER:
            break
        if data[pos:pos + len(_LZ4_MAGIC)] != _LZ4_MAGIC:
            return f"is damaged (no LZ4 block header at byte {pos})"
        method = data[pos + 8] & 0xF0
        compressed, original = struct.unpack_from("<ii", data, pos + 9)
        if method not in (0x10, 0x20) or compressed < 0 or original < 0 \
                or (method == 0x10 and compressed != original):
            return f"is damaged (a bad LZ4 block header at byte {pos})"
        pos += _LZ4_HEADER + compressed
        ended = original == 0
    if pos != len(data) or not ended:
        return "is cut short (its last LZ4 block or the end mark is missing)"
    return None


def _check_keyed_state(spark, q: str, name: str, last: Optional[int], findings: list) -> None:
    """The keyed operators' state (``meta`` and ``runs`` of
    ``runtime/spark_keyed.py``, a pair per link of a chained step) read
    through Spark's state data source: every run a key group lists is
    stored and decodes."""
    if last is None:
        return
    for op, (op_name, _) in state_operators(q).items():
        if op_name is None or "transformWithState" not in op_name:
            continue
        for meta_var, runs_var in keyed_state_pairs(os.path.join(q, "state", str(op))):
            _check_keyed_pair(spark, q, name, last, op, op_name, meta_var, runs_var, findings)


def _check_keyed_pair(spark, q: str, name: str, last: int, op: int, op_name: str, meta_var: str,
                      runs_var: str, findings: list) -> None:
    try:
        meta = read_state_variable(spark, q, op, last, meta_var)
    except Exception as e:   # a variable this operator does not have, or unreadable state
        text = str(e).split("\n")[0]
        if meta_var in text and ("STATE_VAR" in text or "not found" in text.lower()):
            return
        findings.append(Finding(name, True, f"state of operator {op} ({op_name}) after batch {last} "
                                            f"cannot be read: {text}"))
        return
    if meta.empty:
        return
    runs = read_state_variable(spark, q, op, last, runs_var)
    stored = {}
    for _, r in runs.iterrows():
        stored[(int(r["key"]["_kg"]), r["user_map_key"]["run_id"])] = r["user_map_value"]["blob"]
    for _, r in meta.iterrows():
        group = int(r["key"]["_kg"])
        listed = json.loads(r["value"]["run_ids"])
        ids = listed if isinstance(listed, list) else listed["runs"]
        operator = (listed.get("operator") if isinstance(listed, dict) else None) or op_name
        for rid in ids:
            blob = stored.get((group, rid))
            problem = "is listed but missing" if blob is None else _undecodable(blob)
            if problem:
                findings.append(Finding(name, True, (
                    f"state of operator {op} ({operator}), key group {group}, after batch {last}: "
                    f"state run {rid} {problem}")))


def _undecodable(blob) -> Optional[str]:
    import pyarrow as pa
    try:
        pa.ipc.open_stream(pa.BufferReader(bytes(blob))).read_all()
    except (pa.ArrowException, ValueError) as e:
        return f"does not decode ({e})"
    return None


# ------------------------------------------------------------ checksum files
#: Hadoop's checksum file (``ChecksumFs``): ``crc\0``, the bytes per
#: checksum (a big-endian int), then a big-endian CRC-32 per chunk
_CRC_MAGIC = b"crc\x00"
_BYTES_PER_CHECKSUM = 512


def checksum_path(path: str) -> str:
    """Where Hadoop keeps ``path``'s checksum: ``.NAME.crc`` beside it."""
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.crc")


def hadoop_checksum(data: bytes, bytes_per_checksum: int = _BYTES_PER_CHECKSUM) -> bytes:
    """The bytes of ``data``'s checksum file, as Hadoop writes it."""
    sums = b"".join(struct.pack(">I", zlib.crc32(data[i:i + bytes_per_checksum]))
                    for i in range(0, len(data), bytes_per_checksum))
    return _CRC_MAGIC + struct.pack(">i", bytes_per_checksum) + sums


def checksum_mismatch(path: str) -> Optional[str]:
    """Why ``path`` does not match its checksum file, or None (it matches,
    or it has none)."""
    try:
        with open(checksum_path(path), "rb") as fh:
            crc = fh.read()
    except FileNotFoundError:
        return None
    if len(crc) < 8 or crc[:4] != _CRC_MAGIC:
        return f"its checksum file {os.path.basename(checksum_path(path))} is not one"
    with open(path, "rb") as fh:
        data = fh.read()
    if hadoop_checksum(data, struct.unpack(">i", crc[4:8])[0]) != crc:
        return (f"it does not match its checksum file {os.path.basename(checksum_path(path))} "
                "(the file was damaged or changed after it was written)")
    return None


def log_files(q: str) -> Iterator[str]:
    """The files of query checkpoint ``q`` other than the state stores' data:
    the query's id, the offset, commit and source logs, the stateful
    operators' metadata and state schema.  Spark writes each once and never
    in place; nothing checksums them but a ``.crc`` file
    (docs/runtime.md, "Checkpoint files on the local file system")."""
    if os.path.isfile(os.path.join(q, "metadata")):
        yield os.path.join(q, "metadata")
    dirs = [os.path.join(q, "offsets"), os.path.join(q, "commits")]
    sources = os.path.join(q, "sources")
    if os.path.isdir(sources):
        dirs += [os.path.join(sources, s) for s in os.listdir(sources)]
    for d in dirs:
        if os.path.isdir(d):
            yield from (os.path.join(d, f) for f in os.listdir(d) if re.fullmatch(r"\d+(\.compact)?", f))
    state = os.path.join(q, "state")
    for op in os.listdir(state) if os.path.isdir(state) else []:
        for sub in ("_metadata", "_stateSchema"):
            for root, _, files in os.walk(os.path.join(state, op, sub)):
                yield from (os.path.join(root, f) for f in files if not f.startswith("."))


def seal_logs(q: str) -> None:
    """Write Hadoop's checksum file beside every log file of query checkpoint
    ``q`` that has none, and remove checksum files whose log file Spark
    purged.  Sessions write checkpoint files without them (Hadoop's
    ``RawLocalFs``: no child processes per file); these are written here, in
    the process, so that ``check`` and the next start find a damaged log
    file, and Hadoop's default file system verifies them too."""
    if not q or not os.path.isdir(q):
        return
    for path in log_files(q):
        crc = checksum_path(path)
        if os.path.exists(crc):
            continue
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:      # purged meanwhile
            continue
        tmp = crc[:-4] + ".crc-tmp"
        with open(tmp, "wb") as fh:
            fh.write(hadoop_checksum(data))
        os.replace(tmp, crc)
    for d in (os.path.join(q, "offsets"), os.path.join(q, "commits")):
        for f in os.listdir(d) if os.path.isdir(d) else []:
            m = re.fullmatch(r"\.(\d+)\.crc", f)
            if m and not os.path.exists(os.path.join(d, m.group(1))):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(d, f))


def verify_logs(q: str, checkpoint: str) -> None:
    """Raise :class:`DamagedCheckpoint` naming the first log file of ``q``
    that does not match its checksum file: run before a query resumes."""
    if not q or not os.path.isdir(q):
        return
    for path in sorted(log_files(q)):
        problem = checksum_mismatch(path)
        if problem:
            raise _damaged(f"{os.path.relpath(path, q)}: {problem}", checkpoint)


def _check_checksum_files(q: str, name: str, findings: list) -> None:
    """Every file with a checksum file beside it matches it: the log files
    (sealed by :func:`seal_logs`) and, in checkpoints written with Hadoop's
    default local file system, every file."""
    for root, _, files in os.walk(q):
        for f in files:
            m = re.fullmatch(r"\.(.+)\.crc", f)
            if not m or not os.path.isfile(os.path.join(root, m.group(1))):
                continue
            path = os.path.join(root, m.group(1))
            if any(path in x.text for x in findings):
                continue        # already named (a torn log file)
            problem = checksum_mismatch(path)
            if problem:
                findings.append(Finding(name, True, f"{os.path.relpath(path, q)}: {problem}"))


def check_checkpoint(checkpoint: str, spark=None) -> CheckReport:
    """Verify ``checkpoint`` (module docstring); ``spark``: also read the
    keyed operators' state."""
    if not os.path.isdir(checkpoint):
        raise FileNotFoundError(f"checkpoint {checkpoint} does not exist")
    queries = query_dirs(checkpoint)
    findings: list = []
    lasts = {}
    if not queries:
        findings.append(Finding(checkpoint, True, "no streaming query checkpoint here (no offsets and "
                                                  "commits directories)"))
    for q in queries:
        name = os.path.relpath(q, checkpoint)
        blocking: list = []     # findings that keep Spark from reading the state
        last = _check_logs(q, name, blocking)
        lasts[name] = last
        _check_state_files(q, name, last, blocking)
        _check_temporary_files(q, name, findings)
        _check_checksum_files(q, name, blocking)
        findings.extend(blocking)
        if spark is not None and not any(f.problem for f in blocking):
            _check_keyed_state(spark, q, name, last, findings)
    return CheckReport(checkpoint, [os.path.relpath(q, checkpoint) for q in queries], findings, lasts)


# ----------------------------------------------------------------- relocate
#: the files of Spark's query checkpoint that name absolute paths
#: (docs/errors.md, "A moved project"): the file source logs (every input
#: file read) and transformWithState's operator metadata (its state schema
#: files); relative to Spark's checkpoint directory (:func:`query_dirs`).
#: The plan fingerprint beside it is ours: plan.fingerprint.relocate_fingerprint
_PATH_FILES = ("sources", "state")


def _path_bearing_files(q: str):
    for rel in _PATH_FILES:
        for root, _, files in os.walk(os.path.join(q, rel)):
            # state data (RocksDB .zip/.sst/.changelog) is binary and relative;
            # only the operators' metadata logs name files
            if rel.endswith("state") and f"{os.sep}_metadata" not in root:
                continue
            for f in files:
                if not f.endswith(".crc"):
                    yield os.path.join(root, f)


def path_pattern(old: str) -> "re.Pattern":
    """``old`` as a path prefix ending at a component boundary (``/a/proj``
    does not match ``/a/project``)."""
    return re.compile(re.escape(old) + r"(?=[/\"\\\]',)]|$)")


def relocate_checkpoint(checkpoint: str, old: str, new: str) -> list[str]:
    """Rewrite the absolute paths under ``old`` to ``new`` in a checkpoint's
    path-bearing files (:data:`_PATH_FILES`), so a project directory moved
    from ``old`` to ``new`` resumes where it stopped.  Each file is replaced
    atomically and its Hadoop checksum file (``.NAME.crc``, which would no
    longer match) removed.  Returns the files rewritten; raises ValueError
    when ``checkpoint`` is not a streaming checkpoint or nothing in it names
    ``old``."""
    old, new = os.path.abspath(old).rstrip(os.sep), os.path.abspath(new).rstrip(os.sep)
    queries = query_dirs(checkpoint)
    if not queries:
        raise ValueError(f"{checkpoint}: not a streaming checkpoint (no offsets and commits "
                         "logs under it)")
    pattern = path_pattern(old)
    changed = []
    for q in queries:
        for path in _path_bearing_files(q):
            with open(path, "rb") as f:
                blob = f.read()
            if b"\0" in blob:
                continue
            text = blob.decode("utf-8")
            updated = pattern.sub(new.replace("\\", "\\\\"), text)
            if updated == text:
                continue
            tmp = path + ".relocate-tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(updated)
            os.replace(tmp, path)
            crc = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.crc")
            if os.path.exists(crc):
                os.remove(crc)
            changed.append(path)
    return changed
