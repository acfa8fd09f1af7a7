"""Plan nodes: the single description of a pipeline (docs/plan.md).

A node is an immutable value that carries everything needed to build its
operator (keys, options, expressions as sqlglot trees, the source's reader)
and derives its own :class:`Traits` from its inputs' traits with one small
rule per node type (``derive_traits``), in the style of Flink's
``FlinkRelMdUniqueKeys``/``FlinkRelMdUpsertKeys``.  Nothing here touches
Spark: the API and the SQL front end build nodes, ``rules`` rewrites them,
``lower`` alone turns them into operators and DataFrames, tests feed them as
data.

Trait rules (docs/semantics.md, sections 1-4 and 10):

* Source: the primary key is a unique key and the upsert key; the mode is the
  stream's.
* Project: a key survives when each of its columns is kept by an injective
  expression of itself (a plain reference, a rename, a widening cast); a key
  touching a column that is dropped, narrowed by a cast or combined with others
  (``concat``, arithmetic, ...) is lost.
* Filter: keeps every trait (a row is kept or dropped whole).
* Normalize (ChangelogNormalize): its key is the unique key and upsert key; it
  produces a retract stream (upsert without update-before).  Its retractions
  come from its state, so non-determinism upstream of it is neutralised.
* Deduplicate, Aggregate, TopN (docs/operators.md): the dedup key, the group
  key, and (partition, rank) of a Top-N with the rank number become the unique
  key and upsert key; keep first emits inserts only; a Top-N without the rank
  number has no upsert key (rows enter and leave whole).
* History (SCD type 2): the key plus ``__START_AT`` is the unique key, upsert
  key and primary key; a retract stream (versions are updated and removed).
  ApplyAs (Auto CDC's delete/truncate conditions) keeps every trait.
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

* WindowTableFunction (TUMBLE/HOP/CUMULATE/SESSION, docs/windows.md): adds
  ``window_start``/``window_end``; a row may be repeated once per window, so a
  unique key stays unique only together with ``window_start``; the input must
  be insert-only.
* WindowAggregate: its group keys plus both window bounds are the unique key,
  upsert key and primary key; insert-only output (retract with allowed
  lateness: a re-fire is ``-U``/``+U``, a grown session ``-D``/``+I``); it
  consumes the event time (no time attribute after it).

Order (docs/semantics.md, section 10): ``ordered`` says each key's changes
reach the next operator in source-sequence order whatever order files or
micro-batches bring them in.  A bounded source is ordered (the runtime sorts
each key group's rows by ``_seq``); so is an insert-only one (nothing to
retract).  A streaming source with updates is not, unless the user declares it
(``ordered=True``).  ChangelogNormalize restores it (it drops changes older than
the key's applied one); projections and filters keep it; a join or
materializer emits its own consistent changelog, so its output is ordered.
``rules.order_input`` puts a ChangelogNormalize in front of every
order-sensitive consumer of an unordered input.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Optional, Sequence

from ..model import ChangelogMode, join_output_names
from ..model.history import history_columns
from ..model.join_side import JOIN_KEY_CONTAINS_UNIQUE_KEY, JoinInputSideSpec, join_input_side_spec
from ..model.watermark import DAY_MS, BoundedOutOfOrderness, WatermarkStrategy

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
    """What the planner knows about a node's output.

    ``primary_key``: the declared key the API uses as the default key of
    ``normalize`` and ``write_upsert`` (a source's primary key, carried through
    projections, set by normalize and the materializer, lost by a join).
    ``time_attribute``/``watermark``: the event-time column and its strategy.
    """

    columns: tuple[str, ...]
    mode: ChangelogMode
    unique_keys: tuple[Key, ...] = ()
    upsert_key: Optional[Key] = None          # None: no upsert key (compare whole rows)
    nondeterministic: frozenset = frozenset()
    has_watermark: bool = False
    notes: tuple[str, ...] = ()               # why a key was lost, auto-inserted steps, ...
    ordered: bool = True                      # per-key changes arrive in sequence order
    primary_key: Key = ()
    time_attribute: Optional[str] = None
    watermark: Optional[WatermarkStrategy] = None

    def describe(self) -> str:
        return (f"changelogMode=[{self.mode.kinds[1:-1]}], uniqueKeys={fmt_keys(self.unique_keys)}, "
                f"upsertKey={fmt_key(self.upsert_key)}")


# --------------------------------------------------------------------------- base


class Node:
    """A plan node; ``children`` are its inputs (in order)."""

    children: tuple = ()

    @property
    def traits(self) -> Traits:
        cached = self.__dict__.get("_traits")
        if cached is None:
            cached = self.derive_traits()
            object.__setattr__(self, "_traits", cached)
        return cached

    def derive_traits(self) -> Traits:
        raise NotImplementedError

    def label(self) -> str:
        raise NotImplementedError

    def with_children(self, *children: "Node") -> "Node":
        """The same node over other inputs (for rewriting rules)."""
        raise NotImplementedError


class _Unary(Node):
    """A node with one input, the field ``input``."""

    input: Node

    @property
    def children(self):
        return (self.input,)

    def with_children(self, *children: Node) -> Node:
        (child,) = children
        return self if child is self.input else dataclasses.replace(self, input=child)


def infer(node: Node) -> Traits:
    """The traits of ``node`` (its own rule; cached on the node)."""
    return node.traits


# --------------------------------------------------------------------------- sources


@dataclasses.dataclass(frozen=True, eq=False)
class Source(Node):
    """A leaf: a CDC reader or a DataFrame that already has ``_kind``/``_seq``.

    ``reader``: what the connector returned; lowering reads its ``rows`` (the
    changes plus dead letters and skipped records as side rows, which reach
    the dead-letter output whatever operators follow).  ``dataframe``: the wrapped DataFrame of
    ``ChangelogStream.from_dataframe``.  Lowering reads the one that is set.
    """

    name: str
    columns: tuple[str, ...]
    primary_key: Key = ()
    mode: ChangelogMode = ChangelogMode.RETRACT
    upsert_key: Optional[Key] = None   # default: the primary key
    nondeterministic: frozenset = frozenset()
    has_watermark: bool = False
    streaming: bool = False
    declared_ordered: bool = False     # the user vouches for per-key arrival order
    reader: Optional[object] = dataclasses.field(default=None, repr=False)
    dataframe: Optional[object] = dataclasses.field(default=None, repr=False)

    def with_children(self, *children: Node) -> Node:
        assert not children
        return self

    @property
    def ordered(self) -> bool:
        """Each key's changes arrive in sequence order (see the module docstring)."""
        return self.declared_ordered or not self.streaming or not self.mode.has_updates

    def label(self) -> str:
        extra = ", ordered=[declared]" if self.declared_ordered and self.streaming \
            and self.mode.has_updates else ""
        if extra and getattr(self.reader, "log_ordered", False):
            extra = ", ordered=[log]"
        return (f"Source(name=[{self.name}], fields=[{', '.join(self.columns)}], "
                f"primaryKey={fmt_key(self.primary_key)}{extra})")

    def derive_traits(self) -> Traits:
        pk = _key(self.primary_key)
        up = _key(self.upsert_key) if self.upsert_key is not None else pk
        notes = ()
        if self.streaming and self.mode.has_updates and self.declared_ordered and \
                not getattr(self.reader, "log_ordered", False):
            notes = ("declared ordered: each key's changes are applied in arrival order. If files "
                     "or micro-batches bring a key's changes out of source-sequence order, a join, "
                     "materializer or sink can apply a retraction before its row and keep stale "
                     "rows or lose rows",)
        return Traits(tuple(self.columns), self.mode, _dedup_keys([pk]), up or None,
                      frozenset(self.nondeterministic), self.has_watermark, notes, self.ordered,
                      primary_key=pk)


