"""Changelog traits of plan nodes, inferred in one place (spec sections 1-4).

Every plan node has :class:`Traits`: its changelog mode, its unique keys, its
upsert key (a unique key whose per-key order of changes is still intact) and
which columns are non-deterministic.  Each node kind has one small pure
function computing its traits from its inputs' traits, in the style of an
optimizer rule; :func:`infer` dispatches on the node.  Nothing here touches
Spark: the API builds the nodes, the planner reasons about them, tests feed
them as data.

Rules (Flink's ``FlinkRelMdUniqueKeys``/``FlinkRelMdUpsertKeys``):

* Source: the primary key is a unique key and the upsert key; the mode is the
  stream's.
* Project: a key survives when each of its columns is kept by an injective
  expression of itself (a plain reference, a rename, a widening cast); a key
  touching a column that is dropped, narrowed by a cast or combined with others
  (``concat``, arithmetic, ...) is lost.
* Normalize (ChangelogNormalize): its key is the unique key and upsert key; it
  produces a retract stream (upsert without update-before).  Its retractions
  come from its state, so non-determinism upstream of it is neutralised.
* Exchange (the shuffle in front of a join side): the upsert key survives only
  if it contains the shuffle columns; otherwise rows of one upsert key go to
  different tasks and their order is lost (the seed's ``s1`` shuffled by
  ``level``).
* Join: a side's unique keys stay unique when the *other* side is unique on
  its join columns (inner joins and the preserved side of outer joins); the
  union of a left and a right unique key is always unique.  Upsert keys follow
  the same rule applied to the sides' upsert keys after their exchange (the
  "is the other side unique on its join key" test uses unique keys).  The
  output is a retract stream if an input has updates or the join is outer.

Order (docs/semantics.md, "Order guarantee"): ``ordered`` says each key's
changes reach the next operator in source-sequence order whatever order files
or micro-batches bring them in.  A bounded source is ordered (the runtime sorts
each key group's rows by ``_seq``); so is an insert-only one (nothing to
retract).  A streaming source with updates is not, unless the user declares it
(``ordered=True``).  ChangelogNormalize restores it (it drops changes older than
the key's applied one); projections keep it; a join or materializer emits its
own consistent changelog, so its output is ordered.  ``rules.order_input`` puts a
ChangelogNormalize in front of every order-sensitive consumer of an unordered
input.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Optional, Sequence

from ..model import ChangelogMode

Key = tuple[str, ...]


def _key(cols: Optional[Iterable[str]]) -> Key:
    return tuple(cols) if cols else ()


def _dedup_keys(keys: Iterable[Sequence[str]]) -> tuple[Key, ...]:
    """Distinct keys (as sets), shortest first, without supersets of another key."""
    out: list[Key] = []
    for k in sorted((tuple(k) for k in keys if k), key=lambda k: (len(k), k)):
        if not any(set(o) <= set(k) for o in out):
            out.append(k)
    return tuple(out)


def fmt_key(key: Optional[Sequence[str]]) -> str:
    return "[" + ", ".join(key or ()) + "]"


def fmt_keys(keys: Sequence[Sequence[str]]) -> str:
    return "[" + ", ".join(fmt_key(k) for k in keys) + "]" if keys else "[]"


@dataclasses.dataclass(frozen=True)
class Traits:
    """What the planner knows about a node's output."""

    columns: tuple[str, ...]
    mode: ChangelogMode
    unique_keys: tuple[Key, ...] = ()
    upsert_key: Optional[Key] = None          # None: no upsert key (compare whole rows)
    nondeterministic: frozenset = frozenset()
    has_watermark: bool = False
    notes: tuple[str, ...] = ()               # why a key was lost, auto-inserted steps, ...
    ordered: bool = True                      # per-key changes arrive in sequence order

    def describe(self) -> str:
        return (f"changelogMode=[{self.mode.kinds[1:-1]}], uniqueKeys={fmt_keys(self.unique_keys)}, "
                f"upsertKey={fmt_key(self.upsert_key)}")


# --------------------------------------------------------------------------- nodes


class Node:
    """A plan node; ``children`` are its inputs."""

    children: tuple = ()

    @property
    def traits(self) -> Traits:
        cached = self.__dict__.get("_traits")
        if cached is None:
            cached = infer(self)
            object.__setattr__(self, "_traits", cached)
        return cached


