"""A ``CREATE TABLE`` with a ``filesystem`` connector read as a source
(docs/sql.md, "Connectors (`WITH` options)"): the CDC reader, the
changelog-file reader or plain rows (:func:`operation_column`), with the
table's schema and primary key, then its computed columns (``PROCTIME()`` is
``current_timestamp()``, marked non-deterministic), then its watermark
(``bound = delay - 1 ms``, :mod:`.script`).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from ..api import read_changes, read_postgres_cdc
from ..connectors.cdc_json import InvalidChangeError
from .context import Context
from .errors import UnsupportedFeature
from .relation import Field, Relation
from .script import ColumnDef, Connector, Position, TableDef, node_position


def operation_column(c: Connector) -> Optional[str]:
    """The column holding each row's operation (``+I``, ``-U``, ...) of a
    ``json``/``csv``/``parquet``/``avro`` table, or None: plain rows, every
    one an insert, as Flink reads these formats.  A table is a changelog when
    it names the column (``'changelog.kind-column'``), or names a sequence
    column or a ``'changelog.mode'`` with updates (then the column is ``op``)."""
    named = c.option("changelog.kind-column")
    if named is not None:
        return named
    mode = c.option("changelog.mode", "insert-only").lower()
    if c.option("changelog.seq-column") is not None or mode != "insert-only":
        return "op"
    return None


def read_source(ctx: Context, t: TableDef, pos: Position, operation: Optional[str] = None,
                op_mapping: Optional[tuple] = None) -> Relation:
    """The table's relation; ``operation``: read the plain-file table as a
    changelog whose operation is that column (``FROM_CHANGELOG``, which
    removes it from the columns), its codes ``op_mapping`` ((code, RowKind)
    pairs; None: the usual spellings)."""
    c = t.connector
    if c.kind == "postgres-cdc":
        return _with_computed_columns(ctx, t, pos, _read_postgres_cdc(ctx, t))
    if c.kind not in ("filesystem", "kafka"):
        raise ctx.error(f"table {t.name} (connector {c.kind!r}) cannot be read: "
                        "sources are 'filesystem' and 'kafka' tables", pos, UnsupportedFeature)
    if operation is not None:
        t = dataclasses.replace(t, columns=tuple(col for col in t.columns
                                                 if col.name != operation))
    path = c.path
    hidden = None
    if c.kind == "kafka" and t.watermark is not None and t.kafka_partition_column is None:
        t, c, hidden = _with_hidden_partition(t)
    if c.kind == "kafka":
        from ..connectors import kafka
        try:
            path = kafka.kafka_frame(ctx.spark, dict(c.options), ctx.streaming)
        except (kafka.KafkaUnavailable, ValueError) as e:
            raise ctx.error(f"table {t.name}: {e}", t.position) from None
    kw = {"options": c.format_options}
    if c.reader_format == "changelog":
        kw.update(changelog_file_format=c.changelog_file_format,
                  kind_column=operation or operation_column(c),
                  seq_column=c.option("changelog.seq-column"))
        if op_mapping is not None:
            kw["op_mapping"] = dict(op_mapping)
        csv = {k.split(".", 1)[1]: v for k, v in c.options if k.startswith("csv.")}
        names = {"field-delimiter": "sep", "quote-character": "quote",
                 "escape-character": "escape"}
        if csv:
            kw["csv_options"] = {names[k]: v for k, v in csv.items()}
    kw["ordered"] = c.option("source.ordered", "false").lower() == "true"
    mode = c.option("changelog.mode", "all").lower()
    modes = {"all": None, "insert-only": "insert-only", "upsert": "upsert"}
    if mode not in modes:
        raise ctx.error(f"table {t.name}: 'changelog.mode' is 'all' (default), "
                        f"'insert-only' or 'upsert', got {mode!r}", t.position)
    kw["mode"] = modes[mode]
    files = c.option("source.max-files-per-trigger")
    max_files = int(files) if files else ctx.max_files_per_trigger
    try:
        stream = read_changes(ctx.spark, path, format=c.reader_format,
                              schema=t.schema_ddl(), primary_key=t.primary_key or None,
                              streaming=ctx.streaming, strict=ctx.strict,
                              max_files_per_trigger=max_files, name=t.name, **kw)
    except ValueError as e:
        if isinstance(e, InvalidChangeError):   # bad input (strict), not a script error
            raise
        raise ctx.error(f"table {t.name}: {e}", t.position) from None
    return _with_computed_columns(ctx, t, pos, stream, hidden)


#: the hidden column of a Kafka table's partition (:func:`_with_hidden_partition`)
HIDDEN_PARTITION = "__kafka_partition"


def _with_hidden_partition(t: TableDef) -> tuple[TableDef, Connector, str]:
    """A Kafka table with a watermark but no ``METADATA FROM 'partition'``
    column reads the partition anyway, as a hidden column: each Kafka
    partition generates its own watermark and idles on its own, as Flink's
    Kafka source does by default (docs/sql.md, "Kafka and other streams").
    The column is projected away right after the watermark."""
    from ..connectors.kafka import KAFKA_METADATA
    if HIDDEN_PARTITION in t.column_names:
        raise ValueError(f"table {t.name}: the column name {HIDDEN_PARTITION!r} is reserved")
    flink_type = KAFKA_METADATA["partition"][0]
    col = ColumnDef(HIDDEN_PARTITION, flink_type, flink_type, metadata_key="partition")
    fo = t.connector.format_options
    c = dataclasses.replace(t.connector, format_options=dataclasses.replace(
        fo, metadata=fo.metadata + ((HIDDEN_PARTITION, "partition"),)))
    return dataclasses.replace(t, columns=t.columns + (col,), connector=c), c, HIDDEN_PARTITION


def _read_postgres_cdc(ctx: Context, t: TableDef):
    """A ``postgres-cdc`` table (docs/sources.md, "PostgreSQL CDC"): the declared
    columns must be columns of the PostgreSQL table with the Spark type its
    catalog gives, and the declared primary key must be the table's."""
    from ..connectors.postgres_cdc import PostgresCdcError
    if not ctx.streaming:
        raise ctx.error(f"table {t.name}: 'postgres-cdc' is a streaming source; run the script "
                        "streaming (without --batch / execution.runtime-mode = batch)", t.position)
    opts = dict(t.connector.options)
    try:
        stream = read_postgres_cdc(ctx.spark, opts.pop("table-name", None), **{
            "hostname": opts.pop("hostname", None), "username": opts.pop("username", None),
            "database_name": opts.pop("database-name", None), "slot_name": opts.pop("slot.name", None),
            "name": t.name}, **opts)
    except (PostgresCdcError, TypeError) as e:
        raise ctx.error(f"table {t.name}: {e}", t.position) from None
    from pyspark.sql.types import _parse_datatype_string
    catalog = {c: stream.df.schema[c].dataType for c in stream.traits.columns}
    for col in t.physical_columns:
        if col.name not in catalog:
            raise ctx.error(f"table {t.name}: column {col.name!r} is not a column of the PostgreSQL "
                            f"table (it has {list(catalog)})", t.position)
        if col.spark_type and _parse_datatype_string(col.spark_type) != catalog[col.name]:
            raise ctx.error(f"table {t.name}: column {col.name!r} is declared {col.spark_type} "
                            f"but PostgreSQL's type maps to "
                            f"{catalog[col.name].simpleString().upper()}", t.position)
    if t.primary_key and tuple(t.primary_key) != tuple(stream.traits.primary_key):
        raise ctx.error(f"table {t.name}: PRIMARY KEY ({', '.join(t.primary_key)}) is not the "
                        f"PostgreSQL table's ({', '.join(stream.traits.primary_key)})", t.position)
    names = [col.name for col in t.physical_columns]
    return stream if names == list(catalog) else stream.select(*names)


