"""Debezium lines parsed in the line task with pyarrow's JSON reader (docs/runtime.md,
"Reading CDC files: one pass").

Spark's ``from_json`` decodes every line through a ``java.io.Reader`` (about
half the speed of Spark's own JSON file source), so the common case is parsed
here, in the Python task that already holds the lines' bytes
(:mod:`~spark_changelog.connectors.lines`), by Arrow's JSON reader (C++, typed
by an explicit schema, strict: a value of another JSON type, a fraction or
exponent for an integer, a duplicate key, a bad escape all fail).

What a line gets here is an *offer*, never a verdict: the typed envelope
(``_j_*`` columns) of the lines Arrow parsed, and the line's text (``raw``) for
every line this module cannot prove good.  Spark then decides each line exactly
as before (``debezium.fast_columns`` on these columns, the VARIANT path with
its stated reasons on ``raw`` for the rest), so a line Arrow rejects only costs
speed.  ``raw`` is left out (NULL) only when the checks below already show the
line passes every check of the fast path; Spark fails the query if it ever
disagrees (a bug, never silent).

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
# the position bounds of cdc_json (LSN 62 bits; binlog file 28, offset 34; ts_ms 42; file number 34)
_LSN_LIMIT, _BINLOG_FILE_LIMIT, _BINLOG_OFFSET_LIMIT = 1 << 62, 1 << 28, 1 << 34
_TS_LIMIT, _FILE_NO_LIMIT = 1 << 42, 1 << 34


class DebeziumArrowParser:
    """The ``lines.LineParser`` of Debezium reads whose columns are all of
    :data:`ARROW_TYPES`: ``columns`` are (name, Spark simple type) pairs."""

    def __init__(self, columns: Sequence[tuple[str, str]], primary_key: Sequence[str]):
        self.columns = list(columns)
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
        self.fields = [pa.field("_j_ok", pa.bool_()), pa.field("_j_op", pa.string()),
                       pa.field("_j_before", image), pa.field("_j_after", image),
                       pa.field("_j_lsn", pa.int64()), pa.field("_j_file", pa.string()),
                       pa.field("_j_spos", pa.int64()), pa.field("_j_row", pa.int64()),
                       pa.field("_j_ts", pa.int64())]

    @property
    def ddl(self) -> str:
        image = "STRUCT<" + ", ".join(f"`{n.replace('`', '``')}`: {t.upper()}" for n, t in self.columns) + ">"
        return (f"_j_ok BOOLEAN, _j_op STRING, _j_before {image}, _j_after {image}, _j_lsn BIGINT, "
                "_j_file STRING, _j_spos BIGINT, _j_row BIGINT, _j_ts BIGINT")

    # ----------------------------------------------------------------- parsing

    def __call__(self, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                 file_no: int) -> tuple[list[pa.Array], np.ndarray]:
        """Typed envelope columns for the lines ``[starts[i], ends[i])`` of
        ``buf`` and the mask of lines whose text Spark needs."""
        n = len(starts)
        lo = int(starts[0]) if n else 0
        buf, starts, ends = buf[lo:int(ends[-1]) if n else 0], starts - lo, ends - lo
        nonempty = ends > starts
        first = buf[np.minimum(starts, max(len(buf) - 1, 0))] if len(buf) else np.zeros(n, np.uint8)
        last = buf[np.maximum(ends - 1, 0)] if len(buf) else np.zeros(n, np.uint8)
        candidate = nonempty & (first == _OPEN) & (last == _CLOSE)
        rows = np.full(n, -1, dtype=np.int64)      # row of the parsed table per line, -1 = not parsed
        table = None
        cand = np.flatnonzero(candidate)
        if len(cand):
            text = buf if candidate.all() else _blank_out(buf, starts[~candidate], ends[~candidate])
            table = self._parse(text, starts, ends, cand, rows, self.json_schema)
        wrapped = None
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
                wrapped = self._parse(text, starts, ends, lines, wrapped_rows, self.wrapped_schema)
                rows[keep & (wrapped_rows < 0)] = -1   # its payload did not parse: the VARIANT path decides
                return self._columns(table, rows, file_no, wrapped, wrapped_rows)
        return self._columns(table, rows, file_no)

    def _parse(self, text: np.ndarray, starts: np.ndarray, ends: np.ndarray, cand: np.ndarray,
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
            part = self._read(text[lo:hi], schema)
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

    def _read(self, data: np.ndarray, schema: pa.Schema):
        try:
            return pj.read_json(
                pa.BufferReader(pa.py_buffer(data)),
                read_options=pj.ReadOptions(use_threads=False, block_size=max(1 << 16, len(data) + 1)),
                parse_options=pj.ParseOptions(explicit_schema=schema, newlines_in_values=False,
                                              unexpected_field_behavior="ignore"))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeError):
            return None

    # ----------------------------------------------------------------- columns and the raw mask

    def _columns(self, table, rows: np.ndarray, file_no: int, wrapped_table=None,
                 wrapped_rows=None) -> tuple[list[pa.Array], np.ndarray]:
        n = len(rows)
        parsed = rows >= 0
        if table is None or not parsed.any():
            arrays = [pa.array(np.zeros(n, dtype=bool))] + [pa.nulls(n, f.type) for f in self.fields[1:]]
            return arrays, np.ones(n, dtype=bool)
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

        def env(name: str) -> pa.Array:
            return pc.if_else(pick, payload[name], top[name]) if wrapped.any() else top[name]

        source = _children(env("source"))
        ok = parsed & (has_schema == has_payload)
        op, before, after = env("op"), env("before"), env("after")
        ts = pc.coalesce(env("ts_ms"), source["ts_ms"])
        arrays = [pa.array(ok), op, before, after, source["lsn"], source["file"], source["pos"], source["row"], ts]
        good = ok & self._images_ok(op, before, after) & _position_ok(
            source["lsn"], source["file"], source["pos"], source["row"], ts, file_no)
        return arrays, ~good

    def _images_ok(self, op: pa.Array, before: pa.Array, after: pa.Array) -> np.ndarray:
        def is_op(*values: str) -> np.ndarray:
            return _valid(pc.if_else(pc.is_in(op, pa.array(values)), True, None))

        after_ok, before_ok = self._key_present(after), self._key_present(before)
        return (is_op("c", "r") & after_ok) | (is_op("u") & after_ok & before_ok) | (is_op("d") & before_ok)

    def _key_present(self, image: pa.Array) -> np.ndarray:
        ok = _valid(image)
        children = _children(image)
        for k in self.primary_key:
            ok &= _valid(children[k])
        return ok


def _position_ok(lsn, file, pos, row, ts, file_no: int) -> np.ndarray:
    """Lines whose ``_seq`` position surely encodes (a sufficient condition for
    ``debezium.position`` finding no error; anything else sends the line's text)."""
    has_lsn = _valid(lsn)
    lsn_v = _ints(lsn)
    binlog_digits = pc.extract_regex(file.fill_null(""), r"(?P<d>\d+)$")
    has_digits = _valid(binlog_digits)
    has_binlog = ~has_lsn & has_digits & _valid(pos)
    digits = pc.utf8_ltrim(pc.struct_field(binlog_digits, "d").fill_null("0"), "0")
    short = (pc.utf8_length(digits).to_numpy(zero_copy_only=False) <= 9)
    file_v = _ints(pc.if_else(pa.array(short), pc.if_else(pc.equal(digits, ""), "0", digits), "0").cast(pa.int64()))
    pos_v, row_v = _ints(pos), _ints(row)
    binlog_ok = (short & (file_v < _BINLOG_FILE_LIMIT) & (pos_v >= 0) & (pos_v < _BINLOG_OFFSET_LIMIT)
                 & (row_v >= 0) & (row_v < _BINLOG_OFFSET_LIMIT) & (pos_v + row_v < _BINLOG_OFFSET_LIMIT))
    has_ts = _valid(ts)
    ts_v = _ints(ts)
    return np.where(has_lsn, (lsn_v >= 0) & (lsn_v < _LSN_LIMIT),
                    np.where(has_binlog, binlog_ok,
                             np.where(has_ts, (ts_v >= 0) & (ts_v < _TS_LIMIT),
                                      0 <= file_no < _FILE_NO_LIMIT)))


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
