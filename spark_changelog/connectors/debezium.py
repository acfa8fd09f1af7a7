"""Debezium JSON change events (docs/semantics.md, sections 1-2; shared parsing in ``cdc_json``).

One JSON object per line, either the plain envelope
``{"before": {...}, "after": {...}, "op": "u", "source": {...}, "ts_ms": ...}`` or,
with Kafka Connect's ``schemas.enable=true``, ``{"schema": {...}, "payload":
<envelope>}``.

=====  ===============================================================
op     rows
=====  ===============================================================
c, r   ``+I`` after  (``r`` = snapshot read)
u      ``-U`` before, ``+U`` after; when a primary-key column differs between
       the images: ``-D`` before, ``+I`` after
d      ``-D`` before
=====  ===============================================================

Skipped: Kafka tombstones (empty line, ``null``, ``{"schema":null,"payload":null}``),
logical-decoding messages (``op = m``) and schema-change events (no ``op``, a
``ddl`` field).  Invalid: malformed JSON, missing or unknown ``op``, truncate
(``op = t``: it removes every row, which row changes cannot express), ``after``
missing on c/r/u, ``before`` missing on u/d (for PostgreSQL set ``REPLICA IDENTITY
FULL``, as Flink also requires), wrong-typed fields, missing/null primary key,
unreadable or out-of-range positions.

``debezium-json.database.include`` and ``debezium-json.table.include`` (ours,
as Canal's in Flink) skip the events of other ``source.db``/``source.table``
(category ``ignored``); every key of :func:`metadata` can fill a ``METADATA
FROM`` column (``format_options``).  Either takes the VARIANT path for every
line.

DECIMAL, DATE and TIMESTAMP columns read Debezium's encodings (base64
decimals, days, epoch numbers) by the envelope's schema or the declared type
(:mod:`debezium_types`).

``_seq`` (module docstring of ``cdc_json``): ``source.lsn``; else MySQL
``source.file`` suffix and ``source.pos + source.row``; else ``ts_ms`` (then
``source.ts_ms``) with the line; else the file number with the line.
"""
from __future__ import annotations

from typing import Callable, Optional

from pyspark.sql import DataFrame
from pyspark.sql import types as T

from spark_changelog.connectors import cdc_json as C
from spark_changelog.connectors import debezium_types as DT
from spark_changelog.connectors.cdc_json import Sql, all_of, concat, lit, when

OPS = ("c", "r", "u", "d")
#: column types whose conversion by Arrow's JSON reader (strict: no conversion at all) the
#: variant path agrees with
FAST_TYPES = (T.BooleanType, T.IntegerType, T.LongType, T.DoubleType, T.StringType)
IGNORED_OPS = ("m",)


def read_debezium(spark, path, schema, primary_key=None, **kw) -> C.ReadResult:
    """``read_changes(..., format="debezium-json")``."""
    return C.read_with("debezium", spark, path, schema, primary_key, **kw)


def metadata(v: Sql, env: Sql) -> dict[str, Sql]:
    """Flink's Debezium metadata keys -> SQL over the line ``v`` and its
    envelope ``env`` (the payload when the schema is included)."""
    schema = C.field(v, "$.schema")
    return {
        "schema": f"CASE WHEN {C.present(schema)} THEN to_json({schema}) END",
        "ingestion-timestamp": C.timestamp_ms(C.get_as(env, "$.ts_ms", "bigint")),
        "source.timestamp": C.timestamp_ms(C.get_as(env, "$.source.ts_ms", "bigint")),
        "source.database": C.get_as(env, "$.source.db", "string"),
        "source.schema": C.get_as(env, "$.source.schema", "string"),
        "source.table": f"coalesce({C.get_as(env, '$.source.table', 'string')}, "
                        f"{C.get_as(env, '$.source.collection', 'string')})",
        "source.properties": C.get_as(env, "$.source", "map<string,string>"),
    }


