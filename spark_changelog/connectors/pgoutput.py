"""Decoding PostgreSQL's ``pgoutput`` logical replication messages (protocol
version 1, text tuples) into changelog rows (docs/sources.md, "PostgreSQL
CDC"), without a Spark import: the stream reader's task runs this in a Python
worker.

The message formats are PostgreSQL's "Logical Replication Message Formats"
(Begin ``B``, Commit ``C``, Relation ``R``, Insert ``I``, Update ``U``, Delete
``D``, Truncate ``T``, Type ``Y``, Origin ``O``, Message ``M``).  One change
becomes:

- Insert: ``+I`` new row;
- Update with the old row (``REPLICA IDENTITY FULL``): ``-U`` old, ``+U`` new;
  or ``-D`` old, ``+I`` new when the key changed;
- Update with only the old key (default identity, key changed): ``-D`` of the
  old key (other columns null), ``+I`` new;
- Update without old data (default identity, same key): ``+U`` new (upsert mode);
- Delete: ``-D`` of the old row, or of the key alone (default identity).

``_seq = ((commit end LSN << TX_POSITION_BITS) | position in transaction) * 2 +
phase``: transactions sort by their commit, changes inside one by their
order, and a change's retraction before its addition (``connectors/seq_layout.py``).
"""
from __future__ import annotations

import struct
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc

from .seq_layout import PG_COMMIT_LSN_BITS, PG_TX_POSITION_BITS, PHASE_AFTER, PHASE_BEFORE

KIND_INSERT, KIND_UPDATE_BEFORE, KIND_UPDATE_AFTER, KIND_DELETE = 0, 1, 2, 3

_I16 = struct.Struct("!h")
_I32 = struct.Struct("!i")
_U32 = struct.Struct("!I")
_U64 = struct.Struct("!Q")


class PgoutputError(RuntimeError):
    """A change the source cannot turn into rows (names table, column, LSN)."""