# --------------------------------------------------------------------------- event time


@dataclasses.dataclass(frozen=True, eq=False)
class WatermarkAssigner(_Unary):
    """Declares the event-time column and the watermark strategy
    (docs/semantics.md, section 6)."""

    input: Node
    column: str
    bound_ms: int = 0
    #: a column whose values are the source's partitions, each with its own
    #: watermark (a Kafka table's partition); None: the source is one partition
    partition: Optional[str] = None
    #: a partition without rows for this long (processing time) is idle and
    #: leaves the minimum; None: the operator's own setting (default: never)
    idle_timeout_ms: Optional[int] = None

    @property
    def strategy(self) -> WatermarkStrategy:
        return BoundedOutOfOrderness(self.column, self.bound_ms)

    @property
    def source_name(self) -> str:
        """The source the watermark is generated at (its partitions' prefix)."""
        return "+".join(s.name for s in source_leaves(self)) or "source"

    def generates(self) -> str:
        """What the source generates, for the operators that use it."""
        per = f" per partition of {self.partition}" if self.partition else ""
        return f"{self.source_name}{per}: {self.strategy.describe()}"

    def label(self) -> str:
        parts = f"per partition of {self.partition}" if self.partition else "one partition"
        idle = "" if self.idle_timeout_ms is None else f", idle after {self.idle_timeout_ms} ms"
        return (f"WatermarkAssigner(rowtime=[{self.column}], "
                f"watermark=[{self.column} - {self.bound_ms} ms], "
                f"generated=[at source {self.source_name}, {parts}{idle}])")

    def derive_traits(self) -> Traits:
        return dataclasses.replace(self.input.traits, has_watermark=True, notes=(),
                                   time_attribute=self.column, watermark=self.strategy)


# --------------------------------------------------------------------------- projection


@dataclasses.dataclass(frozen=True)
class ProjectItem:
    """One output column of a projection.

    ``source``: the input column it is computed from when it is a function of
    that one column alone, else ``None``.  ``injective``: it is a one-to-one
    function of ``source`` (a reference, a rename, a widening cast), so keys
    over ``source`` carry over.  ``deterministic``: False for ``rand()``,
    ``current_timestamp()``, ``uuid()``, ... ``text``: for explain.
    ``inputs``: the input columns it reads (non-determinism propagates
    through them).  These facts are read from ``expr``, the expression as a
    sqlglot tree (``expressions.project_item``); lowering generates Spark SQL
    from it.  ``column``: the pyspark Column the user passed, which lowering
    uses as it is (it may hold what SQL cannot name, e.g. a Python UDF).
    """

    name: str
    source: Optional[str] = None
    injective: bool = True
    deterministic: bool = True
    text: str = ""
    inputs: tuple[str, ...] = ()
    expr: Optional[object] = dataclasses.field(default=None, compare=False, repr=False)
    column: Optional[object] = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def ref(cls, name: str, source: Optional[str] = None) -> "ProjectItem":
        from sqlglot import exp
        source = source or name
        return cls(name, source, True, True, source if source == name else f"{source} AS {name}",
                   (source,), exp.column(source, quoted=True))


