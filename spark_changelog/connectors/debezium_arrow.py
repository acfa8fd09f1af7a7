"""Debezium lines parsed in the line task with pyarrow's JSON reader (docs/runtime.md,
"Reading CDC files: one pass").

Spark's ``from_json`` decodes every line through a ``java.io.Reader`` (about
half the speed of Spark's own JSON file source), so the common case is parsed
here, in the Python task that already holds the lines' bytes
(:mod:`~spark_changelog.connectors.lines`), by Arrow's JSON reader (C++, typed
by an explicit schema, strict: a value of another JSON type, a fraction or
exponent for an integer, a bad escape all fail, and so does a duplicate key
among the fields it types; one repeated among the fields it skips is not
seen, docs/runtime.md, "Parsed once, mostly by Arrow").

A line this module can decide leaves the task *finished*: its change rows
(``-U``/``+U``, or ``-D``/``+I`` when a key column changes; ``_kind``, ``_seq``
and the user columns, exactly as ``debezium.parse``'s SQL would build them),
so Spark only passes them through.  Every other line leaves as one row with
its text (``raw``) for Spark's VARIANT path, which decides it and states the
reason.  So the checks here must equal the SQL's for every line they accept;
where that is not certain (``-0.0`` or non-finite doubles, ``NaN`` anywhere,
a JSON-null ``schema`` beside a ``payload``, a file name with a line break,
negative binlog parts) the line is left to the VARIANT path: that only costs
speed.  ``tests/connectors/test_debezium_arrow.py`` compares both paths.

Alignment: only lines that start with ``{`` and end with ``}`` are given to
Arrow (the others are blanked to spaces, which it skips).  Such a line cannot
continue an object of the line before (``}`` then ``{`` is not valid JSON, and
a string cannot hold a raw newline), so each one yields at least one row or an
error; a parse whose row count equals its line count therefore maps rows to
lines one to one.  A failing part is bisected (``{} {}`` on one line, a bad
line) down to single lines, within a budget of a few parses of the range.

No Spark import: this runs in the Python workers.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from spark_changelog.connectors.seq_layout import (BINLOG_FILE_BITS, BINLOG_OFFSET_BITS, FILE_LINE_BITS,
                                                   FILE_NO_BITS, LSN_BITS, PHASE_AFTER, PHASE_BEFORE, TS_LINE_BITS,
                                                   TS_MS_BITS)
from spark_changelog.model.rowkind import RowKind
from spark_changelog.model.schema import KIND_COL, PACKED_GROUP_COL, PACKED_KIND, PACKED_ROWS_COL, SEQ_COL

#: Spark simple type name -> Arrow type, for the user columns of the fast path
#: (debezium.FAST_TYPES)
ARROW_TYPES = {"boolean": pa.bool_(), "int": pa.int32(), "bigint": pa.int64(), "double": pa.float64(),
               "string": pa.string()}
_SOURCE = pa.struct([("lsn", pa.int64()), ("file", pa.string()), ("pos", pa.int64()), ("row", pa.int64()),
                     ("ts_ms", pa.int64())])
#: bytes Arrow may parse per range, as a multiple of the range, before the
#: remaining failing parts go to Spark's VARIANT path whole
_PARSE_BUDGET = 4
_OPEN, _CLOSE, _SPACE = ord("{"), ord("}"), ord(" ")
#: the ``op`` values of the fast path, in the order of the codes :meth:`DebeziumArrowParser._rows` uses
_OPS = pa.array(["c", "r", "u", "d"])
_INSERT, _UPDATE_BEFORE, _UPDATE_AFTER, _DELETE = (int(k) for k in (RowKind.INSERT, RowKind.UPDATE_BEFORE,
                                                                     RowKind.UPDATE_AFTER, RowKind.DELETE))
#: Arrow type -> Spark DDL type of the line task's columns
_SPARK_TYPES = {pa.bool_(): "BOOLEAN", pa.int8(): "TINYINT", pa.int32(): "INT", pa.int64(): "BIGINT",
                pa.float64(): "DOUBLE", pa.string(): "STRING"}


class FinishingParser:
    """What a line parser that finishes lines shares (``lines.LineParser``):
    ``columns`` (name, Spark simple type) pairs and the line task's
    :attr:`fields` for the finished change rows: the user columns by
    position (``_j_0``...: a user column may be called ``line`` or ``raw``),
    the row kind and ``_seq``; NULL on rows that carry a line's text."""

    def __init__(self, columns: Sequence[tuple[str, str]]):
        self.columns = list(columns)
        self.fields = ([pa.field(f"_j_{i}", ARROW_TYPES[t]) for i, (_, t) in enumerate(self.columns)]
                       + [pa.field("_j_kind", pa.int8()), pa.field("_j_seq", pa.int64())])

    @property
    def ddl(self) -> str:
        """The Spark DDL of :attr:`fields`."""
        return ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in self.fields)


