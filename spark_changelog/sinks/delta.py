"""Upsert table sink on Delta Lake, written with ``deltalake`` (delta-rs).

One micro-batch becomes exactly one Delta commit (docs/sinks.md):

1. the batch (Arrow, :meth:`DeltaUpsertSink.write_arrow_batch`; a pandas
   batch is converted once) is checked and reduced to the net change of each
   primary key (``kernels.last_change_per_key``: the last change by ``_seq``,
   retractions before additions at equal ``_seq``), vectorized, no pandas;
2. it is applied on the primary key: matched + net retraction (``-U``/``-D``)
   -> delete, matched + net ADD (``+I``/``+U``) -> update all columns, not
   matched + ADD -> insert.  A retraction of a key that is not in the table
   does nothing (it is counted as ``missing_deletes``).  On a table with
   deletion vectors (the default for new tables) the old rows' positions go
   into deletion vectors and the new rows into new files
   (:class:`StagedUpsert`, written by the executors; docs/sinks.md,
   "Updates and deletes: deletion vectors"); on a table without, one delta-rs
   ``MERGE``.  Where an append of the net additions is provably the same (the
   table has no data file; or the stream emits each key once and this query
   is the table's only writer, ``keys_emitted_once``), the additions are
   appended instead, committed only on top of the version the decision read
   (docs/sinks.md, "Appends instead of MERGE");
3. the commit carries a Delta *application transaction* (``txn`` action)
   ``appId = query_id, version = batch_id``.  Before writing, the sink reads the
   table's last version for ``query_id`` and skips a batch whose id is ``<=``
   it (``skipped_replay``), so a batch replayed after a crash is applied once.

Data and progress are in the same commit: a reader (or a crash) sees either
the whole batch and its batch id, or neither.

Decisions
---------
* **Batches that change nothing still commit their batch id**
  (``commit_empty_batches=True``, the default): an empty batch, or one whose
  net changes are all deletes of absent keys (delta-rs skips the commit of such
  a no-op ``MERGE``), is recorded by a commit holding only the ``txn`` action
  (about 300 bytes of log, no data file).  Progress in the table then always
  equals the last batch the query handed over, which is what a demanding
  exactly-once consumer checks (a restarted query whose checkpoint is behind
  the table is visible at once).  Pass ``commit_empty_batches=False`` for
  queries with frequent empty triggers: nothing is committed for them, which
  is still correct for a single writer, because replaying a batch that changed
  nothing changes nothing.
* **Primary key**: recorded as the table property ``spark_changelog.primary_key``
  (a JSON list) and in the table description; the key columns are declared
  ``NOT NULL`` in the Delta schema (Delta enforces it, a second safety net).
* **Null keys** raise :class:`ValueError` naming the column and the row.  The
  caller is expected to send such rows to the dead-letter output first.
* **Typing**: the batch is cast to the sink's Arrow schema (a pandas batch
  with ``pa.Table.from_pandas(..., schema=...)``), so a ``bigint`` column that
  pandas turned into ``float64`` because of nulls is written back as ``int64``
  (a non-integral float or an overflow is an error, never silently changed).
* **Performance** (tables without deletion vectors): ``MERGE`` runs with ``streamed_exec=False``: the batch is
  already in memory, and this lets delta-rs derive a pruning predicate from the
  batch's key range, so files whose key range the batch does not touch are
  neither read nor rewritten (measured: 100k new keys into a 5M-row table of
  20 files 0.15 s instead of 0.9 s with ``streamed_exec=True``).  Delta is
  copy-on-write (delta-rs writes no deletion vectors): a batch touching keys
  spread over the whole table rewrites the whole table, so the cost of such a
  batch grows with the table (1M upserts into 1M rows ~1.3-2 s; 100k random
  upserts into 5M rows ~3 s, 2 idle cores).  To keep key-local batches (recent
  rows, new keys) cheap, tables are created with ``delta.targetFileSize`` =
  32 MiB (override through ``configuration``) instead of delta-rs' 100 MB, so
  a 5M-row table is several key-clustered files rather than one, and
  :meth:`DeltaUpsertSink.optimize` re-clusters by key when merges have mixed
  the files.
* **One writer per query id**: the skip check and the commit are not one
  atomic step; like Spark's own Delta sink, it relies on a query running once
  at a time (Spark guarantees it per checkpoint).
"""
from __future__ import annotations

import collections
import contextlib
import json
import os
import time
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from ..model import KIND_COL, METADATA_COLUMNS, SEQ_COL, as_key
from ..model.rowkind import IS_ADD
from ..operators.kernels import arrow_key_arrays, last_change_per_key
from .base import UpsertSink, check_kinds
from .delta_log import (CommitTaken, LiveFiles, TableStore, commit_next_version, local_table_dir,
                        read_deletion_vector, write_deletion_vectors)

PRIMARY_KEY_PROPERTY = "spark_changelog.primary_key"
#: ``delta.targetFileSize`` given to tables the sink creates, unless configured.
DEFAULT_TARGET_FILE_SIZE = 32 * 1024 * 1024
_ADD_COL = "__spark_changelog_is_add"
#: commit-info key naming the query of a commit (its ``txn`` appId names it too)
_QUERY_ID_META = "spark_changelog.query_id"
#: appends tried before a MERGE when other commits keep taking the next version
_APPEND_ATTEMPTS = 3
#: the automatic compaction starts when this many files are small or mostly
#: deleted (Delta's ``autoCompact.minNumFiles`` default; docs/sinks.md,
#: "Compaction: automatic")
DEFAULT_COMPACT_MIN_FILES = 50

__all__ = ["DeltaPath", "DeltaUpsertSink", "DeltaSinkSchemaError", "StagedAppend", "StagedUpsert", "live_rows",
           "KEY_INDEX_DIR", "PRIMARY_KEY_PROPERTY", "TABLE_OPTIONS", "compact_table", "sink_options",
           "read_table", "table_key"]


class DeltaSinkSchemaError(ValueError):
    """The existing table does not match the sink's schema, key or partitioning."""


#: the sink's options as SQL ``WITH`` options of a ``delta`` table, named as
#: Delta's own table properties and settings (docs/sql.md) -> the argument of
#: :class:`DeltaUpsertSink`
TABLE_OPTIONS = {"delta.enableDeletionVectors": "deletion_vectors",
                 "delta.autoOptimize.autoCompact": "auto_compact",
                 "delta.autoCompact.minNumFiles": "compact_min_files"}


def sink_options(options: Mapping[str, str]) -> dict:
    """The :data:`TABLE_OPTIONS` among ``options`` (text, as ``WITH`` gives
    them) -> :class:`DeltaUpsertSink` arguments; a bad value is a
    ``ValueError`` naming the option."""
    out: dict = {}
    for name, arg in TABLE_OPTIONS.items():
        value = options.get(name)
        if value is None:
            continue
        text = str(value).strip().lower()
        if arg == "compact_min_files":
            if not text.isdigit() or int(text) < 2:
                raise ValueError(f"{name!r} must be a whole number of files, 2 or more, got {value!r}")
            out[arg] = int(text)
        elif text in ("true", "false"):
            out[arg] = text == "true"
        else:
            raise ValueError(f"{name!r} must be 'true' or 'false', got {value!r}")
    return out


class DeltaPath(os.PathLike):
    """A Delta table's path with options for the sink the pipeline builds for
    it (``write_upsert(DeltaPath("out/t", deletion_vectors=False))``; SQL's
    ``WITH`` options, :func:`sink_options`): the keyword arguments of
    :class:`DeltaUpsertSink`."""

    def __init__(self, path: "str | os.PathLike", **options: Any):
        self.path, self.options = os.fspath(path), options

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"DeltaPath({self.path!r}, {self.options!r})"


def _deltalake():
    import deltalake  # imported lazily: only this sink needs it

    return deltalake


def _quote(col: str) -> str:
    return "`" + col.replace("`", "``") + "`"


def _field_json(schema) -> dict[str, dict]:
    """name -> {"type", "nullable"} of a deltalake Schema (types as Delta JSON)."""
    return {f["name"]: {"type": f["type"], "nullable": f["nullable"]}
            for f in json.loads(schema.to_json())["fields"]}


def _type_text(t: Any) -> str:
    return t if isinstance(t, str) else json.dumps(t, sort_keys=True)