@dataclasses.dataclass(frozen=True, eq=False)
class Project(_Unary):
    input: Node
    items: tuple[ProjectItem, ...]

    def label(self) -> str:
        return f"Project(select=[{', '.join(i.text or i.name for i in self.items)}])"

    def derive_traits(self) -> Traits:
        """Keys whose columns all survive injectively, renamed to their output names."""
        t = self.input.traits
        # input column -> output names that carry it one-to-one
        carried: dict[str, list[str]] = {}
        for it in self.items:
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
            notes.append(f"upsert key {fmt_key(t.upsert_key)} lost: not all of its columns are "
                         "kept unchanged by the projection")
        nd = set()
        for it in self.items:
            reads = it.inputs or ((it.source,) if it.source else ())
            if not it.deterministic or any(c in t.nondeterministic for c in reads):
                nd.add(it.name)
        time_attr = carried[t.time_attribute][0] if t.time_attribute in carried else None
        watermark = t.watermark
        if watermark is not None and time_attr is not None:
            watermark = watermark.renamed(time_attr)
        return Traits(tuple(i.name for i in self.items), t.mode, uks, up, frozenset(nd),
                      t.has_watermark, tuple(notes), t.ordered,
                      primary_key=remap(t.primary_key) or (), time_attribute=time_attr,
                      watermark=watermark)


@dataclasses.dataclass(frozen=True, eq=False)
class Filter(_Unary):
    """Keeps the rows for which ``condition`` (a sqlglot tree) is true.

    On a stream with updates a filter keeps or drops ``-U`` and ``+U`` of one
    update independently, which is right for a retract stream (the row leaving
    the filter is retracted, the one entering it added); an upsert stream has
    no ``-U``, so the API normalizes it first (docs/semantics.md, section 1).
    ``column``: the pyspark Column the user passed, used as is by lowering.
    """

    input: Node
    condition: object = dataclasses.field(repr=False)
    text: str = ""
    column: Optional[object] = dataclasses.field(default=None, compare=False, repr=False)

    def label(self) -> str:
        return f"Calc(where=[{self.text}])"

    def derive_traits(self) -> Traits:
        return dataclasses.replace(self.input.traits, notes=())


@dataclasses.dataclass(frozen=True, eq=False)
class UnionAll(Node):
    """``UNION ALL`` of changelogs (docs/plan.md, "Union"): every change of
    every input, each keeping its own ``_seq``; the columns are named after the
    first input's and matched by position.

    The order rule: a union moves no row between partitions of its inputs and
    re-sorts nothing, so each input's per-key order (by its ``_seq``) is kept
    downstream, as every keyed operator sorts a key's rows by ``_seq``.
    Between inputs there is no order (as in Flink, where a union merges the
    streams as they arrive): a key that gets changes from two inputs sees
    them interleaved by ``_seq`` value, which means "in source order" only
    when the inputs share one sequence space (two tables of one database log:
    the LSN).  The planner normalizes an input that is not in sequence order
    or has no ``-U`` (an upsert stream: the union has no key to rebuild the
    old rows by) before the union (``rules.optimize``).  No key survives a
    union (the inputs may hold the same rows)."""

    inputs: tuple

    @property
    def children(self):
        return tuple(self.inputs)

    def with_children(self, *children: Node) -> Node:
        if all(a is b for a, b in zip(children, self.inputs)):
            return self
        return dataclasses.replace(self, inputs=tuple(children))

    def label(self) -> str:
        return f"Union(all=[true], union=[{', '.join(self.traits.columns)}])"

    def derive_traits(self) -> Traits:
        ts = [c.traits for c in self.inputs]
        mode = ChangelogMode.RETRACT if any(t.mode.has_updates for t in ts) \
            else ChangelogMode.INSERT_ONLY
        times = {t.time_attribute for t in ts}
        time_attr = ts[0].time_attribute if len(times) == 1 else None
        has_wm = all(t.has_watermark for t in ts)
        # a column is nondeterministic if it is in any input (matched by position)
        nondet = frozenset(ts[0].columns[i] for t in ts for i, c in enumerate(t.columns)
                           if c in t.nondeterministic)
        return Traits(ts[0].columns, mode, nondeterministic=nondet, has_watermark=has_wm,
                      ordered=all(t.ordered for t in ts),
                      time_attribute=time_attr if has_wm else None,
                      watermark=ts[0].watermark if has_wm and time_attr else None)


# --------------------------------------------------------------------------- keyed operators


#: label suffix and note of a keyed node whose changes are folded per micro-batch
MINI_BATCH_LABEL = {False: "", True: ", miniBatch=[true]"}
MINI_BATCH_NOTE = ("mini-batch: each key's changes within one micro-batch are folded into its net "
                   "change (intermediate versions are not emitted; the same final table)")