@dataclasses.dataclass(frozen=True, eq=False)
class Source(Node):
    name: str
    columns: tuple[str, ...]
    primary_key: Key = ()
    mode: ChangelogMode = ChangelogMode.RETRACT
    upsert_key: Optional[Key] = None   # default: the primary key
    nondeterministic: frozenset = frozenset()
    has_watermark: bool = False
    streaming: bool = False
    declared_ordered: bool = False     # the user vouches for per-key arrival order

    @property
    def ordered(self) -> bool:
        """Each key's changes arrive in sequence order (see the module docstring)."""
        return self.declared_ordered or not self.streaming or not self.mode.has_updates

    def label(self) -> str:
        extra = ", ordered=[declared]" if self.declared_ordered and self.streaming \
            and self.mode.has_updates else ""
        return (f"Source(name=[{self.name}], fields=[{', '.join(self.columns)}], "
                f"primaryKey={fmt_key(self.primary_key)}{extra})")


@dataclasses.dataclass(frozen=True, eq=False)
class WatermarkAssigner(Node):
    """Declares the event-time column and the watermark strategy (spec section 6)."""

    input: Node
    column: str
    bound_ms: int = 0

    @property
    def children(self):
        return (self.input,)

    def label(self) -> str:
        return (f"WatermarkAssigner(rowtime=[{self.column}], "
                f"watermark=[{self.column} - {self.bound_ms} ms])")


@dataclasses.dataclass(frozen=True)
class ProjectItem:
    """One output column of a projection.

    ``source``: the input column it is computed from when it is a function of
    that one column alone, else ``None``.  ``injective``: it is a one-to-one
    function of ``source`` (a reference, a rename, a widening cast), so keys
    over ``source`` carry over.  ``deterministic``: False for ``rand()``,
    ``current_timestamp()``, ``uuid()``, ... ``text``: for explain.
    """

    name: str
    source: Optional[str] = None
    injective: bool = True
    deterministic: bool = True
    text: str = ""
    inputs: tuple[str, ...] = ()   # input columns it reads (for non-determinism propagation)

    @classmethod
    def ref(cls, name: str, source: Optional[str] = None) -> "ProjectItem":
        source = source or name
        return cls(name, source, True, True, source if source == name else f"{source} AS {name}",
                   (source,))


@dataclasses.dataclass(frozen=True, eq=False)
class Project(Node):
    input: Node
    items: tuple[ProjectItem, ...]

    @property
    def children(self):
        return (self.input,)

    def label(self) -> str:
        return f"Project(select=[{', '.join(i.text or i.name for i in self.items)}])"


@dataclasses.dataclass(frozen=True, eq=False)
class Filter(Node):
    """Keeps the rows satisfying ``condition`` (SQL ``WHERE``).  On a stream with
    ``-U`` rows both halves of an update are tested: a row leaving the filter is
    retracted, one entering it is added, so the traits are the input's."""

    input: Node
    condition: str
    deterministic: bool = True

    @property
    def children(self):
        return (self.input,)

    def label(self) -> str:
        return f"Filter(where=[{self.condition}])"


@dataclasses.dataclass(frozen=True, eq=False)
class Normalize(Node):
    input: Node
    key: Key
    generate_update_before: bool = True
    inserted_because: str = ""   # set when the planner inserted it (rules.order_input)

    @property
    def children(self):
        return (self.input,)

    @property
    def auto(self) -> bool:
        return bool(self.inserted_because)

    def label(self) -> str:
        why = f", inserted: {self.inserted_because}" if self.auto else ""
        return f"ChangelogNormalize(key={fmt_key(self.key)}{why})"


@dataclasses.dataclass(frozen=True, eq=False)
class Join(Node):
    left: Node
    right: Node
    left_keys: Key
    right_keys: Key
    how: str = "inner"
    has_condition: bool = False

    @property
    def children(self):
        return (self.left, self.right)

    @property
    def right_rename(self) -> dict:
        return join_output_names(self.left.traits.columns, self.right.traits.columns)

    def label(self) -> str:
        rn = self.right_rename
        where = " AND ".join(f"{lk} = {rn[rk]}" for lk, rk in zip(self.left_keys, self.right_keys))
        specs = join_input_specs(self)
        return (f"Join(joinType=[{self.how.capitalize()}Join], where=[{where}"
                f"{' AND <condition>' if self.has_condition else ''}], "
                f"leftInputSpec=[{specs[0]}], rightInputSpec=[{specs[1]}])")


@dataclasses.dataclass(frozen=True, eq=False)
class Materialize(Node):
    """SinkUpsertMaterializer in front of a sink (inserted by ``rules.materialize``)."""

    input: Node
    sink_key: Key
    upsert_key: Optional[Key]
    conflict: str = "deduplicate"

    @property
    def children(self):
        return (self.input,)

    def label(self) -> str:
        return (f"SinkUpsertMaterializer(key={fmt_key(self.sink_key)}, "
                f"upsertKey={fmt_key(self.upsert_key)}, conflictStrategy=[{self.conflict.upper()}])")