def position_inputs(env: Sql) -> dict[str, Sql]:
    """Stage columns the ``_seq`` position is built from, and their read errors."""
    lsn, lsn_err = C.number(env, "$.source.lsn", "source.lsn")
    pos, pos_err = C.number(env, "$.source.pos", "source.pos")
    row, row_err = C.number(env, "$.source.row", "source.row")
    ts, ts_err = C.number(env, "$.ts_ms", "ts_ms")
    src_ts, src_ts_err = C.number(env, "$.source.ts_ms", "source.ts_ms")
    binlog = C.get_as(env, "$.source.file", "string")
    suffix, ends_in_digit = lit(r"(\d+)$"), lit(r"\d$")
    return {
        "_lsn": lsn,
        "_binlog_no": C.digits_number(f"regexp_extract({binlog}, {suffix}, 1)"),
        "_has_binlog": all_of(f"coalesce({binlog}, '') RLIKE {ends_in_digit}", f"{pos} IS NOT NULL"),
        "_binlog_offset": f"try_add({pos}, coalesce({row}, 0))",
        "_ts": f"coalesce({ts}, {src_ts})",
        "_number_error": C.first_error([lsn_err, pos_err, row_err, ts_err, src_ts_err]),
    }


def position(r: Callable[[str], Sql]) -> tuple[Sql, Sql]:
    """(position, range error) from the staged :func:`position_inputs` columns
    (``r`` names a staged column; ``cdc_json`` table)."""
    return C.choose_position(
        [
            (f"{r('_lsn')} IS NOT NULL", C.pack_position([(r("_lsn"), C.LSN_BITS, "source.lsn")])),
            (r("_has_binlog"), C.pack_position([(r("_binlog_no"), C.BINLOG_FILE_BITS, "source.file"),
                                                (r("_binlog_offset"), C.BINLOG_OFFSET_BITS, "source.pos")])),
            (f"{r('_ts')} IS NOT NULL", C.pack_position([(r("_ts"), C.TS_MS_BITS, "ts_ms"),
                                                         ("line", C.TS_LINE_BITS, None)])),
        ],
        C.fallback_position(),
    )


def arrow_parser(ctx: C.ReadContext):
    """The line task's parser (:mod:`debezium_arrow`) when every column is of
    :data:`FAST_TYPES` and no format option asks for more than the images
    (metadata columns, table filters), else None (then every line takes the
    VARIANT path)."""
    schema, key, options = ctx.schema, ctx.primary_key, ctx.options
    if isinstance(ctx.path, DataFrame) or options.metadata or options.database_include or options.table_include:
        return None
    if not all(isinstance(f.dataType, FAST_TYPES) for f in schema.fields):
        return None
    from spark_changelog.connectors.debezium_arrow import DebeziumArrowParser
    return DebeziumArrowParser([(f.name, f.dataType.simpleString()) for f in schema.fields], key)


def finishes_rows(ctx: C.ReadContext) -> bool:
    """Whether the line task finishes lines (and so can pack them:
    ``ReadResult.packed_rows``)."""
    return arrow_parser(ctx) is not None


class _Stages:
    """The VARIANT path's named stages: each one projection's worth of columns
    that later stages reference by name (:meth:`__call__` gives the SQL).

    The stages are nested one-element ``transform`` scopes of ONE expression,
    evaluated only on the lines the line task did not finish (``fast``, nearly
    all lines, pass through), in a projection that Spark compiles as split
    methods (:meth:`select`)."""

    def __init__(self, df: DataFrame, fast: Optional[Sql]):
        self.df, self.fast = df, fast
        self.names: dict[str, Sql] = {}
        self.scopes: list[tuple[str, Sql]] = []

    def add(self, **columns: Sql) -> None:
        scope = f"_stage{len(self.scopes)}"
        self.scopes.append((scope, "named_struct(" + ", ".join(f"{lit(n)}, {e}" for n, e in columns.items()) + ")"))
        self.names.update({n: f"{scope}.{C.ident(n)}" for n in columns})

    def __call__(self, name: str) -> Sql:
        return self.names[name]

    def select(self, columns: dict[str, Sql], fast_columns: dict[str, Sql]) -> DataFrame:
        """``file``, ``line``, ``raw`` and ``columns`` (``fast_columns`` on the
        finished rows)."""
        struct = "named_struct(" + ", ".join(f"{lit(n)}, {e}" for n, e in columns.items()) + ")"
        for scope, body in reversed(self.scopes):
            struct = f"element_at(transform(array({body}), {scope} -> {struct}), 1)"
        # ``reflect`` (an identity here) has no generated code: the projection
        # holding it stays out of whole-stage code generation and gets Spark's
        # per-projection code, split into small methods.  In the whole-stage
        # loop the VARIANT path made one method of 27-40 KB of bytecode, which
        # the JIT worked on for seconds and then gave up on ("out of virtual
        # registers"): every row, fast or not, then ran in the interpreter.
        slow = f"CASE WHEN reflect('java.lang.String', 'valueOf', raw) IS NOT NULL THEN {struct} END"
        fast = self.fast or "false"
        df = self.df.selectExpr("*", f"CASE WHEN {fast} THEN NULL ELSE {slow} END AS _slow")
        packed = C.packed_columns(self.df)
        if self.fast is None:
            return df.selectExpr("file", "line", "raw", *[f"_slow.{n}" for n in columns], *packed)
        return df.selectExpr("file", "line", "raw", *[f"CASE WHEN {fast} THEN {fast_columns[n]} ELSE _slow.{n} END AS {n}"
                                                      for n in columns], *packed)