@dataclasses.dataclass(frozen=True, eq=False)
class Normalize(_Unary):
    """ChangelogNormalize on ``key`` (docs/semantics.md, section 5)."""

    input: Node
    key: Key
    generate_update_before: bool = True
    inserted_because: str = ""   # set when the planner inserted it (rules.order_input)
    state_ttl_ms: Optional[int] = None
    tombstone_retention_ms: Optional[int] = DAY_MS
    key_groups: Optional[int] = None   # None: the runtime's default
    fold_batch: bool = False           # micro-batch folding (rules.fold_micro_batches)

    @property
    def auto(self) -> bool:
        return bool(self.inserted_because)

    def label(self) -> str:
        why = f", inserted: {self.inserted_because}" if self.auto else ""
        return f"ChangelogNormalize(key={fmt_key(self.key)}{MINI_BATCH_LABEL[self.fold_batch]}{why})"

    def derive_traits(self) -> Traits:
        t = self.input.traits
        key = _key(self.key)
        mode = ChangelogMode.RETRACT if self.generate_update_before else ChangelogMode.UPSERT
        return Traits(t.columns, mode, _dedup_keys([key] + list(t.unique_keys)), key,
                      frozenset(), t.has_watermark, primary_key=key,
                      time_attribute=t.time_attribute, watermark=t.watermark,
                      notes=(MINI_BATCH_NOTE,) if self.fold_batch else ())


@dataclasses.dataclass(frozen=True, eq=False)
class ApplyAs(_Unary):
    """Auto CDC's event options in front of a history or a table
    (docs/operators.md, "Auto CDC"): ``delete_when`` (a Spark SQL condition
    over the change) turns matching changes into deletes; ``truncate_when``
    marks changes that delete every key (each becomes a delete of every key
    in ``key`` seen before or after it, computed key-wise in Spark);
    ``resequence``: the one column of ``sequence_by`` (integer or timestamp)
    becomes the sequence ``_seq``.  ``sequence_by``: the columns that place a
    change (a truncate's deletes carry its values).  Keeps the input's traits."""

    input: Node
    delete_when: Optional[str] = None
    truncate_when: Optional[str] = None
    key: Key = ()
    sequence_by: Key = ()
    resequence: bool = False

    def label(self) -> str:
        parts = [f"applyAsDeletes=[{self.delete_when}]" if self.delete_when else "",
                 f"applyAsTruncates=[{self.truncate_when}]" if self.truncate_when else "",
                 f"sequence=[{self.sequence_by[0]}]" if self.resequence else ""]
        return f"ApplyAs({', '.join(p for p in parts if p)})"

    def derive_traits(self) -> Traits:
        return dataclasses.replace(self.input.traits, notes=())


@dataclasses.dataclass(frozen=True, eq=False)
class History(_Unary):
    """SCD type 2 history of the changes of ``key`` (docs/operators.md, "SCD
    type 2 history"): one row per version with ``__START_AT``/``__END_AT``.
    Traits: the history key (``key`` + ``__START_AT``) is the unique key,
    upsert key and primary key; the output retracts versions it changes
    (``-U``/``+U``, ``-D``); it restores order itself (a late change is placed
    by its sequence), so the output is ordered."""

    input: Node
    key: Key
    sequence_by: Key = ()              # () : the source sequence _seq
    columns: Optional[Key] = None      # None: every input column
    track_history: Optional[Key] = None
    ignore_null_updates: bool = False
    key_groups: Optional[int] = None
    #: 1: only each key's current version, keyed by the key (ScdType1Table:
    #: the type 1 table where partial updates need the changes kept)
    scd_type: int = 2

    @property
    def data_columns(self) -> Key:
        return tuple(self.columns) if self.columns is not None else tuple(self.input.traits.columns)

    @property
    def state_ttl_ms(self) -> None:
        """No state TTL: a key's changes are its history's source (a late
        change is placed among them), kept as long as the history table."""
        return None

    @property
    def history_columns(self) -> tuple[Key, Key]:
        return history_columns(self.sequence_by)

    @property
    def history_key(self) -> Key:
        return tuple(self.key) + (self.history_columns[0] if self.scd_type == 2 else ())

    def label(self) -> str:
        nulls = ", ignoreNullUpdates=[true]" if self.ignore_null_updates else ""
        sequence = f"sequenceBy={fmt_key(self.sequence_by or ('_seq',))}"
        if self.scd_type == 1:
            return f"ScdType1Table(key={fmt_key(self.key)}, {sequence}{nulls})"
        tracked = self.track_history if self.track_history is not None else tuple(
            c for c in self.data_columns if c not in self.key)
        return (f"ScdType2History(key={fmt_key(self.key)}, historyKey={fmt_key(self.history_key)}, "
                f"{sequence}, trackHistory={fmt_key(tracked)}{nulls})")

    def derive_traits(self) -> Traits:
        start, end = self.history_columns
        hk = self.history_key
        cols = self.data_columns + ((start + end) if self.scd_type == 2 else ())
        t = self.input.traits
        notes = ()
        if not self.sequence_by and t.upsert_key and not set(t.upsert_key) <= set(self.key):
            notes = (f"ordered by the input's sequence, but the input's upsert key "
                     f"{fmt_key(t.upsert_key)} is not within the key {fmt_key(self.key)}: the "
                     "changes of one key may come from several upstream keys whose sequence "
                     "numbers are not comparable; pass sequence_by",)
        return Traits(cols, ChangelogMode.RETRACT, (hk,), hk,
                      frozenset(), t.has_watermark, notes, primary_key=hk)