def _open(path: str, storage_options: Optional[dict]):
    dl = _deltalake()
    return dl.DeltaTable(path, storage_options=storage_options)


def _recorded_key(dt) -> tuple[str, ...]:
    raw = dt.metadata().configuration.get(PRIMARY_KEY_PROPERTY)
    return tuple(json.loads(raw)) if raw else ()


def table_key(path: "str | os.PathLike", storage_options: Optional[dict] = None) -> tuple[str, ...]:
    """The primary key recorded in the table at ``path`` (``()`` when the table
    was not created by this sink and has no key recorded)."""
    return _recorded_key(_open(os.fspath(path), storage_options))


def _nullable_types(t: pa.DataType):
    """Arrow -> pandas dtype for ``to_pandas``: integers and booleans become the
    nullable extension dtypes so that a null never turns a bigint into a float."""
    if pa.types.is_integer(t):
        return pd.api.types.pandas_dtype(
            {8: "Int8", 16: "Int16", 32: "Int32", 64: "Int64"}[t.bit_width]
            if pa.types.is_signed_integer(t) else
            {8: "UInt8", 16: "UInt16", 32: "UInt32", 64: "UInt64"}[t.bit_width])
    if pa.types.is_boolean(t):
        return pd.BooleanDtype()
    return None


def read_table(path: "str | os.PathLike", storage_options: Optional[dict] = None) -> pd.DataFrame:
    """The current rows of the Delta table at ``path``, sorted by its primary key.

    Integer and boolean columns use pandas' nullable dtypes (``Int64``,
    ``boolean``), whether or not they hold nulls, so types are exact and stable.
    """
    return read_arrow_table(path, storage_options).to_pandas(
        types_mapper=_nullable_types).reset_index(drop=True)


def read_arrow_table(path: "str | os.PathLike", storage_options: Optional[dict] = None) -> pa.Table:
    """:func:`read_table` as Arrow (exact values of every type, nested ones too)."""
    dt = _open(os.fspath(path), storage_options)
    key = _recorded_key(dt)
    if "deletionVectors" in (dt.protocol().reader_features or []):
        # delta-rs 1.6.6's ``to_pyarrow_table`` refuses deletion vectors; its
        # DataFusion scan applies them (its text columns come as string views)
        dl = _deltalake()
        tbl = pa.table(dl.QueryBuilder().register("t", dt).execute("SELECT * FROM t")).cast(
            pa.schema(dt.schema().to_arrow()))
    else:
        tbl = dt.to_pyarrow_table()
    if key:
        tbl = tbl.sort_by([(k, "ascending") for k in key])
    return tbl


def compact_table(path: "str | os.PathLike", *, vacuum_hours: Optional[int] = None,
                  storage_options: Optional[dict] = None) -> dict:
    """Compact an upsert table and cluster it by its primary key (``z_order``
    on the recorded key; docs/sinks.md, "Compaction and vacuum"): one commit
    that rewrites files with the same rows (no batch id; a running query's
    appends still see itself as the only writer).  With ``vacuum_hours``, then
    delete the data files no version newer than that many hours references
    (a reader of an older version, or time travel to it, fails after).
    -> ``{"files_removed", "files_added", "vacuumed"}``."""
    dt = _open(os.fspath(path), storage_options)
    key = _recorded_key(dt)
    if not key:
        raise DeltaSinkSchemaError(f"Delta table at {os.fspath(path)!r} has no primary key recorded "
                                   f"(table property {PRIMARY_KEY_PROPERTY!r}): not an upsert table")
    metrics = dt.optimize.z_order(list(key))
    dt.update_incremental()
    _index_keys(dt, key)
    vacuumed: list = []
    if vacuum_hours is not None:
        dt.update_incremental()
        # the hours are the caller's choice: below the table's retention too
        vacuumed = dt.vacuum(retention_hours=int(vacuum_hours), dry_run=False, enforce_retention_duration=False)
        _drop_orphan_key_indexes(os.fspath(path))
    return {"files_removed": int(metrics.get("numFilesRemoved", 0)),
            "files_added": int(metrics.get("numFilesAdded", 0)), "vacuumed": len(vacuumed)}


