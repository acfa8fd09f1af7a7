"""The plan's fingerprint, kept in a streaming query's checkpoint (docs/errors.md,
"A checkpoint whose query changed").

A checkpoint holds the state of the operators that wrote it.  When the script
changes, Spark either fails deep inside (``STREAMING_STATEFUL_OPERATOR_NOT_
MATCH_IN_STATE_METADATA``) or, worse, accepts the change silently: a changed
``WHERE`` runs on new input only, and the rows the new filter excludes stay
in the table.  So the checkpoint directory keeps ``plan-fingerprint.json``:

    {"version": 1,
     "state": sha256 of the state-bearing shape: every node but filters,
              projections and watermark assigners, with the columns entering
              each stateful operator and its key-group count when set,
     "full": sha256 of the whole plan (every node's label and columns),
     "stateful": the state-bearing nodes, one line each, for messages,
     "plan": the plan as lines (every node), for messages,
     "key_groups": the key-group count of keyed operators that set none,
     "key_group_ids": how their key groups' ids are laid out,
     "keyed_chains": whether keyed operators run chained}

The key-group count is part of the state's layout (docs/runtime.md, "Key
groups and rescaling"): a new checkpoint records the default for its state
partitions (``model.partitioning.default_key_groups``), one without the field
was written when the default was ``LEGACY_KEY_GROUPS``, and a query resumes with
the count its checkpoint recorded (:func:`with_key_groups`).  An operator
that sets the recorded count explicitly has the same state as one that sets
none, so the comparison leaves ``key groups=<recorded>`` out of the lines of
keyed operators.  ``spark-changelog rescale`` rewrites the state to another
count and records it here.  ``key_group_ids`` is the other half of the
layout: ``"spread"`` (``model.partitioning.SPREAD_IDS``: a key group's index
``pmod(hash(key), G)`` is stored under an id Spark's hash partitioner spreads
evenly over the state partitions), recorded by every new checkpoint; a
checkpoint with progress and without the field was written with the index
itself as the id (``PLAIN_IDS``) and resumes so
(:func:`checkpoint_key_group_ids`).  ``spark-changelog rescale`` writes the
state it regroups with the spread ids and records them.  ``keyed_chains``
is the third: ``true`` (recorded by every new checkpoint) when keyed
operators whose keys nest run as one keyed step, the later one's state in
the earlier one's key groups (``plan.chains``, docs/runtime.md, "Chained
keyed operators"); a checkpoint with progress and without the field ran
them unchained, as separate stateful operators, and keeps running so
(:func:`checkpoint_keyed_chains`).  ``spark-changelog rescale`` keeps it.

On a restart the fingerprint of the script's plan is compared with the file:
the same ``state`` and ``full``: go on; the same ``state`` but another
``full`` (a filter, a projection, a watermark changed): go on with a warning
saying what is not redone, and the file is rewritten; another ``state``:
refused (:class:`~spark_changelog.model.errors.CheckpointMismatch`), with the
choices spelled out (or, for event-time deduplication and ``ON CONFLICT DO
ERROR/NOTHING`` written when their state was Spark's event-time timers, why
that checkpoint cannot resume).  A checkpoint without the file (written before it
existed) is taken as is and gets one.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from typing import Optional

from ..model.errors import CheckpointMismatch
from ..model.partitioning import LEGACY_KEY_GROUPS, PLAIN_IDS, SPREAD_IDS
from .nodes import Filter, Node, Normalize, Project, Sink, Source, WatermarkAssigner, WindowAggregate

FILE_NAME = "plan-fingerprint.json"
VERSION = 1

#: nodes that keep no state: changing them does not break a checkpoint
STATELESS = (Filter, Project, WatermarkAssigner)


def _walk(node: Node, depth: int = 0):
    yield node, depth
    for child in node.children:
        yield from _walk(child, depth + 1)


def _label(node: Node) -> str:
    """The node's label without why the planner inserted it (the same
    operator and state whatever its consumer)."""
    if isinstance(node, Normalize) and node.inserted_because:
        node = dataclasses.replace(node, inserted_because="")
    return node.label()


def _state_label(node: Node) -> str:
    """The label as far as state goes: a sink's table (its name or path)
    holds no state of the query, so a moved or renamed table does not count;
    nor does a window aggregate's ``window_time`` column."""
    if isinstance(node, Sink):
        return _label(dataclasses.replace(node, name="*"))
    if isinstance(node, WindowAggregate):   # window_time is computed after the operator
        return _label(dataclasses.replace(node, window_time=False))
    return _label(node)