@dataclasses.dataclass(frozen=True, eq=False)
class Join(Node):
    """Regular (unbounded) join (docs/semantics.md, section 4).

    ``condition``: an extra non-equi predicate, vectorized over candidate pairs
    (``condition(left_df, right_df) -> bool array``, output column names).
    """

    left: Node
    right: Node
    left_keys: Key
    right_keys: Key
    how: str = "inner"
    condition: Optional[Callable] = dataclasses.field(default=None, repr=False)
    state_ttl_ms: object = None        # int or (left, right)
    key_groups: Optional[int] = None

    @property
    def children(self):
        return (self.left, self.right)

    def with_children(self, *children: Node) -> Node:
        left, right = children
        if left is self.left and right is self.right:
            return self
        return dataclasses.replace(self, left=left, right=right)

    @property
    def has_condition(self) -> bool:
        return self.condition is not None

    @property
    def right_rename(self) -> dict:
        return join_output_names(self.left.traits.columns, self.right.traits.columns)

    def label(self) -> str:
        rn = self.right_rename
        where = " AND ".join(f"{lk} = {rn[rk]}" for lk, rk in zip(self.left_keys, self.right_keys))
        specs = join_input_specs(self)
        return (f"Join(joinType=[{self.how.capitalize()}Join], where=[{where}"
                f"{' AND <condition>' if self.has_condition else ''}], "
                f"leftInputSpec=[{specs[0].label}], rightInputSpec=[{specs[1].label}])")

    def derive_traits(self) -> Traits:
        left, right = self.left.traits, self.right.traits
        t = join_traits(left, right, self.left_keys, self.right_keys, self.how)
        # the event-time column of the output: the left one, else the right one
        # (renamed as in the output); the watermark is the query's, min over sources
        if not t.has_watermark:
            return t
        time_attr = left.time_attribute
        if time_attr is None and right.time_attribute is not None:
            time_attr = self.right_rename[right.time_attribute]
        watermark = left.watermark or right.watermark
        if watermark is not None and time_attr is not None:
            watermark = watermark.renamed(time_attr)
        return dataclasses.replace(t, time_attribute=time_attr, watermark=watermark)


@dataclasses.dataclass(frozen=True, eq=False)
class Materialize(_Unary):
    """SinkUpsertMaterializer in front of a sink (inserted by ``rules.materialize``)."""

    input: Node
    sink_key: Key
    upsert_key: Optional[Key]
    conflict: str = "deduplicate"
    state_ttl_ms: Optional[int] = None
    key_groups: Optional[int] = None

    @property
    def waits_for_watermark(self) -> bool:
        return self.conflict in ("error", "nothing")

    @property
    def spec(self):
        """The watermarks it waits for: the sources' (``source_watermark_spec``)."""
        return source_watermark_spec(self.input, self.input.traits.time_attribute)

    def label(self) -> str:
        wm = f", watermark=[{self.spec.describe()}]" if self.waits_for_watermark else ""
        return (f"SinkUpsertMaterializer(key={fmt_key(self.sink_key)}, "
                f"upsertKey={fmt_key(self.upsert_key)}, conflictStrategy=[{self.conflict.upper()}]"
                f"{wm})")

    def derive_traits(self) -> Traits:
        t = self.input.traits
        notes = ()
        if self.waits_for_watermark:
            notes = (f"ON CONFLICT DO {self.conflict.upper()} folds each key's changes once the "
                     "watermark passes the one they arrived under",)
        # its output per sink key is ordered: the sink key is now the upsert key
        return dataclasses.replace(t, unique_keys=_dedup_keys([self.sink_key] + list(t.unique_keys)),
                                   upsert_key=self.sink_key, notes=notes, primary_key=self.sink_key)


@dataclasses.dataclass(frozen=True, eq=False)
class Sink(_Unary):
    """An upsert table keyed by ``key``; ``decision``: the materializer decision
    once planned (``rules.materialize``).  ``materializer_ttl_ms``/``key_groups``
    are the options of the materializer the planner may insert."""

    input: Node
    name: str
    key: Key
    strategy: str = "auto"
    conflict: Optional[str] = None
    decision: Optional[object] = None   # rules.MaterializeDecision once planned
    materializer_ttl_ms: Optional[int] = None
    key_groups: Optional[int] = None

    def label(self) -> str:
        parts = [f"Sink(table=[{self.name}], primaryKey={fmt_key(self.key)}"]
        if self.decision is not None:
            parts.append(f", upsertMaterialize=[{str(self.decision.inserted).lower()}]")
        if self.conflict or (self.decision is not None and self.decision.inserted):
            parts.append(f", conflictStrategy=[{(self.conflict or 'deduplicate').upper()}]")
        return "".join(parts) + ")"

    def derive_traits(self) -> Traits:
        return dataclasses.replace(self.input.traits, notes=())


