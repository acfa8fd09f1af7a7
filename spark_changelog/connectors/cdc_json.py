"""Change-data-capture readers: shared parsing (docs/semantics.md, sections 1 and 2).

``read_changes`` turns files written by a CDC tool (Debezium, Canal, Maxwell) or
plain changelog files into a changelog stream: the user's columns, typed, plus
``_kind`` (the :class:`~spark_changelog.model.rowkind.RowKind` code, tinyint) and
``_seq`` (bigint), see :mod:`spark_changelog.model.schema`.  An update becomes two
rows, ``-U`` of the old image and ``+U`` of the new one (docs/semantics.md, section 1: an update
is never one composite row).

Everything runs inside Spark, batch or streaming, with the same expressions.
Files are cut into numbered lines in parallel over byte ranges
(:mod:`~spark_changelog.connectors.lines`: exact 1-based line numbers however a
file is split).  Each line is parsed once: Debezium lines are first parsed
with the typed envelope by Arrow's JSON reader in that same line task
(:mod:`~spark_changelog.connectors.debezium_arrow`), and a line that passes
every check there is done; any other line (and every line of the other
formats) is parsed into a VARIANT (``try_parse_json``) and checked field by
field with ``variant_get``, which states the reason of a bad record.  A
streaming read yields exactly the rows of a batch read of the same files
because every output value is a function of (file, line, record) only.

Result
------
:class:`ReadResult` ``rows`` is the one-pass stream: every input line becomes
its change rows or one *side row* (``_kind = -1``, a JSON payload in
``_metrics``, the channel operator counters use too), so good rows, dead
letters and skipped lines leave the same pass over the files, pass through
every operator and join, and the pipeline's sink handler splits them off
(``runtime.pipeline``).  Three views of it, one row per input line in exactly
one of them (nothing is dropped silently):

``changes``  user columns in schema order, ``_kind``, ``_seq``.
``invalid``  ``raw`` string, ``file`` string, ``line`` bigint, ``reason`` string
             (side payload ``{"dead_letter": {...}}``);
             the reason names the field (``field 'price': value "abc" is not a
             DOUBLE (in 'after')``); several problems of one record are joined
             with ``"; "``.  A record is all or nothing: a Canal message with one
             bad row goes to ``invalid`` whole and emits none of its rows.
``skipped``  ``raw``, ``file``, ``line``, ``category``, ``reason`` (side payload
             ``{"skipped": {...}}``): lines that are
             legitimately not changes.  ``category`` is ``"tombstone"`` (a Kafka
             tombstone: an empty/whitespace line, ``null``, or Debezium's
             ``{"schema":null,"payload":null}`` in the middle of a file) or
             ``"ignored"`` (DDL and control records, e.g. Canal ``CREATE``,
             Maxwell ``table-alter``, Debezium schema-change events).
             Blank lines after the last record of a file are not rows at all.

``ReadResult.tombstones_skipped`` / ``ignored_skipped`` count those categories
for a batch read (one small Spark job, computed on first access and cached).
For a streaming read they are ``None``: count ``res.skipped`` per micro-batch
(``batch.filter("category = 'tombstone'").count()`` in ``foreachBatch``).

Strict mode
-----------
Batch: ``strict=True`` makes ``read_changes`` raise :class:`InvalidChangeError`
for the first bad record ordered by (file, line); its message names file, line
and field.  Streaming: validation happens per micro-batch, so the caller
enforces it: call :func:`raise_if_invalid` on each micro-batch of
``res.invalid`` (``foreachBatch``) for the deterministic first error.  With
``strict=True`` a streaming ``res.changes`` additionally fails the query
(``raise_error``) as soon as a task meets an invalid record, so no change after a
bad record is ever emitted unnoticed; which bad record is reported first is then
up to task scheduling.  A pipeline (``write_upsert(strict=True)``) checks the
dead letters of each micro-batch before writing anything of it and names the
first by (file, line).

Typed values
------------
A field present in the record (not absent, not JSON ``null``) whose value does
not convert to the schema type is a wrong-type error: conversion is Spark's
``try_variant_get`` (JSON strings holding numbers, e.g. Canal's ``"1"``, are
accepted for numeric columns, as Flink's JSON format does).  No value changes
silently (docs/semantics.md, section 1): a fraction or a boolean into an
integer column, a number outside the column's range, and more digits than a
DECIMAL(p, s) holds are wrong-type errors, never truncated or rounded
(:func:`coerce_variant`).  DATE/TIMESTAMP columns accept strings; Debezium's
epoch numbers and base64 decimals are decoded by the envelope's schema or the
declared type (:mod:`~spark_changelog.connectors.debezium_types`); other
formats reject a numeric epoch value rather than guess its unit.  BINARY
columns take base64 strings (Debezium's default).  Absent and ``null`` fields
become NULL; for primary-key columns that is an error.  JSON keys match column
names exactly (case-sensitive).

Format options (:mod:`~spark_changelog.connectors.format_options`): database
and table filters, ``METADATA`` columns, ``NaN``/``Infinity``, and
ignore-parse-errors, which marks a dead letter so that a run without a
dead-letter directory counts it instead of stopping.

Sequence encoding (``_seq``)
----------------------------
``_seq = position * 2 + phase``.  ``phase`` is 0 for the before image of an event
(``-U``, or the ``-D`` of a delete or of a key-changing update) and 1 for the
after image (``+I``/``+U``), so one event's retraction sorts before its addition.
``position`` is a non-negative integer below 2**62 built from the source's own
log position, most significant part first.  Parts marked *range-checked* send
the record to ``invalid`` (reason names the field) instead of overflowing; parts
marked *clamped* saturate at their maximum, which can only produce ties (never an
inversion) among records whose more significant parts are equal.

=============================  ===============================================  ==========
source / priority              position (bit widths)                            limits
=============================  ===============================================  ==========
Debezium, ``source.lsn``       lsn (62)                                         lsn < 2^62
Debezium, MySQL binlog         file suffix (28) | pos + row (34)                 files < 2^28, pos+row < 2^34
Debezium, ``ts_ms`` then       ts_ms (42) | line (20, clamped)                   ts < 2^42 ms (year 2109)
``source.ts_ms``
Canal                          es//1000, else ts//1000, else file number (34)   < 2^34
                               | line (20, clamped) | index in ``data`` (8, clamped)
Maxwell, ``position``          file suffix (20) | offset (32) | xoffset (10,     files < 2^20, offset < 2^32
                               clamped)
Maxwell, ``ts`` (seconds)      ts (34) | line (28, clamped)                      ts < 2^34 s
changelog without seq column,  file number (34) | line (28, clamped)             < 2^34
and every format's fallback
changelog with seq column      the column's value as is (no ``*2 + phase``)      bigint
=============================  ===============================================  ==========

Why these choices:

* PostgreSQL gives every change its own LSN; only snapshot rows (``op = r``) share
  one, and those are one row per key, so ties never occur within one key.  LSNs
  follow the WAL, not commit order, so two concurrent transactions can interleave
  across keys; for one key, row locks make WAL order the commit order, which is
  the order consumers sort by (key, ``_seq``).
* MySQL binlog: ``pos`` is the byte offset of the event and ``row`` the row inside
  it.  Every row of an event occupies at least one byte of it, so ``pos + row`` is
  strictly increasing and collision free within a binlog file (no bits wasted on
  a separate row field).  ``source.file`` is ``mysql-bin.000003``: its numeric
  suffix orders the files.
* A timestamp does not order events within one millisecond; the line number keeps
  file order for equal timestamps.  That is file order within one file only: two
  changes of one key with equal timestamps in different files are ordered by
  their line numbers, so prefer log positions (LSN, binlog) when the connector
  provides them.  Canal's ``es`` is the binlog event time, which MySQL records
  in whole seconds (Canal multiplies it by 1000), so it is used in seconds and
  the saved bits go to the line and the row index.
* Maxwell's ``xoffset`` counts rows within a transaction and ``position`` is the
  event's binlog position, so (position, xoffset) orders rows; with only ``ts``
  (seconds) the line is the tie-breaker, not ``xoffset``: xoffset restarts at 0
  for every transaction, so two transactions within one second would interleave.
* The file number is the last run of digits in the file name without its
  extensions (``inventory.customers+0+0000000042.json`` -> 42, Kafka Connect's
  start offset; ``binlog-3.json`` -> 3; no digits -> 0).

One source partition must use one kind of position (a Debezium connector always
fills the same fields); mixing records with and without ``source.lsn`` in one
source would compare numbers of different scales.
"""
from __future__ import annotations