class DeltaUpsertSink(UpsertSink):
    """Upsert sink writing the net change of each micro-batch in one Delta commit.

    ``schema`` is the Arrow schema of the data columns (no ``_kind``/``_seq``).
    The table is created on first use, with the ``deletionVectors`` feature
    unless ``deletion_vectors=False`` (then protocol 1/2 and updates are
    delta-rs MERGEs, also on an existing table that has the feature;
    docs/sinks.md, "The table other readers open"); an
    existing table keeps its protocol and must have the same
    columns and types, the same recorded primary key and (when ``partition_by``
    is given) the same partition columns, else :class:`DeltaSinkSchemaError`.
    ``adopt_existing=True`` records the key in a table that has none (for
    example one created by another tool); it is then the caller's promise that
    the key is unique.  ``auto_compact``: after a batch's commit, when
    ``compact_min_files`` files are small or mostly deleted, the sink
    rewrites them key-sorted in a commit of its own (:meth:`compact_if_due`;
    docs/sinks.md, "Compaction: automatic").
    """

    def __init__(
        self,
        path: "str | os.PathLike",
        key: "str | Sequence[str]",
        schema: pa.Schema,
        partition_by: "str | Sequence[str] | None" = None,
        *,
        commit_empty_batches: bool = True,
        storage_options: Optional[dict] = None,
        configuration: Optional[Mapping[str, Optional[str]]] = None,
        writer_properties: Any = None,
        streamed_exec: bool = False,
        adopt_existing: bool = False,
        keys_emitted_once: bool = False,
        deletion_vectors: bool = True,
        auto_compact: bool = True,
        compact_min_files: int = DEFAULT_COMPACT_MIN_FILES,
    ) -> None:
        self.path = os.fspath(path)
        self.key = as_key(key)
        self.schema = pa.schema(schema)
        self.partition_by = as_key(partition_by) if partition_by is not None else None
        self.commit_empty_batches = commit_empty_batches
        self.storage_options = storage_options
        self.configuration = dict(configuration or {})
        self.writer_properties = writer_properties
        self.streamed_exec = streamed_exec
        self.adopt_existing = adopt_existing
        self.keys_emitted_once = keys_emitted_once
        self.deletion_vectors = deletion_vectors
        self.auto_compact = auto_compact
        if isinstance(compact_min_files, bool) or not isinstance(compact_min_files, (int, np.integer)) \
                or compact_min_files < 2:
            raise ValueError(f"compact_min_files must be a whole number >= 2, got {compact_min_files!r}")
        self.compact_min_files = int(compact_min_files)
        self._live_files: Optional[LiveFiles] = None
        #: query id -> (table version checked up to, only that query wrote rows)
        self._writers: dict[str, tuple[int, bool]] = {}
        self._store: Optional[TableStore] = None
        self.columns = tuple(self.schema.names)
        self._check_definition()
        self._dt = None
        #: (version, directory existed before) of a table this sink created and
        #: no batch has committed to yet: a failing first batch removes it again
        self._created: Optional[tuple[int, bool]] = None

    def __getstate__(self) -> dict:
        # picklable (a Spark Connect server runs the batch handler): the open
        # table and the log's file system are reopened there
        return {**self.__dict__, "_dt": None, "_store": None, "_live_files": None}

    # ------------------------------------------------------------------ setup
    def _check_definition(self) -> None:
        if not self.key:
            raise ValueError("DeltaUpsertSink needs a primary key (at least one column)")
        if len(set(self.columns)) != len(self.columns):
            raise ValueError(f"duplicate column names in sink schema: {list(self.columns)}")
        missing = [k for k in self.key if k not in self.columns]
        if missing:
            raise ValueError(f"primary key column(s) {missing} not among sink columns {list(self.columns)}")
        reserved = [c for c in self.columns if c in METADATA_COLUMNS or c == _ADD_COL]
        if reserved:
            raise ValueError(f"sink schema must hold data columns only; {reserved} are reserved "
                             f"for changelog metadata")
        if self.partition_by:
            missing = [c for c in self.partition_by if c not in self.columns]
            if missing:
                raise ValueError(f"partition column(s) {missing} not among sink columns {list(self.columns)}")

    @property
    def store(self) -> TableStore:
        """The table's files (log, deletion vectors, data files) as one file
        system, local or an object store (:class:`delta_log.TableStore`)."""
        if self._store is None:
            self._store = TableStore(self.path, self.storage_options)
        return self._store

    def _delta_schema(self):
        dl = _deltalake()
        fields = [f.with_nullable(False) if f.name in self.key else f for f in self.schema]
        return dl.Schema.from_arrow(pa.schema(fields))

    def _table(self):
        """The (refreshed) table, created on first use and validated once."""
        if self._dt is not None:
            self._dt.update_incremental()
            return self._dt
        dl = _deltalake()
        created = None
        if not dl.DeltaTable.is_deltatable(self.path, self.storage_options):
            existed = local_table_dir(self.path) is not None and os.path.exists(local_table_dir(self.path))
            config = {"delta.targetFileSize": str(DEFAULT_TARGET_FILE_SIZE), **self.configuration,
                      PRIMARY_KEY_PROPERTY: json.dumps(list(self.key))}
            try:
                dl.DeltaTable.create(
                    self.path, self._delta_schema(), mode="error",
                    partition_by=list(self.partition_by or []) or None,
                    description=f"spark_changelog upsert table, primary key ({', '.join(self.key)})",
                    configuration=config, storage_options=self.storage_options,
                    raise_if_key_not_exists=False)
                if self.deletion_vectors and self.store.can_commit:
                    # only the feature: delta-rs 1.6.6 would add ``variantType``
                    # with the property ``delta.enableDeletionVectors``
                    dl.DeltaTable(self.path, storage_options=self.storage_options).alter.add_feature(
                        dl.TableFeatures.DeletionVectors, allow_protocol_versions_increase=True)
                created = existed
            except Exception:
                # another writer may have created it in the meantime: validate that one
                if not dl.DeltaTable.is_deltatable(self.path, self.storage_options):
                    raise
        dt = dl.DeltaTable(self.path, storage_options=self.storage_options)
        self._validate_existing(dt)
        self._dt = dt
        if created is not None:
            self._created = (dt.version(), created)
        return dt

    def remove_if_created_empty(self) -> None:
        """A failed batch that found no table leaves none: the table this sink
        created for it (no version after the creation) is removed again, so a
        failing first run writes nothing (docs/sinks.md, "One commit per
        micro-batch, exactly once").  Local tables only."""
        import shutil
        table_dir = local_table_dir(self.path)
        if self._created is None or table_dir is None:
            return
        version, existed = self._created
        self._created, self._dt, self._live_files = None, None, None
        dl = _deltalake()
        if dl.DeltaTable(self.path, storage_options=self.storage_options).version() != version:
            return          # another writer committed meanwhile: the table stays
        if existed:
            shutil.rmtree(os.path.join(table_dir, "_delta_log"), ignore_errors=True)
        else:
            shutil.rmtree(table_dir, ignore_errors=True)

    def _validate_existing(self, dt) -> None:
        where = f"Delta table at {self.path!r}"
        conf = dt.metadata().configuration
        raw = conf.get(PRIMARY_KEY_PROPERTY)
        if raw is None:
            if not self.adopt_existing:
                raise DeltaSinkSchemaError(
                    f"{where} has no primary key recorded (table property {PRIMARY_KEY_PROPERTY!r}); "
                    f"it was not created by DeltaUpsertSink. Pass adopt_existing=True to record "
                    f"key {list(self.key)} in it.")
            dt.alter.set_table_properties({PRIMARY_KEY_PROPERTY: json.dumps(list(self.key))},
                                          raise_if_not_exists=False)
            dt.update_incremental()
        elif tuple(json.loads(raw)) != self.key:
            raise DeltaSinkSchemaError(
                f"{where} has primary key {json.loads(raw)}, but the sink declares {list(self.key)}")

        have, want = _field_json(dt.schema()), _field_json(self._delta_schema())
        problems = []
        for name in want:
            if name not in have:
                problems.append(f"column {name!r} ({_type_text(want[name]['type'])}) is missing from the table")
            elif have[name]["type"] != want[name]["type"]:
                problems.append(f"column {name!r} is {_type_text(have[name]['type'])} in the table, "
                                f"{_type_text(want[name]['type'])} in the sink schema")
            elif name not in self.key and have[name]["nullable"] != want[name]["nullable"]:
                problems.append(f"column {name!r} is {'' if have[name]['nullable'] else 'NOT '}NULL "
                                f"in the table, {'' if want[name]['nullable'] else 'NOT '}NULL in the "
                                f"sink schema")
        problems += [f"table column {name!r} ({_type_text(have[name]['type'])}) is not in the sink schema"
                     for name in have if name not in want]
        if problems:
            raise DeltaSinkSchemaError(f"{where} does not match the sink schema: " + "; ".join(problems))
        parts = tuple(dt.metadata().partition_columns)
        if self.partition_by is not None and parts != tuple(self.partition_by):
            raise DeltaSinkSchemaError(
                f"{where} is partitioned by {list(parts)}, but the sink declares {list(self.partition_by)}")

    def optimize(self, *, target_size: Optional[int] = None) -> dict:
        """Compact the table and cluster it by the primary key (delta-rs
        ``optimize.z_order`` on the key columns; for one column that is a sort).

        Merges rewrite whole files and mix key ranges over time; after this,
        batches touching a narrow key range rewrite only the few files covering
        it again.  Data is unchanged and no batch id is recorded.  Run it between
        batches (it is a separate commit that a concurrent MERGE may conflict with).
        """
        dt = self._table()
        metrics = dt.optimize.z_order(list(self.key), target_size=target_size)
        dt.update_incremental()
        _index_keys(dt, self.key)
        return metrics

    # --------------------------------------------------------------- progress
    def last_batch_id(self, query_id: str) -> int:
        version = self._table().transaction_version(query_id)
        return -1 if version is None else int(version)

    def _commit_properties(self, query_id: str, batch_id: int, **kwargs):
        dl = _deltalake()
        return dl.CommitProperties(
            app_transactions=[dl.Transaction(app_id=query_id, version=batch_id)],
            custom_metadata={_QUERY_ID_META: query_id, "spark_changelog.batch_id": batch_id},
            **kwargs)

    def _commit_progress_only(self, dt, query_id: str, batch_id: int, props=None) -> None:
        """A commit with no data, holding only the ``txn`` action (``props``:
        other commit properties, default the batch's)."""
        dt.create_write_transaction(
            [], mode="append", schema=dt.schema(),
            partition_by=list(dt.metadata().partition_columns) or None,
            commit_properties=props or self._commit_properties(query_id, batch_id))
        dt.update_incremental()

    # ------------------------------------------------------------------ write
    def write_batch(self, changes: pd.DataFrame, *, query_id: str, batch_id: int) -> dict:
        """A batch as pandas (data columns + ``_kind``/``_seq``, any order):
        checked as pandas (errors name the frame's index label), converted to
        the sink's Arrow schema once, then :meth:`write_arrow_batch`'s path."""
        batch_id = _checked_ids(query_id, batch_id)
        dt = self._table()
        if _replayed(dt, query_id, batch_id):
            return self._skipped(dt, batch_id)
        if len(changes) == 0:
            return self._write(dt, self.schema.empty_table(), query_id, batch_id)
        self._check_batch(changes, query_id, batch_id)
        table = self._to_arrow(changes[list(self.columns)], query_id, batch_id)
        table = table.append_column(KIND_COL, pa.array(changes[KIND_COL].to_numpy(dtype=np.int8)))
        table = table.append_column(SEQ_COL, pa.array(changes[SEQ_COL].to_numpy(dtype=np.int64)))
        return self._after_batch(self._write(dt, table, query_id, batch_id))

    def write_arrow_batch(self, changes: pa.Table, *, query_id: str, batch_id: int) -> dict:
        """A batch as Arrow (the micro-batch's ``toArrow()`` with the side rows
        split off): checked, reduced to the net change per key and committed
        without a pandas round trip.  Errors name the row by its position."""
        batch_id = _checked_ids(query_id, batch_id)
        dt = self._table()
        if _replayed(dt, query_id, batch_id):
            return self._skipped(dt, batch_id)
        if changes.num_rows:
            self._check_arrow_batch(changes, query_id, batch_id)
        return self._after_batch(self._write(dt, changes, query_id, batch_id))

    def _skipped(self, dt, batch_id: int) -> dict:
        return {**_empty_result(batch_id), "skipped_replay": True, "table_version": dt.version()}

    def _write(self, dt, changes: pa.Table, query_id: str, batch_id: int) -> dict:
        """Net change per key, then one commit (append or MERGE) with the batch id."""
        result = _empty_result(batch_id)
        if changes.num_rows == 0:
            if self.commit_empty_batches:
                self._commit_progress_only(dt, query_id, batch_id)
                result["committed"] = True
            result["table_version"] = dt.version()
            return result
        net, net_add = _net_changes(self, changes, query_id, batch_id)
        n_retract = int((~net_add).sum())
        for _ in range(_APPEND_ATTEMPTS):
            result["write"] = self._append_reason(dt, query_id)
            if result["write"] is None:
                break
            adds = net.filter(pa.array(net_add))
            if adds.num_rows == 0 and not self.commit_empty_batches:
                # only deletes of absent keys: nothing to commit (as a MERGE)
                result.update(missing_deletes=n_retract, table_version=dt.version())
                return result
            try:
                self._append(dt, adds, query_id, batch_id)
            except _deltalake().exceptions.CommitFailedError:
                # another commit landed after the version this decision read:
                # decide again on the new version (it may now be a MERGE)
                dt.update_incremental()
                if _replayed(dt, query_id, batch_id):
                    return self._skipped(dt, batch_id)
                continue
            result.update(committed=True, inserted=adds.num_rows, upserted=adds.num_rows,
                          missing_deletes=n_retract, table_version=dt.version())
            return result
        if self._deletion_vector_layout(dt):
            stage = StagedUpsert(self, query_id, batch_id)
            return stage.commit_batch([stage.write_net(net, net_add, 0)])
        result["write"] = "merge"
        metrics = self._merge(dt, net.append_column(pa.field(_ADD_COL, pa.bool_(), nullable=False),
                                                    pa.array(net_add)), query_id, batch_id)
        # delta-rs does not commit a MERGE that changes nothing: record the batch anyway
        if dt.transaction_version(query_id) == batch_id:
            result["committed"] = True
        elif self.commit_empty_batches:
            self._commit_progress_only(dt, query_id, batch_id)
            result["committed"] = True
        result.update(
            inserted=int(metrics["num_target_rows_inserted"]),
            updated=int(metrics["num_target_rows_updated"]),
            deleted=int(metrics["num_target_rows_deleted"]),
            table_version=dt.version(),
            merge_metrics=metrics)
        result["upserted"] = result["inserted"] + result["updated"]
        result["missing_deletes"] = n_retract - result["deleted"]
        return result

    def _merge(self, dt, source: pa.Table, query_id: str, batch_id: int) -> dict:
        on = " AND ".join(f"t.{_quote(k)} = s.{_quote(k)}" for k in self.key)
        add, retract = f"s.{_quote(_ADD_COL)}", f"NOT s.{_quote(_ADD_COL)}"
        return (
            dt.merge(source, on, source_alias="s", target_alias="t",
                     streamed_exec=self.streamed_exec, writer_properties=self.writer_properties,
                     commit_properties=self._commit_properties(query_id, batch_id))
            .when_matched_delete(retract)
            .when_matched_update_all(add, except_cols=[_ADD_COL])
            .when_not_matched_insert_all(add, except_cols=[_ADD_COL])
            .execute())

    # ----------------------------------------------------------------- append
    def _append_reason(self, dt, query_id: str) -> Optional[str]:
        """Why appending the batch's net additions is the same as the MERGE
        at the table's current version ``dt.version()``, or ``None`` (MERGE).

        * ``"append: empty table"``: the table has no data file, so no key of
          the batch is in it: every net addition is an insert, every net
          retraction a missing delete;
        * ``"append: keys emitted once, only writer"``: the stream emits each
          sink key at most once over the query's life (``keys_emitted_once``,
          from the planner) and every commit of the table that changed rows
          carries this query's id, so the table holds only keys this query
          emitted before, none of which it emits again.

        The append commits only on top of exactly this version
        (:meth:`_append`), so a commit of another writer in between makes it
        fail and the decision is taken again."""
        if not dt.file_uris():
            return "append: empty table"
        if self.keys_emitted_once and self._only_writer(dt, query_id):
            return "append: keys emitted once, only writer"
        return None

    def _only_writer(self, dt, query_id: str) -> bool:
        """Every commit of the table up to ``dt.version()`` that changed rows
        (an ``add`` or ``remove`` action with ``dataChange``) carries this
        query's transaction (a ``txn`` action with ``appId = query_id``); the
        others only created the table, rewrote files with the same rows
        (``OPTIMIZE``) or changed properties.  The commits are read from the
        log by version (delta-rs' ``history()`` reads the newest commits on
        storage, not those of the version read): all of them on the first
        call, the new ones after.  Once false, it stays false for the query
        (another writer's rows stay in the table); a log whose early commits
        were cleaned up cannot prove it."""
        version = dt.version()
        checked, only = self._writers.get(query_id, (-1, True))
        for v in range(checked + 1, version + 1):
            if not only:
                break
            actions = self._commit_actions(v)
            only = actions is not None and (
                any(a.get("txn", {}).get("appId") == query_id for a in actions)
                or not any(a.get(kind, {}).get("dataChange", True)
                           for a in actions for kind in ("add", "remove") if kind in a))
        self._writers[query_id] = (max(version, checked), only)
        return only

    def _commit_actions(self, version: int) -> Optional[list]:
        """The actions of the table's commit ``version`` (``None`` if its log
        file is gone)."""
        try:
            text = self.store.read(f"_delta_log/{version:020d}.json").decode("utf-8")
        except FileNotFoundError:
            return None
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def _append(self, dt, adds: pa.Table, query_id: str, batch_id: int) -> None:
        """Append ``adds`` with the batch's transaction, committed only as the
        version right after the one read (``max_commit_retries=0``: delta-rs
        would otherwise rebase a blind append over a concurrent commit, which
        may have added the same keys); raises ``CommitFailedError`` if another
        commit took that version."""
        props = self._commit_properties(query_id, batch_id, max_commit_retries=0)
        if adds.num_rows == 0:
            self._commit_progress_only(dt, query_id, batch_id, props)
            return
        _deltalake().write_deltalake(
            dt, adds, mode="append", partition_by=list(dt.metadata().partition_columns) or None,
            writer_properties=self.writer_properties, commit_properties=props)
        dt.update_incremental()

    # ------------------------------------------------------------- compaction
    def _after_batch(self, result: dict) -> dict:
        """A batch's result, after the automatic compaction it may have made due."""
        if result.get("committed") and self.auto_compact:
            # the batch's commit left the open table at its version: no refresh
            compaction = self.compact_if_due(refresh=result.get("table_version") != self._dt.version())
            if compaction:
                result["compaction"] = compaction
        return result

    def compact_if_due(self, refresh: bool = True) -> Optional[dict]:
        """The automatic compaction (docs/sinks.md, "Compaction: automatic"),
        run by the driver after a batch's commit: when at least
        ``compact_min_files`` live files are *small* (below half the table's
        ``delta.targetFileSize``) or *mostly deleted* (a deletion vector holds
        at least half of their rows), the smallest of them, up to twice the
        target size in all, are read without their deleted rows, sorted by
        the key and written as files of about the target size, in one commit
        that changes no row (``dataChange`` false: ``remove`` of the old
        files, ``add`` of the new; readers see the table before or after it,
        the same rows either way).  The old files stay until a vacuum.
        Unpartitioned tables on a store the sink commits to (the commit is
        its own, as for deletion vectors: local file systems and S3).  Another writer's commit in between: nothing is committed,
        the next batch tries again.  -> ``{"files_removed", "files_added",
        "table_version"}``, or ``None`` when not due."""
        if not self.store.can_commit:
            return None
        dt = self._table() if refresh or self._dt is None else self._dt
        if dt.metadata().partition_columns:
            return None
        version = dt.version()
        target = int(dt.metadata().configuration.get("delta.targetFileSize") or DEFAULT_TARGET_FILE_SIZE)
        chosen = _compaction_candidates(self.live_files(version).values(), target, self.compact_min_files)
        if not chosen:
            return None
        new_files = _rewrite_sorted(self, chosen, target)
        now = int(time.time() * 1000)
        actions = [{"commitInfo": {"timestamp": now, "operation": "OPTIMIZE",
                                   "operationParameters": {"writer": "spark_changelog", "policy": "auto-compact",
                                                           "minNumFiles": self.compact_min_files},
                                   "isBlindAppend": False, "clientVersion": "spark_changelog",
                                   "operationMetrics": {"numRemovedFiles": len(chosen),
                                                        "numAddedFiles": len(new_files)}}}]
        actions += [{"remove": dict(_remove_action(a, now), dataChange=False)} for a in chosen]
        actions += [{"add": {"path": f["path"], "partitionValues": {}, "size": f["size"], "modificationTime": now,
                             "dataChange": False, "stats": f["stats"]}} for f in new_files]
        try:
            commit_next_version(self.store, version + 1, actions)
        except BaseException as err:
            _drop_data_files(self, [{"files": new_files}], keep_table=True)
            if isinstance(err, CommitTaken):
                return None     # another writer was first: the next batch tries again
            raise
        dt.update_incremental()
        _checkpoint_if_due(dt)
        return {"files_removed": len(chosen), "files_added": len(new_files), "table_version": dt.version()}

    # ------------------------------------------- appends written by the executors
    def stage_batch(self, query_id: str, batch_id: int) -> "Optional[StagedAppend | StagedUpsert]":
        """On the driver, before the sink writers run: the table is created if
        needed, then a stage whose data files the executors write, or ``None``
        (the batch is collected and merged from the driver: a partitioned
        table, or a table without deletion vectors that needs a MERGE).
        docs/sinks.md, "Appends written by the executors" and "Updates and
        deletes: deletion vectors"."""
        batch_id = _checked_ids(query_id, batch_id)
        dt = self._table()
        if _replayed(dt, query_id, batch_id):
            return StagedAppend(self, query_id, batch_id, reason=None)
        if dt.metadata().partition_columns:
            return None
        reason = self._append_reason(dt, query_id)
        if reason is not None:
            return StagedAppend(self, query_id, batch_id, reason=reason)
        return StagedUpsert(self, query_id, batch_id) if self._deletion_vector_layout(dt) else None

    def _deletion_vector_layout(self, dt) -> bool:
        """Updates and deletes go to deletion vectors: the sink may write
        them (``deletion_vectors``), the table supports
        them (reader and writer feature), is unpartitioned and on a store
        the sink commits to itself (:attr:`delta_log.TableStore.can_commit`:
        a local file system, or S3 with conditional puts)."""
        protocol = dt.protocol()
        return (self.deletion_vectors and "deletionVectors" in (protocol.reader_features or [])
                and "deletionVectors" in (protocol.writer_features or [])
                and not dt.metadata().partition_columns and self.store.can_commit)

    def live_files(self, version: int) -> dict[str, dict]:
        """path -> ``add`` action of the table's live files at ``version``."""
        if self._live_files is None:
            self._live_files = LiveFiles(self.store)
        return self._live_files.at(version)

    # ----------------------------------------------------------------- checks
    def _check_columns(self, names, query_id: str, batch_id: int) -> None:
        """The batch has the sink's columns plus ``_kind``/``_seq`` and nothing else
        (metadata columns aside)."""
        missing = [c for c in list(self.columns) + [KIND_COL, SEQ_COL] if c not in set(names)]
        if missing:
            raise ValueError(f"batch {batch_id} of query {query_id!r} lacks column(s) {missing} "
                             f"(sink columns {list(self.columns)} plus {KIND_COL}/{SEQ_COL})")
        extra = [c for c in names if c not in self.columns and c not in METADATA_COLUMNS]
        if extra:
            raise ValueError(f"batch {batch_id} of query {query_id!r} has column(s) {extra} that are "
                             f"not in the sink schema {list(self.columns)}")

    def _check_arrow_batch(self, changes: pa.Table, query_id: str, batch_id: int) -> None:
        """The checks of :meth:`_check_batch` on an Arrow batch (vectorized)."""
        import pyarrow.compute as pc
        self._check_columns(changes.column_names, query_id, batch_id)
        kinds = changes[KIND_COL]
        bad = pc.invert(pc.fill_null(pc.is_in(kinds, value_set=pa.array([0, 1, 2, 3], kinds.type)), False))
        if pc.any(bad).as_py():
            i = _first_true(bad)
            raise ValueError(f"invalid {KIND_COL} value {kinds[i].as_py()!r} in row {i} "
                             f"of batch {batch_id} (expected 0=+I, 1=-U, 2=+U, 3=-D)")
        if changes[SEQ_COL].null_count:
            i = _first_true(pc.is_null(changes[SEQ_COL]))
            raise ValueError(f"null {SEQ_COL} in row {i} of batch {batch_id}")
        for k in self.key:
            n_null = changes[k].null_count
            if n_null:
                i = _first_true(pc.is_null(changes[k]))
                row = changes.select(list(self.columns) + [KIND_COL, SEQ_COL]).slice(i, 1).to_pylist()[0]
                raise ValueError(
                    f"primary key column {k!r} is null in {n_null} row(s) of batch "
                    f"{batch_id} (query {query_id!r}) for Delta table {self.path!r}; first one: "
                    f"row {i} = {row}. Route rows with a null key to the "
                    f"dead-letter output before the sink.")

    def _check_batch(self, changes: pd.DataFrame, query_id: str, batch_id: int) -> None:
        self._check_columns(list(changes.columns), query_id, batch_id)
        check_kinds(changes, batch_id)
        if changes[SEQ_COL].isna().any():
            i = changes[SEQ_COL].isna().to_numpy().nonzero()[0][0]
            raise ValueError(f"null {SEQ_COL} in row {changes.index[i]!r} of batch {batch_id}")
        for k in self.key:
            nulls = changes[k].isna().to_numpy()
            if nulls.any():
                i = nulls.nonzero()[0][0]
                row = {c: changes[c].iloc[i] for c in list(self.columns) + [KIND_COL, SEQ_COL]}
                raise ValueError(
                    f"primary key column {k!r} is null in {int(nulls.sum())} row(s) of batch "
                    f"{batch_id} (query {query_id!r}) for Delta table {self.path!r}; first one: "
                    f"row {changes.index[i]!r} = {row}. Route rows with a null key to the "
                    f"dead-letter output before the sink.")

    def _to_arrow(self, frame: pd.DataFrame, query_id: str, batch_id: int) -> pa.Table:
        try:
            table = pa.Table.from_pandas(frame, schema=self.schema, preserve_index=False, safe=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            raise ValueError(f"batch {batch_id} of query {query_id!r} does not convert to the sink "
                             f"schema of {self.path!r}: {e}") from e
        return table.replace_schema_metadata(None)

    def _cast(self, table: pa.Table, query_id: str, batch_id: int) -> pa.Table:
        """``table`` (the data columns) in the sink's Arrow schema; a value that
        does not fit (overflow, truncation) is an error, never silently changed."""
        if table.schema.remove_metadata() == self.schema.remove_metadata():
            return table.replace_schema_metadata(None)
        try:
            return table.cast(self.schema, safe=True).replace_schema_metadata(None)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            raise ValueError(f"batch {batch_id} of query {query_id!r} does not convert to the sink "
                             f"schema of {self.path!r}: {e}") from e


class StagedAppend:
    """A batch appended to the table with data files written by the executors
    and one commit by the driver (picklable: the sink travels without its
    open table).  ``reason`` None: the batch is a replay, nothing is written.

    Each partition (every change of its keys in it) reduces its changes to
    the net change per key and writes its net additions as one Parquet file
    into the table's directory, named with a fresh id (a retried task writes
    another file; only the files of the attempts Spark kept are committed,
    the others are never referenced and a vacuum deletes them).  The commit
    adds the files with the batch's ``txn``, only on top of the version the
    decision read (``max_commit_retries=0``): a commit of another writer in
    between fails the batch, and the query's restart decides again."""

    def __init__(self, sink: DeltaUpsertSink, query_id: str, batch_id: int, reason: Optional[str]):
        self.sink, self.query_id, self.batch_id, self.reason = sink, query_id, batch_id, reason

    def write_partition(self, changes: pa.Table, partition: int) -> dict:
        s = self.sink
        if self.reason is None or changes.num_rows == 0:
            return {"adds": 0, "retracts": 0, "files": []}
        s._check_arrow_batch(changes, self.query_id, self.batch_id)
        net, net_add = _net_changes(s, changes, self.query_id, self.batch_id)
        adds = net.filter(pa.array(net_add))
        # sorted by the key: later batches search the file (its key index)
        return {"adds": adds.num_rows, "retracts": net.num_rows - adds.num_rows,
                "files": _write_data_file(s, adds.sort_by([(k, "ascending") for k in s.key]), partition)}

    def drop(self, written: list[dict]) -> None:
        """The batch failed before its commit: delete the files its partitions
        wrote (referenced by no version)."""
        _drop_data_files(self.sink, written)

    def commit(self, written: list[dict]) -> dict:
        s = self.sink
        dt = s._dt          # the version the decision read: not refreshed
        if self.reason is None:
            return s._skipped(dt, self.batch_id)
        from deltalake.transaction import AddAction
        files = [f for w in written for f in w["files"]]
        n_adds = sum(w["adds"] for w in written)
        n_retracts = sum(w["retracts"] for w in written)
        result = {**_empty_result(self.batch_id), "write": self.reason, "missing_deletes": n_retracts}
        props = s._commit_properties(self.query_id, self.batch_id, max_commit_retries=0)
        if files:
            now = int(time.time() * 1000)
            dt.create_write_transaction(
                [AddAction(f["path"], f["size"], {}, now, True, f["stats"]) for f in files],
                mode="append", schema=dt.schema(), commit_properties=props)
            dt.update_incremental()
        elif s.commit_empty_batches:
            s._commit_progress_only(dt, self.query_id, self.batch_id, props)
        else:
            result["table_version"] = dt.version()
            return result
        result.update(committed=True, inserted=n_adds, upserted=n_adds, table_version=dt.version())
        return s._after_batch(result)


def _net_changes(sink: DeltaUpsertSink, changes: pa.Table, query_id: str, batch_id: int
                 ) -> "tuple[pa.Table, np.ndarray]":
    """A checked batch (or a partition of one) reduced to the net change per
    key -> (the rows in the sink's schema, whether each is an addition)."""
    is_add = IS_ADD[changes[KIND_COL].to_numpy().astype(np.int64)]
    keep = last_change_per_key(arrow_key_arrays(changes, sink.key),
                               changes[SEQ_COL].to_numpy().astype(np.int64), is_add)
    return sink._cast(changes.select(list(sink.columns)).take(keep), query_id, batch_id), is_add[keep]


def _write_data_file(sink: DeltaUpsertSink, rows: pa.Table, partition: int) -> list[dict]:
    """``rows`` as one new Parquet file in the table's directory (a fresh
    name: a retried task writes another) -> ``[{"path", "size", "stats"}]``
    (``[]`` for no rows)."""
    if rows.num_rows == 0:
        return []
    import uuid

    import pyarrow.parquet as pq
    name = f"part-{partition:05d}-{uuid.uuid4()}-c000.snappy.parquet"
    fs = sink.store.fs
    with fs.open_output_stream(name) as f:
        pq.write_table(rows, f, compression="snappy")
    table_dir = sink.store.local_dir
    if table_dir is not None:       # key indexes are local only: object stores read the key column
        _write_key_index(os.path.join(table_dir, name), rows.select(list(sink.key)))
    return [{"path": name, "size": fs.get_file_info(name).size, "stats": _file_stats(rows, sink.key)}]


def _drop_data_files(sink: DeltaUpsertSink, written: list[dict], keep_table: bool = False) -> None:
    table_dir = sink.store.local_dir
    for f in (f for w in written for f in w["files"]):
        sink.store.delete(f["path"])
        if table_dir is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(_key_index_path(os.path.join(table_dir, f["path"])))
    if not keep_table:
        sink.remove_if_created_empty()


#: the column of a file's row positions while its keys are looked up
_POS_COL = "__spark_changelog_row"


class StagedUpsert:
    """A batch of updates and deletes applied with deletion vectors
    (docs/sinks.md, "Updates and deletes: deletion vectors"): each partition
    (every change of its keys in it), on its executor, reduces its changes to
    the net change per key, writes its net additions as one new Parquet file,
    and finds the rows its keys have in the table now: it reads the key
    columns of the live files whose key range (file statistics) overlaps its
    own, joins them with its keys and drops the rows a deletion vector
    already deletes.  Those row positions (RoaringBitmaps) and counts go back
    to the driver, which writes one deletion-vector file (each touched file's
    old vector with the new positions) and commits, in one new version
    on top of the one read: ``remove`` + ``add`` with the new vector of
    every touched file, ``add`` of the new files, the batch's ``txn``.  A
    commit of another writer in between fails the batch (nothing of it
    visible; the query's restart replays it).  Picklable: the sink travels
    without its open table, the live files as a list."""

    def __init__(self, sink: DeltaUpsertSink, query_id: str, batch_id: int):
        self.sink, self.query_id, self.batch_id = sink, query_id, batch_id
        self.version = sink._dt.version()
        live = sink.live_files(self.version)
        self.files = [_lookup_entry(a, sink) for a in live.values()]

    # ------------------------------------------------------------- executors
    def write_partition(self, changes: pa.Table, partition: int) -> dict:
        s = self.sink
        if changes.num_rows == 0:
            return self.write_net(s.schema.empty_table(), np.zeros(0, dtype=bool), partition)
        s._check_arrow_batch(changes, self.query_id, self.batch_id)
        return self.write_net(*_net_changes(s, changes, self.query_id, self.batch_id), partition)

    def write_net(self, net: pa.Table, net_add: np.ndarray, partition: int) -> dict:
        """The net changes of a partition (:func:`_net_changes`): new file,
        rows looked up -> what the partition sends to the driver."""
        s = self.sink
        out = {"adds": 0, "retracts": 0, "updated": 0, "deleted": 0, "files": [], "positions": {}}
        if net.num_rows == 0:
            return out
        out["adds"] = int(net_add.sum())
        out["retracts"] = net.num_rows - out["adds"]
        # sorted by the key: later batches search the file instead of hashing it
        adds = net.filter(pa.array(net_add))
        out["files"] = _write_data_file(s, adds.sort_by([(k, "ascending") for k in s.key]), partition)
        keys = net.select(list(s.key)).append_column(_ADD_COL, pa.array(net_add))
        self._locate(keys, out)
        return out

    def _locate(self, keys: pa.Table, out: dict) -> None:
        """The live rows of ``keys`` in the table: per file, the positions
        (base64 of a serialized RoaringBitmap) into ``out["positions"]``, and
        how many were net additions (``updated``) or retractions (``deleted``)."""
        import base64

        import pyarrow.compute as pc
        s = self.sink
        store = s.store
        bounds = {k: pc.min_max(keys[k]).as_py() for k in s.key}
        key_schema = pa.schema([s.schema.field(k).with_nullable(False) for k in s.key])
        is_add_of_key = keys[_ADD_COL].to_numpy(zero_copy_only=False).astype(bool)
        for f in self.files:
            if not _may_hold(f, bounds):
                continue
            pos, is_add = _matches(_file_keys(store, f["path"], key_schema, f["rows"]),
                                   keys, s.key, is_add_of_key)
            found = _bitmap(pos)
            if f["dv"] and len(pos):
                # only the found rows the vector already deletes: the cost
                # follows the batch's rows, not the rows deleted so far
                dead = read_deletion_vector(store, f["dv"]) & found
                if dead:
                    live = ~np.isin(pos, np.frombuffer(dead.to_array(), dtype=np.uint32))
                    pos, is_add = pos[live], is_add[live]
                    found -= dead
            if len(pos):
                out["positions"][f["path"]] = base64.b64encode(found.serialize()).decode("ascii")
                out["updated"] += int(is_add.sum())
                out["deleted"] += int((~is_add).sum())

    def drop(self, written: list[dict]) -> None:
        """The batch failed before its commit: delete its new data files."""
        _drop_data_files(self.sink, written)

    # ---------------------------------------------------------------- driver
    def commit(self, written: list[dict]) -> dict:
        """The batch's commit, then the automatic compaction if due."""
        return self.sink._after_batch(self.commit_batch(written))

    def commit_batch(self, written: list[dict]) -> dict:
        import base64

        from pyroaring import BitMap
        s = self.sink
        touched: dict[str, BitMap] = {}
        for w in written:
            for path, blob in w["positions"].items():
                touched.setdefault(path, BitMap()).update(BitMap.deserialize(base64.b64decode(blob)))
        new_files = [f for w in written for f in w["files"]]
        n = {k: sum(w[k] for w in written) for k in ("adds", "retracts", "updated", "deleted")}
        result = {**_empty_result(self.batch_id), "write": "deletion vectors"}
        if not touched and not new_files and not s.commit_empty_batches:
            result.update(missing_deletes=n["retracts"], table_version=self.version)
            return result
        live = s.live_files(self.version)
        now = int(time.time() * 1000)
        actions: list[dict] = [
            {"commitInfo": {"timestamp": now, "operation": "MERGE",
                            "operationParameters": {"predicate": "primary key", "writer": "spark_changelog"},
                            "isBlindAppend": False, "clientVersion": "spark_changelog",
                            "operationMetrics": {"numTargetRowsInserted": n["adds"] - n["updated"],
                                                 "numTargetRowsUpdated": n["updated"],
                                                 "numTargetRowsDeleted": n["deleted"]},
                            _QUERY_ID_META: self.query_id, "spark_changelog.batch_id": self.batch_id}},
            {"txn": {"appId": self.query_id, "version": self.batch_id, "lastUpdated": now}}]
        vectors, dv_file = [], None
        for path, positions in touched.items():
            add = live[path]
            deleted = read_deletion_vector(s.store, add.get("deletionVector")) | positions
            actions.append({"remove": _remove_action(add, now)})
            if len(deleted) < _num_records(add):
                vectors.append((add, deleted))
        try:
            if vectors:
                dv_file, descriptors = write_deletion_vectors(s.store, [v for _, v in vectors])
                actions += [{"add": _with_deletion_vector(add, d)} for (add, _), d in zip(vectors, descriptors)]
            actions += [{"add": {"path": f["path"], "partitionValues": {}, "size": f["size"],
                                 "modificationTime": now, "dataChange": True, "stats": f["stats"]}}
                        for f in new_files]
            commit_next_version(s.store, self.version + 1, actions)
        except BaseException as err:
            self.drop(written)
            if dv_file is not None:
                s.store.delete(dv_file)
            if isinstance(err, CommitTaken):
                raise _deltalake().exceptions.CommitFailedError(
                    f"batch {self.batch_id} of query {self.query_id!r}: {err}; nothing of the batch "
                    f"is in the table, a restart of the query replays it") from None
            raise
        dt = s._dt
        dt.update_incremental()
        _checkpoint_if_due(dt)
        result.update(committed=True, inserted=n["adds"] - n["updated"], updated=n["updated"],
                      deleted=n["deleted"], upserted=n["adds"], missing_deletes=n["retracts"] - n["deleted"],
                      table_version=dt.version())
        return result


#: key columns of data files already read, by file (``_file_keys``)
_KEY_CACHE: "collections.OrderedDict[str, pa.Table | np.ndarray]" = collections.OrderedDict()
#: how many bytes of key columns a process keeps (``SPARK_CHANGELOG_DELTA_KEY_CACHE_MB``, default 512)
_KEY_CACHE_BYTES = int(os.environ.get("SPARK_CHANGELOG_DELTA_KEY_CACHE_MB", "512")) * 1024 * 1024
#: at most this many files' keys (each mapped index is a memory mapping, which the kernel counts)
_KEY_CACHE_FILES = 4096


#: the directory of the data files' key indexes (hidden from Delta readers
#: and vacuum, as every name starting with ``_``)
KEY_INDEX_DIR = "_spark_changelog_keys"


def _key_index_path(data_file: str) -> str:
    return os.path.join(os.path.dirname(data_file), KEY_INDEX_DIR, os.path.basename(data_file) + ".keys.npy")


def _sorted_int_keys(keys: pa.Table) -> Optional[np.ndarray]:
    """The one integer key column as numpy when strictly ascending, else ``None``."""
    if keys.num_columns != 1 or not pa.types.is_integer(keys.schema.field(0).type) or not keys.num_rows \
            or keys.column(0).null_count:
        return None
    column = keys.column(0).to_numpy().astype(np.int64, copy=False)
    return column if np.all(column[1:] > column[:-1]) else None


def _write_key_index(data_file: str, keys: pa.Table) -> None:
    """The key index of a data file sorted by its one integer key: the keys
    as a little-endian int64 ``.npy`` beside it (``_spark_changelog_keys/``),
    written whole (by rename) or not at all.  A file that is not sorted by
    such a key gets none (its keys are read from the Parquet file)."""
    column = _sorted_int_keys(keys)
    if column is None:
        return
    path = _key_index_path(data_file)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "wb") as f:
            np.save(f, column.astype("<i8", copy=False))
        os.replace(tmp, path)
    except OSError:             # an index is an optimization: read the Parquet file instead
        with contextlib.suppress(OSError):
            os.remove(tmp)


