"""Maxwell JSON change records (docs/semantics.md, sections 1-2; shared parsing in ``cdc_json``).

One record per line: ``{"database": ..., "table": ..., "type": "insert" |
"update" | "delete", "ts": <seconds>, "xid": ..., "xoffset": ..., "position":
"binlog.000003:1234", "data": {...}, "old": {...}}``.

================  ====================================================
type              rows
================  ====================================================
insert            ``+I`` data
bootstrap-insert  ``+I`` data (rows of a ``maxwell-bootstrap`` snapshot)
update            ``-U`` before, ``+U`` data; before = data overlaid with
                  ``old`` (the old values of the changed columns only).
                  When a primary-key column changed: ``-D`` before, ``+I`` data
delete            ``-D`` data
================  ====================================================

Skipped (category ``ignored``): ``bootstrap-start``, ``bootstrap-complete`` and
DDL records (``database-create|alter|drop``, ``table-create|alter|drop``).
Unknown types are invalid.  ``maxwell-json.database.include`` and
``maxwell-json.table.include`` (ours; Flink's Maxwell format has no filter)
skip the records of other databases and tables (category ``ignored``); every
field of :func:`metadata` can fill a ``METADATA FROM`` column
(``format_options``).

``_seq`` (module docstring of ``cdc_json``): the binlog file suffix and offset
from ``position`` with ``xoffset``; else ``ts`` (seconds) with the line; else the
file number with the line.
"""
from __future__ import annotations

from pyspark.sql import DataFrame

from spark_changelog.connectors import cdc_json as C
from spark_changelog.connectors.cdc_json import all_of, concat, lit, when

INSERT_TYPES = ("insert", "bootstrap-insert")
DML_TYPES = INSERT_TYPES + ("update", "delete")
IGNORED_TYPES = ("bootstrap-start", "bootstrap-complete", "database-create", "database-alter",
                 "database-drop", "table-create", "table-alter", "table-drop")
#: position = binlog file suffix (20) | offset (32) | xoffset (10, clamped)
FILE_BITS, OFFSET_BITS, XOFFSET_BITS = 20, 32, 10
#: without a position: ts in seconds (34) | line (28, clamped)
TS_BITS, LINE_BITS = 34, 28
_POSITION = r"(\d+):(\d+)$"


def read_maxwell(spark, path, schema, primary_key=None, **kw) -> C.ReadResult:
    """``read_changes(..., format="maxwell-json")``."""
    return C.read_with("maxwell", spark, path, schema, primary_key, **kw)


def metadata(v: C.Sql) -> dict[str, C.Sql]:
    """Flink's Maxwell metadata keys -> SQL over the record ``v``."""
    return {
        "database": C.get_as(v, "$.database", "string"),
        "table": C.get_as(v, "$.table", "string"),
        "primary-key-columns": C.get_as(v, "$.primary_key_columns", "array<string>"),
        "ingestion-timestamp": C.timestamp_ms(f"{C.get_as(v, '$.ts', 'bigint')} * 1000"),
    }


