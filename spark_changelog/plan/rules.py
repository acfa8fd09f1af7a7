"""Planner rules: where a ChangelogNormalize and a SinkUpsertMaterializer go.

``order_input(node, consumer)`` (docs/semantics.md, section 10): an
order-sensitive consumer (a join side, the materializer, an upsert sink, and
every stateful operator that keeps per-key state) must see each source key's
changes in source-sequence order.  A streaming CDC source does not guarantee
that: files and micro-batches can bring an older change after a newer one, and
a join would then retract a row it has not stored yet and keep the older row
for ever.  Where the input is not ``ordered`` the rule inserts a
sequence-aware ChangelogNormalize on the input's upsert key: it applies each
key's newest change and drops (and counts as ``superseded``) any change older
than the one applied.  An upsert input of a join gets one too: the join needs
update-before rows to retract what it emitted.

Where a SinkUpsertMaterializer goes (docs/semantics.md, section 3):

``materialize(sink, strategy, conflict)`` mirrors Flink's
``table.exec.sink.upsert-materialize``:

* ``auto``: insert it only where the sink has a primary key, the input has
  updates, and the sink key does not contain the input's upsert key (then the
  changes of one sink key may arrive in any order: docs/semantics.md, section 2);
* ``force``: always, when the sink has a primary key;
* ``none``: never.  An explicit ``conflict`` with ``none`` is rejected: Flink
  2.3 silently ignores ``ON CONFLICT DO DEDUPLICATE`` there (FLINK-41007).

Every decision carries the reason it was (not) taken; ``unsafe`` marks a plan
whose sink may end with wrong rows (``none`` where ``auto`` would insert it).
Plan-time warnings: rows without an upsert key that carry non-deterministic
columns (their retractions can never match, the materializer's state grows
forever); a ``conflict`` of ``error``/``nothing`` needs watermarks.
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Optional, Sequence

from ..model import ChangelogMode
from .nodes import (Aggregate, Deduplicate, Filter, History, Join, Materialize, Node, Normalize,
                    Project,
                    Sink, TopN, Traits, UnionAll, WatermarkAssigner, fmt_key, source_leaves)

STRATEGIES = ("auto", "none", "force")
CONFLICTS = ("deduplicate", "error", "nothing")


class PlanError(ValueError):
    """A plan that cannot be run as asked."""


@dataclasses.dataclass(frozen=True)
class MaterializeDecision:
    inserted: bool
    reason: str
    unsafe: bool = False
    conflict: str = "deduplicate"
    warnings: tuple[str, ...] = ()


def needs_materializer(t: Traits, sink_key) -> tuple[bool, str]:
    """Whether ``auto`` inserts it, and why."""
    sk = tuple(sink_key)
    if not t.mode.has_updates:
        return False, "the input is insert-only: there are no updates whose order could be lost"
    if t.upsert_key and set(t.upsert_key) <= set(sk):
        return False, (f"the sink key {fmt_key(sk)} contains the input's upsert key "
                       f"{fmt_key(t.upsert_key)}: the changes of every sink key keep their order")
    why = (f"the input has updates ({t.mode.value} [{t.mode.kinds[1:-1]}]) and ")
    if t.upsert_key:
        why += (f"its upsert key {fmt_key(t.upsert_key)} is not contained in the sink key "
                f"{fmt_key(sk)}: several upsert keys map to one sink key")
    else:
        why += (f"it has no upsert key (order per key lost upstream), so the changes of one sink "
                f"key {fmt_key(sk)} can arrive in any order (docs/semantics.md, section 2)")
    return True, why


def nondeterminism_warnings(t: Traits) -> tuple[str, ...]:
    if t.upsert_key or not t.mode.has_updates or not t.nondeterministic:
        return ()
    cols = ", ".join(sorted(t.nondeterministic))
    return (f"non-deterministic column(s) [{cols}] in rows without an upsert key: a retraction "
            "is matched against earlier rows on all columns, and a re-computed value never "
            "matches, so retractions are lost and the materializer's state grows without bound. "
            "Compute such columns before a stateful step that keeps the row (e.g. normalize), "
            "keep an upsert key, or drop the column.",)


def unordered_warnings(t: Traits, consumer: str) -> tuple[str, ...]:
    if t.ordered:
        return ()
    return (f"{consumer} gets a streaming changelog without a key, so its per-row order cannot be "
            "restored: changes are applied in arrival order, and a retraction that arrives "
            "before its row (files or micro-batches out of sequence order) leaves a stale row. "
            "Declare a primary key on the source (docs/semantics.md, section 10).",)


def decide(t: Traits, sink_key, strategy: str = "auto", conflict: Optional[str] = None,
           require_on_conflict: bool = False) -> MaterializeDecision:
    """The materializer decision for a sink with ``sink_key`` over input traits ``t``."""
    strategy = strategy.lower()
    if strategy not in STRATEGIES:
        raise PlanError(f"materialize must be one of {STRATEGIES}, got {strategy!r}")
    if conflict is not None and conflict not in CONFLICTS:
        raise PlanError(f"conflict must be one of {CONFLICTS}, got {conflict!r}")
    sk = tuple(sink_key or ())
    warnings = nondeterminism_warnings(t) + unordered_warnings(t, "the sink")
    if strategy == "none" and conflict is not None:
        raise PlanError(
            f"conflict={conflict!r} (ON CONFLICT DO {conflict.upper()}) needs the sink upsert "
            "materializer, but materialize='none' disables it; Flink 2.3 silently ignores the "
            "clause in this case (FLINK-41007). Use materialize='auto' or 'force', or drop "
            "conflict=.")
    if not sk:
        if conflict is not None:
            raise PlanError(f"conflict={conflict!r} needs a sink with a primary key")
        return MaterializeDecision(False, "the sink has no primary key", warnings=warnings)
    needed, why = needs_materializer(t, sk)
    if strategy == "none":
        if needed:
            return MaterializeDecision(
                False, f"disabled (materialize='none'), although {why}. UNSAFE: an upsert sink "
                "keyed by " + fmt_key(sk) + " may apply a retraction after a newer row and lose "
                "it (docs/semantics.md, section 2)", unsafe=True, conflict="none", warnings=warnings)
        return MaterializeDecision(False, f"disabled (materialize='none'); not needed: {why}",
                                   conflict="none", warnings=warnings)
    if needed and conflict is None and require_on_conflict:
        raise PlanError(
            f"The query has an upsert key that differs from the primary key of the sink. Primary "
            f"key: {fmt_key(sk)}, upsert key: {fmt_key(t.upsert_key)}. This can lead to "
            "non-deterministic results when multiple records with different upsert keys map to "
            "the same primary key. Specify conflict='deduplicate' (keep the latest row, state "
            "intensive), 'error' (fail on conflict) or 'nothing' (keep the first row).")
    if conflict in ("error", "nothing") and (needed or strategy == "force") and not t.has_watermark:
        raise PlanError(
            f"conflict={conflict!r} (ON CONFLICT DO {conflict.upper()}) requires all sources to "
            "define watermarks (it buffers changes per key until the watermark passes them); "
            "the input has none. Use conflict='deduplicate'.")
    chosen = conflict or "deduplicate"
    if strategy == "force":
        return MaterializeDecision(True, f"forced (materialize='force'); auto would "
                                   f"{'insert it too: ' if needed else 'not: '}{why}",
                                   conflict=chosen, warnings=warnings)
    if needed:
        return MaterializeDecision(True, why, conflict=chosen, warnings=warnings)
    return MaterializeDecision(False, f"not needed: {why}", conflict=chosen, warnings=warnings)


def materialize(sink: Sink, strategy: Optional[str] = None, conflict: Optional[str] = None,
                require_on_conflict: bool = False) -> Sink:
    """The sink with its decision, and a :class:`Materialize` node in front of
    it when inserted.  ``strategy``/``conflict`` default to the sink's."""
    strategy = strategy or sink.strategy
    conflict = conflict if conflict is not None else sink.conflict
    d = decide(sink.input.traits, sink.key, strategy, conflict, require_on_conflict)
    inp: Node = sink.input
    if d.inserted:
        inp = Materialize(inp, tuple(sink.key), inp.traits.upsert_key, d.conflict,
                          sink.materializer_ttl_ms, sink.key_groups)
    return dataclasses.replace(sink, input=inp, strategy=strategy, conflict=conflict, decision=d)