def parse(ctx: C.ReadContext) -> DataFrame:
    """Per-line frame for :func:`cdc_json.finish` (docs/runtime.md, "Reading CDC files: one pass").

    The line task (:func:`arrow_parser`) has already turned the lines it could
    decide into their finished change rows (``raw`` NULL, values in ``_j_*``):
    each passes through as a one-element ``_changes``.  Every other line is
    parsed into a VARIANT and checked field by field, in the named stages of
    :class:`_Stages`, which the finished rows never run."""
    cols, key, schema = ctx.columns, ctx.primary_key, ctx.schema
    parser = arrow_parser(ctx)
    image_cols, image_schema = ctx.image_schema.fieldNames(), ctx.image_schema
    if parser is not None and ctx.packer is not None:
        from spark_changelog.connectors.debezium_arrow import PackingParser
        parser = PackingParser(parser, ctx.packer)
    df = C.read_lines(ctx, parser=parser)
    r = stages = _Stages(df, "raw IS NULL" if parser is not None else None)
    stages.add(_v=C.parse_variant("raw", ctx.options))
    schemas_form = all_of(f"{C.field(r('_v'), '$.schema')} IS NOT NULL",
                          f"{C.field(r('_v'), '$.payload')} IS NOT NULL")
    stages.add(_env=when((schemas_form, C.field(r("_v"), "$.payload")), otherwise=r("_v")))
    stages.add(
        _op=C.get_as(r("_env"), "$.op", "string"),
        _op_v=C.field(r("_env"), "$.op"),
        _before_v=C.field(r("_env"), "$.before"),
        _after_v=C.field(r("_env"), "$.after"),
        _blank=C.is_blank("raw"),
        _ddl=C.present(C.field(r("_env"), "$.ddl")),
        **position_inputs(r("_env")),
    )
    excluded, excluded_reason = C.include_filter(
        ctx.options, C.get_as(r("_env"), "$.source.db", "string"),
        C.get_as(r("_env"), "$.source.table", "string"), "debezium-json")
    stages.add(_excluded=excluded, _excluded_reason=excluded_reason)
    blank_or_null = f"({r('_blank')} OR is_variant_null({r('_v')}) OR is_variant_null({r('_env')}))"
    malformed = f"({r('_v')} IS NULL AND NOT {r('_blank')})"
    pos, pos_err = position(r)
    stages.add(
        _tombstone=blank_or_null,
        _malformed=malformed,
        _not_object=f"(NOT {malformed} AND NOT {blank_or_null} AND NOT {C.is_object(r('_env'))})",
        _after_ok=all_of(C.present(r("_after_v")), C.is_object(r("_after_v"))),
        _before_ok=all_of(C.present(r("_before_v")), C.is_object(r("_before_v"))),
        _op_present=C.present(r("_op_v")),
        _before_raw=C.raw_struct(lambda c: C.field(r("_before_v"), C.json_path(c)), image_cols),
        _after_raw=C.raw_struct(lambda c: C.field(r("_after_v"), C.json_path(c)), image_cols),
        _pos=pos,
        _pos_error=pos_err,
    )
    shape_ok = f"(NOT {r('_malformed')} AND NOT {r('_not_object')})"
    schema_change = f"(NOT {r('_op_present')} AND {r('_ddl')})"
    op, excluded = r("_op"), r("_excluded")
    meta = C.metadata_columns(ctx, metadata(r("_v"), r("_env")))
    convert = None
    if any(DT.decodes(f.dataType) for f in image_schema.fields):
        stages.add(_types=DT.field_types(r("_v")))

        def convert(v: Sql, dtype: T.DataType, column: str) -> Optional[Sql]:
            return DT.convert(v, dtype, f"{r('_types')}[{lit(column)}]", ctx.options)
    stages.add(
        _shape_ok=shape_ok,
        _schema_change=schema_change,
        _op_ok=all_of(shape_ok, C.is_in(op, OPS), f"NOT {excluded}"),
        _ignored=all_of(shape_ok, f"({C.is_in(op, IGNORED_OPS)} OR {schema_change} OR {excluded})"),
        _before=C.typed_struct(r("_before_raw"), schema, metadata=meta, convert=convert),
        _after=C.typed_struct(r("_after_raw"), schema, metadata=meta, convert=convert),
    )
    op_ok, shape_ok, op_present = r("_op_ok"), r("_shape_ok"), r("_op_present")
    after_v, before_v, after_ok, before_ok = r("_after_v"), r("_before_v"), r("_after_ok"), r("_before_ok")
    needs_after = all_of(op_ok, C.is_in(op, ("c", "r", "u")))
    needs_before = all_of(op_ok, C.is_in(op, ("u", "d")))
    envelope_errors = C.errors_array(when((cond, message)) for cond, message in [
        (r("_malformed"), lit("malformed JSON: the record does not parse")),
        (r("_not_object"), lit("malformed record: not a JSON object")),
        (f"{shape_ok} AND NOT {op_present} AND NOT {r('_schema_change')} AND NOT {excluded}",
         lit("field 'op': missing")),
        (f"{shape_ok} AND {op} = 't' AND NOT {excluded}",
         lit("field 'op': truncate events ('t') cannot be expressed as row changes")),
        (f"{shape_ok} AND {op_present} AND NOT {C.is_in(op, OPS + IGNORED_OPS + ('t',))} AND NOT {excluded}",
         concat(lit("field 'op': unknown value "), C.json_text(r("_op_v")), lit(" (expected c, r, u or d)"))),
        (f"{needs_after} AND NOT {C.present(after_v)}",
         concat(lit("field 'after': missing or null for op '"), op, lit("'"))),
        (f"{needs_after} AND {C.present(after_v)} AND NOT {after_ok}", lit("field 'after': not a JSON object")),
        (f"{needs_before} AND NOT {C.present(before_v)}",
         concat(lit("field 'before': missing or null for op '"), op, lit("'"),
                when((f"{op} = 'u'", lit(" (PostgreSQL: set REPLICA IDENTITY FULL)")), otherwise="''"))),
        (f"{needs_before} AND {C.present(before_v)} AND NOT {before_ok}", lit("field 'before': not a JSON object")),
    ])
    errors = C.concat_messages(
        envelope_errors,
        C.gate(f"{needs_after} AND {after_ok}",
               C.image_errors(r("_after_raw"), r("_after"), image_schema, key, lit("'after'"))),
        C.gate(f"{needs_before} AND {before_ok}",
               C.image_errors(r("_before_raw"), r("_before"), image_schema, key, lit("'before'"))),
        C.gate(op_ok, C.errors_array([r("_number_error"), r("_pos_error")])),
    )

    def changes_of(before: Sql, after: Sql, op: Sql, pos: Sql) -> Sql:
        pk_changed = C.key_changed(before, after, key)
        seq_b, seq_a = C.seq_of(pos, C.PHASE_BEFORE), C.seq_of(pos, C.PHASE_AFTER)
        return when(
            (C.is_in(op, ("c", "r")), f"array({C.change_row(after, cols, C.INSERT, seq_a)})"),
            (f"{op} = 'u'", "array({}, {})".format(
                C.change_row(before, cols, f"CASE WHEN {pk_changed} THEN {C.DELETE} ELSE {C.UPDATE_BEFORE} END",
                             seq_b),
                C.change_row(after, cols, f"CASE WHEN {pk_changed} THEN {C.INSERT} ELSE {C.UPDATE_AFTER} END",
                             seq_a))),
            (f"{op} = 'd'", f"array({C.change_row(before, cols, C.DELETE, seq_b)})"),
        )

    ignored_reason = when((excluded, r("_excluded_reason")),
                          (r("_schema_change"), lit("Debezium schema change event")),
                          otherwise=concat(lit("Debezium op '"), op, lit("' (not a row change)")))
    skip_category, skip_reason = C.skip_values(r("_tombstone"), r("_ignored"), ignored_reason)
    return stages.select(
        {"_changes": f"CASE WHEN {op_ok} THEN {changes_of(r('_before'), r('_after'), op, r('_pos'))} END",
         "_errors": errors, "_skip_category": skip_category, "_skip_reason": skip_reason},
        C.finished_line(cols))