def parse(ctx: C.ReadContext) -> DataFrame:
    """Per-line frame for :func:`cdc_json.finish`, built in a few named projections."""
    cols, key, schema = ctx.columns, ctx.primary_key, ctx.schema
    image_cols, image_schema = ctx.image_schema.fieldNames(), ctx.image_schema
    df = C.stage(C.read_lines(ctx), _v=C.parse_variant("raw", ctx.options))
    excluded, excluded_reason = C.include_filter(ctx.options, C.get_as("_v", "$.database", "string"),
                                                 C.get_as("_v", "$.table", "string"), "maxwell-json")
    ts, ts_err = C.number("_v", "$.ts", "ts")
    xoffset, xoffset_err = C.number("_v", "$.xoffset", "xoffset")
    position_text = C.get_as("_v", "$.position", "string")
    pattern = lit(_POSITION)
    df = C.stage(
        df,
        _blank=C.is_blank("raw"),
        _type=f"lower({C.get_as('_v', '$.type', 'string')})",
        _type_v=C.field("_v", "$.type"),
        _data=C.field("_v", "$.data"),
        _old=C.field("_v", "$.old"),
        _position_v=C.field("_v", "$.position"),
        _has_position=f"coalesce({position_text} RLIKE {pattern}, false)",
        _binlog_no=C.digits_number(f"regexp_extract({position_text}, {pattern}, 1)"),
        _binlog_offset=C.digits_number(f"regexp_extract({position_text}, {pattern}, 2)"),
        _xoffset=f"coalesce({xoffset}, 0)",
        _ts=ts,
        _number_error=C.first_error([ts_err, xoffset_err]),
        _excluded=excluded,
        _excluded_reason=excluded_reason,
    )
    pos, pos_err = C.choose_position(
        [("_has_position", C.pack_position([("_binlog_no", FILE_BITS, "position"),
                                            ("_binlog_offset", OFFSET_BITS, "position"),
                                            ("_xoffset", XOFFSET_BITS, None)])),
         ("_ts IS NOT NULL", C.pack_position([("_ts", TS_BITS, "ts"), ("line", LINE_BITS, None)]))],
        C.fallback_position(),
    )
    blank_or_null = "(_blank OR is_variant_null(_v))"
    malformed = "(_v IS NULL AND NOT _blank)"
    df = C.stage(
        df,
        _tombstone=blank_or_null,
        _malformed=malformed,
        _not_object=f"(NOT {malformed} AND NOT {blank_or_null} AND NOT {C.is_object('_v')})",
        _data_ok=all_of(C.present("_data"), C.is_object("_data")),
        _old_ok=f"(NOT {C.present('_old')} OR {C.is_object('_old')})",
        _data_raw=C.raw_struct(lambda c: C.field("_data", C.json_path(c)), image_cols),
        _old_raw=C.raw_struct(lambda c: C.field("_old", C.json_path(c)), image_cols),
        _pos=pos,
        _pos_error=pos_err,
    )
    shape_ok = "(NOT _malformed AND NOT _not_object)"
    meta = C.metadata_columns(ctx, metadata("_v"))
    df = C.stage(
        df,
        _shape_ok=shape_ok,
        _dml=all_of(shape_ok, C.is_in("_type", DML_TYPES), "NOT _excluded"),
        _ignored=all_of(shape_ok, f"({C.is_in('_type', IGNORED_TYPES)} OR _excluded)"),
        _after=C.typed_struct("_data_raw", schema, metadata=meta),
        _before=C.typed_struct(C.overlay_struct("_old_raw", "_data_raw", image_cols), schema, metadata=meta),
    )
    is_update = "(_dml AND _type = 'update')"
    errors = C.concat_messages(
        C.errors_array([
            when(("_malformed", lit("malformed JSON: the record does not parse"))),
            when(("_not_object", lit("malformed record: not a JSON object"))),
            when((f"_shape_ok AND NOT _excluded AND NOT {C.present('_type_v')}", lit("field 'type': missing"))),
            when((f"_shape_ok AND {C.present('_type_v')} AND NOT _dml AND NOT _ignored",
                  concat(lit("field 'type': unknown value "), C.json_text("_type_v"),
                         lit(" (expected insert, update or delete)")))),
            when((f"_dml AND NOT {C.present('_data')}", lit("field 'data': missing or null"))),
            when((f"_dml AND {C.present('_data')} AND NOT _data_ok", lit("field 'data': not a JSON object"))),
            when((f"{is_update} AND NOT _old_ok", lit("field 'old': not a JSON object"))),
            when((f"_dml AND {C.present('_position_v')} AND NOT _has_position",
                  concat(lit("field 'position': value "), C.json_text("_position_v"),
                         lit(" is not 'binlog-file.N:offset'")))),
        ]),
        C.gate("_dml AND _data_ok", C.image_errors("_data_raw", "_after", image_schema, key, lit("'data'"))),
        C.gate(f"{is_update} AND _data_ok AND _old_ok",
               C.image_errors("_old_raw", "_before", image_schema, key, lit("'old'"), pk_null_only=True)),
        C.gate("_dml", C.errors_array(["_number_error", "_pos_error"])),
    )
    pk_changed = C.key_changed("_before", "_after", key)
    seq_b, seq_a = C.seq_of("_pos", C.PHASE_BEFORE), C.seq_of("_pos", C.PHASE_AFTER)
    changes = when(
        (C.is_in("_type", INSERT_TYPES), f"array({C.change_row('_after', cols, C.INSERT, seq_a)})"),
        ("_type = 'delete'", f"array({C.change_row('_after', cols, C.DELETE, seq_b)})"),
        ("_type = 'update'", "array({}, {})".format(
            C.change_row("_before", cols, f"CASE WHEN {pk_changed} THEN {C.DELETE} ELSE {C.UPDATE_BEFORE} END",
                         seq_b),
            C.change_row("_after", cols, f"CASE WHEN {pk_changed} THEN {C.INSERT} ELSE {C.UPDATE_AFTER} END",
                         seq_a))),
    )
    ignored_reason = when(("_excluded", "_excluded_reason"),
                          otherwise=concat(lit("Maxwell type '"), "_type", lit("' ignored")))
    return df.selectExpr(
        "file", "line", "raw",
        f"CASE WHEN _dml THEN {changes} END AS _changes",
        f"{errors} AS _errors",
        *C.skip_columns("_tombstone", "_ignored", ignored_reason),
    )