class DebeziumArrowParser(FinishingParser):
    """The ``lines.LineParser`` of Debezium reads whose columns are all of
    :data:`ARROW_TYPES`: ``columns`` are (name, Spark simple type) pairs."""

    def __init__(self, columns: Sequence[tuple[str, str]], primary_key: Sequence[str]):
        super().__init__(columns)
        self.primary_key = tuple(primary_key)
        image = pa.struct([(n, ARROW_TYPES[t]) for n, t in self.columns])
        envelope = [("before", image), ("after", image), ("op", pa.string()), ("source", _SOURCE),
                    ("ts_ms", pa.int64())]
        # plain envelopes first; lines whose ``schema`` is present (Kafka
        # Connect's schemas.enable form) are parsed again for their payload:
        # an always-absent payload struct in the first schema costs a quarter
        # of the parse
        self.json_schema = pa.schema(envelope + [("schema", pa.struct([]))])
        self.wrapped_schema = pa.schema([("schema", pa.struct([])), ("payload", pa.struct(envelope))])

    # ----------------------------------------------------------------- parsing

    def __call__(self, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, file_no: int,
                 line_numbers: np.ndarray) -> tuple[np.ndarray, list[pa.Array], np.ndarray]:
        """The rows of the lines ``[starts[i], ends[i])`` of ``buf`` (numbered
        ``line_numbers``): the line of each row, the :attr:`fields` columns and
        the mask of rows that need their line's text.  A fast line gives its
        finished change rows (an update two), any other line one row with its
        text and every field NULL."""
        n = len(starts)
        buf, starts, ends, table, rows, having = parse_objects(buf, starts, ends, self.json_schema)
        if table is not None:
            has_schema = _valid(table.column("schema"))
            if has_schema.any():
                # the envelope is the payload: parse those lines (a subset of
                # the parsed ones) again, the others blanked
                lines = np.flatnonzero(rows >= 0)[has_schema[rows[rows >= 0]]]
                keep = np.zeros(n, dtype=bool)
                keep[lines] = True
                wrapped_rows = np.full(n, -1, dtype=np.int64)
                text = _blank_out(buf, starts[~keep], ends[~keep])
                wrapped = parse_lines(text, starts, ends, lines, wrapped_rows, self.wrapped_schema)
                rows[keep & (wrapped_rows < 0)] = -1   # its payload did not parse: the VARIANT path decides
                return self._rows(table, rows, file_no, line_numbers, having, wrapped, wrapped_rows)
        return self._rows(table, rows, file_no, line_numbers, having)

    # ----------------------------------------------------------------- the fast lines' rows

    def _rows(self, table, rows: np.ndarray, file_no: int, line_numbers: np.ndarray, having: "_Substrings",
              wrapped_table=None, wrapped_rows=None) -> tuple[np.ndarray, list[pa.Array], np.ndarray]:
        n = len(rows)
        parsed = rows >= 0
        if table is None or not parsed.any():
            return np.arange(n), [pa.nulls(n, f.type) for f in self.fields], np.ones(n, dtype=bool)
        if parsed.all() and table.num_rows == n and np.array_equal(rows, np.arange(n)):
            top = {name: _flat(table.column(name)) for name in table.column_names}   # no reordering needed
        else:
            take = pa.array(rows, mask=~parsed)
            top = {name: _flat(table.column(name).take(take)) for name in table.column_names}
        has_schema = _valid(top["schema"])
        has_payload = np.zeros(n, dtype=bool)
        if wrapped_table is not None:
            payload_col = _flat(wrapped_table.column("payload").take(pa.array(wrapped_rows, mask=wrapped_rows < 0)))
            has_payload = _valid(payload_col)
            payload = _children(payload_col)
        wrapped = has_schema & has_payload
        pick = pa.array(wrapped)
        # Spark reads a line as wrapped when both keys are there, JSON null
        # included, which Arrow cannot see: a line not wrapped by Arrow's
        # reading that holds the string ``"payload"`` (or a backslash-u escape,
        # which could spell it) is left to the VARIANT path
        plain = ~has_schema & ~(having('"payload"', "y") | having("\\u", "\\"))

        def env(name: str) -> pa.Array:
            return pc.if_else(pick, payload[name], top[name]) if wrapped.any() else top[name]

        source = _children(env("source"))
        op, before, after = env("op"), env("before"), env("after")
        ts = pc.coalesce(env("ts_ms"), source["ts_ms"])
        position, position_ok = _position(source["lsn"], source["file"], source["pos"], source["row"], ts,
                                          file_no, line_numbers)
        # one lookup of each line's op in (c, r, u, d): 0-3, -1 for any other or NULL
        op_code = np.asarray(pc.index_in(op, value_set=_OPS).fill_null(-1).to_numpy(zero_copy_only=False))
        inserted, updated, deleted = (op_code == 0) | (op_code == 1), op_code == 2, op_code == 3
        after_ok, before_ok = self._key_present(after), self._key_present(before)
        fast = (parsed & (wrapped | plain) & position_ok & values_plain(before)
                & values_plain(after)
                & ((inserted & after_ok) | (updated & after_ok & before_ok) | (deleted & before_ok)))
        return self._finished(fast, inserted & fast, updated & fast, before, after, position)

    def _finished(self, fast: np.ndarray, inserted: np.ndarray, updated: np.ndarray, before: pa.Array,
                  after: pa.Array, position: np.ndarray) -> tuple[np.ndarray, list[pa.Array], np.ndarray]:
        """The change rows of the fast lines, exactly as ``debezium.parse``'s
        SQL builds them (docs/semantics.md, section 1): c/r ``+I`` after; u
        ``-U`` before, ``+U`` after, or ``-D``/``+I`` when a key column differs;
        d ``-D`` before; ``_seq`` = position * 2 + phase.  Other lines: one row,
        every field NULL."""
        n = len(fast)
        counts = np.where(updated, 2, 1)
        line_of = np.repeat(np.arange(n), counts)
        first_row = np.cumsum(counts) - counts
        second = np.zeros(len(line_of), dtype=bool)
        second[first_row[updated] + 1] = True
        slow = ~fast[line_of]
        uses_after = inserted[line_of] | second      # else the before image (u's first row, d)
        befores, afters = _children(before), _children(after)
        key_changed = np.zeros(n, dtype=bool)
        for k in self.primary_key:
            key_changed |= ~_true(pc.equal(befores[k], afters[k]))
        changed = key_changed[line_of]
        row_updated = updated[line_of]
        kind = np.where(uses_after,
                        np.where(row_updated & ~changed, _UPDATE_AFTER, _INSERT),
                        np.where(row_updated & ~changed, _UPDATE_BEFORE, _DELETE)).astype(np.int8)
        seq = position[line_of] * 2 + np.where(uses_after, PHASE_AFTER, PHASE_BEFORE)
        image_row = pa.array(line_of + n * uses_after, mask=slow)
        values = [pa.concat_arrays([befores[c], afters[c]]).take(image_row) for c, _ in self.columns]
        return (line_of, values + [pa.array(kind, mask=slow), pa.array(seq, mask=slow)], slow)

    def _key_present(self, image: pa.Array) -> np.ndarray:
        ok = _valid(image)
        children = _children(image)
        for k in self.primary_key:
            ok &= _valid(children[k])
        return ok