import dataclasses
import importlib
import re
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from spark_changelog.model.rowkind import RowKind
from spark_changelog.connectors.format_options import FormatOptions
from spark_changelog.connectors.seq_layout import (  # noqa: F401  (the _seq layout, shared with the line task)
    BINLOG_FILE_BITS, BINLOG_OFFSET_BITS, FILE_LINE_BITS, FILE_NO_BITS, LSN_BITS, PHASE_AFTER, PHASE_BEFORE,
    POSITION_BITS, TS_LINE_BITS, TS_MS_BITS)
from spark_changelog.model import METRICS_COL as SIDE_COL, METRICS_KIND as SIDE_KIND
from spark_changelog.model import PACKED_GROUP_COL, PACKED_ROWS_COL
from spark_changelog.model.schema import (
    KIND_COL,
    SEQ_COL,
    ChangelogMode,
    StreamSchema,
    as_key,
)

__all__ = [
    "FORMATS",
    "InvalidChangeError",
    "ReadResult",
    "SKIP_IGNORED",
    "SKIP_TOMBSTONE",
    "first_invalid",
    "raise_if_invalid",
    "read_changes",
]

#: ``format=`` values and the module that parses each.
FORMATS = {
    "debezium-json": "debezium",
    "canal-json": "canal",
    "maxwell-json": "maxwell",
    "changelog": "changelog_files",
}
CHANGELOG_FILE_FORMATS = ("json", "csv", "parquet", "avro")

SKIP_TOMBSTONE = "tombstone"
#: side rows (the pipeline's side-row channel, ``runtime.spark_keyed``): kind,
#: payload column, and the payload keys the sink handler reads
DEAD_LETTER = "dead_letter"
SKIPPED = "skipped"
SKIP_IGNORED = "ignored"

INVALID_COLUMNS = ("raw", "file", "line", "reason")
SKIPPED_COLUMNS = ("raw", "file", "line", "category", "reason")

INSERT = int(RowKind.INSERT)
UPDATE_BEFORE = int(RowKind.UPDATE_BEFORE)
UPDATE_AFTER = int(RowKind.UPDATE_AFTER)
DELETE = int(RowKind.DELETE)
_ROW_LIMIT_DIGITS = 18  # digit strings longer than this (after leading zeros) exceed 2^59

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_TEMPORAL = (T.DateType, T.TimestampType, T.TimestampNTZType)
_SNIPPET_CHARS = 120


# --------------------------------------------------------------------------- errors


class InvalidChangeError(ValueError):
    """A change record that cannot be turned into changelog rows (strict mode)."""

    def __init__(self, file: str, line: int, reason: str, raw: Optional[str] = None):
        self.file, self.line, self.reason, self.raw = file, int(line), reason, raw
        record = "" if raw is None else f"; record: {_clip(raw, 300)}"
        super().__init__(f"invalid change record in {file} line {self.line}: {reason}{record}")


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n] + "..."


# --------------------------------------------------------------------------- result