@dataclasses.dataclass(frozen=True, eq=False)
class Sink(Node):
    input: Node
    name: str
    key: Key
    strategy: str = "auto"
    conflict: Optional[str] = None
    decision: Optional[object] = None   # rules.MaterializeDecision once planned

    @property
    def children(self):
        return (self.input,)

    def label(self) -> str:
        parts = [f"Sink(table=[{self.name}], primaryKey={fmt_key(self.key)}"]
        if self.decision is not None:
            parts.append(f", upsertMaterialize=[{str(self.decision.inserted).lower()}]")
        if self.conflict or (self.decision is not None and self.decision.inserted):
            parts.append(f", conflictStrategy=[{(self.conflict or 'deduplicate').upper()}]")
        return "".join(parts) + ")"


# --------------------------------------------------------------------------- rules


def source_traits(node: Source) -> Traits:
    pk = _key(node.primary_key)
    up = _key(node.upsert_key) if node.upsert_key is not None else pk
    notes = ()
    if node.streaming and node.mode.has_updates and node.declared_ordered:
        notes = ("declared ordered: each key's changes are applied in arrival order. If files or "
                 "micro-batches bring a key's changes out of source-sequence order, a join, "
                 "materializer or sink can apply a retraction before its row and keep stale rows "
                 "or lose rows",)
    return Traits(tuple(node.columns), node.mode, _dedup_keys([pk]), up or None,
                  frozenset(node.nondeterministic), node.has_watermark, notes, node.ordered)


def project_traits(t: Traits, items: Sequence[ProjectItem]) -> Traits:
    """Keys whose columns all survive injectively, renamed to their output names."""
    # input column -> output names that carry it one-to-one
    carried: dict[str, list[str]] = {}
    for it in items:
        if it.source is not None and it.injective and it.source in t.columns:
            carried.setdefault(it.source, []).append(it.name)

    def remap(key: Key) -> Optional[Key]:
        if not key or any(c not in carried for c in key):
            return None
        return tuple(carried[c][0] for c in key)

    uks = _dedup_keys(k for k in (remap(k) for k in t.unique_keys) if k)
    up = remap(t.upsert_key) if t.upsert_key else None
    notes = []
    if t.upsert_key and up is None:
        notes.append(f"upsert key {fmt_key(t.upsert_key)} lost: not all of its columns are kept "
                     "unchanged by the projection")
    nd = set()
    for it in items:
        reads = it.inputs or ((it.source,) if it.source else ())
        if not it.deterministic or any(c in t.nondeterministic for c in reads):
            nd.add(it.name)
    return Traits(tuple(i.name for i in items), t.mode, uks, up, frozenset(nd), t.has_watermark,
                  tuple(notes), t.ordered)


def normalize_traits(t: Traits, key: Key, generate_update_before: bool = True) -> Traits:
    key = _key(key)
    mode = ChangelogMode.RETRACT if generate_update_before else ChangelogMode.UPSERT
    return Traits(t.columns, mode, _dedup_keys([key] + list(t.unique_keys)), key,
                  frozenset(), t.has_watermark)


def exchange_upsert_key(t: Traits, by: Key) -> tuple[Optional[Key], Optional[str]]:
    """The upsert key after a hash shuffle on ``by`` (and a note when it is lost)."""
    if not t.upsert_key:
        return None, None
    if set(by) <= set(t.upsert_key):
        return t.upsert_key, None
    return None, (f"upsert key {fmt_key(t.upsert_key)} lost: the input is shuffled by "
                  f"{fmt_key(by)}, which it does not contain, so changes of one key can take "
                  "different paths")


def join_output_names(left_cols: Sequence[str], right_cols: Sequence[str]) -> dict:
    """Right column -> output name (``JoinInputLayout``'s rule: ``id`` -> ``id0``)."""
    used = set(left_cols)
    out = {}
    for c in right_cols:
        name, i = c, 0
        while name in used:
            name, i = f"{c}{i}", i + 1
        used.add(name)
        out[c] = name
    return out


def _side_unique_on(keys: Sequence[Key], join_cols: Key) -> bool:
    return any(k and set(k) <= set(join_cols) for k in keys)


def _join_keys(how: str, left: Sequence[Key], right: Sequence[Key],
               left_unique: bool, right_unique: bool) -> list[Key]:
    out: list[Key] = []
    if right_unique and how in ("inner", "left"):
        out += list(left)
    if left_unique and how in ("inner", "right"):
        out += list(right)
    out += [tuple(l) + tuple(c for c in r if c not in l) for l in left for r in right]
    return out


