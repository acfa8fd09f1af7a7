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

``_seq`` (module docstring of ``cdc_json``): ``source.lsn``; else MySQL
``source.file`` suffix and ``source.pos + source.row``; else ``ts_ms`` (then
``source.ts_ms``) with the line; else the file number with the line.
"""
from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import types as T

from spark_changelog.connectors import cdc_json as C
from spark_changelog.connectors.cdc_json import Sql, all_of, concat, lit, when

OPS = ("c", "r", "u", "d")
#: column types whose conversion by Arrow's JSON reader (strict: no conversion at all) the
#: variant path agrees with
FAST_TYPES = (T.BooleanType, T.IntegerType, T.LongType, T.DoubleType, T.StringType)
IGNORED_OPS = ("m",)


def read_debezium(spark, path, schema, primary_key=None, **kw) -> C.ReadResult:
    """``read_changes(..., format="debezium-json")``."""
    return C.read_with("debezium", spark, path, schema, primary_key, **kw)


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


def position() -> tuple[Sql, Sql]:
    """(position, range error) from the :func:`position_inputs` columns (``cdc_json`` table)."""
    return C.choose_position(
        [
            ("_lsn IS NOT NULL", C.pack_position([("_lsn", C.LSN_BITS, "source.lsn")])),
            ("_has_binlog", C.pack_position([("_binlog_no", C.BINLOG_FILE_BITS, "source.file"),
                                             ("_binlog_offset", C.BINLOG_OFFSET_BITS, "source.pos")])),
            ("_ts IS NOT NULL", C.pack_position([("_ts", C.TS_MS_BITS, "ts_ms"), ("line", C.TS_LINE_BITS, None)])),
        ],
        C.fallback_position(),
    )


def arrow_parser(schema, key):
    """The line task's parser (:mod:`debezium_arrow`) when every column is of
    :data:`FAST_TYPES`, else None (then every line takes the VARIANT path)."""
    if not all(isinstance(f.dataType, FAST_TYPES) for f in schema.fields):
        return None
    from spark_changelog.connectors.debezium_arrow import DebeziumArrowParser
    return DebeziumArrowParser([(f.name, f.dataType.simpleString()) for f in schema.fields], key)


def parse(ctx: C.ReadContext) -> DataFrame:
    """Per-line frame for :func:`cdc_json.finish`, built in a few named projections.

    The line task (:func:`arrow_parser`) has already turned the lines it could
    decide into their finished change rows (``raw`` NULL, values in ``_j_*``):
    each passes through as a one-element ``_changes``.  Every other line is
    parsed into a VARIANT and checked field by field (every column staged
    below is NULL for the finished rows, so the variant path costs them only
    its NULL checks)."""
    cols, key, schema = ctx.columns, ctx.primary_key, ctx.schema
    parser = arrow_parser(schema, key)
    df = C.read_lines(ctx, parser=parser)
    fast = "raw IS NULL" if parser is not None else "false"

    def stage(frame, **columns):
        return C.stage(frame, **{n: f"CASE WHEN {fast} THEN NULL ELSE {e} END" for n, e in columns.items()})

    df = stage(df, _v="try_parse_json(raw)")
    schemas_form = all_of(f"{C.field('_v', '$.schema')} IS NOT NULL", f"{C.field('_v', '$.payload')} IS NOT NULL")
    df = stage(df, _env=when((schemas_form, C.field("_v", "$.payload")), otherwise="_v"))
    df = stage(
        df,
        _op=C.get_as("_env", "$.op", "string"),
        _op_v=C.field("_env", "$.op"),
        _before_v=C.field("_env", "$.before"),
        _after_v=C.field("_env", "$.after"),
        _blank=C.is_blank("raw"),
        _ddl=C.present(C.field("_env", "$.ddl")),
        **position_inputs("_env"),
    )
    blank_or_null = "(_blank OR is_variant_null(_v) OR is_variant_null(_env))"
    malformed = "(_v IS NULL AND NOT _blank)"
    pos, pos_err = position()
    df = stage(
        df,
        _tombstone=blank_or_null,
        _malformed=malformed,
        _not_object=f"(NOT {malformed} AND NOT {blank_or_null} AND NOT {C.is_object('_env')})",
        _after_ok=all_of(C.present("_after_v"), C.is_object("_after_v")),
        _before_ok=all_of(C.present("_before_v"), C.is_object("_before_v")),
        _op_present=C.present("_op_v"),
        _before_raw=C.raw_struct(lambda c: C.field("_before_v", C.json_path(c)), cols),
        _after_raw=C.raw_struct(lambda c: C.field("_after_v", C.json_path(c)), cols),
        _pos=pos,
        _pos_error=pos_err,
    )
    shape_ok = "(NOT _malformed AND NOT _not_object)"
    schema_change = "(NOT _op_present AND _ddl)"
    df = stage(
        df,
        _shape_ok=shape_ok,
        _schema_change=schema_change,
        _op_ok=all_of(shape_ok, C.is_in("_op", OPS)),
        _ignored=all_of(shape_ok, f"({C.is_in('_op', IGNORED_OPS)} OR {schema_change})"),
        _before=C.typed_struct("_before_raw", schema),
        _after=C.typed_struct("_after_raw", schema),
    )
    needs_after = all_of("_op_ok", C.is_in("_op", ("c", "r", "u")))
    needs_before = all_of("_op_ok", C.is_in("_op", ("u", "d")))
    envelope_errors = C.errors_array(when((cond, message)) for cond, message in [
        ("_malformed", lit("malformed JSON: the record does not parse")),
        ("_not_object", lit("malformed record: not a JSON object")),
        ("_shape_ok AND NOT _op_present AND NOT _schema_change", lit("field 'op': missing")),
        ("_shape_ok AND _op = 't'", lit("field 'op': truncate events ('t') cannot be expressed as row changes")),
        (f"_shape_ok AND _op_present AND NOT {C.is_in('_op', OPS + IGNORED_OPS + ('t',))}",
         concat(lit("field 'op': unknown value "), C.json_text("_op_v"), lit(" (expected c, r, u or d)"))),
        (f"{needs_after} AND NOT {C.present('_after_v')}",
         concat(lit("field 'after': missing or null for op '"), "_op", lit("'"))),
        (f"{needs_after} AND {C.present('_after_v')} AND NOT _after_ok", lit("field 'after': not a JSON object")),
        (f"{needs_before} AND NOT {C.present('_before_v')}",
         concat(lit("field 'before': missing or null for op '"), "_op", lit("'"),
                when(("_op = 'u'", lit(" (PostgreSQL: set REPLICA IDENTITY FULL)")), otherwise="''"))),
        (f"{needs_before} AND {C.present('_before_v')} AND NOT _before_ok", lit("field 'before': not a JSON object")),
    ])
    errors = C.concat_messages(
        envelope_errors,
        C.gate(f"{needs_after} AND _after_ok",
               C.image_errors("_after_raw", "_after", schema, key, lit("'after'"))),
        C.gate(f"{needs_before} AND _before_ok",
               C.image_errors("_before_raw", "_before", schema, key, lit("'before'"))),
        C.gate("_op_ok", C.errors_array(["_number_error", "_pos_error"])),
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

    ignored_reason = when(("_schema_change", lit("Debezium schema change event")),
                          otherwise=concat(lit("Debezium op '"), "_op", lit("' (not a row change)")))
    finished = (f"array({C.change_row_of([(c, f'_j_{i}') for i, c in enumerate(cols)], '_j_kind', '_j_seq')})"
                if parser is not None else "NULL")
    return df.selectExpr(
        "file", "line", "raw",
        f"CASE WHEN {fast} THEN {finished} "
        f"WHEN _op_ok THEN {changes_of('_before', '_after', '_op', '_pos')} END AS _changes",
        f"CASE WHEN {fast} THEN {C.EMPTY_MESSAGES} ELSE {errors} END AS _errors",
        # NULL for the finished rows: their _tombstone/_ignored are NULL
        *C.skip_columns("_tombstone", "_ignored", ignored_reason),
    )