def _with_computed_columns(ctx: Context, t: TableDef, pos: Position, stream,
                           hidden: Optional[str] = None) -> Relation:
    """The table's columns, computed ones added, then its watermark;
    ``hidden``: a column read for the watermark's partitions only."""
    fields = [Field(t.name, col.name, col.name) for col in t.physical_columns]
    rel = Relation(stream, tuple(fields))
    for col in t.columns:
        if not col.computed:
            continue
        if col.proctime:
            stream = rel.stream.with_column(col.name, "current_timestamp()", deterministic=False)
        else:
            expr = ctx.spark_sql(col.expression, rel, pos)
            with ctx.analysis(f"computed column {col.name}", [col.expression],
                              node_position(col.expression, pos)):
                stream = rel.stream.with_column(col.name, expr)
        rel = Relation(stream, rel.fields + (Field(t.name, col.name, col.name,
                                                   proctime=col.proctime),))
    order = tuple(col.name for col in t.columns)
    if tuple(rel.stream.schema.columns) != order:
        rel = Relation(rel.stream.select(*order), tuple(Field(t.name, n, n) for n in order))
    if t.watermark is not None:
        # a Kafka table's partitions each generate their own watermark, as
        # Flink's Kafka source does (docs/sql.md, "Kafka and other streams")
        partition = t.kafka_partition_column if t.connector.kind == "kafka" else None
        idle = t.connector.idle_timeout_ms
        if idle is None:
            idle = ctx.settings.idle_timeout_ms
        rel = Relation(rel.stream.with_watermark(t.watermark.column, t.watermark.bound_ms,
                                                 partition=partition, idle_timeout=idle),
                       rel.fields)
    if hidden is not None:
        fields = tuple(f for f in rel.fields if f.name != hidden)
        rel = Relation(rel.stream.select(*(f.column for f in fields)), fields)
    return rel


__all__ = ["read_source"]