def join_traits(left: Traits, right: Traits, left_keys: Key, right_keys: Key,
                how: str = "inner") -> Traits:
    how = how.lower()
    rn = join_output_names(left.columns, right.columns)
    r_uks = [tuple(rn[c] for c in k) for k in right.unique_keys]
    left_unique = _side_unique_on(left.unique_keys, left_keys)
    right_unique = _side_unique_on(right.unique_keys, right_keys)
    uks = _dedup_keys(_join_keys(how, left.unique_keys, r_uks, left_unique, right_unique))

    notes = []
    l_up, note = exchange_upsert_key(left, left_keys)
    if note:
        notes.append("left " + note)
    r_up, note = exchange_upsert_key(right, right_keys)
    if note:
        notes.append("right " + note)
    r_up = tuple(rn[c] for c in r_up) if r_up else None
    ups = _dedup_keys(_join_keys(how, [l_up] if l_up else [], [r_up] if r_up else [],
                                 left_unique, right_unique))
    up = ups[0] if ups else None
    if up is None and (l_up or r_up):
        kept, other, other_keys = (("left", "right", right_keys) if l_up else
                                   ("right", "left", left_keys))
        notes.append(f"the {kept} side keeps its upsert key {fmt_key(l_up or r_up)}, but the "
                     f"{other} side is not unique on its join key {fmt_key(other_keys)} and has no "
                     f"upsert key left, so the output has no upsert key")
    for side, t in (("left", left), ("right", right)):
        if not t.ordered:
            notes.append(f"{side} input is a streaming changelog without a key: its per-row order "
                         "cannot be restored, changes are joined in arrival order")
    updates = left.mode.has_updates or right.mode.has_updates or how != "inner"
    mode = ChangelogMode.RETRACT if updates else ChangelogMode.INSERT_ONLY
    nd = frozenset(left.nondeterministic) | frozenset(rn[c] for c in right.nondeterministic)
    return Traits(tuple(left.columns) + tuple(rn[c] for c in right.columns), mode, uks, up, nd,
                  left.has_watermark and right.has_watermark, tuple(notes))


def join_input_specs(node: Join) -> tuple[str, str]:
    """Flink's ``JoinInputSideSpec`` names of both sides (the state view each gets)."""
    def spec(t: Traits, keys: Key) -> str:
        if not t.unique_keys:
            return "NoUniqueKey"
        if _side_unique_on(t.unique_keys, keys):
            return "JoinKeyContainsUniqueKey"
        return "HasUniqueKey"
    return spec(node.left.traits, node.left_keys), spec(node.right.traits, node.right_keys)


def join_state_unique_key(t: Traits, keys: Key) -> Optional[Key]:
    """The unique key a join side's state view uses: one contained in the join
    key if any (``JoinKeyContainsUniqueKey``), else the shortest one."""
    inside = [k for k in t.unique_keys if set(k) <= set(keys)]
    if inside:
        return inside[0]
    return t.unique_keys[0] if t.unique_keys else None


def infer(node: Node) -> Traits:
    if isinstance(node, Source):
        return source_traits(node)
    if isinstance(node, Project):
        return project_traits(node.input.traits, node.items)
    if isinstance(node, Filter):
        t = node.input.traits
        notes = () if node.deterministic else (
            "non-deterministic filter condition: a retraction may be filtered differently "
            "from the row it retracts",)
        return dataclasses.replace(t, notes=notes)
    if isinstance(node, WatermarkAssigner):
        return dataclasses.replace(node.input.traits, has_watermark=True, notes=())
    if isinstance(node, Normalize):
        return normalize_traits(node.input.traits, node.key, node.generate_update_before)
    if isinstance(node, Join):
        return join_traits(node.left.traits, node.right.traits, node.left_keys, node.right_keys,
                           node.how)
    if isinstance(node, Materialize):
        t = node.input.traits
        # its output per sink key is ordered: the sink key is now the upsert key
        return dataclasses.replace(t, unique_keys=_dedup_keys([node.sink_key] + list(t.unique_keys)),
                                   upsert_key=node.sink_key, notes=())
    if isinstance(node, Sink):
        return dataclasses.replace(node.input.traits, notes=())
    raise TypeError(f"unknown plan node {type(node).__name__}")


__all__ = ["Traits", "Node", "Source", "Project", "ProjectItem", "Filter", "Normalize", "Join",
           "Materialize",
           "WatermarkAssigner",
           "Sink", "infer", "source_traits", "project_traits", "normalize_traits", "join_traits",
           "exchange_upsert_key", "join_output_names", "join_input_specs", "join_state_unique_key",
           "fmt_key", "fmt_keys"]
