"""Schema facts of a changelog stream (docs/semantics.md, section 1).

A stream is a Spark DataFrame whose data columns are the user's columns plus
two metadata columns:

``_kind`` (tinyint)
    the :class:`~spark_changelog.model.rowkind.RowKind` code of the row.
``_seq`` (bigint)
    a sequence that totally orders the changes of one source partition
    (Debezium ``source.lsn``/``pos``, ``ts_ms``, or file + line; the
    PostgreSQL CDC source: commit LSN + position in the transaction,
    docs/sources.md).  Operators
    emit rows carrying an ``_seq`` that keeps the per-key (or per-row) order of
    their own emissions.  Several rows emitted for one input row share its
    ``_seq``; between rows of one key with equal ``_seq`` a retraction always
    precedes an addition (``-U`` before ``+U``), which is the order Flink emits
    them in.  Shuffles never keep row order: every consumer re-sorts by
    ``(key, _seq)`` and never relies on arrival order.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Optional, Sequence

from .watermark import WatermarkStrategy

KIND_COL = "_kind"
SEQ_COL = "_seq"
METADATA_COLUMNS = (KIND_COL, SEQ_COL)
#: side rows: ``_kind = -1`` with a JSON payload in ``_metrics`` (operator
#: metrics, a reader's dead letters and skipped records); they pass through
#: every operator to the sink handler (docs/plan.md, "Lowering")
METRICS_COL = "_metrics"
METRICS_KIND = -1
#: packed rows: a reader's line task may pack a keyed operator's input rows
#: per key group itself (docs/runtime.md, "Packing in the line task"); such a
#: row (``_kind = -2``, data columns null) carries the key group and the
#: packed rows in two extra columns, and only that operator's packing pass
#: ever sees it
PACKED_KIND = -2
PACKED_GROUP_COL = "_packed_kg"
PACKED_ROWS_COL = "_packed_rows"


class ChangelogMode(enum.Enum):
    """Which kinds a stream may contain (docs/semantics.md, section 1)."""

    INSERT_ONLY = "insert-only"   # +I
    UPSERT = "upsert"             # +I +U -D, keyed, no -U
    RETRACT = "retract"           # +I -U +U -D

    @property
    def kinds(self) -> str:
        return {"insert-only": "[I]", "upsert": "[I,UA,D]", "retract": "[I,UB,UA,D]"}[self.value]

    @property
    def has_updates(self) -> bool:
        return self is not ChangelogMode.INSERT_ONLY


@dataclasses.dataclass(frozen=True)
class StreamSchema:
    """What the planner knows about a stream besides its column types."""

    columns: tuple[str, ...]
    primary_key: tuple[str, ...] = ()
    upsert_key: Optional[tuple[str, ...]] = None
    mode: ChangelogMode = ChangelogMode.RETRACT
    time_attribute: Optional[str] = None   # the event-time column (the watermark's)
    watermark: Optional[WatermarkStrategy] = None

    def __post_init__(self) -> None:
        for name, cols in (("primary key", self.primary_key), ("upsert key", self.upsert_key or ())):
            missing = [c for c in cols if c not in self.columns]
            if missing:
                raise ValueError(f"{name} column(s) {missing} not among columns {list(self.columns)}")
        if self.time_attribute is not None and self.time_attribute not in self.columns:
            raise ValueError(f"event-time column {self.time_attribute!r} not among columns "
                             f"{list(self.columns)}")
        clash = [c for c in self.columns if c in METADATA_COLUMNS]
        if clash:
            raise ValueError(f"column name(s) {clash} are reserved for changelog metadata")

    def with_(self, **changes) -> "StreamSchema":
        return dataclasses.replace(self, **changes)


def join_output_names(left_columns: Sequence[str], right_columns: Sequence[str]) -> dict:
    """Right column -> its name in a join's output: left columns keep theirs; a
    right column whose name is taken gets the first free ``name0``, ``name1``,
    ... (Flink/Calcite's ``id``, ``id0``).  The one rule for the planner and the
    join operator (docs/semantics.md, section 4)."""
    used = set(left_columns)
    out = {}
    for c in right_columns:
        name, i = c, 0
        while name in used:
            name, i = f"{c}{i}", i + 1
        used.add(name)
        out[c] = name
    return out


def as_key(cols: "str | Sequence[str] | None") -> tuple[str, ...]:
    if cols is None:
        return ()
    if isinstance(cols, str):
        return tuple(c.strip() for c in cols.split(",") if c.strip())
    return tuple(cols)
