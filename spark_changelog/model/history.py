"""The columns of an SCD type 2 history table (docs/operators.md, "SCD type 2 history").

Named as Spark's ``create_auto_cdc_flow`` names them: ``__START_AT`` is the
sequence value of the change that opened a version, ``__END_AT`` the one of
the change that closed it (null: the current version).
"""
from __future__ import annotations

from typing import Sequence

START_AT = "__START_AT"
END_AT = "__END_AT"


def history_columns(sequence_by: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The ``__START_AT`` and ``__END_AT`` columns for a sequence of these
    columns (``()``: the source sequence ``_seq``).  Several columns (Spark's
    ``struct(...)`` sequence) are stored flattened, one pair per field
    (``__START_AT_<field>``, ``__END_AT_<field>``): an upsert key of plain
    columns works in every sink (PostgreSQL has no struct columns)."""
    if len(sequence_by) <= 1:
        return (START_AT,), (END_AT,)
    return (tuple(f"{START_AT}_{c}" for c in sequence_by),
            tuple(f"{END_AT}_{c}" for c in sequence_by))


__all__ = ["START_AT", "END_AT", "history_columns"]