@dataclasses.dataclass
class ReadResult:
    """What :func:`read_changes` returns (see the module docstring).

    ``rows`` is the one-pass stream: change rows and side rows (``_kind =
    -1``, payload in ``_metrics``: dead letters and skipped records), what a
    pipeline runs on.  ``changes``/``invalid``/``skipped`` are views of it.
    All are lazy DataFrames (streaming ones for a streaming read).

    A read whose line task finishes rows (:meth:`packed_rows`) builds
    ``rows`` when it is first asked for: the one keyed operator reading them
    directly takes the packed variant instead, and its schema is known
    without building either (:attr:`schema`), so only one read plan is
    built and analyzed by Spark (docs/runtime.md, "Before the query starts").
    """

    #: the rows once built (None: not yet, :attr:`rows` builds them)
    _rows: Optional[DataFrame]
    stream_schema: StreamSchema
    format: str
    streaming: bool
    fail_on_invalid: bool = False   # a strict streaming read: ``changes`` fails on a bad record
    _counts: Optional[dict] = dataclasses.field(default=None, repr=False)
    #: (format module, ReadContext) the rows were built from: :meth:`packed_rows`
    _built_from: Optional[tuple] = dataclasses.field(default=None, repr=False)
    _files_taken: bool = dataclasses.field(default=False, repr=False)

    @property
    def rows(self) -> DataFrame:
        if self._rows is None:
            module, ctx = self._built_from
            self._rows = finish(module.parse(self._plan_context(ctx)), ctx)._rows
        return self._rows

    def _plan_context(self, ctx: "ReadContext") -> "ReadContext":
        """``ctx`` for the next read plan built: the first takes the listing
        made when the read was declared, any later one lists on its own, so
        every plan reads its own source, as when each listed its files."""
        if ctx.files is None or self._files_taken:
            return dataclasses.replace(ctx, files=None)
        self._files_taken = True
        return ctx

    @property
    def built(self) -> bool:
        """Whether :attr:`rows` is built."""
        return self._rows is not None

    @property
    def schema(self) -> T.StructType:
        """The Spark schema of :attr:`rows`, without building them when they
        are not built yet (:func:`rows_schema`)."""
        return self._rows.schema if self._rows is not None else rows_schema(self._built_from[1])

    @property
    def spark(self) -> SparkSession:
        return self._built_from[1].spark if self._built_from is not None else self.rows.sparkSession

    def packed_rows(self, packer: Callable) -> Optional[DataFrame]:
        """The :attr:`rows` of a second read plan whose line task packs the
        lines it finishes with ``packer`` (finished change rows as an Arrow
        table -> (key group, packed rows) pairs): each pair leaves as one row
        of kind ``PACKED_KIND`` with the extra columns ``PACKED_GROUP_COL``
        and ``PACKED_ROWS_COL``; every other line and side row as in
        :attr:`rows`.  Only for the one keyed operator reading this source
        (docs/runtime.md, "Packing in the line task").  None when the
        format's line task finishes no rows (every format but Debezium, or a
        column type its fast path does not parse)."""
        if self._built_from is None:
            return None
        module, ctx = self._built_from
        if not getattr(module, "finishes_rows", lambda _ctx: False)(ctx):
            return None
        return finish(module.parse(dataclasses.replace(self._plan_context(ctx), packer=packer)), ctx)._rows

    @property
    def changes(self) -> DataFrame:
        """User columns, ``_kind``, ``_seq``: the change rows only."""
        if not self.fail_on_invalid:
            return self.rows.where(f"{KIND_COL} <> {SIDE_KIND}").drop(SIDE_COL)
        # one condition (not a projection then a filter, which the optimizer
        # would reorder): data rows pass, a dead letter stops the query
        dead = f"from_json({SIDE_COL}, 'dead_letter STRUCT<file STRING, line BIGINT, reason STRING>').dead_letter"
        message = concat("'invalid change record in '", f"{dead}.file", "' line '",
                         f"CAST({dead}.line AS STRING)", "': '", f"{dead}.reason")
        return self.rows.where(
            f"CASE WHEN {KIND_COL} <> {SIDE_KIND} THEN true WHEN {dead} IS NOT NULL "
            f"THEN CAST(raise_error({message}) AS BOOLEAN) ELSE false END").drop(SIDE_COL)

    @property
    def invalid(self) -> DataFrame:
        """``raw``, ``file``, ``line``, ``reason`` of the dead letters."""
        return self._side(DEAD_LETTER, "raw STRING, file STRING, line BIGINT, reason STRING")

    @property
    def skipped(self) -> DataFrame:
        """``raw``, ``file``, ``line``, ``category``, ``reason`` of skipped lines."""
        return self._side(SKIPPED, "raw STRING, file STRING, line BIGINT, category STRING, reason STRING")

    def _side(self, name: str, ddl: str) -> DataFrame:
        payload = f"from_json({SIDE_COL}, {lit(f'{name} STRUCT<{ddl}>')}).{name}"
        return (self.rows.where(f"{KIND_COL} = {SIDE_KIND}")
                .selectExpr(f"inline(CASE WHEN {payload} IS NOT NULL THEN array({payload}) END)"))

    @property
    def tombstones_skipped(self) -> Optional[int]:
        """Kafka tombstones skipped (batch); ``None`` for streaming: count ``skipped``."""
        return self._skipped_count(SKIP_TOMBSTONE)

    @property
    def ignored_skipped(self) -> Optional[int]:
        """DDL/control records ignored (batch); ``None`` for streaming."""
        return self._skipped_count(SKIP_IGNORED)

    def _skipped_count(self, category: str) -> Optional[int]:
        if self.streaming:
            return None
        if self._counts is None:
            rows = self.skipped.groupBy("category").count().collect()
            self._counts = {r["category"]: int(r["count"]) for r in rows}
        return self._counts.get(category, 0)


# --------------------------------------------------------------------------- entry point


@dataclasses.dataclass(frozen=True)
class ReadContext:
    """Everything a format module needs to build its per-line DataFrame."""

    spark: SparkSession
    path: Union[str, Sequence[str]]
    format: str
    schema: T.StructType
    primary_key: tuple[str, ...]
    streaming: bool
    strict: bool
    max_files_per_trigger: Optional[int]
    changelog_file_format: str
    kind_column: Optional[str]          # None: plain rows, every one an insert
    seq_column: Optional[str]
    csv_options: Mapping[str, str]
    #: packs the finished rows of the line task per key group (a runtime's
    #: callable, :meth:`ReadResult.packed_rows`); None: rows leave unpacked
    packer: Optional[Callable] = None
    #: the format options (``format_options``): filters, metadata columns, ...
    options: FormatOptions = FormatOptions()
    #: (code, RowKind) pairs: the kind column's own codes (Flink's
    #: ``FROM_CHANGELOG`` ``op_mapping``), matched exactly; None: the
    #: spellings of ``model.rowkind.KIND_SPELLINGS``
    op_mapping: Optional[tuple[tuple[str, int], ...]] = None
    #: the files' listing (``lines.list_files``), made when the read is
    #: declared, shared by the read plans built later; None: made by the plan
    files: Optional[DataFrame] = None

    @property
    def columns(self) -> list[str]:
        return self.schema.fieldNames()

    @property
    def image_schema(self) -> T.StructType:
        """The columns read from a row image: every column but the
        ``METADATA`` ones (those come from the envelope)."""
        meta = self.options.metadata_columns
        return T.StructType([f for f in self.schema.fields if f.name not in meta])


