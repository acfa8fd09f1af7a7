"""Canal JSON change messages (docs/semantics.md, sections 1-2; shared parsing in ``cdc_json``).

One flat message per line: ``{"data": [...], "old": [...], "type": "INSERT" |
"UPDATE" | "DELETE", "pkNames": [...], "isDdl": false, "es": ..., "ts": ...,
"database": ..., "table": ...}``.  Each element of ``data`` is one row, in order:

======  =============================================================
type    rows for ``data[i]``
======  =============================================================
INSERT  ``+I`` data[i]
INIT    ``+I`` data[i] (rows of the initial snapshot, as in Flink)
UPDATE  ``-U`` before, ``+U`` data[i]; before = data[i] overlaid with
        ``old[i]``, which holds the old values of the changed columns only.
        When a primary-key column changed: ``-D`` before, ``+I`` data[i]
DELETE  ``-D`` data[i]
======  =============================================================

Canal writes most values as strings (``"1"``, ``"2.50"``); they are cast to the
schema types and a value that does not cast is a wrong-type error.  ``pkNames``
is not used: the key is the ``primary_key`` argument.  ``database`` and
``table`` are matched by ``canal-json.database.include`` and
``canal-json.table.include`` (a record not included is skipped, category
``ignored``); every field of :data:`METADATA` can fill a ``METADATA FROM``
column (``format_options``).

Skipped (category ``ignored``, counted by ``ReadResult.ignored_skipped``): DDL
and control messages, i.e. ``isDdl = true`` or type ``CREATE``, ``ALTER``,
``ERASE``, ``QUERY``, ``RENAME``, ``CINDEX``, ``DINDEX``, ``GTID``, ``XACOMMIT``,
``XAROLLBACK``, ``MHEARTBEAT``.  ``TRUNCATE`` is invalid (it removes every row,
which row changes cannot express), as are unknown types.  A message is all or
nothing: if one of its rows is bad, the line goes to ``invalid`` and none of its
rows is emitted.

``_seq`` (module docstring of ``cdc_json``): ``es`` in seconds (else ``ts`` in
seconds, else the file number) | line | index in ``data``.
"""
from __future__ import annotations

from pyspark.sql import DataFrame

from spark_changelog.connectors import cdc_json as C
from spark_changelog.connectors.cdc_json import all_of, concat, lit, when

#: ``INIT``: rows of Canal's initial snapshot, inserts (as in Flink)
INSERT_TYPES = ("INSERT", "INIT")
DML_TYPES = INSERT_TYPES + ("UPDATE", "DELETE")
IGNORED_TYPES = ("CREATE", "ALTER", "ERASE", "QUERY", "RENAME", "CINDEX", "DINDEX",
                 "GTID", "XACOMMIT", "XAROLLBACK", "MHEARTBEAT")
#: bits of the position that are not the timestamp: line (20) | row index (8)
LINE_BITS, INDEX_BITS = 20, 8
MAJOR_BITS = C.POSITION_BITS - LINE_BITS - INDEX_BITS


def read_canal(spark, path, schema, primary_key=None, **kw) -> C.ReadResult:
    """``read_changes(..., format="canal-json")``."""
    return C.read_with("canal", spark, path, schema, primary_key, **kw)


def metadata(v: C.Sql) -> dict[str, C.Sql]:
    """Flink's Canal metadata keys -> SQL over the message ``v``."""
    return {
        "database": C.get_as(v, "$.database", "string"),
        "table": C.get_as(v, "$.table", "string"),
        "sql-type": C.get_as(v, "$.sqlType", "map<string,int>"),
        "pk-names": C.get_as(v, "$.pkNames", "array<string>"),
        "ingestion-timestamp": C.timestamp_ms(C.get_as(v, "$.ts", "bigint")),
        "event-timestamp": C.timestamp_ms(C.get_as(v, "$.es", "bigint")),
    }