def lsn_text(lsn: int) -> str:
    """``0/16B3748`` as PostgreSQL prints it."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def change_seq(commit_lsn: int, position: int, phase: int) -> int:
    """The ``_seq`` of a change (module docstring)."""
    if commit_lsn >= 1 << PG_COMMIT_LSN_BITS:
        raise PgoutputError(f"commit LSN {lsn_text(commit_lsn)} does not fit the sequence encoding "
                            f"({PG_COMMIT_LSN_BITS} bits); see docs/sources.md")
    if position >= 1 << PG_TX_POSITION_BITS:
        raise PgoutputError(f"transaction committed at {lsn_text(commit_lsn)} has more than "
                            f"{1 << PG_TX_POSITION_BITS} changes to one table, more than the "
                            "sequence encoding orders; see docs/sources.md")
    return (((commit_lsn << PG_TX_POSITION_BITS) | position) << 1) | phase


def snapshot_seq(consistent_lsn: int) -> int:
    """All snapshot rows share one ``_seq``: the slot's consistent point, before
    every change the slot streams (those commit after it)."""
    return change_seq(consistent_lsn, 0, PHASE_AFTER)


class ChangeDecoder:
    """Collects one table's changes from a sequence of pgoutput messages.

    ``columns``: the table's columns (name, type name) as the source was
    declared with; a Relation message that differs (a column added, dropped,
    renamed or retyped while streaming) is an error naming the table and the
    change.  ``after_lsn``: transactions whose commit ends at or before it
    were applied by an earlier micro-batch and are skipped (the slot may not
    have been advanced yet).  ``key``: the primary key columns.
    """

    def __init__(self, table: str, columns: list[tuple[str, str]], key: list[str],
                 after_lsn: int = 0):
        self.table = table
        self.names = [c for c, _ in columns]
        self.types = [t for _, t in columns]
        self.key_idx = [self.names.index(k) for k in key]
        self.after_lsn = after_lsn
        self.relid: Optional[int] = None
        self.rows: list[list] = []          # one list of column values per changelog row
        self.kinds: list[int] = []
        self.seqs: list[int] = []
        self._tx_start = 0          # row index where the open transaction's rows start
        self._tx_changes = 0
        self._tx_positions: list[tuple[int, int]] = []   # (position, phase) per row of the open tx
        self.last_commit_lsn = after_lsn
        self.transactions = 0

    # -- rows ------------------------------------------------------------------
    def _add(self, row: list, kind: int, phase: int) -> None:
        self.rows.append(row)
        self.kinds.append(kind)
        self._tx_positions.append((self._tx_changes, phase))

    def _tuple(self, buf: bytes, pos: int, old: Optional[list] = None) -> tuple[list, int]:
        (n,) = _I16.unpack_from(buf, pos)
        pos += 2
        if n != len(self.names):
            raise PgoutputError(f"table {self.table}: a change carries {n} columns, the source "
                                f"was declared with {len(self.names)}")
        row = [None] * n
        unpack = _I32.unpack_from
        for i in range(n):
            tag = buf[pos]
            if tag == 0x74:                    # 't': text value
                (ln,) = unpack(buf, pos + 1)
                pos += 5
                row[i] = buf[pos:pos + ln].decode("utf-8")
                pos += ln
            elif tag == 0x6E:                  # 'n': null
                pos += 1
            elif tag == 0x75:                  # 'u': unchanged TOASTed value, not sent
                if old is None:
                    raise PgoutputError(
                        f"table {self.table}: an update left the large (TOASTed) value of column "
                        f"{self.names[i]!r} unchanged, and pgoutput does not send it with the "
                        f"default replica identity; run ALTER TABLE {self.table} REPLICA IDENTITY "
                        "FULL so updates carry the whole old row")
                row[i] = old[i]
                pos += 1
            else:
                raise PgoutputError(f"table {self.table}: unknown tuple data tag {tag!r}")
        return row, pos

    def _key_only(self, row: list) -> list:
        keep = set(self.key_idx)
        return [v if i in keep else None for i, v in enumerate(row)]

    # -- messages ----------------------------------------------------------------
    def feed(self, msg: bytes) -> None:
        tag = msg[0]
        if tag == 0x42:          # B: begin
            self._tx_start = len(self.kinds)
            self._tx_changes = 0
            self._tx_positions = []
        elif tag == 0x43:        # C: commit (flags, commit lsn, end lsn, ts)
            (end_lsn,) = _U64.unpack_from(msg, 10)
            self._commit(end_lsn)
        elif tag == 0x52:        # R: relation
            self._relation(msg)
        elif tag == 0x49:        # I: insert
            self._check_rel(msg)
            row, _ = self._tuple(msg, 6)
            self._add(row, KIND_INSERT, PHASE_AFTER)
            self._tx_changes += 1
        elif tag == 0x55:        # U: update
            self._check_rel(msg)
            pos = 5
            sub = msg[pos]
            old = None
            old_is_key = False
            if sub in (0x4B, 0x4F):            # K: old key, O: old row
                old, pos = self._tuple(msg, pos + 1)
                old_is_key = sub == 0x4B
                sub = msg[pos]
            if sub != 0x4E:
                raise PgoutputError(f"table {self.table}: malformed update message")
            new, _ = self._tuple(msg, pos + 1, old=None if old_is_key else old)
            if old is None:
                self._add(new, KIND_UPDATE_AFTER, PHASE_AFTER)
            elif old_is_key or [old[i] for i in self.key_idx] != [new[i] for i in self.key_idx]:
                self._add(self._key_only(old) if old_is_key else old, KIND_DELETE, PHASE_BEFORE)
                self._add(new, KIND_INSERT, PHASE_AFTER)
            else:
                self._add(old, KIND_UPDATE_BEFORE, PHASE_BEFORE)
                self._add(new, KIND_UPDATE_AFTER, PHASE_AFTER)
            self._tx_changes += 1
        elif tag == 0x44:        # D: delete
            self._check_rel(msg)
            sub = msg[5]
            old, _ = self._tuple(msg, 6)
            self._add(self._key_only(old) if sub == 0x4B else old, KIND_DELETE, PHASE_BEFORE)
            self._tx_changes += 1
        elif tag == 0x54:        # T: truncate
            raise PgoutputError(f"table {self.table}: TRUNCATE is not supported by the CDC source "
                                "(it carries no rows to retract); delete the rows instead, or "
                                "start a new query with a snapshot")
        # Y (type), O (origin), M (logical message): nothing to emit

    def _check_rel(self, msg: bytes) -> None:
        (relid,) = _U32.unpack_from(msg, 1)
        if relid != self.relid:
            raise PgoutputError(f"table {self.table}: a change for relation {relid} arrived "
                                "before its Relation message, or for another table")

    def _relation(self, msg: bytes) -> None:
        (relid,) = _U32.unpack_from(msg, 1)
        pos = 5
        end = msg.index(b"\0", pos)
        nspname = msg[pos:end].decode()
        pos = end + 1
        end = msg.index(b"\0", pos)
        relname = msg[pos:end].decode()
        pos = end + 2                          # replica identity byte
        (n,) = _I16.unpack_from(msg, pos)
        pos += 2
        names = []
        for _ in range(n):
            pos += 1                           # flags
            end = msg.index(b"\0", pos)
            names.append(msg[pos:end].decode())
            pos = end + 1 + 8                  # type oid, type modifier
        if names != self.names:
            added = [c for c in names if c not in self.names]
            dropped = [c for c in self.names if c not in names]
            change = "; ".join(filter(None, [f"added {added}" if added else "",
                                             f"dropped {dropped}" if dropped else ""])) or \
                f"columns now {names}"
            raise PgoutputError(
                f"table {self.table} ({nspname}.{relname}) changed its columns while streaming "
                f"({change}); the source's schema is fixed when the query starts: stop the "
                "query and start a new one (new checkpoint and slot) to read the new schema")
        self.relid = relid

    def _commit(self, end_lsn: int) -> None:
        if end_lsn <= self.after_lsn:         # applied by an earlier micro-batch
            del self.kinds[self._tx_start:]
            del self.rows[self._tx_start:]
        else:
            self.seqs.extend(change_seq(end_lsn, p, ph) for p, ph in self._tx_positions)
            self.last_commit_lsn = end_lsn
            self.transactions += 1
        self._tx_positions = []
        self._tx_start = len(self.kinds)

    # -- output ------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.seqs)

    def take(self, schema: pa.Schema) -> pa.RecordBatch:
        """The committed rows collected so far as one Arrow batch (``schema``:
        the data columns' types, then ``_kind`` and ``_seq``); the decoder
        keeps only the open transaction's rows."""
        n = len(self.seqs)
        columns = list(zip(*self.rows[:n])) if n else [()] * len(self.names)
        arrays = [text_to_arrow(list(col), field.type, self.table, field.name)
                  for col, field in zip(columns, schema)]
        arrays.append(pa.array(self.kinds[:n], pa.int8()))
        arrays.append(pa.array(self.seqs, pa.int64()))
        del self.rows[:n]
        del self.kinds[:n]
        self.seqs = []
        self._tx_start = len(self.kinds)
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def text_to_arrow(values: list, typ: pa.DataType, table: str, column: str) -> pa.Array:
    """PostgreSQL text output (session: UTC, ISO dates, hex bytea) -> Arrow, one
    vectorized cast per column; a value that does not convert is an error
    naming table and column."""
    strings = pa.array(values, pa.string())
    try:
        if pa.types.is_string(typ):
            return strings
        if pa.types.is_boolean(typ):
            return pc.equal(strings, "t")
        if pa.types.is_binary(typ):
            return pa.array([None if v is None else bytes.fromhex(v[2:]) for v in values], pa.binary())
        return strings.cast(typ)
    except (pa.ArrowInvalid, ValueError) as err:
        raise PgoutputError(f"table {table}, column {column!r}: a value does not convert to "
                            f"{typ} ({err})") from err