def _index_keys(dt, key: Sequence[str]) -> None:
    """Key indexes for the live files that lack one and are sorted by the
    table's one integer key (after a compaction by delta-rs, whose files are
    sorted by the key: their first look-up then maps the index)."""
    if local_table_dir(dt.table_uri) is None or len(key) != 1 or dt.metadata().partition_columns \
            or not pa.types.is_integer(pa.schema(dt.schema().to_arrow()).field(key[0]).type):
        return
    import pyarrow.parquet as pq
    for uri in dt.file_uris():
        data_file = local_table_dir(uri) or uri
        if not os.path.exists(_key_index_path(data_file)):
            _write_key_index(data_file, pq.read_table(data_file, columns=list(key)))


def _drop_orphan_key_indexes(path: str) -> None:
    """Delete the key indexes whose data file a vacuum deleted (Delta's
    vacuum leaves ``_`` directories alone)."""
    table_dir = local_table_dir(path)
    index_dir = table_dir and os.path.join(table_dir, KEY_INDEX_DIR)
    if not index_dir or not os.path.isdir(index_dir):
        return
    for name in os.listdir(index_dir):
        if name.endswith(".keys.npy") and not os.path.exists(os.path.join(table_dir, name[:-len(".keys.npy")])):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(index_dir, name))