# --------------------------------------------------------------------------- windows

WINDOW_START = "window_start"
WINDOW_END = "window_end"
#: Flink's window_time: the window's last millisecond, the window aggregate's
#: event-time attribute (docs/windows.md, "Cascading windows")
WINDOW_TIME = "window_time"


@dataclasses.dataclass(frozen=True, eq=False)
class WindowTableFunction(_Unary):
    """``TUMBLE``/``HOP``/``CUMULATE``/``SESSION(TABLE input, DESCRIPTOR(column),
    ...)`` (docs/windows.md): the window projection, and the watermark the
    windows wait for: ``generator`` (default: the input's watermark) per
    source ``partition`` (a column, ``"<file>"``, or one), idle after
    ``idle_timeout_ms``."""

    input: Node
    column: str
    window: object                      # model.windows.WindowAssigner
    generator: Optional[object] = None  # model.watermark.WatermarkGenerator
    partition: Optional[str] = None
    idle_timeout_ms: Optional[int] = None

    @property
    def from_source(self) -> bool:
        """The windows wait for the watermarks generated at the sources
        (carried with the stream, docs/windows.md, "Watermarks from the
        source"), not for a generator or partitioning of their own."""
        return self.generator is None and self.partition is None and \
            self.input.traits.watermark is not None

    @property
    def spec(self):
        """The :class:`~spark_changelog.model.partition_watermarks.EventTimeSpec`."""
        from ..model.partition_watermarks import EventTimeSpec
        if self.from_source:
            return source_watermark_spec(self.input, self.column, self.idle_timeout_ms)
        gen = self.generator or self.input.traits.watermark
        if gen is None:
            raise ValueError(f"window on {self.column!r}: the stream has no watermark; declare "
                             "one (with_watermark / WATERMARK FOR) or pass a generator")
        if gen.column != self.column:
            gen = gen.renamed(self.column)
        return EventTimeSpec(gen, self.partition, self.idle_timeout_ms)

    def label(self) -> str:
        return (f"WindowTableFunction(window=[{self.window.describe()}], rowtime=[{self.column}], "
                f"watermark=[{self.spec.describe()}])")

    def derive_traits(self) -> Traits:
        t = self.input.traits
        keys = _dedup_keys([tuple(k) + (WINDOW_START,) for k in t.unique_keys])
        return dataclasses.replace(t, columns=tuple(t.columns) + (WINDOW_START, WINDOW_END),
                                   unique_keys=keys, upsert_key=None, notes=(),
                                   primary_key=())


@dataclasses.dataclass(frozen=True, eq=False)
class WindowAggregate(_Unary):
    """GROUP BY ``group_keys``, ``window_start``, ``window_end`` over a
    :class:`WindowTableFunction`; ``aggregates``: ``(name, function, column)``
    with function ``count`` (column None: ``COUNT(*)``), ``count_distinct``,
    ``sum``, ``avg``, ``min``, ``max``.  Late rows go to the late output.

    ``window_time``: the output has a ``window_time`` column (``window_end``
    minus 1 ms) after the bounds.  Over the sources' watermarks it is the
    output's event-time attribute, so a window over this aggregate's result
    (a cascading window aggregation, docs/windows.md) waits for the same
    watermarks, which pass through the operator."""

    input: WindowTableFunction
    group_keys: Key
    aggregates: tuple
    allowed_lateness_ms: int = 0
    key_groups: Optional[int] = None
    window_time: bool = False

    @property
    def key(self) -> Key:
        return tuple(self.group_keys) + (WINDOW_START, WINDOW_END)

    def label(self) -> str:
        def call(name, func, col):
            inner = "*" if col is None else col
            text = f"COUNT(DISTINCT {inner})" if func == "count_distinct" else f"{func.upper()}({inner})"
            return f"{text} AS {name}"
        aggs = ", ".join(call(*a) for a in self.aggregates)
        w = self.input
        return (f"WindowAggregate(groupBy=[{', '.join(self.group_keys)}], "
                f"window=[{w.window.describe()}], select=[{aggs}], "
                f"allowedLateness=[{self.allowed_lateness_ms} ms], lateRows=[late output]"
                f"{', rowtime=[' + WINDOW_TIME + ']' if self.window_time else ''})")

    def derive_traits(self) -> Traits:
        key = self.key
        mode = ChangelogMode.RETRACT if self.allowed_lateness_ms else ChangelogMode.INSERT_ONLY
        time_cols = (WINDOW_TIME,) if self.window_time else ()
        cols = key + time_cols + tuple(a[0] for a in self.aggregates)
        watermark = self.input.traits.watermark if self.input.from_source else None
        if not self.window_time or watermark is None:
            return Traits(cols, mode, (key,), key, frozenset(), False, primary_key=key)
        # the sources' watermark rows pass through the operator (runtime.spark_event_time)
        return Traits(cols, mode, (key,), key, frozenset(), True, primary_key=key,
                      time_attribute=WINDOW_TIME, watermark=watermark.renamed(WINDOW_TIME))


# --------------------------------------------------------------------------- dedup, aggregate, top-n


