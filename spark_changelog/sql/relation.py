"""The relation model every query shape works on (docs/sql.md, opening
section).

A :class:`Relation` is a :class:`~spark_changelog.api.ChangelogStream` plus the
SQL names it is visible under (its :class:`Field` s): a column of the stream
can be ``o.id`` in SQL and ``id0`` in the stream after a join renamed it.  A
relation may be *pending*: a ``ROW_NUMBER()`` waiting for the enclosing
query's filter on the row number, a window table function waiting for its
``GROUP BY``.  A pending call knows the error to raise when nothing completes
it (``unsettled_error``), so the dispatch needs no knowledge of the shapes.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from ..api import ChangelogStream


@dataclasses.dataclass(frozen=True)
class Field:
    qualifier: Optional[str]   # table name or alias it is visible under
    name: str                  # name in SQL
    column: str                # column of the stream
    proctime: bool = False     # a PROCTIME() column (a processing-time attribute)


@dataclasses.dataclass
class Relation:
    stream: ChangelogStream
    fields: tuple[Field, ...]
    #: a ROW_NUMBER() waiting for its filter (:class:`.row_number.RankCall`) or a
    #: window table function waiting for its GROUP BY (:class:`.window_tvf.WindowCall`)
    pending: Optional[object] = None

    def requalified(self, qualifier: str) -> "Relation":
        return Relation(self.stream, tuple(dataclasses.replace(f, qualifier=qualifier)
                                           for f in self.fields), self.pending)


__all__ = ["Field", "Relation"]