#: consumers of an upsert stream that need -U rows, and why
NEEDS_UPDATE_BEFORE = {
    "join": "the join must retract what it emitted for the key",
    "filter": "a row that leaves the filter must be retracted by its old content",
    "group aggregate": "the accumulators retract the old row's values",
    "top-n": "a row that leaves the top N is retracted by its old content",
    "union": "a union has no key to rebuild an old row by, so its consumers need -U",
}


def order_input(node: Node, consumer: str, update_before: bool = True,
                state_ttl_ms: Optional[int] = None) -> Node:
    """``node``, or a ChangelogNormalize over it that restores per-key order.

    ``consumer`` names what needs the order (for explain); ``update_before``:
    whether the consumer needs ``-U`` rows (a join or a materializer does, an
    upsert sink keyed by the upsert key does not).  The normalize keeps its
    state as long as the consumer does (``state_ttl_ms``: the consumer's TTL,
    as Flink's ``table.exec.state.ttl`` covers every stateful operator).
    """
    t = node.traits
    upsert_input = t.mode is ChangelogMode.UPSERT and consumer in NEEDS_UPDATE_BEFORE
    if t.ordered and not upsert_input:
        return node
    key = t.upsert_key or (t.unique_keys[0] if t.unique_keys else None)
    if not key:
        if upsert_input:
            raise PlanError(f"an upsert stream without a key cannot be the input of a {consumer}: "
                            "give it a primary key")
        # no key to restore the order by: the changes are applied as they arrive;
        # join_traits and decide() say so in explain and as a plan warning
        return node
    if not t.ordered:
        why = (f"{consumer} needs each key's changes in source-sequence order; a streaming source "
               "may bring them out of order across files and micro-batches (older changes are "
               "dropped and counted as superseded)")
    else:
        why = f"upsert input of a {consumer} needs update-before: {NEEDS_UPDATE_BEFORE[consumer]}"
        update_before = True
    return Normalize(node, tuple(key), update_before, inserted_because=why,
                     state_ttl_ms=state_ttl_ms)


