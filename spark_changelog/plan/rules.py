"""Planner rules: where a SinkUpsertMaterializer goes (spec section 3).

``materialize(sink, strategy, conflict)`` mirrors Flink's
``table.exec.sink.upsert-materialize``:

* ``auto``: insert it only where the sink has a primary key, the input has
  updates, and the sink key does not contain the input's upsert key (then the
  changes of one sink key may arrive in any order: spec section 2);
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
from typing import Optional

from .traits import Materialize, Node, Sink, Traits, fmt_key

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
                f"key {fmt_key(sk)} can arrive in any order (spec section 2)")
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


def decide(t: Traits, sink_key, strategy: str = "auto", conflict: Optional[str] = None,
           require_on_conflict: bool = False) -> MaterializeDecision:
    """The materializer decision for a sink with ``sink_key`` over input traits ``t``."""
    strategy = strategy.lower()
    if strategy not in STRATEGIES:
        raise PlanError(f"materialize must be one of {STRATEGIES}, got {strategy!r}")
    if conflict is not None and conflict not in CONFLICTS:
        raise PlanError(f"conflict must be one of {CONFLICTS}, got {conflict!r}")
    sk = tuple(sink_key or ())
    warnings = nondeterminism_warnings(t)
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
                "it (spec section 2)", unsafe=True, conflict="none", warnings=warnings)
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
        inp = Materialize(inp, tuple(sink.key), inp.traits.upsert_key, d.conflict)
    return dataclasses.replace(sink, input=inp, strategy=strategy, conflict=conflict, decision=d)


def plan_warnings(node: Node) -> list[str]:
    out: list[str] = []

    def walk(n):
        for c in n.children:
            walk(c)
        if isinstance(n, Sink) and n.decision is not None:
            out.extend(w for w in n.decision.warnings if w not in out)
    walk(node)
    return out


__all__ = ["MaterializeDecision", "PlanError", "decide", "materialize", "needs_materializer",
           "nondeterminism_warnings", "plan_warnings", "STRATEGIES", "CONFLICTS"]