def parse(ctx: C.ReadContext) -> DataFrame:
    """Per-line frame for :func:`cdc_json.finish`, built in a few named projections.

    The rows of a message are arrays handled with ``transform``: first the raw and
    typed images of each row, then each row's changes and messages.
    """
    cols, key, schema = ctx.columns, ctx.primary_key, ctx.schema
    image_cols, image_schema = ctx.image_schema.fieldNames(), ctx.image_schema
    df = C.stage(C.read_lines(ctx), _v=C.parse_variant("raw", ctx.options))
    excluded, excluded_reason = C.include_filter(ctx.options, C.get_as("_v", "$.database", "string"),
                                                 C.get_as("_v", "$.table", "string"), "canal-json")
    es, es_err = C.number("_v", "$.es", "es")
    ts, ts_err = C.number("_v", "$.ts", "ts")
    df = C.stage(
        df,
        _blank=C.is_blank("raw"),
        _type=f"upper({C.get_as('_v', '$.type', 'string')})",
        _type_v=C.field("_v", "$.type"),
        _is_ddl=f"coalesce({C.get_as('_v', '$.isDdl', 'boolean')}, false)",
        _data=C.get_as("_v", "$.data", "array<variant>"),
        _old=C.get_as("_v", "$.old", "array<variant>"),
        _old_v=C.field("_v", "$.old"),
        _es_sec=f"{es} div 1000",
        _ts_sec=f"{ts} div 1000",
        _number_error=C.first_error([es_err, ts_err]),
        _excluded=excluded,
        _excluded_reason=excluded_reason,
        _meta=C.raw_struct(lambda c: C.metadata_columns(ctx, metadata("_v"))[c], ctx.options.metadata_columns)
        if ctx.options.metadata else "CAST(NULL AS STRING)",
    )
    major, major_err = C.choose_position(
        [("_es_sec IS NOT NULL", C.pack_position([("_es_sec", MAJOR_BITS, "es"), ("line", LINE_BITS, None)])),
         ("_ts_sec IS NOT NULL", C.pack_position([("_ts_sec", MAJOR_BITS, "ts"), ("line", LINE_BITS, None)]))],
        C.pack_position([("file_no", MAJOR_BITS, "file name number"), ("line", LINE_BITS, None)]),
    )
    blank_or_null = "(_blank OR is_variant_null(_v))"
    malformed = "(_v IS NULL AND NOT _blank)"
    x, i = "_x", "_i"
    old_i = f"get(_old, {i})"
    raw_rows = (f"transform(_data, ({x}, {i}) -> named_struct("
                f"'data', {C.raw_struct(lambda c: C.field(x, C.json_path(c)), image_cols)}, "
                f"'old', {C.raw_struct(lambda c: C.field(old_i, C.json_path(c)), image_cols)}, "
                f"'data_ok', {C.is_object(x)}, 'old_ok', ({old_i} IS NULL OR {C.is_object(old_i)})))")
    df = C.stage(
        df,
        _tombstone=blank_or_null,
        _malformed=malformed,
        _not_object=f"(NOT {malformed} AND NOT {blank_or_null} AND NOT {C.is_object('_v')})",
        _raw_rows=raw_rows,
        _base=major,
        _pos_error=major_err,
    )
    shape_ok = "(NOT _malformed AND NOT _not_object)"
    r = "_r"
    meta = {c: C.struct_field("_meta", c) for c in ctx.options.metadata_columns}
    typed_rows = (f"transform(_raw_rows, {r} -> named_struct("
                  f"'after', {C.typed_struct(f'{r}.data', schema, metadata=meta)}, "
                  f"'before', {C.typed_struct(C.overlay_struct(f'{r}.old', f'{r}.data', image_cols), schema, metadata=meta)}))")
    df = C.stage(
        df,
        _shape_ok=shape_ok,
        _dml=all_of(shape_ok, C.is_in("_type", DML_TYPES), "NOT _excluded"),
        # a record the include options leave out is skipped whatever its type (Flink filters first)
        _ignored=all_of(shape_ok, "(_excluded OR " + all_of(
            "coalesce(_type, '') <> 'TRUNCATE'",
            f"({C.is_in('_type', IGNORED_TYPES)} OR (_is_ddl AND NOT {C.is_in('_type', DML_TYPES)}))") + ")"),
        _rows=typed_rows,
    )

    # per row i: t = typed images, w = raw images
    t, w = "_t", f"_raw_rows[{i}]"
    where = concat("'data['", f"CAST({i} AS STRING)", "']'")
    where_old = concat("'old['", f"CAST({i} AS STRING)", "']'")
    pos_i = f"(shiftleft(_base, {INDEX_BITS}) + least({i}, {(1 << INDEX_BITS) - 1}))"
    seq_b, seq_a = C.seq_of(pos_i, C.PHASE_BEFORE), C.seq_of(pos_i, C.PHASE_AFTER)
    after, before = f"{t}.after", f"{t}.before"
    pk_changed = C.key_changed(before, after, key)
    row_changes = when(
        (C.is_in("_type", INSERT_TYPES), f"array({C.change_row(after, cols, C.INSERT, seq_a)})"),
        ("_type = 'DELETE'", f"array({C.change_row(after, cols, C.DELETE, seq_b)})"),
        ("_type = 'UPDATE'", "array({}, {})".format(
            C.change_row(before, cols, f"CASE WHEN {pk_changed} THEN {C.DELETE} ELSE {C.UPDATE_BEFORE} END", seq_b),
            C.change_row(after, cols, f"CASE WHEN {pk_changed} THEN {C.INSERT} ELSE {C.UPDATE_AFTER} END", seq_a))),
    )
    is_update = "_type = 'UPDATE'"
    row_errors = C.concat_messages(
        C.errors_array([
            when((f"NOT {w}.data_ok", concat(lit("field '"), where, lit("': not a JSON object")))),
            when((f"{is_update} AND NOT {w}.old_ok", concat(lit("field '"), where_old, lit("': not a JSON object")))),
        ]),
        C.gate(f"{w}.data_ok", C.image_errors(f"{w}.data", after, image_schema, key, where)),
        C.gate(f"{is_update} AND {w}.data_ok AND {w}.old_ok",
               C.image_errors(f"{w}.old", before, image_schema, key, where_old, pk_null_only=True)),
    )
    results = (f"transform(_rows, ({t}, {i}) -> named_struct('changes', {row_changes}, "
               f"'errors', {row_errors}))")
    df = C.stage(df, _results=f"CASE WHEN _dml THEN {results} END")

    line_errors = C.errors_array([
        when(("_malformed", lit("malformed JSON: the record does not parse"))),
        when(("_not_object", lit("malformed record: not a JSON object"))),
        when((f"_shape_ok AND NOT _excluded AND NOT {C.present('_type_v')}", lit("field 'type': missing"))),
        when(("_shape_ok AND NOT _excluded AND _type = 'TRUNCATE'",
              lit("field 'type': TRUNCATE cannot be expressed as row changes"))),
        when((f"_shape_ok AND {C.present('_type_v')} AND NOT _ignored AND "
              f"NOT {C.is_in('_type', DML_TYPES + ('TRUNCATE',))}",
              concat(lit("field 'type': unknown value "), C.json_text("_type_v"),
                     lit(" (expected INSERT, INIT, UPDATE or DELETE)")))),
        when(("_dml AND _data IS NULL", lit("field 'data': missing or not an array"))),
        when(("_dml AND size(_data) = 0", lit("field 'data': empty array"))),
        when((f"_dml AND _type = 'UPDATE' AND {C.present('_old_v')} AND _old IS NULL",
              lit("field 'old': not an array"))),
        "CASE WHEN _dml THEN _number_error END",
        "CASE WHEN _dml THEN _pos_error END",
    ])
    errors = C.concat_messages(line_errors, f"flatten(transform(_results, {r} -> {r}.errors))")
    ignored_reason = when(("_excluded AND NOT _is_ddl", "_excluded_reason"),
                          otherwise=concat(lit("Canal type '"), "coalesce(_type, '')", lit("'"),
                                           when(("_is_ddl", lit(" (DDL)")), otherwise="''"), lit(" ignored")))
    return df.selectExpr(
        "file", "line", "raw",
        f"flatten(transform(_results, {r} -> {r}.changes)) AS _changes",
        f"{errors} AS _errors",
        *C.skip_columns("_tombstone", "_ignored", ignored_reason),
    )
