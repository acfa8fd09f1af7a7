"""Row kinds of a changelog (docs/semantics.md, section 1).

The byte values are Flink's ``RowKind.toByteValue()`` so that data recorded from
Flink and data written by us use the same codes.
"""
from __future__ import annotations

import enum

import numpy as np


class RowKind(enum.IntEnum):
    INSERT = 0          # +I
    UPDATE_BEFORE = 1   # -U
    UPDATE_AFTER = 2    # +U
    DELETE = 3          # -D

    @property
    def short(self) -> str:
        return _SHORT[self]

    @property
    def is_add(self) -> bool:
        """``+I``/``+U`` accumulate; ``-U``/``-D`` retract (docs/semantics.md, section 1)."""
        return self in (RowKind.INSERT, RowKind.UPDATE_AFTER)

    @property
    def is_retract(self) -> bool:
        return not self.is_add

    @classmethod
    def parse(cls, text: "str | int | RowKind") -> "RowKind":
        """Accept ``+I``/``-U``/``+U``/``-D``, Flink's names, or the byte value."""
        if isinstance(text, RowKind):
            return text
        if isinstance(text, (int, np.integer)):
            return cls(int(text))
        key = str(text).strip()
        try:
            return _FROM_TEXT[key.upper()]
        except KeyError:
            raise ValueError(
                f"unknown row kind {text!r}: expected one of +I, -U, +U, -D "
                "(or INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE)"
            ) from None


_SHORT = {
    RowKind.INSERT: "+I",
    RowKind.UPDATE_BEFORE: "-U",
    RowKind.UPDATE_AFTER: "+U",
    RowKind.DELETE: "-D",
}
_FROM_TEXT = {v: k for k, v in _SHORT.items()}
_FROM_TEXT.update({k.name: k for k in RowKind})
_FROM_TEXT.update({str(int(k)): k for k in RowKind})

#: numpy lookup: kind code -> True for ADD kinds.
IS_ADD = np.array([True, False, True, False])
SHORT_NAMES = np.array(["+I", "-U", "+U", "-D"], dtype=object)


#: the spellings a changelog file's kind column may use (upper-cased): the
#: short form, Flink's name, the byte value
KIND_SPELLINGS = {name: int(k) for k in RowKind for name in (k.short, k.name, str(int(k)))}
