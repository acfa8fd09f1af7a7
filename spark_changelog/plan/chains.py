"""Which keyed operators run chained in one keyed step (docs/runtime.md,
"Chained keyed operators").

A keyed operator that reads the output of a keyed operator as it is (no
projection or filter between them), whose key contains that operator's key,
gets every row of one of its keys out of one key group of that operator.
The two then run in one call per key group, in that operator's key groups,
with no shuffle between them (``runtime.keyed_chain``).  Chained:

* the sink upsert materializer (not one waiting for the watermark) after a
  ChangelogNormalize whose key its sink key contains, in the normalize's key
  groups (a key-group count set on the materializer is not used);
* a regular join whose inputs are both a ChangelogNormalize on exactly that
  input's join keys (in their order): one shuffle of both inputs' rows in
  the join's union layout, tagged by side, and one call per key group runs
  the left normalize, the right normalize and the join, in the join's key
  groups.  Not when a normalize folds micro-batches (its pre-fold before
  the shuffle is per input).

Chaining changes where the second operator's state lives, so a checkpoint
records it (``"keyed_chains"`` in ``plan-fingerprint.json``): a query whose
checkpoint was written unchained lowers its plan inside
``keyed_chains(False)`` and keeps running unchained.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Optional

from .nodes import Join, Materialize, Node, Normalize, fmt_key

_CHAINS: contextvars.ContextVar = contextvars.ContextVar("keyed_chains", default=True)


@contextlib.contextmanager
def keyed_chains(enabled: bool):
    """Plans lowered (and explained) in this block chain keyed operators
    where they can (``enabled``) or never: ``plan.execute`` runs a query
    with what its checkpoint recorded (``fingerprint.checkpoint_keyed_chains``)."""
    token = _CHAINS.set(bool(enabled))
    try:
        yield
    finally:
        _CHAINS.reset(token)


def chaining() -> bool:
    """Whether :func:`keyed_chains`'s block (or the default) chains."""
    return _CHAINS.get()


def chain_reason(node: Node) -> Optional[str]:
    """Why ``node`` runs in one keyed step with the keyed operator it reads
    (its input, which then has no step of its own), or None when it does
    not (module docstring)."""
    if not chaining():
        return None
    if isinstance(node, Materialize) and isinstance(node.input, Normalize) and not node.waits_for_watermark:
        before = node.input
        # the chain runs in the normalize's key groups, whatever count the
        # materializer sets: the decision must not change when a checkpoint's
        # count is set on the nodes (fingerprint.with_key_groups)
        if set(before.key) <= set(node.sink_key):
            return (f"keyed chain: one keyed step with the ChangelogNormalize(key={fmt_key(before.key)}) it "
                    f"reads, no shuffle between them: its key {fmt_key(node.sink_key)} contains "
                    f"{fmt_key(before.key)}, so every row of one of its keys comes out of one key group "
                    "of the normalize")
    if isinstance(node, Join) and isinstance(node.left, Normalize) and isinstance(node.right, Normalize):
        left, right = node.left, node.right
        if tuple(left.key) == tuple(node.left_keys) and tuple(right.key) == tuple(node.right_keys) \
                and not left.fold_batch and not right.fold_batch:
            return (f"keyed chain: one keyed step with the ChangelogNormalize(key={fmt_key(left.key)}) and "
                    f"ChangelogNormalize(key={fmt_key(right.key)}) it reads, one shuffle of both inputs: "
                    "each normalize's key is its input's join key, so every row of one join key comes "
                    "out of one key group of each normalize")
    return None


__all__ = ["keyed_chains", "chaining", "chain_reason"]