@dataclasses.dataclass(frozen=True, eq=False)
class Deduplicate(_Unary):
    """Keep the first or last row per ``key`` (docs/operators.md, "Deduplication").

    ``order_by``: ``None`` orders by arrival (processing time: the source
    sequence), a column name by that event-time attribute.  Traits: ``key``
    becomes the unique key, upsert key and primary key (the input's unique keys
    stay unique: the output rows are a subset of the input's); keep first
    emits inserts only, keep last updates (retract with update-before, else
    upsert).  Keep first on event time waits for the watermark (a note says
    so); keep last over a changelog input is ChangelogNormalize.

    ``proctime_column``: an input column holding processing time that nothing
    after the operator reads (SQL's ``ORDER BY pt`` column when ``pt`` is not
    selected).  The operator orders by arrival, never by that value, so the
    column reaches it null, as Flink's ``PROCTIME()`` indicator is null in its
    rows until something materializes it: neither state nor output depends on
    when a row was read, and a reader's line task can pack the rows
    (docs/runtime.md, "Packing in the line task").  Not in the label: the
    columns and the state are the same."""

    input: Node
    key: Key
    keep: str = "first"
    order_by: Optional[str] = None
    generate_update_before: bool = True
    generate_insert: bool = True
    fold_batch: bool = False
    state_ttl_ms: Optional[int] = None
    key_groups: Optional[int] = None
    proctime_column: Optional[str] = None

    @property
    def waits_for_watermark(self) -> bool:
        return self.keep == "first" and self.order_by is not None

    @property
    def spec(self):
        """The watermarks it waits for: the sources' (``source_watermark_spec``)."""
        return source_watermark_spec(self.input, self.order_by)

    def label(self) -> str:
        order = "PROCTIME" if self.order_by is None else f"ROWTIME({self.order_by})"
        row = "FirstRow" if self.keep == "first" else "LastRow"
        fold = MINI_BATCH_LABEL[self.fold_batch and self.keep == "last"]
        wm = f", watermark=[{self.spec.describe()}]" if self.waits_for_watermark else ""
        return f"Deduplicate(keep=[{row}], key={fmt_key(self.key)}, order=[{order}]{fold}{wm})"

    def derive_traits(self) -> Traits:
        t = self.input.traits
        key = _key(self.key)
        if self.keep == "first":
            mode = ChangelogMode.INSERT_ONLY
        else:
            mode = ChangelogMode.RETRACT if self.generate_update_before else ChangelogMode.UPSERT
        notes = ()
        if self.waits_for_watermark:
            notes = (f"keep first on event time {self.order_by!r} waits for the watermark: a "
                     "key's row is emitted once the watermark passes its event time, rows "
                     "behind the watermark are dropped as late (Flink 2.3)",)
        if self.fold_batch and self.keep == "last":
            notes += (MINI_BATCH_NOTE,)
        # a global deduplication (no key) keeps one row: no key column identifies it
        return dataclasses.replace(
            t, mode=mode, unique_keys=_dedup_keys([key] + list(t.unique_keys)),
            upsert_key=key or None, primary_key=key, notes=notes, ordered=True)


#: an aggregate call of GroupAggregate: (function, column or None for COUNT(*), output name)
AggCall = tuple


def agg_text(call: AggCall) -> str:
    f, col, out = call
    if f == "count_distinct":
        return f"COUNT(DISTINCT {col}) AS {out}"
    return f"{f.upper()}({col or '*'}) AS {out}"


@dataclasses.dataclass(frozen=True, eq=False)
class Aggregate(_Unary):
    """``GROUP BY key`` with retracting aggregate functions (docs/operators.md,
    "Group aggregation").  Traits: the columns are the key then the
    aggregates; the group key is the unique key, upsert key and primary key;
    the output has updates (``-U``/``+U``, ``-D`` when a group empties); an
    aggregate over a non-deterministic column is non-deterministic; the event
    time attribute does not survive (it is not a column of the output)."""

    input: Node
    key: Key
    aggs: tuple = ()
    generate_update_before: bool = True
    emit_unchanged: Optional[bool] = None
    state_ttl_ms: Optional[int] = None
    key_groups: Optional[int] = None

    def label(self) -> str:
        return (f"GroupAggregate(groupBy={fmt_key(self.key)}, select=["
                + ", ".join(list(self.key) + [agg_text(a) for a in self.aggs]) + "])")

    def derive_traits(self) -> Traits:
        t = self.input.traits
        key = _key(self.key)
        cols = key + tuple(a[2] for a in self.aggs)
        nondet = frozenset(a[2] for a in self.aggs if a[1] in t.nondeterministic) \
            | frozenset(k for k in key if k in t.nondeterministic)
        mode = ChangelogMode.RETRACT if self.generate_update_before else ChangelogMode.UPSERT
        # the event-time attribute is not an output column: no time attribute
        return Traits(cols, mode, unique_keys=(key,), upsert_key=key, nondeterministic=nondet,
                      has_watermark=t.has_watermark, ordered=True, primary_key=key)