def _cached_bytes(keys: "pa.Table | np.ndarray") -> int:
    # a memory-mapped index lives in the page cache, shared by the processes
    return 0 if isinstance(keys, np.memmap) else keys.nbytes


def _file_keys(store: TableStore, name: str, key_schema: pa.Schema, rows: Optional[int] = None
               ) -> "pa.Table | np.ndarray":
    """The key columns of the data file ``name`` of ``store``: a numpy array when the
    file is sorted by its one integer key (the sink's own files and compacted
    ones), else an Arrow table.  Such a file has a key index (the sorted keys
    as ``.npy``, :func:`_write_key_index`), mapped into memory instead of
    read: a look-up touches only the pages its keys fall on, and the
    processes of a machine share them (docs/sinks.md, "Updates and deletes:
    deletion vectors"); a file without one (written by another writer) is
    read once and gets its index then.  Data files never change (a new name
    for new content), so each process keeps the most recently used ones, up
    to ``_KEY_CACHE_BYTES`` (mapped indexes do not count): the micro-batches
    of a running query look their keys up without reading the table again.
    ``rows``: the file's row count (its statistics), which an index must
    have, else it is not used (and written again).  Key indexes are kept
    for local tables only; on an object store the key column is read from
    the Parquet file (once per process, then cached)."""
    path = store.uri(name)
    if path in _KEY_CACHE:
        _KEY_CACHE.move_to_end(path)
        return _KEY_CACHE[path]
    index = _key_index_path(path) if store.local_dir is not None else None
    keys: "pa.Table | np.ndarray | None" = None
    if index and len(key_schema) == 1 and pa.types.is_integer(key_schema.field(0).type) \
            and os.path.exists(index):
        with contextlib.suppress(ValueError, OSError):
            keys = np.load(index, mmap_mode="r")
        if keys is not None and (keys.ndim != 1 or (rows is not None and len(keys) != rows)):
            keys = None
    if keys is None:
        table = store.parquet(name).read(columns=key_schema.names)
        if table.schema != key_schema:
            table = table.cast(key_schema)
        column = _sorted_int_keys(table)
        keys = table if column is None else column
        if column is not None and index:
            _write_key_index(path, table)
    size = _cached_bytes(keys)
    if size <= _KEY_CACHE_BYTES:
        _KEY_CACHE[path] = keys
        total = sum(_cached_bytes(v) for v in _KEY_CACHE.values())
        while total > _KEY_CACHE_BYTES or len(_KEY_CACHE) > _KEY_CACHE_FILES:
            total -= _cached_bytes(_KEY_CACHE.popitem(last=False)[1])
    return keys