_OPTIMIZED: "weakref.WeakKeyDictionary[Node, object]" = weakref.WeakKeyDictionary()
_UNCHANGED = object()


def optimize(node: Node) -> Node:
    """The plan with what the planner inserts in front of order-sensitive
    operators: every join input and the input of a group aggregate, Top-N and
    insert-only deduplication goes through :func:`order_input`.  Pure and
    memoized per node, so planning a stream twice gives the same tree (and
    lowering builds its DataFrames once)."""
    done = _OPTIMIZED.get(node)
    if done is not None:
        return node if done is _UNCHANGED else done
    children = tuple(optimize(c) for c in node.children)
    if isinstance(node, Join):
        ttl = node.state_ttl_ms
        ttls = ttl if isinstance(ttl, tuple) else (ttl, ttl)
        children = tuple(order_input(c, "join", state_ttl_ms=t) for c, t in zip(children, ttls))
    elif isinstance(node, Aggregate):
        children = (order_input(children[0], "group aggregate", state_ttl_ms=node.state_ttl_ms),)
    elif isinstance(node, TopN):
        children = (order_input(children[0], "top-n", state_ttl_ms=node.state_ttl_ms),)
    elif isinstance(node, Deduplicate) and children[0].traits.mode is ChangelogMode.INSERT_ONLY:
        # keep last over a changelog input is a ChangelogNormalize itself (sequence-aware)
        children = (order_input(children[0], "deduplicate", state_ttl_ms=node.state_ttl_ms),)
    elif isinstance(node, UnionAll):
        # each input's per-key order is what the union keeps (plan/nodes.py, UnionAll)
        children = tuple(order_input(c, "union") for c in children)
    elif isinstance(node, Filter) and children[0].traits.mode is ChangelogMode.UPSERT:
        # stateless, so not order-sensitive; but an upsert input has no -U to filter
        children = (order_input(children[0], "filter"),)
    done = node.with_children(*children) if children else node
    # a value referring to its own key would keep the entry alive for ever
    _OPTIMIZED[node] = _UNCHANGED if done is node else done
    return done


_FOLDED: "weakref.WeakKeyDictionary[Node, object]" = weakref.WeakKeyDictionary()


def fold_micro_batches(node: Node) -> Node:
    """The plan with micro-batch folding on every keep-last operator
    (ChangelogNormalize, keep-last Deduplicate): each key's changes within a
    micro-batch become its net change (docs/operators.md, "Micro-batch
    folding"; Flink's ``table.exec.mini-batch.enabled``).  Group aggregation
    and Top-N emit once per key and micro-batch anyway; keep first emits a
    key's first row only, so there is nothing to fold.  Memoized like
    :func:`optimize`."""
    done = _FOLDED.get(node)
    if done is not None:
        return node if done is _UNCHANGED else done
    children = tuple(fold_micro_batches(c) for c in node.children)
    out = node.with_children(*children) if children else node
    foldable = isinstance(out, Normalize) or (isinstance(out, Deduplicate) and out.keep == "last")
    if foldable and not out.fold_batch:
        out = dataclasses.replace(out, fold_batch=True)
    _FOLDED[node] = _UNCHANGED if out is node else out
    return out