def parse_objects(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, schema: pa.Schema):
    """The lines ``[starts[i], ends[i])`` of ``buf`` that may be one JSON
    object each (``{`` ... ``}``, no ``NaN``/``Infinity``: Arrow's reader takes
    them as numbers, even in fields it ignores, and Spark's does not), read
    with :func:`parse_lines`.  Returns (``buf``, ``starts``, ``ends``
    rebased to the lines' own bytes; the table or None; each line's row of
    it, -1 where none; the lines' :class:`_Substrings`)."""
    n = len(starts)
    lo = int(starts[0]) if n else 0
    buf, starts, ends = buf[lo:int(ends[-1]) if n else 0], starts - lo, ends - lo
    nonempty = ends > starts
    first = buf[np.minimum(starts, max(len(buf) - 1, 0))] if len(buf) else np.zeros(n, np.uint8)
    last = buf[np.maximum(ends - 1, 0)] if len(buf) else np.zeros(n, np.uint8)
    having = _Substrings(buf, starts, ends)
    non_numbers = having("NaN", "N") | having("Infinity", "I")
    candidate = nonempty & (first == _OPEN) & (last == _CLOSE) & ~non_numbers
    rows = np.full(n, -1, dtype=np.int64)      # row of the parsed table per line, -1 = not parsed
    table = None
    cand = np.flatnonzero(candidate)
    if len(cand):
        text = buf if candidate.all() else _blank_out(buf, starts[~candidate], ends[~candidate])
        table = parse_lines(text, starts, ends, cand, rows, schema)
    return buf, starts, ends, table, rows, having