@dataclasses.dataclass(frozen=True, eq=False)
class TopN(_Unary):
    """``ROW_NUMBER() OVER (PARTITION BY partition_by ORDER BY order_by) <= n``
    (docs/operators.md, "Top-N").  Traits: with the rank number in the output
    (``rank_column``), (partition, rank) is the unique key and upsert key: the
    changes are per rank position; without it, rows enter (``+I``) and leave
    (``-D``) whole, so there is no upsert key (compare whole rows).  The
    input's unique keys stay unique (the output rows are a subset)."""

    input: Node
    partition_by: Key
    n: int
    order_by: tuple = ()             # ((column, ascending), ...)
    rank_column: Optional[str] = None
    state_ttl_ms: Optional[int] = None
    key_groups: Optional[int] = None

    def label(self) -> str:
        order = ", ".join(f"{c} {'ASC' if a else 'DESC'}" for c, a in self.order_by)
        strategy = "AppendFast" if self.input.traits.mode is ChangelogMode.INSERT_ONLY \
            else "Retract"
        select = (f", select=[*, {self.rank_column}]" if self.rank_column else "")
        return (f"Rank(strategy=[{strategy}Strategy], rankType=[ROW_NUMBER], "
                f"rankRange=[rankStart=1, rankEnd={self.n}], "
                f"partitionBy={fmt_key(self.partition_by)}, orderBy=[{order}]{select})")

    def derive_traits(self) -> Traits:
        t = self.input.traits
        part = _key(self.partition_by)
        if self.rank_column:
            cols = t.columns + (self.rank_column,)
            rank_key = part + (self.rank_column,)
            keys, upsert = _dedup_keys([rank_key] + list(t.unique_keys)), rank_key
        else:
            cols, keys, upsert = t.columns, t.unique_keys, None
        note = ("" if self.rank_column else "Top-N without the rank number: rows enter (+I) "
                "and leave (-D) whole, no upsert key")
        return dataclasses.replace(t, columns=cols, mode=ChangelogMode.RETRACT, unique_keys=keys,
                                   upsert_key=upsert, primary_key=upsert or t.primary_key,
                                   notes=(note,) if note else (), ordered=True)


# --------------------------------------------------------------------------- join rules


def exchange_upsert_key(t: Traits, by: Key) -> tuple[Optional[Key], Optional[str]]:
    """The upsert key after a hash shuffle on ``by`` (and a note when it is lost)."""
    if not t.upsert_key:
        return None, None
    if set(by) <= set(t.upsert_key):
        return t.upsert_key, None
    return None, (f"upsert key {fmt_key(t.upsert_key)} lost: the input is shuffled by "
                  f"{fmt_key(by)}, which it does not contain, so changes of one key can take "
                  "different paths")


def _side_unique_on(keys: Sequence[Key], join_cols: Key) -> bool:
    """At most one row of the side per join key (its state is one row per join key)."""
    return join_input_side_spec(join_cols, keys).view == JOIN_KEY_CONTAINS_UNIQUE_KEY


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


def join_input_specs(node: Join) -> tuple[JoinInputSideSpec, JoinInputSideSpec]:
    """The state view each side of a join gets (``model.join_side``; the
    lowering hands each side's unique key to the operator, explain prints them)."""
    return (join_input_side_spec(node.left_keys, node.left.traits.unique_keys),
            join_input_side_spec(node.right_keys, node.right.traits.unique_keys))


def source_watermark_spec(node: Node, column: Optional[str], idle_timeout_ms: Optional[int] = None):
    """The :class:`~spark_changelog.model.partition_watermarks.EventTimeSpec`
    of an event-time operator over ``node`` that waits for the watermarks
    its sources generate (docs/windows.md, "Watermarks from the source"):
    every window, event-time deduplication and ``ON CONFLICT DO
    ERROR/NOTHING`` folds them the same way.  ``idle_timeout_ms``: for the
    sources that declare none."""
    from ..model.partition_watermarks import EventTimeSpec
    from ..model.source_watermarks import SourceWatermarks
    assigners = watermark_assigners(node)
    sources = tuple(w.generates() for w in assigners)
    idle = tuple((w.source_name, w.idle_timeout_ms) for w in assigners
                 if w.idle_timeout_ms is not None)
    return EventTimeSpec(SourceWatermarks(column or "", sources, idle), None, idle_timeout_ms)


def watermark_assigners(node: Node) -> list["WatermarkAssigner"]:
    """The watermark assigners feeding ``node``, left to right, each once."""
    out: list = []

    def walk(n: Node) -> None:
        if isinstance(n, WatermarkAssigner):
            if not any(w is n for w in out):
                out.append(n)
            return
        for c in n.children:
            walk(c)
    walk(node)
    return out


def source_leaves(node: Node) -> list[Source]:
    """The Source leaves of a plan, left to right, each once."""
    out: list[Source] = []

    def walk(n: Node) -> None:
        if isinstance(n, Source):
            if not any(s is n for s in out):
                out.append(n)
        for c in n.children:
            walk(c)
    walk(node)
    return out


__all__ = ["watermark_assigners", "source_watermark_spec", "Traits", "Node", "Source", "WatermarkAssigner", "Project", "ProjectItem",
           "Filter", "UnionAll",
           "Normalize", "ApplyAs", "History", "Join", "Materialize", "Sink", "Deduplicate", "Aggregate", "TopN",
           "AggCall", "agg_text", "infer", "join_traits",
           "exchange_upsert_key", "join_input_specs", "source_leaves",
           "fmt_key", "fmt_keys", "Key"]
