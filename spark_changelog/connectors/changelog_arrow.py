"""Changelog JSON lines parsed by Arrow in the line task, as
:mod:`~spark_changelog.connectors.debezium_arrow` does for Debezium
(docs/runtime.md, "Reading CDC files: one pass").

A line is *finished* here (its change row: the user columns, ``_kind``,
``_seq``, exactly as ``changelog_files``' SQL builds them) when Arrow's strict
reader parses it as one object with the schema's types, its values are plain
(no ``-0.0`` or non-finite double), every key column is present, its kind is
one of the accepted spellings in ASCII (``+I``, ``INSERT``, ``0``, ...,
blanks around it and any case), and its sequence column, when there is one,
holds an integer; without one, its file number fits the ``_seq`` encoding.
Every other line (tombstones, bad records, other spellings) leaves with its
text for Spark's VARIANT path, which decides it and states the reason.
``tests/connectors/test_changelog_arrow.py`` compares both paths.

No Spark import: this runs in the Python workers.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_changelog.connectors.debezium_arrow import (ARROW_TYPES, FinishingParser, _flat, _ints, _true, _valid,
                                                       parse_objects, values_plain)
from spark_changelog.connectors.seq_layout import FILE_LINE_BITS, FILE_NO_BITS, PHASE_AFTER, PHASE_BEFORE
from spark_changelog.model.rowkind import KIND_SPELLINGS, RowKind

_NAMES = pa.array(list(KIND_SPELLINGS))
_CODES = np.array(list(KIND_SPELLINGS.values()), dtype=np.int8)


class ChangelogArrowParser(FinishingParser):
    """The ``lines.LineParser`` of changelog JSON reads whose columns are all
    of ``debezium_arrow.ARROW_TYPES``: ``columns`` are (name, Spark simple
    type) pairs.  The same fields as the Debezium parser's (a finished line
    is one row here)."""

    def __init__(self, columns: Sequence[tuple[str, str]], primary_key: Sequence[str],
                 kind_column: Optional[str], seq_column: Optional[str]):
        super().__init__(columns)
        self.primary_key = tuple(primary_key)
        self.kind_column, self.seq_column = kind_column, seq_column
        fields = [(n, ARROW_TYPES[t]) for n, t in self.columns]
        if kind_column is not None:     # None: plain rows, every one an insert
            fields.append((kind_column, pa.string()))
        if seq_column is not None:
            fields.append((seq_column, pa.int64()))
        self.json_schema = pa.schema(fields)

    def __call__(self, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, file_no: int,
                 line_numbers: np.ndarray) -> tuple[np.ndarray, list[pa.Array], np.ndarray]:
        """One row per line: a fast line's change row, any other line's row
        with every field NULL (and its text wanted)."""
        n = len(starts)
        _, _, _, table, rows, _ = parse_objects(buf, starts, ends, self.json_schema)
        parsed = rows >= 0
        if table is None or not parsed.any():
            return np.arange(n), [pa.nulls(n, f.type) for f in self.fields], np.ones(n, dtype=bool)
        take = pa.array(rows, mask=~parsed)
        top = {name: _flat(table.column(name)).take(take) for name in table.column_names}
        image = pa.StructArray.from_arrays([top[c] for c, _ in self.columns], [c for c, _ in self.columns])
        if self.kind_column is None:
            known = np.ones(n, dtype=bool)
            kind = np.full(n, int(RowKind.INSERT), dtype=np.int8)
        else:
            kind_text = top[self.kind_column]
            ascii_text = _true(pc.string_is_ascii(kind_text))
            # Spark's trim() removes spaces only; upper() of ASCII is ASCII's
            spelled = pc.index_in(pc.utf8_upper(pc.utf8_trim(kind_text, " ")), value_set=_NAMES)
            known = _valid(spelled) & ascii_text
            kind = np.where(known, _CODES[_ints(spelled)], 0).astype(np.int8)
        key_present = np.ones(n, dtype=bool)
        for k in self.primary_key:
            key_present &= _valid(top[k])
        fast = parsed & known & key_present & values_plain(image)
        if self.seq_column is not None:
            seq_value = top[self.seq_column]
            fast &= _valid(seq_value)
            seq = _ints(seq_value)
        else:
            fast &= 0 <= file_no < 1 << FILE_NO_BITS
            position = ((min(max(file_no, 0), (1 << FILE_NO_BITS) - 1) << FILE_LINE_BITS)
                        + np.clip(np.asarray(line_numbers, dtype=np.int64), 0, (1 << FILE_LINE_BITS) - 1))
            added = (kind == int(RowKind.INSERT)) | (kind == int(RowKind.UPDATE_AFTER))
            seq = position * 2 + np.where(added, PHASE_AFTER, PHASE_BEFORE)
        slow = ~fast
        values = [pc.if_else(pa.array(fast), top[c], pa.nulls(n, top[c].type)) for c, _ in self.columns]
        return (np.arange(n), values + [pa.array(kind, mask=slow), pa.array(seq, mask=slow)], slow)