def read_changes(
    spark: SparkSession,
    path: Union[str, Sequence[str]],
    format: str = "debezium-json",
    schema: Union[T.StructType, str, None] = None,
    primary_key: Union[str, Sequence[str], None] = None,
    streaming: bool = False,
    strict: bool = False,
    max_files_per_trigger: Optional[int] = None,
    changelog_file_format: str = "json",
    kind_column: Optional[str] = "op",
    seq_column: Optional[str] = None,
    csv_options: Optional[Mapping[str, str]] = None,
    options: Optional[FormatOptions] = None,
    op_mapping: Optional[Mapping[str, int]] = None,
) -> ReadResult:
    """Read CDC files at ``path`` into a changelog stream (docs/semantics.md, sections 1-2).

    ``path``: files, or a DataFrame of records (a ``value`` column, string or
    binary, plus Kafka's ``topic``, ``partition``, ``offset``, ``timestamp``
    when present: Spark's Kafka source; :mod:`.kafka`), batch or streaming as
    the DataFrame is.
    ``format``: ``debezium-json``, ``canal-json``, ``maxwell-json`` or ``changelog``
    (files with an explicit kind column, ``changelog_file_format`` = ``json``,
    ``csv`` with a header line, ``parquet`` or ``avro``; ``kind_column=None``:
    plain rows, every one an insert, an insert-only stream).  ``schema``: the user columns
    (StructType or DDL string); required except for changelog Parquet files, whose
    schema is taken from the files.  ``primary_key``: columns that must be present
    in every image; a Debezium/Canal/Maxwell update that changes them becomes
    ``-D`` old + ``+I`` new instead of ``-U``/``+U``.  ``streaming`` uses Spark's
    file streaming source (``path`` a directory or glob; ``max_files_per_trigger``
    is passed through as ``maxFilesPerTrigger``).  ``options``: Flink's format
    options and the metadata columns (:mod:`.format_options`).  ``op_mapping``:
    the kind column's codes -> RowKind (``format="changelog"``), matched
    exactly, any other code a dead letter.  See the module docstring for
    ``strict``, the result and the ``_seq`` encoding.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown CDC format {format!r}: expected one of {sorted(FORMATS)}")
    if format == "changelog" and changelog_file_format not in CHANGELOG_FILE_FORMATS:
        raise ValueError(
            f"unknown changelog_file_format {changelog_file_format!r}: expected one of {CHANGELOG_FILE_FORMATS}"
        )
    if isinstance(path, DataFrame):
        # a stream of records (Spark's Kafka source, or any DataFrame with a
        # ``value`` column): connectors.kafka.frame_lines
        if format == "changelog" and changelog_file_format != "json":
            raise ValueError("a DataFrame source holds JSON records: changelog_file_format='json'")
        streaming = path.isStreaming
    elif streaming and not isinstance(path, str):
        raise ValueError("a streaming read takes one path (a directory or a glob), not a list")
    if max_files_per_trigger is not None and int(max_files_per_trigger) < 1:
        raise ValueError("max_files_per_trigger must be a positive integer")
    key = as_key(primary_key)
    if format == "changelog" and schema is None and changelog_file_format == "parquet":
        schema = _parquet_user_schema(spark, path, kind_column, seq_column)
    struct = resolve_schema(schema, format)
    _check_columns(struct, key, format, kind_column, seq_column)
    options = options or FormatOptions()
    _check_metadata(struct, key, format, options, isinstance(path, DataFrame))
    ctx = ReadContext(
        spark=spark, path=path, format=format, schema=struct, primary_key=key,
        streaming=bool(streaming), strict=bool(strict),
        max_files_per_trigger=None if max_files_per_trigger is None else int(max_files_per_trigger),
        changelog_file_format=changelog_file_format, kind_column=kind_column,
        seq_column=seq_column, csv_options=dict(csv_options or {}), options=options,
        op_mapping=None if op_mapping is None else tuple(sorted(op_mapping.items())),
    )
    module = importlib.import_module(f"spark_changelog.connectors.{FORMATS[format]}")
    if getattr(module, "finishes_rows", lambda _ctx: False)(ctx):
        # built when first used (ReadResult); the files are listed now and
        # the column names checked, so a missing path or a name JSON cannot
        # hold fails here as it always did
        from spark_changelog.connectors.lines import list_files
        for column in ctx.columns:
            json_path(column)
        ctx = dataclasses.replace(ctx, files=list_files(spark, path, streaming=ctx.streaming,
                                                        max_files_per_trigger=ctx.max_files_per_trigger))
        result = _result(None, ctx)
    else:
        result = finish(module.parse(ctx), ctx)
    result = dataclasses.replace(result, _built_from=(module, ctx))
    if strict and not streaming:
        raise_if_invalid(result.invalid)
    return result


def resolve_schema(schema: Union[T.StructType, str, None], fmt: str) -> T.StructType:
    """The user columns as a StructType (CHAR/VARCHAR read as STRING)."""
    if schema is None:
        raise ValueError(
            f"read_changes(format={fmt!r}) needs schema=: the user columns as a StructType or a DDL "
            "string such as 'id BIGINT, name STRING, price DOUBLE'. CDC records are never used to "
            "infer a schema (one malformed record would change every type)."
        )
    if isinstance(schema, str):
        parsed = T.StructType.fromDDL(schema)
        if not isinstance(parsed, T.StructType):
            parsed = T.StructType([T.StructField("value", parsed)])
        schema = parsed
    if not isinstance(schema, T.StructType):
        raise TypeError(f"schema must be a StructType or a DDL string, not {type(schema).__name__}")
    fields = [T.StructField(f.name, _plain_type(f.dataType), True, f.metadata) for f in schema.fields]
    return T.StructType(fields)


def _plain_type(dtype: T.DataType) -> T.DataType:
    if isinstance(dtype, (T.CharType, T.VarcharType)):
        return T.StringType()
    return dtype


def avro_available(spark: SparkSession) -> bool:
    """Whether Spark finds its ``avro`` data source (the classes ship with
    Spark, the data source is registered by the package)."""
    from .session_info import data_source_available
    return data_source_available(spark, "avro")


def require_avro(spark: SparkSession) -> None:
    """Spark's Avro data source is a separate package: a clear error naming
    it (and how to add it) when it is not on the classpath."""
    if not avro_available(spark):
        version = spark.version
        raise ValueError(
            "'format' = 'avro' needs Spark's Avro data source, which is not on the classpath: add "
            f"the package org.apache.spark:spark-avro_2.13:{version} (spark-submit --packages, or "
            "the Spark conf spark.jars.packages, before the session starts)") from None


def _check_columns(schema: T.StructType, key: tuple[str, ...], fmt: str, kind_column: Optional[str],
                   seq_column: Optional[str]) -> None:
    names = schema.fieldNames()
    if not names:
        raise ValueError("schema has no columns")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"duplicate column name(s) {dupes} in schema")
    # StreamSchema checks reserved names and that the key is among the columns
    StreamSchema(columns=tuple(names), primary_key=key)
    if fmt == "changelog":
        meta = [c for c in (kind_column, seq_column) if c]
        clash = [c for c in meta if c in names]
        if clash:
            raise ValueError(
                f"kind/seq column(s) {clash} are also user columns; the changelog file's kind "
                "column and sequence column are metadata, not part of the schema"
            )
        if seq_column is not None and seq_column == kind_column:
            raise ValueError("kind_column and seq_column must differ")


def _check_metadata(schema: T.StructType, key: tuple[str, ...], fmt: str, options: FormatOptions,
                    frame: bool) -> None:
    from spark_changelog.connectors.format_options import metadata_key
    from spark_changelog.connectors.kafka import KAFKA_METADATA
    names = schema.fieldNames()
    for column, mkey in options.metadata:
        if mkey in KAFKA_METADATA:
            if not frame:
                raise ValueError(f"metadata key {mkey!r} of column {column!r} is a Kafka record's: a "
                                 "source of files has none")
        else:
            metadata_key(fmt, mkey)
        if column not in names:
            raise ValueError(f"metadata column {column!r} is not a column of the schema")
        if column in key:
            raise ValueError(f"metadata column {column!r} cannot be part of the primary key")


def _parquet_user_schema(spark: SparkSession, path, kind_column: Optional[str], seq_column: Optional[str]) -> T.StructType:
    files = spark.read.parquet(*([path] if isinstance(path, str) else list(path)))
    drop = {kind_column, seq_column}
    return T.StructType([f for f in files.schema.fields if f.name not in drop])


# --------------------------------------------------------------------------- strict helpers


def first_invalid(invalid: Any) -> Optional[dict]:
    """The first invalid record by (file, line) of a Spark or pandas DataFrame, or None."""
    if invalid is None:
        return None
    if isinstance(invalid, DataFrame):
        rows = invalid.select(*INVALID_COLUMNS).orderBy("file", "line").limit(1).collect()
        return rows[0].asDict() if rows else None
    frame = invalid
    if len(frame) == 0:
        return None
    first = frame.sort_values(["file", "line"], kind="stable").iloc[0]
    return {c: first[c] for c in INVALID_COLUMNS}


def raise_if_invalid(invalid: Any) -> None:
    """Raise :class:`InvalidChangeError` for the first (file, line) record of ``invalid``.

    Use it in ``foreachBatch`` on each micro-batch of ``ReadResult.invalid`` to make
    a streaming read strict; a batch read with ``strict=True`` calls it itself.
    """
    rec = first_invalid(invalid)
    if rec is not None:
        raise InvalidChangeError(rec["file"], rec["line"], rec["reason"], rec["raw"])


# --------------------------------------------------------------------------- SQL building blocks
#
# The parsers are written as Spark SQL expression text, applied one projection at
# a time with ``selectExpr``: one JVM call per projection instead of py4j round
# trips for every ``Column`` operation (about 22k for the Debezium read, slower
# than even the first job's cold parse: docs/runtime.md, "From the process's
# start to the first job's query"), and each projection names its results so
# that later ones reference them instead of repeating them.

Sql = str


def ident(name: str) -> Sql:
    """A quoted SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def lit(text: str) -> Sql:
    """A SQL string literal (backslash escapes, the parser's default)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def when(*branches: tuple[Sql, Sql], otherwise: Optional[Sql] = None) -> Sql:
    body = " ".join(f"WHEN {c} THEN {v}" for c, v in branches)
    tail = f" ELSE {otherwise}" if otherwise is not None else ""
    return f"CASE {body}{tail} END"


def concat(*parts: Sql) -> Sql:
    return f"concat({', '.join(parts)})"


def all_of(*conds: Sql) -> Sql:
    return "(" + " AND ".join(conds) + ")"


def any_of(*conds: Sql) -> Sql:
    return "(" + " OR ".join(conds) + ")"


def is_in(expr: Sql, values: Iterable[str]) -> Sql:
    return f"({expr} IN ({', '.join(lit(v) for v in values)}))"


def stage(df: DataFrame, **columns: Sql) -> DataFrame:
    """``df`` with the named SQL expressions appended (one projection)."""
    return df.selectExpr("*", *[f"{expr} AS {ident(name)}" for name, expr in columns.items()])


# --------------------------------------------------------------------------- lines


def read_lines(ctx: ReadContext, keep_header: bool = False, parser=None) -> DataFrame:
    """One row per line: ``file`` string, ``file_no`` bigint (:func:`file_number`),
    ``line`` bigint (1-based), ``raw`` string; with ``keep_header`` a ``header``
    column holds the file's first line (for CSV).

    Files are read in parallel over byte ranges with exact line numbers
    (:mod:`spark_changelog.connectors.lines`).  A byte-order mark and CRLF line
    ends are removed; blank lines after a file's last non-blank line are not
    returned.  A ``parser`` (``lines.read_lines``) adds its typed columns and
    leaves ``raw`` NULL on the lines it does not need the text of.
    """
    if isinstance(ctx.path, DataFrame):
        from spark_changelog.connectors.kafka import frame_lines
        if keep_header or parser is not None:
            raise ValueError("a DataFrame source has no header line and no Arrow line task")
        return frame_lines(ctx.path)
    from spark_changelog.connectors.lines import read_lines as numbered_lines
    return numbered_lines(ctx.spark, ctx.path, streaming=ctx.streaming,
                          max_files_per_trigger=ctx.max_files_per_trigger, keep_header=keep_header,
                          parser=parser, files=ctx.files)


def is_blank(raw: Sql) -> Sql:
    return f"(trim(BOTH {lit(' ' + chr(9) + chr(13) + chr(10))} FROM {raw}) = '')"


# --------------------------------------------------------------------------- variant helpers


def json_path(name: str) -> str:
    """A ``variant_get`` path selecting the key ``name`` (JSON keys are case-sensitive)."""
    if _IDENT.match(name):
        return f"$.{name}"
    if "'" not in name:
        return f"$['{name}']"
    if '"' not in name:
        return f'$["{name}"]'
    raise ValueError(f"column name {name!r} contains both quote characters; it cannot be read from JSON")


def field(v: Sql, path: str) -> Sql:
    """The sub-variant at ``path`` (SQL NULL if absent; a variant null if JSON null)."""
    return f"variant_get({v}, {lit(path)}, 'variant')"


def get_as(v: Sql, path: str, sql_type: str) -> Sql:
    """The value at ``path`` cast to ``sql_type``; NULL if absent or not convertible."""
    return f"try_variant_get({v}, {lit(path)}, {lit(sql_type)})"


def present(v: Sql) -> Sql:
    """``v`` exists and is not JSON null."""
    return f"({v} IS NOT NULL AND NOT is_variant_null({v}))"


def is_object(v: Sql) -> Sql:
    return f"(try_variant_get({v}, '$', 'struct<>') IS NOT NULL)"


def clip(text: Sql) -> Sql:
    """``text`` cut to a readable length for messages."""
    return f"regexp_replace({text}, {lit('^(.{%d}).+$' % _SNIPPET_CHARS)}, '$1...')"


def json_text(v: Sql) -> Sql:
    """The JSON text of a variant value, clipped for messages."""
    return clip(f"to_json({v})")


def type_label(dtype: T.DataType) -> str:
    return dtype.simpleString().upper() if _is_atomic(dtype) else dtype.simpleString()


def _is_atomic(dtype: T.DataType) -> bool:
    return not isinstance(dtype, (T.StructType, T.ArrayType, T.MapType))


#: a JSON string, or a bare non-numeric number (Jackson's ALLOW_NON_NUMERIC_NUMBERS)
_STRING_OR_NON_NUMERIC = r'("(?:[^"\\]|\\.)*")|([+-]?Infinity|NaN)'
_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)


def exact_decimal(dtype: T.DecimalType) -> str:
    """The widest DECIMAL with ``dtype``'s integer digits: a value converted to
    both is exact in ``dtype`` when the two are equal (docs/semantics.md,
    section 1: a value is never rounded or truncated to fit its column)."""
    return f"decimal(38,{38 - (dtype.precision - dtype.scale)})"


def coerce_variant(v: Sql, dtype: T.DataType) -> Sql:
    """``v`` (a variant) converted to ``dtype``; NULL when absent, null or not
    convertible, and when the conversion would change the value: a fraction
    or a boolean into an integer column, more digits than a DECIMAL column
    holds (Spark's cast would truncate or round them)."""
    target = lit(dtype.simpleString())
    if isinstance(dtype, _TEMPORAL):
        return f"CASE WHEN schema_of_variant({v}) = 'STRING' THEN try_variant_get({v}, '$', {target}) END"
    if isinstance(dtype, T.BinaryType):
        return (f"CASE WHEN schema_of_variant({v}) = 'STRING' "
                f"THEN try_to_binary(try_variant_get({v}, '$', 'string'), 'base64') END")
    value = f"try_variant_get({v}, '$', {target})"
    if isinstance(dtype, _INTEGRAL):
        # the DOUBLE reading equals the integer unless a fraction was cut (a
        # DOUBLE is exact up to 2^53); the (rare) 0 and 1 are checked for a
        # JSON boolean.  A fraction below the DOUBLE's precision
        # (1.0000000000000000001, 9007199254740993.5) is seen in the variant's
        # type: parse_json keeps a number of up to 38 digits as a DECIMAL with
        # its trailing zeros stripped (50.0 is DECIMAL(2,0)), so a scale
        # other than 0 is a fraction.  No DECIMAL reading here: at 19+ digits
        # Spark allocates a BigDecimal per value, which doubled the VARIANT
        # path's time
        double = f"try_variant_get({v}, '$', 'double')"
        schema = f"schema_of_variant({v})"
        return (f"CASE WHEN ({double} = {value} OR abs({value}) > {1 << 53}) AND "
                f"({value} NOT IN (0, 1) OR {schema} <> 'BOOLEAN') AND "
                f"({schema} NOT LIKE 'DECIMAL(%' OR {schema} LIKE '%,0)') THEN {value} END")
    if isinstance(dtype, T.DecimalType):
        return f"CASE WHEN try_variant_get({v}, '$', {lit(exact_decimal(dtype))}) = {value} THEN {value} END"
    return value


def coerce_string(text: Sql, dtype: T.DataType) -> Sql:
    """A string field (CSV) converted to ``dtype``; NULL when not convertible
    or when the conversion would change the value (:func:`coerce_variant`)."""
    if isinstance(dtype, T.StringType):
        return text
    if isinstance(dtype, T.BinaryType):
        return f"try_to_binary({text}, 'base64')"
    if isinstance(dtype, T.DecimalType):
        value = f"try_cast({text} AS {dtype.simpleString()})"
        return f"CASE WHEN try_cast({text} AS {exact_decimal(dtype)}) = {value} THEN {value} END"
    if _is_atomic(dtype):
        return f"try_cast({text} AS {dtype.simpleString()})"
    return f"try_variant_get(try_parse_json({text}), '$', {lit(dtype.simpleString())})"


def parse_variant(raw: Sql, options: FormatOptions) -> Sql:
    """``raw`` parsed into a VARIANT (NULL when it is not JSON).  With
    ``allow_non_numeric_numbers`` a line that does not parse is parsed again
    with its bare ``NaN``/``Infinity`` tokens quoted (a string ``"NaN"``
    converts to the DOUBLE NaN); strings are matched whole so that text
    inside them is left alone, and U+0001 (never raw in valid JSON) marks
    the tokens between the two replacements."""
    parsed = f"try_parse_json({raw})"
    if not options.allow_non_numeric_numbers:
        return parsed
    mark = chr(1)
    marked = f"regexp_replace({raw}, {lit(_STRING_OR_NON_NUMERIC)}, {lit('$1' + mark + '$2' + mark)})"
    token, as_string = lit(mark + "([^" + mark + "]*)" + mark), lit('"$1"')
    quoted = f"regexp_replace(regexp_replace({marked}, {lit(mark * 2)}, ''), {token}, {as_string})"
    return f"coalesce({parsed}, try_parse_json({quoted}))"


def include_filter(options: FormatOptions, database: Sql, table: Sql, prefix: str) -> tuple[Sql, Sql]:
    """(excluded, reason) of the ``<prefix>.database.include`` and
    ``<prefix>.table.include`` options: a record whose database or table
    (strings, NULL when absent) the pattern does not match whole is
    excluded (Flink: ``Pattern.matcher(...).matches()``)."""
    checks = []
    for value, pattern, what in ((database, options.database_include, "database"),
                                 (table, options.table_include, "table")):
        if pattern is not None:
            full = lit(r"\A(?:" + pattern + r")\z")
            checks.append((f"NOT coalesce({value} RLIKE {full}, false)",
                           concat(lit(f"{what} "), f"coalesce(concat({lit(chr(39))}, {value}, {lit(chr(39))}), '(none)')",
                                  lit(f" not included by '{prefix}.{what}.include' = '{pattern}'"))))
    if not checks:
        return "false", "CAST(NULL AS STRING)"
    return any_of(*[c for c, _ in checks]), when(*checks)


EMPTY_MESSAGES: Sql = "CAST(array() AS ARRAY<STRING>)"


def raw_struct(get: Callable[[str], Sql], columns: Sequence[str]) -> Sql:
    """The fields ``get(name)`` of one image, unconverted: variants (JSON formats)
    or strings (CSV).  Stage it as a column; :func:`typed_struct` converts it and
    :func:`image_errors` checks it, both by field reference."""
    return "named_struct(" + ", ".join(f"{lit(c)}, {get(c)}" for c in columns) + ")"


def typed_struct(raw: Sql, schema: T.StructType, *, strings: bool = False,
                 metadata: Optional[Mapping[str, Sql]] = None,
                 convert: Optional[Callable[[Sql, T.DataType, str], Optional[Sql]]] = None) -> Sql:
    """The staged :func:`raw_struct` ``raw`` converted to the schema types;
    ``metadata``: column -> value of the ``METADATA`` columns (not in ``raw``);
    ``convert(value, type, column)``: a format's own conversion (None: the
    plain one)."""
    metadata = metadata or {}

    def value(f: T.StructField) -> Sql:
        if f.name in metadata:
            return f"CAST({metadata[f.name]} AS {f.dataType.simpleString()})"
        v = struct_field(raw, f.name)
        own = convert(v, f.dataType, f.name) if convert is not None else None
        return own if own is not None else (coerce_string if strings else coerce_variant)(v, f.dataType)

    return "named_struct(" + ", ".join(f"{lit(f.name)}, {value(f)}" for f in schema.fields) + ")"


def metadata_columns(ctx: "ReadContext", values: Mapping[str, Sql]) -> dict[str, Sql]:
    """column -> SQL value of the ``METADATA FROM`` columns, from the format's
    ``values`` (metadata key -> SQL over the record) and, for a DataFrame
    source, the Kafka record's fields (``connectors.kafka``)."""
    from spark_changelog.connectors.kafka import KAFKA_METADATA
    values = {**values, **{k: column for k, (_, column) in KAFKA_METADATA.items()}}
    return {column: values[key] for column, key in ctx.options.metadata}


def timestamp_ms(ms: Sql) -> Sql:
    """An epoch-millisecond number as a TIMESTAMP (Flink's TIMESTAMP_LTZ(3))."""
    return f"timestamp_millis({ms})"


def overlay_struct(old_raw: Sql, data_raw: Sql, columns: Sequence[str]) -> Sql:
    """The raw before image of an update (Canal, Maxwell): ``old`` holds the old
    values of the changed columns only, the other columns are as in ``data``.
    (A key present in ``old`` with a JSON null is a variant null, not SQL NULL.)"""
    return "named_struct(" + ", ".join(
        f"{lit(c)}, coalesce({struct_field(old_raw, c)}, {struct_field(data_raw, c)})" for c in columns) + ")"


def struct_field(struct: Sql, name: str) -> Sql:
    return f"{struct}.{ident(name)}"


def type_article(dtype: T.DataType) -> str:
    """``an INT``, ``a BIGINT``: the type's Flink name with its article."""
    label = type_label(dtype)
    return f"{'an' if label[0] in 'AEIOU' else 'a'} {label}"


def _type_text(dtype: T.DataType) -> str:
    hint = " (expected an ISO-8601 string)" if isinstance(dtype, _TEMPORAL) else ""
    return type_article(dtype) + hint


def image_errors(raw: Sql, typed: Sql, schema: T.StructType, primary_key: Sequence[str], where: Sql,
                 *, strings: bool = False, pk_null_only: bool = False) -> Sql:
    """The messages (``array<string>``) of one image.

    ``raw`` and ``typed`` are the staged :func:`raw_struct` and
    :func:`typed_struct` of the image; ``where`` is a string expression naming
    it (``'after'``, ``data[0]``).  Messages: a present value that did not convert
    (``field 'price': value "abc" is not a DOUBLE (in 'after')``) and a missing or
    null primary-key column.  With ``pk_null_only`` a key column only fails when
    present as JSON null (``old`` objects list changed columns only).
    """
    here = (lambda c: f"{struct_field(raw, c)} IS NOT NULL") if strings \
        else (lambda c: present(struct_field(raw, c)))
    shown = (lambda c: concat("'\"'", struct_field(raw, c), "'\"'")) if strings \
        else (lambda c: f"to_json({struct_field(raw, c)})")
    bad = ", ".join(
        f"CASE WHEN {here(f.name)} AND {struct_field(typed, f.name)} IS NULL THEN named_struct("
        f"'f', {lit(f.name)}, 'v', {shown(f.name)}, 't', {lit(_type_text(f.dataType))}) END"
        for f in schema.fields)
    messages = (f"transform(filter(array({bad}), e -> e IS NOT NULL), e -> concat('field \\'', e.f, "
                f"'\\': value ', {clip('e.v')}, ' is not ', e.t, ' (in ', {where}, ')'))")
    if not primary_key:
        return messages
    if pk_null_only:
        missing = [f"CASE WHEN is_variant_null({struct_field(raw, k)}) THEN {lit(k)} END" for k in primary_key]
    else:
        missing = [f"CASE WHEN NOT ({here(k)}) THEN {lit(k)} END" for k in primary_key]
    keys = (f"transform(filter(array({', '.join(missing)}), k -> k IS NOT NULL), k -> concat('field \\'', k, "
            f"'\\': primary key is missing or null (in ', {where}, ')'))")
    return f"concat({messages}, {keys})"


def change_row(struct: Sql, columns: Sequence[str], kind: Union[int, Sql], seq: Sql) -> Sql:
    """One element of ``_changes``: the user columns of ``struct``, ``_kind`` and ``_seq``."""
    return change_row_of([(c, struct_field(struct, c)) for c in columns], kind, seq)


def change_row_of(values: Sequence[tuple[str, Sql]], kind: Union[int, Sql], seq: Sql) -> Sql:
    """One element of ``_changes`` from (user column, value) pairs in schema order."""
    named = ", ".join(f"{lit(c)}, {v}" for c, v in values)
    return (f"named_struct({named}, {lit(KIND_COL)}, CAST({kind} AS TINYINT), {lit(SEQ_COL)}, "
            f"CAST({seq} AS BIGINT), {lit(SIDE_COL)}, CAST(NULL AS STRING))")


def key_changed(before: Sql, after: Sql, key: Sequence[str]) -> Sql:
    """True when a primary-key column differs between the two typed images."""
    if not key:
        return "false"
    return any_of(*[f"NOT ({struct_field(before, k)} <=> {struct_field(after, k)})" for k in key])


def errors_array(candidates: Iterable[Sql]) -> Sql:
    """The non-NULL messages among ``candidates`` (each a message or NULL), in order."""
    cands = [f"CAST({c} AS STRING)" for c in candidates]
    if not cands:
        return EMPTY_MESSAGES
    return f"filter(array({', '.join(cands)}), m -> m IS NOT NULL)"


def concat_messages(*arrays: Sql) -> Sql:
    """Message arrays joined in order; a NULL array counts as empty."""
    return "concat(" + ", ".join(f"coalesce({a}, {EMPTY_MESSAGES})" for a in arrays) + ")"


def gate(condition: Sql, messages: Sql) -> Sql:
    """``messages`` when ``condition`` holds, else NULL (empty for :func:`concat_messages`)."""
    return f"CASE WHEN {condition} THEN {messages} END"


def first_error(candidates: Iterable[Sql]) -> Sql:
    """The first non-NULL message among ``candidates``, or NULL."""
    return f"coalesce({', '.join(f'CAST({c} AS STRING)' for c in candidates)})"


def number(v: Sql, path: str, label: str) -> tuple[Sql, Sql]:
    """A bigint field of a variant: (value or NULL, error when present but not a number)."""
    raw = field(v, path)
    value = get_as(v, path, "bigint")
    error = (f"CASE WHEN {present(raw)} AND {value} IS NULL THEN "
             f"{concat(lit(f'field {label!r}: value '), json_text(raw), lit(' is not a BIGINT'))} END")
    return value, error


# --------------------------------------------------------------------------- _seq encoding


def pack_position(parts: Sequence[tuple[Sql, int, Optional[str]]]) -> tuple[Sql, Sql]:
    """Pack ``(value, bits, label)`` parts, most significant first, into one bigint.

    ``label`` None: the part is clamped to ``[0, 2**bits - 1]``.  Otherwise the part
    is range-checked: outside ``[0, 2**bits)`` (or NULL) the position is NULL and
    the error names ``label``.  Values should be column references (each is used
    several times).  The widths must sum to at most 62.
    """
    total = sum(bits for _, bits, _ in parts)
    if total > POSITION_BITS:
        raise ValueError(f"position parts use {total} bits, more than {POSITION_BITS}")
    shift = total
    terms: list[Sql] = []
    checks: list[tuple[Sql, Sql]] = []
    for value, bits, label in parts:
        shift -= bits
        limit = 1 << bits
        v = f"CAST({value} AS BIGINT)"
        if label is None:
            v = f"least(greatest({v}, 0), {limit - 1})"
        else:
            bad = f"({v} IS NULL OR {v} < 0 OR {v} >= {limit})"
            message = concat(lit(f"field '{label}': value "), f"coalesce(CAST({v} AS STRING), '(unreadable)')",
                             lit(f" is outside the range of the _seq encoding (0 <= value < 2^{bits})"))
            checks.append((bad, message))
        terms.append(f"shiftleft({v}, {shift})" if shift else v)
    position = " + ".join(terms)
    if not checks:
        return f"({position})", "CAST(NULL AS STRING)"
    ok = " AND ".join(f"NOT {bad}" for bad, _ in checks)
    return f"CASE WHEN {ok} THEN {position} END", when(*checks)


def choose_position(alternatives: Sequence[tuple[Sql, tuple[Sql, Sql]]],
                    fallback: tuple[Sql, Sql]) -> tuple[Sql, Sql]:
    """The position of the first alternative whose condition holds, else ``fallback``."""
    if not alternatives:
        return fallback
    pos = when(*[(cond, p) for cond, (p, _) in alternatives], otherwise=fallback[0])
    err = when(*[(cond, e) for cond, (_, e) in alternatives], otherwise=fallback[1])
    return pos, err


def seq_of(position: Sql, phase: int) -> Sql:
    """``position * 2 + phase``; ``position`` < 2^62 so this never overflows."""
    return f"(shiftleft({position}, 1) + {phase})"


def file_number(path: Sql) -> Sql:
    """The last run of digits in the file name without extensions (0 if none).

    Values that cannot fit are returned as 2^62 so that range checks reject them.
    """
    base = f"regexp_extract({path}, {lit(_BASENAME)}, 1)"
    stem = f"regexp_replace({base}, {lit(_EXTENSIONS)}, '')"
    return digits_number(f"regexp_extract({stem}, {lit(_LAST_DIGITS)}, 1)")


def digits_number(digits: Sql) -> Sql:
    """A string of decimal digits as bigint: '' or NULL -> 0, too long -> 2^62 (out of range)."""
    trimmed = f"regexp_replace({digits}, {lit(_LEADING_ZEROS)}, '')"
    return (f"CAST(CASE WHEN coalesce({digits}, '') = '' THEN 0 "
            f"WHEN length({trimmed}) > {_ROW_LIMIT_DIGITS} THEN {1 << 62} "
            f"ELSE try_cast({trimmed} AS BIGINT) END AS BIGINT)")


#: the same rule as ``lines.file_number`` (Parquet changelog files are listed by Spark)
_BASENAME = r"([^/]*)$"
_EXTENSIONS = r"(\.[A-Za-z][A-Za-z0-9]*)+$"
_LAST_DIGITS = r"(\d+)\D*$"
_LEADING_ZEROS = r"^0+(?=\d)"


def fallback_position(file_no: Sql = "file_no", line: Sql = "line") -> tuple[Sql, Sql]:
    """File number (34 bits) | line (28 bits, clamped)."""
    return pack_position([(file_no, FILE_NO_BITS, "file name number"), (line, FILE_LINE_BITS, None)])


# --------------------------------------------------------------------------- assembling the result


TOMBSTONE_REASON = "Kafka tombstone (empty or null value)"


def finished_line(columns: Sequence[str]) -> dict[str, Sql]:
    """The per-line columns (``_changes``, ``_errors``, skips) of a line the
    line task finished: its change row from ``_j_0``..., ``_j_kind`` and
    ``_j_seq``; no error, no skip."""
    values = [(c, f"_j_{i}") for i, c in enumerate(columns)]
    return {"_changes": f"array({change_row_of(values, '_j_kind', '_j_seq')})", "_errors": EMPTY_MESSAGES,
            "_skip_category": "CAST(NULL AS STRING)", "_skip_reason": "CAST(NULL AS STRING)"}


def packed_columns(df: DataFrame) -> list[str]:
    """The line task's packed-row columns present in ``df``
    (:meth:`ReadResult.packed_rows`): every step up to :func:`finish` keeps them."""
    return [c for c in (PACKED_GROUP_COL, PACKED_ROWS_COL) if c in df.columns]


def skip_columns(tombstone: Sql, ignored: Sql = "false", ignored_reason: Sql = "NULL",
                 tombstone_reason: str = TOMBSTONE_REASON) -> list[Sql]:
    """``_skip_category`` and ``_skip_reason`` select items from the skip conditions."""
    category, reason = skip_values(tombstone, ignored, ignored_reason, tombstone_reason)
    return [f"{category} AS _skip_category", f"{reason} AS _skip_reason"]


def skip_values(tombstone: Sql, ignored: Sql = "false", ignored_reason: Sql = "NULL",
                tombstone_reason: str = TOMBSTONE_REASON) -> tuple[Sql, Sql]:
    """The ``_skip_category`` and ``_skip_reason`` expressions of :func:`skip_columns`."""
    category = when((tombstone, lit(SKIP_TOMBSTONE)), (ignored, lit(SKIP_IGNORED)))
    reason = when((tombstone, lit(tombstone_reason)), (ignored, f"CAST({ignored_reason} AS STRING)"))
    return category, reason


def side_row(schema: T.StructType, payload: Sql) -> Sql:
    """A side row (``_kind = -1``, ``_metrics`` = JSON ``payload``, every user
    column NULL) shaped like :func:`change_row`."""
    values = ", ".join(f"{lit(f.name)}, CAST(NULL AS {f.dataType.simpleString()})" for f in schema.fields)
    return (f"named_struct({values}, {lit(KIND_COL)}, CAST({SIDE_KIND} AS TINYINT), {lit(SEQ_COL)}, "
            f"CAST(NULL AS BIGINT), {lit(SIDE_COL)}, to_json({payload}))")


def finish(parsed: DataFrame, ctx: ReadContext) -> ReadResult:
    """Turn a format module's per-line frame into the one-pass row stream.

    ``parsed`` has ``file``, ``line`` (bigint), ``raw``, ``_changes`` (array of
    :func:`change_row` structs in schema order, or NULL), ``_errors`` (array of
    messages, never NULL) and ``_skip_category``/``_skip_reason``.  A skipped
    line is never invalid; a line with errors emits no change.

    Every line becomes its change rows, or one side row (``_kind = -1``) whose
    ``_metrics`` payload is ``{"dead_letter": {raw, file, line, reason}}`` or
    ``{"skipped": {raw, file, line, category, reason}}``: one generator over
    one projection, so each line is parsed once and good rows and dead
    letters leave the same pass (``ReadResult.rows``).
    """
    bad = "(_skip_category IS NULL AND size(_errors) > 0)"
    reason = "array_join(_errors, '; ')"
    # ``ignored``: the format's ignore-parse-errors option (format_options):
    # the run goes on without a dead-letter directory
    tolerated = ", 'ignored', true" if ctx.options.ignore_parse_errors else ""
    dead = side_row(ctx.schema, f"named_struct('{DEAD_LETTER}', named_struct('raw', raw, 'file', file, "
                                f"'line', line, 'reason', {reason}{tolerated}))")
    skip = side_row(ctx.schema, f"named_struct('{SKIPPED}', named_struct('raw', raw, 'file', file, "
                                f"'line', line, 'category', _skip_category, 'reason', _skip_reason))")
    rows = parsed.selectExpr(
        f"inline(CASE WHEN _skip_category IS NOT NULL THEN array({skip}) "
        f"WHEN {bad} THEN array({dead}) ELSE _changes END)", *packed_columns(parsed))
    return _result(rows, ctx)


def _result(rows: Optional[DataFrame], ctx: ReadContext) -> ReadResult:
    key = ctx.primary_key
    # plain rows (a changelog file format without a kind column) are inserts
    plain = ctx.format == "changelog" and ctx.kind_column is None
    stream_schema = StreamSchema(columns=tuple(ctx.columns), primary_key=key,
                                 upsert_key=key if key else None,
                                 mode=ChangelogMode.INSERT_ONLY if plain else ChangelogMode.RETRACT)
    return ReadResult(rows, stream_schema=stream_schema, format=ctx.format, streaming=ctx.streaming,
                      fail_on_invalid=ctx.streaming and ctx.strict)


def rows_schema(ctx: ReadContext) -> T.StructType:
    """The Spark schema of :func:`finish`'s rows for a read whose columns
    all have the line task's fast types (the reads built when first used,
    :class:`ReadResult`): the user columns, ``_kind`` (tinyint), ``_seq``
    (bigint) and ``_metrics`` (string), every one nullable, as Spark
    derives it from the generator's structs
    (tests/connectors/test_read_plan.py compares the two)."""
    fields = [T.StructField(f.name, f.dataType, True) for f in ctx.schema.fields]
    return T.StructType(fields + [T.StructField(KIND_COL, T.ByteType(), True),
                                  T.StructField(SEQ_COL, T.LongType(), True),
                                  T.StructField(SIDE_COL, T.StringType(), True)])


def read_with(module_name: str, spark: SparkSession, path, schema, primary_key, **kw) -> ReadResult:
    """Shared body of the ``read_<format>`` convenience wrappers."""
    fmt = {v: k for k, v in FORMATS.items()}[module_name]
    return read_changes(spark, path, format=fmt, schema=schema, primary_key=primary_key, **kw)