def _line(node: Node, depth: int) -> str:
    return f"{'  ' * depth}{_label(node)} columns={list(node.traits.columns)}"


def plan_fingerprint(node: Node, key_groups: Optional[int] = None,
                     key_group_ids: str = SPREAD_IDS, keyed_chains: bool = True) -> dict:
    """The fingerprint of a planned sink (see the module docstring);
    ``key_groups``: the count of keyed operators that set none;
    ``key_group_ids``: their ids' layout; ``keyed_chains``: whether keyed
    operators run chained."""
    plan, stateful = [], []
    for n, depth in _walk(node):
        plan.append(_line(n, depth))
        if isinstance(n, STATELESS):
            continue
        if isinstance(n, Source):
            stateful.append(f"{_label(n)} columns={list(n.traits.columns)}")
        else:
            inputs = [list(c.traits.columns) for c in n.children]
            groups = getattr(n, "key_groups", None)     # fixed for a checkpoint's life
            stateful.append(f"{_state_label(n)} input columns={inputs}"
                            + (f" key groups={groups}" if groups is not None else ""))
    return {"version": VERSION,
            "state": _sha("\n".join(stateful)),
            "full": _sha("\n".join(plan)),
            "stateful": stateful,
            "plan": plan,
            "key_groups": key_groups,
            "key_group_ids": key_group_ids,
            "keyed_chains": bool(keyed_chains)}


def _own_count(line: str) -> bool:
    """Whether the stateful line is an event-time operator's (a window
    aggregation, or an operator that waits for the watermark: its label
    names it), whose key-group count has its own default."""
    return line.lstrip().startswith("WindowAggregate(") or ", watermark=[" in line


def _state_lines(stateful: list, key_groups: int) -> list:
    """The stateful lines as far as state goes when keyed operators that set
    no count run with ``key_groups``: an explicit ``key groups=<that count>``
    is the same state."""
    suffix = f" key groups={key_groups}"
    return [s[:-len(suffix)] if s.endswith(suffix) and not _own_count(s) else s for s in stateful]


#: what an event-time operator's label says it waits for (its sources' watermarks)
_WAITS_FOR = re.compile(r", watermark=\[[^\]]*\]")
#: the operators whose state moved from Spark's event-time timers to the
#: sources' watermark rows (event-time keep-first, ON CONFLICT DO ERROR/NOTHING)
_TIMER_OPERATORS = ("Deduplicate(", "SinkUpsertMaterializer(")


def _earlier_event_time_layout(old: list, new: list) -> list:
    """The checkpoint's stateful lines of event-time deduplication or
    ``ON CONFLICT DO ERROR/NOTHING`` written before these operators waited
    for the sources' watermark rows: the script's line without its
    ``watermark=[...]``, with Spark's timers as state (see
    :func:`check_checkpoint`).  Empty when the checkpoint has none."""
    before = {_WAITS_FOR.sub("", line) for line in new
              if line.startswith(_TIMER_OPERATORS) and _WAITS_FOR.search(line)}
    return [line for line in old if line in before]


def checkpoint_key_groups(checkpoint: str, fresh: int) -> int:
    """The key-group count of keyed operators that set none, for a query
    run with ``checkpoint``: the count it recorded, :data:`LEGACY_KEY_GROUPS`
    for one written before counts were recorded, ``fresh`` (the session's
    default) for a checkpoint without progress."""
    old = read_fingerprint(checkpoint)
    if old is None or not _has_progress(checkpoint):
        return fresh
    return int(old.get("key_groups", LEGACY_KEY_GROUPS))