def parse_lines(text: np.ndarray, starts: np.ndarray, ends: np.ndarray, cand: np.ndarray,
           rows: np.ndarray, schema: pa.Schema):
    budget = _PARSE_BUDGET * max(1, int(ends[cand[-1]] - starts[cand[0]]))
    parts: list[pa.Table] = []
    done = 0
    todo = [(0, len(cand))]                    # candidate index ranges, in line order
    while todo:
        i, j = todo.pop()
        lo, hi = int(starts[cand[i]]), int(ends[cand[j - 1]])
        if hi - lo > budget:
            continue                           # out of budget: Spark's VARIANT path takes them
        budget -= hi - lo
        part = _read(text[lo:hi], schema)
        if part is not None and part.num_rows == j - i:
            rows[cand[i:j]] = np.arange(done, done + part.num_rows)
            done += part.num_rows
            parts.append(part)
        elif j - i > 1:
            mid = (i + j) // 2
            todo += [(mid, j), (i, mid)]       # the first half next: parts stay in line order
    if not parts:
        return None
    return pa.concat_tables(parts).combine_chunks()

def _read(data: np.ndarray, schema: pa.Schema):
    try:
        return pj.read_json(
            pa.BufferReader(pa.py_buffer(data)),
            read_options=pj.ReadOptions(use_threads=False, block_size=max(1 << 16, len(data) + 1)),
            parse_options=pj.ParseOptions(explicit_schema=schema, newlines_in_values=False,
                                          unexpected_field_behavior="ignore"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeError):
        return None


def values_plain(image: pa.Array) -> np.ndarray:
    """Images without a DOUBLE value the VARIANT path may read differently:
    -0.0 (Spark's ``parse_json`` keeps ``-0.0`` as a decimal, so 0.0) and
    non-finite values (``NaN``, or a literal out of range)."""
    ok = np.ones(len(image), dtype=bool)
    for child in image.flatten():
        if pa.types.is_floating(child.type):
            values = child.fill_null(1.0).to_numpy(zero_copy_only=False)
            ok &= np.isfinite(values) & ~((values == 0) & np.signbit(values))
    return ok


class PackingParser:
    """A :class:`FinishingParser` whose finished rows leave the line task
    packed (``cdc_json.ReadResult.packed_rows``, docs/runtime.md, "Packing in
    the line task"): ``packer`` turns a table of finished change rows (the
    user columns by name, ``_kind``, ``_seq``) into (key group, packed rows)
    pairs, and each pair leaves as one row: ``_j_kind`` = ``PACKED_KIND``,
    ``_j_seq`` 0, the user columns NULL, and the two packed columns.  The
    lines left to Spark leave as the parser gives them, and so do the
    finished rows the packer leaves (its optional ``leaves(table)``: a mask
    of rows it cannot pack, which Spark's SQL then finishes from their
    values like any finished line)."""

    def __init__(self, parser: FinishingParser, packer):
        self.parser, self.packer = parser, packer
        self.fields = parser.fields + [pa.field(PACKED_GROUP_COL, pa.int32()),
                                       pa.field(PACKED_ROWS_COL, pa.binary())]

    @property
    def ddl(self) -> str:
        return self.parser.ddl + f", {PACKED_GROUP_COL} INT, {PACKED_ROWS_COL} BINARY"

    def __call__(self, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, file_no: int,
                 line_numbers: np.ndarray) -> tuple[np.ndarray, list[pa.Array], np.ndarray]:
        line_of, values, needs_raw = self.parser(buf, starts, ends, file_no, line_numbers)
        finished = np.flatnonzero(~needs_raw)
        names = [c for c, _ in self.parser.columns] + [KIND_COL, SEQ_COL]
        unpacked = needs_raw
        leaves = getattr(self.packer, "leaves", None)
        if leaves is not None and len(finished):
            left = leaves(pa.table(values if len(finished) == len(line_of) else [v.take(finished) for v in values],
                                   names=names))
            if left.any():
                unpacked = needs_raw.copy()
                unpacked[finished[left]] = True
                finished = finished[~left]
        if not len(finished):
            n = len(line_of)
            return line_of, values + [pa.nulls(n, pa.int32()), pa.nulls(n, pa.binary())], needs_raw
        every = len(finished) == len(line_of)     # the common case: no line left to Spark
        pairs = list(self.packer(pa.table(values if every else [v.take(finished) for v in values], names=names)))
        m = len(pairs)
        if every:
            out = [pa.nulls(m, v.type) for v in values[:-2]]
            out += [pa.array(np.full(m, PACKED_KIND, np.int8)), pa.array(np.zeros(m, np.int64)),
                    pa.array([g for g, _ in pairs], pa.int32()), pa.array([b for _, b in pairs], pa.binary())]
            return np.full(m, line_of[0]), out, np.zeros(m, dtype=bool)
        rest = np.flatnonzero(unpacked)
        # a packed row is numbered as the first finished line: it is never
        # reported by line (its rows are valid changes)
        out_line_of = np.concatenate([line_of[rest], np.full(m, line_of[finished[0]])])
        out = [pa.concat_arrays([v.take(rest), pa.nulls(m, v.type)]) for v in values[:-2]]
        out.append(pa.concat_arrays([values[-2].take(rest), pa.array(np.full(m, PACKED_KIND, np.int8))]))
        out.append(pa.concat_arrays([values[-1].take(rest), pa.array(np.zeros(m, np.int64))]))
        out.append(pa.concat_arrays([pa.nulls(len(rest), pa.int32()), pa.array([g for g, _ in pairs], pa.int32())]))
        out.append(pa.concat_arrays([pa.nulls(len(rest), pa.binary()),
                                     pa.array([b for _, b in pairs], pa.binary())]))
        return out_line_of, out, np.concatenate([needs_raw[rest], np.zeros(m, dtype=bool)])


def _position(lsn, file, pos, row, ts, file_no: int, line: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(position, encodes) per line: ``debezium.position``'s choice and packing
    (``cdc_json`` "Sequence encoding"; position undefined where it does not
    encode).  ``encodes`` is False wherever that SQL would report a range
    error, and also on a few lines where it would not (negative ``pos`` or
    ``row``, a file name with a line break): those take the VARIANT path,
    which decides them."""
    has_lsn = _valid(lsn)
    lsn_v = _ints(lsn)
    pos_v, row_v = _ints(pos), _ints(row)
    n = len(lsn_v)
    has_binlog, binlog_ok, odd_file = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
    file_v = np.zeros(n, dtype=np.int64)
    # the file name matters only without an lsn and with a pos (and is NULL in
    # PostgreSQL's events): the regular expressions run on those lines only
    which = np.flatnonzero(~has_lsn & _valid(pos) & _valid(file))
    if len(which):
        names = file.take(pa.array(which))
        # Java's ``$`` also matches before a final line terminator, RE2's does not
        odd_file[which] = _true(pc.match_substring_regex(names, r"[\n\r\x{85}\x{2028}\x{2029}]"))
        binlog_digits = pc.extract_regex(names, r"(?P<d>\d+)$")
        has_binlog[which] = _valid(binlog_digits)
        digits = pc.utf8_ltrim(pc.struct_field(binlog_digits, "d").fill_null("0"), "0")
        short = pc.utf8_length(digits).to_numpy(zero_copy_only=False) <= 9
        file_v[which] = _ints(pc.if_else(pa.array(short), pc.if_else(pc.equal(digits, ""), "0", digits),
                                         "0").cast(pa.int64()))
        binlog_ok[which] = short
    binlog_ok &= ((file_v < 1 << BINLOG_FILE_BITS) & (pos_v >= 0) & (pos_v < 1 << BINLOG_OFFSET_BITS)
                  & (row_v >= 0) & (row_v < 1 << BINLOG_OFFSET_BITS) & (pos_v + row_v < 1 << BINLOG_OFFSET_BITS))
    has_ts = _valid(ts)
    ts_v = _ints(ts)
    encodes = ~odd_file & np.where(
        has_lsn, (lsn_v >= 0) & (lsn_v < 1 << LSN_BITS),
        np.where(has_binlog, binlog_ok,
                 np.where(has_ts, (ts_v >= 0) & (ts_v < 1 << TS_MS_BITS), 0 <= file_no < 1 << FILE_NO_BITS)))
    line = np.asarray(line, dtype=np.int64)
    position = np.where(
        has_lsn, lsn_v,
        np.where(has_binlog, (file_v << BINLOG_OFFSET_BITS) + pos_v + row_v,
                 np.where(has_ts, (ts_v << TS_LINE_BITS) + np.clip(line, 0, (1 << TS_LINE_BITS) - 1),
                          (min(max(file_no, 0), (1 << FILE_NO_BITS) - 1) << FILE_LINE_BITS)
                          + np.clip(line, 0, (1 << FILE_LINE_BITS) - 1))))
    return np.where(encodes, position, 0), encodes


class _Substrings:
    """Which lines contain a string, for strings that are rare in CDC files:
    a ``memchr`` scan for one of its bytes first, the per-line search
    (Arrow's, over the lines in place) only when that byte occurs at all."""

    def __init__(self, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray):
        self.buf, self.starts, self.ends = buf, starts, ends
        self._bytes = None
        self._views = None

    def __call__(self, text: str, probe: str) -> np.ndarray:
        if self._bytes is None:
            self._bytes = self.buf.tobytes()
        if self._bytes.find(probe.encode()) < 0:
            return np.zeros(len(self.starts), dtype=bool)
        if self._views is None:
            # each line and the separator after it, over ``buf`` itself (no
            # copy): the searched strings hold no line break
            offsets = np.append(self.starts, self.ends[-1] if len(self.ends) else 0).astype(np.int64)
            self._views = pa.Array.from_buffers(pa.large_binary(), len(self.starts),
                                                [None, pa.py_buffer(offsets), pa.py_buffer(self.buf)])
        return _true(pc.match_substring(self._views, text))


def _blank_out(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """A copy of ``buf`` with the byte ranges ``[starts[i], ends[i])`` (disjoint)
    replaced by spaces, which the JSON reader skips."""
    edges = np.zeros(len(buf) + 1, dtype=np.int8)
    np.add.at(edges, starts, 1)
    np.add.at(edges, ends, -1)
    inside = np.cumsum(edges[:-1], dtype=np.int8) > 0
    return np.where(inside, np.uint8(_SPACE), buf)


def _flat(column) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _children(struct: pa.Array) -> dict[str, pa.Array]:
    """A struct array's fields, NULL where the struct is NULL."""
    return {struct.type.field(i).name: child for i, child in enumerate(struct.flatten())}


def _valid(arr) -> np.ndarray:
    return np.asarray(pc.is_valid(arr).to_numpy(zero_copy_only=False), dtype=bool)


def _ints(arr) -> np.ndarray:
    """Integer values, 0 where NULL (callers test validity separately)."""
    return np.asarray(arr.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)


def _true(mask) -> np.ndarray:
    """A boolean Arrow array as numpy, NULL as False."""
    return np.asarray(mask.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)