def _matches(rows: "pa.Table | np.ndarray", keys: pa.Table, key: Sequence[str], is_add_of_key: np.ndarray
             ) -> "tuple[np.ndarray, np.ndarray]":
    """Positions of the file's rows (``rows``: its key columns, from
    :func:`_file_keys`) whose key is among ``keys`` -> (positions, whether
    that key's net change is an addition).  A file sorted by its one integer
    key is searched (``searchsorted`` of the batch's keys, cost ~ the batch);
    any other is joined (cost ~ the file)."""
    if isinstance(rows, np.ndarray):
        wanted = keys.column(key[0]).to_numpy()
        at = np.searchsorted(rows, wanted)
        found = at < len(rows)
        found[found] = rows[at[found]] == wanted[found]
        return at[found], is_add_of_key[found]
    rows = rows.append_column(_POS_COL, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    hit = rows.join(keys, keys=list(key), join_type="inner")
    return hit[_POS_COL].to_numpy(), hit[_ADD_COL].to_numpy(zero_copy_only=False).astype(bool)

def _bitmap(positions: np.ndarray):
    """Row positions -> ``pyroaring.BitMap`` (built from a buffer: pyroaring
    iterates a numpy array element by element)."""
    import array

    from pyroaring import BitMap
    return BitMap(array.array("I", positions.astype(np.uint32).tobytes()))


def _checkpoint_if_due(dt) -> None:
    """A log checkpoint every ``delta.checkpointInterval`` (100) versions, as
    delta-rs writes after its own commits: a reader's (and the sink's) load of
    the table reads the last checkpoint and the commits after it."""
    interval = int(dt.metadata().configuration.get("delta.checkpointInterval") or 100)
    if dt.version() % interval == 0:
        dt.create_checkpoint()


def _compaction_candidates(adds, target: int, min_files: int) -> list[dict]:
    """The live files an automatic compaction rewrites (``[]``: not due):
    when at least ``min_files`` are small (below ``target / 2`` bytes) or
    mostly deleted (a deletion vector holds half their rows or more), the
    smallest of them up to ``2 * target`` bytes in all (at least two, or one
    mostly deleted file)."""
    def due(a: dict) -> bool:
        dead = int((a.get("deletionVector") or {}).get("cardinality") or 0)
        return a["size"] < target // 2 or 2 * dead >= _num_records(a)

    small = sorted((a for a in adds if due(a)), key=lambda a: a["size"])
    if len(small) < min_files:
        return []
    chosen, budget = [], 2 * target
    for a in small:
        if chosen and a["size"] > budget:
            break
        chosen.append(a)
        budget -= a["size"]
    return chosen if len(chosen) > 1 or chosen[0].get("deletionVector") else []


def live_rows(sink: DeltaUpsertSink, add: dict) -> pa.Table:
    """The rows of the live file ``add`` (an ``add`` action) that its
    deletion vector does not delete, in the sink's schema: the sink's own
    read of the table, through its store."""
    rows = sink.store.parquet(add["path"]).read(columns=list(sink.columns)).select(list(sink.columns))
    dead = read_deletion_vector(sink.store, add.get("deletionVector"))
    if dead:
        keep = np.ones(rows.num_rows, dtype=bool)
        keep[np.frombuffer(dead.to_array(), dtype=np.uint32)] = False
        rows = rows.filter(pa.array(keep))
    return rows.cast(sink.schema)


def _rewrite_sorted(sink: DeltaUpsertSink, files: list[dict], target: int) -> list[dict]:
    """The live rows of ``files`` (their deletion vectors applied), sorted by
    the key, as new data files of about ``target`` bytes each."""
    parts, size = [], 0
    for a in files:
        rows = live_rows(sink, a)
        parts.append(rows)
        size += a["size"] * rows.num_rows // max(1, _num_records(a))
    rows = pa.concat_tables(parts).sort_by([(k, "ascending") for k in sink.key])
    per_file = -(-rows.num_rows // max(1, -(-size // target)))
    return [f for start in range(0, rows.num_rows, max(1, per_file))
            for f in _write_data_file(sink, rows.slice(start, per_file), 0)]


def _lookup_entry(add: dict, sink: DeltaUpsertSink) -> dict:
    """What a partition needs of a live file to look its keys up: its path,
    deletion vector and the key columns' bounds (integer keys, and string
    keys whose bounds are not cut off)."""
    stats = json.loads(add.get("stats") or "{}")
    lo, hi = stats.get("minValues") or {}, stats.get("maxValues") or {}
    bounds = {}
    for k in sink.key:
        t = sink.schema.field(k).type
        a, b = lo.get(k), hi.get(k)
        if a is None or b is None:
            continue
        if pa.types.is_integer(t) or (pa.types.is_string(t) and len(b) < 32):
            bounds[k] = (a, b)
    return {"path": add["path"], "dv": add.get("deletionVector"), "bounds": bounds,
            "rows": stats.get("numRecords")}


def _may_hold(file: dict, key_bounds: dict) -> bool:
    for k, (lo, hi) in file["bounds"].items():
        mm = key_bounds.get(k)
        if mm and mm["min"] is not None and (mm["max"] < lo or mm["min"] > hi):
            return False
    return True


def _num_records(add: dict) -> int:
    stats = json.loads(add.get("stats") or "{}")
    return int(stats.get("numRecords", 1 << 62))


def _remove_action(add: dict, now: int) -> dict:
    remove = {"path": add["path"], "deletionTimestamp": now, "dataChange": True, "extendedFileMetadata": True,
              "partitionValues": add.get("partitionValues") or {}, "size": add["size"]}
    if add.get("deletionVector"):
        remove["deletionVector"] = add["deletionVector"]
    return remove


def _with_deletion_vector(add: dict, descriptor: dict) -> dict:
    """The same data file with a new deletion vector; its statistics become
    wide bounds (``tightBounds`` false: some rows are deleted)."""
    stats = json.loads(add.get("stats") or "{}")
    stats["tightBounds"] = False
    out = {k: v for k, v in add.items() if v is not None and k not in ("deletionVector", "stats")}
    out.update(dataChange=True, stats=json.dumps(stats), deletionVector=descriptor)
    return out


def _file_stats(table: pa.Table, key: Sequence[str]) -> str:
    """Delta file statistics (``numRecords``; min, max and null count of the
    integer and short string key columns, which MERGE prunes files by)."""
    import pyarrow.compute as pc
    mins, maxs, nulls = {}, {}, {}
    for k in key:
        col = table[k]
        t = col.type
        if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
            continue
        mm = pc.min_max(col).as_py()
        if pa.types.is_integer(t) or all(len(v) <= 32 for v in mm.values() if v is not None):
            mins[k], maxs[k], nulls[k] = mm["min"], mm["max"], col.null_count
    return json.dumps({"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs,
                       "nullCount": nulls})


def _checked_ids(query_id, batch_id) -> int:
    if not isinstance(query_id, str) or not query_id:
        raise ValueError(f"query_id must be a non-empty string, got {query_id!r}")
    if isinstance(batch_id, bool) or not isinstance(batch_id, (int, np.integer)) or batch_id < 0:
        raise ValueError(f"batch_id must be an integer >= 0, got {batch_id!r}")
    return int(batch_id)


def _replayed(dt, query_id: str, batch_id: int) -> bool:
    last = dt.transaction_version(query_id)
    return last is not None and batch_id <= last


def _empty_result(batch_id: int) -> dict:
    return {"batch_id": batch_id, "upserted": 0, "inserted": 0, "updated": 0, "deleted": 0,
            "missing_deletes": 0, "skipped_replay": False, "committed": False}


def _first_true(mask) -> int:
    """Position of the first true value of a boolean Arrow array."""
    return int(np.flatnonzero(np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool))[0])