def checkpoint_key_group_ids(checkpoint: str) -> str:
    """The key-group id layout of the keyed operators of a query run with
    ``checkpoint``: the layout it recorded, :data:`PLAIN_IDS` for one with
    progress written before layouts were recorded (with or without a
    fingerprint), :data:`SPREAD_IDS` for a checkpoint without progress."""
    if not _has_progress(checkpoint):
        return SPREAD_IDS
    old = read_fingerprint(checkpoint)
    return PLAIN_IDS if old is None else old.get("key_group_ids", PLAIN_IDS)


def checkpoint_keyed_chains(checkpoint: str) -> bool:
    """Whether the keyed operators of a query run with ``checkpoint`` run
    chained: as it recorded; not for one with progress written before it
    was recorded (with or without a fingerprint); yes for a checkpoint
    without progress."""
    if not _has_progress(checkpoint):
        return True
    old = read_fingerprint(checkpoint)
    return False if old is None else bool(old.get("keyed_chains", False))


def rescale_fingerprint(directory: str, key_groups: int) -> None:
    """The fingerprint in ``directory`` after ``spark-changelog rescale``: the
    keyed operators run with ``key_groups`` (their lines lose an explicit
    count, event-time operators keep theirs: the rescale leaves their state),
    under the spread ids (the rescale writes their state so)."""
    old = read_fingerprint(directory)
    if old is None:
        return
    lines = [s if _own_count(s) else re.sub(r" key groups=\d+$", "", s) for s in old.get("stateful", [])]
    write_fingerprint(directory, {**old, "stateful": lines, "state": _sha("\n".join(lines)),
                                  "key_groups": key_groups, "key_group_ids": SPREAD_IDS})