def plan_sink(node: Node, key: Sequence[str], *, table: str = "sink", strategy: str = "auto",
              conflict: Optional[str] = None, require_on_conflict: bool = False,
              materializer_ttl_ms: Optional[int] = None, key_groups: Optional[int] = None,
              mini_batch: bool = False) -> Sink:
    """The planned sink over ``node``: per-key order restored where the input
    does not guarantee it (docs/semantics.md, section 10), then the
    materializer decision (section 3) for an upsert sink keyed by ``key``.
    ``mini_batch``: with :func:`fold_micro_batches`."""
    key = tuple(key)
    base = optimize(node)

    def planned(inp: Node) -> Sink:
        sink = materialize(Sink(inp, str(table), key, strategy, conflict,
                                materializer_ttl_ms=materializer_ttl_ms, key_groups=key_groups),
                           require_on_conflict=require_on_conflict)
        return fold_micro_batches(sink) if mini_batch else sink

    ordered = order_input(base, "upsert sink", update_before=False,
                          state_ttl_ms=materializer_ttl_ms)
    sink = planned(ordered)
    if isinstance(ordered, Normalize) and sink.decision.inserted:
        # the materializer retracts rows by their old content: it needs -U rows
        sink = planned(order_input(base, "sink upsert materializer", update_before=True,
                                   state_ttl_ms=materializer_ttl_ms))
    return sink


#: plan nodes whose state holds a row (or more) per key until it is retracted
_KEYED_STATE = (Join, Materialize, Normalize, Deduplicate, Aggregate, TopN, History)


def state_warnings(node: Node) -> list[str]:
    """Explain's warning about state that nothing bounds (docs/semantics.md,
    section 11): in a streaming run every stateful node without a state TTL
    keeps its per-key state for ever.  Windows are not listed: the watermark
    frees their state.  A bounded (batch) plan keeps no state across runs."""
    names: list[str] = []

    def walk(n: Node) -> None:
        for c in n.children:
            walk(c)
        if isinstance(n, _KEYED_STATE) and not n.state_ttl_ms:
            name = n.label().split("(", 1)[0]
            if name not in names:
                names.append(name)
    if not any(s.streaming for s in source_leaves(node)):
        return []
    walk(node)
    if not names:
        return []
    return [f"the state of {', '.join(names)} grows without bound in a streaming run: per-key "
            "rows stay until they are retracted, and no state TTL is set (`state_ttl_ms=` in the "
            "Python API, SET 'table.exec.state.ttl' in SQL). A TTL bounds it; a TTL shorter than "
            "the time between a row and its retraction leaves stale rows (counted and warned "
            "about at run time)"]


def emitted_once_key(node: Node) -> Optional[tuple[str, ...]]:
    """A key of ``node``'s output whose every value is emitted at most once
    over a query's life, as an insert, or ``None``.

    Keep first on processing time without a state TTL emits a key's first row
    and never anything else for that key (its state keeps every key seen, for
    ever); filters, watermark assigners and projections that keep the key's
    columns one-to-one (renamed at most) pass that on.  Anything else (a
    window, which may copy rows, a join, any operator with updates) ends it.
    The Delta sink appends instead of merging on this promise
    (docs/sinks.md, "Appends instead of MERGE")."""
    if isinstance(node, Deduplicate):
        ok = node.keep == "first" and node.order_by is None and not node.state_ttl_ms and node.key
        return tuple(node.key) if ok else None
    if isinstance(node, (Filter, WatermarkAssigner)):
        return emitted_once_key(node.input)
    if isinstance(node, Project):
        key = emitted_once_key(node.input)
        if key is None:
            return None
        carried = {}
        for it in node.items:
            if it.source is not None and it.injective and it.deterministic:
                carried.setdefault(it.source, it.name)
        return tuple(carried[c] for c in key) if all(c in carried for c in key) else None
    return None


def sink_keys_emitted_once(sink: Sink) -> bool:
    """Each value of the sink key reaches the sink at most once, as an insert:
    the input is insert-only and has a key emitted once
    (:func:`emitted_once_key`) whose columns are all in the sink key."""
    key = emitted_once_key(sink.input)
    return (key is not None and sink.input.traits.mode is ChangelogMode.INSERT_ONLY
            and set(key) <= set(sink.key))


def plan_warnings(node: Node) -> list[str]:
    out: list[str] = []

    def walk(n):
        for c in n.children:
            walk(c)
        if isinstance(n, Sink) and n.decision is not None:
            out.extend(w for w in n.decision.warnings if w not in out)
    walk(node)
    return out


__all__ = ["MaterializeDecision", "PlanError", "decide", "emitted_once_key", "fold_micro_batches",
           "materialize", "sink_keys_emitted_once",
           "needs_materializer",
           "order_input", "unordered_warnings", "optimize", "plan_sink",
           "nondeterminism_warnings", "plan_warnings", "state_warnings", "STRATEGIES", "CONFLICTS"]
