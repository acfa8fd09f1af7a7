"""Which state a regular join keeps for each input side (docs/semantics.md, section 4).

The choice depends only on the side's key facts, so the planner (explain, the
join's traits) and the operator (its state views) read it from this one rule,
as Flink's planner and runtime share ``JoinInputSideSpec``:

* the join key contains a unique key of the side: one row per join key;
* the side has a unique key outside the join key: unique key -> row;
* the side has no unique key: row -> count.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

JOIN_KEY_CONTAINS_UNIQUE_KEY = "JoinKeyContainsUniqueKey"
INPUT_SIDE_HAS_UNIQUE_KEY = "InputSideHasUniqueKey"
INPUT_SIDE_HAS_NO_UNIQUE_KEY = "InputSideHasNoUniqueKey"

#: how Flink's EXPLAIN prints a side's spec (``leftInputSpec=[...]``)
_EXPLAIN_LABEL = {JOIN_KEY_CONTAINS_UNIQUE_KEY: "JoinKeyContainsUniqueKey",
                  INPUT_SIDE_HAS_UNIQUE_KEY: "HasUniqueKey",
                  INPUT_SIDE_HAS_NO_UNIQUE_KEY: "NoUniqueKey"}


@dataclasses.dataclass(frozen=True)
class JoinInputSideSpec:
    """The state view of one join input and the unique key it is keyed by
    (``None`` for :data:`INPUT_SIDE_HAS_NO_UNIQUE_KEY`)."""

    view: str
    unique_key: Optional[tuple[str, ...]]

    @property
    def label(self) -> str:
        return _EXPLAIN_LABEL[self.view]


def join_input_side_spec(join_key: Sequence[str],
                         unique_keys: Sequence[Sequence[str]]) -> JoinInputSideSpec:
    """The spec of a side with these unique keys (first usable one wins; a
    key contained in the join key is preferred, it needs the least state)."""
    keys = [tuple(k) for k in unique_keys if k]
    inside = [k for k in keys if set(k) <= set(join_key)]
    if inside:
        return JoinInputSideSpec(JOIN_KEY_CONTAINS_UNIQUE_KEY, inside[0])
    if keys:
        return JoinInputSideSpec(INPUT_SIDE_HAS_UNIQUE_KEY, keys[0])
    return JoinInputSideSpec(INPUT_SIDE_HAS_NO_UNIQUE_KEY, None)


__all__ = ["JOIN_KEY_CONTAINS_UNIQUE_KEY", "INPUT_SIDE_HAS_UNIQUE_KEY",
           "INPUT_SIDE_HAS_NO_UNIQUE_KEY", "JoinInputSideSpec", "join_input_side_spec"]