def with_key_groups(node: Node, key_groups: int) -> Node:
    """``node`` with every keyed operator that sets no key-group count set to
    ``key_groups`` (window aggregations and the operators that wait for the
    watermark run in the event-time runtime, with its own default)."""
    children = [with_key_groups(c, key_groups) for c in node.children]
    if any(c is not o for c, o in zip(children, node.children)):
        node = node.with_children(*children)
    if getattr(node, "key_groups", 0) is None and not isinstance(node, WindowAggregate) \
            and not getattr(node, "waits_for_watermark", False):
        node = dataclasses.replace(node, key_groups=key_groups)
    return node


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def read_fingerprint(checkpoint: str) -> Optional[dict]:
    try:
        with open(os.path.join(checkpoint, FILE_NAME), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def write_fingerprint(checkpoint: str, fingerprint: dict) -> None:
    os.makedirs(checkpoint, exist_ok=True)
    path = os.path.join(checkpoint, FILE_NAME)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(fingerprint, f, indent=1)
    os.replace(tmp, path)


def relocate_fingerprint(checkpoint: str, pattern, new: str) -> bool:
    """The fingerprint of a query checkpoint with the paths ``pattern``
    matches (a moved project's old directory) replaced by ``new``, its
    hashes recomputed (``spark-changelog relocate``, docs/errors.md).
    Returns whether it changed."""
    fp = read_fingerprint(checkpoint)
    if fp is None:
        return False
    lines = {k: [pattern.sub(new.replace("\\", "\\\\"), line) for line in fp.get(k, [])]
             for k in ("stateful", "plan")}
    if lines == {k: fp.get(k, []) for k in lines}:
        return False
    fp.update(lines, state=_sha("\n".join(lines["stateful"])), full=_sha("\n".join(lines["plan"])))
    write_fingerprint(checkpoint, fp)
    return True


def _has_progress(checkpoint: str) -> bool:
    """Whether Spark's checkpoint under ``checkpoint`` committed a batch."""
    commits = os.path.join(checkpoint, "main", "commits")
    return os.path.isdir(commits) and any(not n.startswith(".") for n in os.listdir(commits))


def _short(line: str) -> str:
    return line.strip().split(" columns=")[0]


def is_streaming(node: Node) -> bool:
    return any(isinstance(n, Source) and n.streaming for n, _ in _walk(node))


def check_checkpoint(checkpoint: str, node: Node, fresh_key_groups: int) -> Optional[str]:
    """Compare the plan ``node`` with the checkpoint's fingerprint (module
    docstring).  Returns a warning when the change is allowed, None when
    nothing changed; raises :class:`CheckpointMismatch` when it breaks state.
    ``fresh_key_groups``: the count a new checkpoint records."""
    groups = checkpoint_key_groups(checkpoint, fresh_key_groups)
    new = plan_fingerprint(node, groups, checkpoint_key_group_ids(checkpoint),
                           checkpoint_keyed_chains(checkpoint))
    old = read_fingerprint(checkpoint)
    if old is None or not _has_progress(checkpoint):
        write_fingerprint(checkpoint, new)
        return None
    if old.get("state") == new["state"] and old.get("full") == new["full"] \
            and old.get("key_groups") == groups and old.get("key_group_ids") == new["key_group_ids"] \
            and old.get("keyed_chains") == new["keyed_chains"]:
        return None
    where = os.path.join(checkpoint, FILE_NAME)
    same_state = (_state_lines(old.get("stateful", []), groups)
                  == _state_lines(new["stateful"], groups))
    if old.get("state") != new["state"] and not same_state:
        old_lines = _state_lines(old.get("stateful", []), groups)
        new_lines = _state_lines(new["stateful"], groups)
        earlier = _earlier_event_time_layout(old_lines, new_lines)
        if earlier:
            raise CheckpointMismatch(
                "it was written by an earlier spark-changelog whose event-time "
                "deduplication and ON CONFLICT DO ERROR/NOTHING kept their state in Spark's "
                "event-time timers; this version folds the sources' watermarks itself "
                "(docs/runtime.md, \"Event time: the sources' watermarks\") and cannot resume "
                "that state", where=f"checkpoint {checkpoint}",
                detail="\n".join(f"in the checkpoint: {s}" for s in earlier),
                todo=("start a new --checkpoint DIR, which reads all input again (write to a "
                      "new table, or empty this one first: its rows stay); or finish this "
                      "checkpoint's input with the version that wrote it"))
        gone = [s for s in old_lines if s not in new_lines]
        added = [s for s in new_lines if s not in old_lines]
        detail = "\n".join([f"in the checkpoint, not in the script: {s}" for s in gone]
                           + [f"in the script, not in the checkpoint: {s}" for s in added])
        raise CheckpointMismatch(
            "the query changed in a way its state cannot follow (a stateful operator, its key "
            "or its input columns changed)", where=f"checkpoint {checkpoint}", detail=detail,
            todo=("either run the script that wrote this checkpoint (its plan is in "
                  f"{where}); or start a new --checkpoint DIR, which reads all input again "
                  "(write to a new table, or empty this one first: its rows stay); or delete "
                  "the checkpoint and the table and run again"))
    removed = [_short(s) for s in old.get("plan", []) if s not in new["plan"]]
    added = [_short(s) for s in new["plan"] if s not in old.get("plan", [])]
    write_fingerprint(checkpoint, new)
    if old.get("full") == new["full"]:
        return None     # only how the key-group layout is written changed
    change = "; ".join([f"was {s}" for s in removed] + [f"now {s}" for s in added])
    return ("the query changed since this checkpoint was written (" + change + "): the state "
            "is kept and only input not yet read goes through the new query; rows already "
            "written are not redone (rows a new filter excludes stay in the table); for the "
            "new query over all input, start a new --checkpoint and a new table")


__all__ = ["plan_fingerprint", "read_fingerprint", "write_fingerprint", "check_checkpoint",
           "checkpoint_key_groups", "checkpoint_key_group_ids", "checkpoint_keyed_chains", "with_key_groups", "rescale_fingerprint", "relocate_fingerprint", "is_streaming", "FILE_NAME", "VERSION"]
