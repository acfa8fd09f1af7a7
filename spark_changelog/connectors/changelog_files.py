"""Changelog files with an explicit row-kind column (docs/semantics.md, section 1; shared
parsing in ``cdc_json``).

Each record is one changelog row: the user columns, a kind column
(``kind_column``, default ``op``) holding ``+I``/``-U``/``+U``/``-D``, Flink's
names ``INSERT``/``UPDATE_BEFORE``/``UPDATE_AFTER``/``DELETE`` or the byte codes
``0``-``3`` (case and surrounding blanks ignored), and optionally a sequence
column (``seq_column``, bigint).  With ``kind_column=None`` the files are plain
rows, as Flink's ``json``/``csv``/``parquet``/``avro`` formats read them: every
record is an insert and the stream is insert-only (docs/sql.md, "Connectors").

``changelog_file_format``:

``json``     one JSON object per line (same parsing and type rules as the CDC
             formats; empty/``null`` lines are tombstones).
``csv``      a header line naming the columns (any order, extra columns ignored
             if within the first ``max(2n, n + 16)`` fields, ``n`` = the columns
             read), then one row per line.  Lines are split on newlines, so
             quoted values cannot contain line breaks.  ``csv_options`` go to
             ``from_csv`` (``sep``, ``quote``, ``escape``, ...).  Empty fields are
             NULL; values are cast to the schema types like Canal's strings.
             Blank lines are skipped as tombstones.
``parquet``  typed columns (the kind column must be a string); ``line`` is the
             1-based row number in the file.  With ``schema=None`` the user
             columns are the file's columns minus the kind/sequence columns.
``avro``     as ``parquet``, through Spark's ``avro`` data source (the
             ``org.apache.spark:spark-avro`` package must be on the classpath).

``_seq``: the sequence column as is when given (NULL or unreadable -> invalid);
otherwise file number | line (module docstring of ``cdc_json``), times two plus
0 for retractions and 1 for additions.
"""
from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import types as T

from spark_changelog.connectors import cdc_json as C
from spark_changelog.connectors.cdc_json import Sql, concat, ident, lit, when
from spark_changelog.connectors.debezium import FAST_TYPES
from spark_changelog.model.rowkind import KIND_SPELLINGS as KIND_NAMES


def read_changelog(spark, path, schema, primary_key=None, **kw) -> C.ReadResult:
    """``read_changes(..., format="changelog")``."""
    return C.read_with("changelog_files", spark, path, schema, primary_key, **kw)


#: ``_kind_text`` of a plain row (no kind column): an insert
PLAIN_ROW_KIND = lit("+I")


def kind_code(text: Sql, op_mapping=None) -> Sql:
    """The RowKind code of a kind string, NULL if unknown: one of
    ``KIND_NAMES`` (case and surrounding spaces ignored), or with
    ``op_mapping`` ((code, kind) pairs) one of its codes, exactly."""
    if op_mapping is not None:
        branches = " ".join(f"WHEN {lit(code)} THEN {kind}" for code, kind in op_mapping)
        return f"CASE {text} {branches} END"
    branches = " ".join(f"WHEN {lit(name)} THEN {code}" for name, code in KIND_NAMES.items())
    return f"CASE upper(trim({text})) {branches} END"


def parse(ctx: C.ReadContext) -> DataFrame:
    if ctx.changelog_file_format == "json":
        return _parse_json(ctx)
    if ctx.changelog_file_format == "csv":
        return _parse_csv(ctx)
    return _parse_typed(ctx)


def _finish_rows(df: DataFrame, ctx: C.ReadContext, tombstone_reason: str = C.TOMBSTONE_REASON,
                 finished: bool = False) -> DataFrame:
    """Shared tail of the three file formats.

    ``df`` has ``_typed`` (the typed user columns), ``_kind_text``, ``_record_ok``
    (the record parsed), ``_record_errors`` (format-specific messages, wrong types
    included), ``_seq_value``/``_seq_present``/``_seq_error`` (the sequence
    column, if any) and ``_tombstone``.
    """
    kind_col, seq_col = ctx.kind_column, ctx.seq_column
    pos, pos_err = C.fallback_position()
    # a plain row's kind is the constant insert: not upper(trim('+I')),
    # which Spark's optimizer folds by initialising ICU's case mapping, ~1 s
    # of a process's first query planning (docs/runtime.md, "Where the time goes")
    kind = str(C.INSERT) if kind_col is None else kind_code("_kind_text", ctx.op_mapping)
    df = C.stage(df, _kind=kind, _pos=pos, _pos_error=pos_err)
    if seq_col is None:
        phase = f"CASE WHEN _kind IN ({C.INSERT}, {C.UPDATE_AFTER}) THEN {C.PHASE_AFTER} ELSE {C.PHASE_BEFORE} END"
        seq = f"(shiftleft(_pos, 1) + {phase})"
        seq_errors = ["_pos_error"]
    else:
        seq = "_seq_value"
        seq_errors = [when(("NOT _seq_present", lit(f"field '{seq_col}': missing or null"))), "_seq_error"]
    ok = "_record_ok"
    expected = ("+I, -U, +U, -D or INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE"
                if ctx.op_mapping is None else
                "one of the op_mapping codes " + ", ".join(code for code, _ in ctx.op_mapping))
    unknown_kind = concat(lit(f"field '{kind_col}': unknown row kind "), "'\"'", C.clip("_kind_text"), "'\"'",
                          lit(f" (expected {expected})"))
    errors = C.errors_array([
        when((f"{ok} AND _kind_text IS NULL", lit(f"field '{kind_col}': missing or null"))),
        when((f"{ok} AND _kind_text IS NOT NULL AND _kind IS NULL", unknown_kind)),
        *[f"CASE WHEN {ok} THEN {e} END" for e in seq_errors],
    ])
    columns = {"_changes": f"array({C.change_row('_typed', ctx.columns, '_kind', seq)})",
               "_errors": f"concat(_record_errors, {errors})"}
    category, reason = C.skip_values("_tombstone", tombstone_reason=tombstone_reason)
    columns.update(_skip_category=category, _skip_reason=reason)
    if not finished:
        return df.selectExpr("file", "line", "raw", *[f"{e} AS {n}" for n, e in columns.items()])
    # the line task finished the lines whose text it did not keep (``raw``
    # NULL, changelog_arrow)
    fast = C.finished_line(ctx.columns)
    return df.selectExpr("file", "line", "raw", *[f"CASE WHEN raw IS NULL THEN {fast[n]} ELSE {e} END AS {n}"
                                                  for n, e in columns.items()], *C.packed_columns(df))


def arrow_parser(ctx: C.ReadContext):
    """The line task's parser (:mod:`changelog_arrow`) of changelog JSON
    files whose columns are all of the fast types and whose kind column has
    the usual spellings (no ``op_mapping``), else None (then every line takes
    the VARIANT path)."""
    if ctx.changelog_file_format != "json" or isinstance(ctx.path, DataFrame) or \
            ctx.op_mapping is not None or \
            not all(isinstance(f.dataType, FAST_TYPES) for f in ctx.schema.fields):
        return None
    from spark_changelog.connectors.changelog_arrow import ChangelogArrowParser
    return ChangelogArrowParser([(f.name, f.dataType.simpleString()) for f in ctx.schema.fields],
                                ctx.primary_key, ctx.kind_column, ctx.seq_column)


def finishes_rows(ctx: C.ReadContext) -> bool:
    """Whether the line task finishes lines (and so can pack them:
    ``ReadResult.packed_rows``)."""
    return arrow_parser(ctx) is not None


def _parse_json(ctx: C.ReadContext) -> DataFrame:
    schema, key = ctx.schema, ctx.primary_key
    parser = arrow_parser(ctx)
    if parser is not None and ctx.packer is not None:
        from spark_changelog.connectors.debezium_arrow import PackingParser
        parser = PackingParser(parser, ctx.packer)
    df = C.stage(C.read_lines(ctx, parser=parser), _v=C.parse_variant("raw", ctx.options))
    df = C.stage(df, _blank=C.is_blank("raw"),
                 _raw=C.raw_struct(lambda c: C.field("_v", C.json_path(c)), ctx.columns))
    blank_or_null = "(_blank OR is_variant_null(_v))"
    malformed = "(_v IS NULL AND NOT _blank)"
    not_object = f"(NOT {malformed} AND NOT {blank_or_null} AND NOT {C.is_object('_v')})"
    df = C.stage(
        df,
        _tombstone=blank_or_null,
        _malformed=malformed,
        _not_object=not_object,
        _record_ok=f"(NOT {malformed} AND NOT {not_object})",
        # a Kafka record's METADATA FROM columns (plain JSON has no keys of its own)
        _typed=C.typed_struct("_raw", schema, metadata=C.metadata_columns(ctx, {})),
        _kind_text=(C.get_as("_v", C.json_path(ctx.kind_column), "string")
                    if ctx.kind_column is not None else PLAIN_ROW_KIND),
        **_json_seq(ctx),
    )
    record_errors = C.concat_messages(
        C.errors_array([when(("_malformed", lit("malformed JSON: the record does not parse"))),
                        when(("_not_object", lit("malformed record: not a JSON object")))]),
        C.gate("_record_ok", C.image_errors("_raw", "_typed", schema, key, lit("record"))),
    )
    return _finish_rows(C.stage(df, _record_errors=record_errors), ctx, finished=parser is not None)


def _json_seq(ctx: C.ReadContext) -> dict[str, Sql]:
    if ctx.seq_column is None:
        return {"_seq_value": "CAST(NULL AS BIGINT)", "_seq_present": "false", "_seq_error": "CAST(NULL AS STRING)"}
    path = C.json_path(ctx.seq_column)
    value, error = C.number("_v", path, ctx.seq_column)
    return {"_seq_value": value, "_seq_present": C.present(C.field("_v", path)), "_seq_error": error}


def _parse_csv(ctx: C.ReadContext) -> DataFrame:
    schema, key = ctx.schema, ctx.primary_key
    wanted = [*ctx.columns, *[c for c in (ctx.kind_column, ctx.seq_column) if c]]
    width = max(2 * len(wanted), len(wanted) + 16)
    fields = ", ".join(f"c{i} STRING" for i in range(width))
    options = ", ".join(f"{lit(k)}, {lit(str(v))}" for k, v in ctx.csv_options.items())
    options = f", map({options})" if options else ""
    names = "array(" + ", ".join(f"_h.c{i}" for i in range(width)) + ")"
    values = "array(" + ", ".join(f"_r.c{i}" for i in range(width)) + ")"
    df = C.read_lines(ctx, keep_header=True).where("line > 1")
    df = C.stage(df, _h=f"from_csv(header, {lit(fields)}{options})", _r=f"from_csv(raw, {lit(fields)}{options})")
    df = C.stage(df, _names=names, _vals=values).drop("_h", "_r")

    def get(c: str) -> Sql:
        at = f"array_position(_names, {lit(c)})"
        return f"CASE WHEN {at} > 0 THEN element_at(_vals, CAST({at} AS INT)) END"

    if ctx.seq_column is None:
        seq = {"_seq_value": "CAST(NULL AS BIGINT)", "_seq_present": "false", "_seq_error": "CAST(NULL AS STRING)"}
    else:
        text = get(ctx.seq_column)
        bad = concat(lit(f"field '{ctx.seq_column}': value "), "'\"'", C.clip(text), "'\"'", lit(" is not a BIGINT"))
        seq = {"_seq_value": f"try_cast({text} AS BIGINT)", "_seq_present": f"({text} IS NOT NULL)",
               "_seq_error": f"CASE WHEN {text} IS NOT NULL AND try_cast({text} AS BIGINT) IS NULL THEN {bad} END"}
    df = C.stage(df, _raw=C.raw_struct(get, ctx.columns))
    df = C.stage(
        df,
        _tombstone=C.is_blank("raw"),
        _record_ok=f"NOT {C.is_blank('raw')}",
        _typed=C.typed_struct("_raw", schema, strings=True),
        _kind_text=get(ctx.kind_column) if ctx.kind_column is not None else PLAIN_ROW_KIND,
        **seq,
    )
    record_errors = C.gate("_record_ok", C.image_errors("_raw", "_typed", schema, key, lit("record"), strings=True))
    df = C.stage(df, _record_errors=C.concat_messages(record_errors))
    return _finish_rows(df, ctx, tombstone_reason="empty line")


def _row_number(fmt: str) -> Sql:
    """The 1-based row number: Parquet's row index in its file; Spark's Avro
    source has none, so the record number within the reading task (the low
    33 bits of ``monotonically_increasing_id``), which follows file order."""
    if fmt == "parquet":
        return "CAST(_metadata.row_index + 1 AS BIGINT)"
    return "(monotonically_increasing_id() & 8589934591) + 1"


#: integer types read as BIGINT, FLOAT as DOUBLE, then checked (:func:`_narrowed`)
_NARROW_INTEGERS = (T.ByteType, T.ShortType, T.IntegerType)


def _read_type(dtype: T.DataType) -> T.DataType:
    """The type a typed file's column is read as: an integer column as
    BIGINT and a FLOAT as DOUBLE, so a file with a wider physical type than
    the declared one (an int64 file for an INT column, a double file for a
    FLOAT) is read whole and checked, instead of being refused by Spark's
    reader or, for an int32 file and a SMALLINT column, silently wrapped."""
    if isinstance(dtype, _NARROW_INTEGERS):
        return T.LongType()
    if isinstance(dtype, T.FloatType):
        return T.DoubleType()
    return dtype


def _narrowed(name: str, dtype: T.DataType) -> tuple[Sql, Sql]:
    """(the value in its declared type or NULL, its error or NULL) of a
    column read by :func:`_read_type`: a value that does not fit, or a
    DOUBLE that a FLOAT would round, is an error naming the field (docs/
    runtime.md, "Typed files"), never wrapped or rounded."""
    col = ident(name)
    if isinstance(dtype, _NARROW_INTEGERS):
        bits = {T.ByteType: 8, T.ShortType: 16, T.IntegerType: 32}[type(dtype)]
        fits = f"{col} BETWEEN {-(1 << bits - 1)} AND {(1 << bits - 1) - 1}"
    elif isinstance(dtype, T.FloatType):
        fits = f"(isnan({col}) OR CAST(CAST({col} AS FLOAT) AS DOUBLE) = {col})"
    else:
        return col, "NULL"
    value = f"CASE WHEN {fits} THEN CAST({col} AS {dtype.simpleString()}) END"
    error = (f"CASE WHEN {col} IS NOT NULL AND NOT {fits} THEN "
             f"{concat(lit(f'field {name!r}: value '), f'CAST({col} AS STRING)', lit(f' is not {C.type_article(dtype)} (in record)'))} END")
    return value, error


def _parse_typed(ctx: C.ReadContext) -> DataFrame:
    """Parquet and Avro files: typed columns read by Spark's data source."""
    schema, key = ctx.schema, ctx.primary_key
    file_schema = T.StructType(
        [T.StructField(f.name, _read_type(f.dataType), f.nullable) for f in schema.fields]
        + ([T.StructField(ctx.kind_column, T.StringType())] if ctx.kind_column else [])
        + ([T.StructField(ctx.seq_column, T.LongType())] if ctx.seq_column else []))
    fmt = ctx.changelog_file_format
    if fmt == "avro":
        C.require_avro(ctx.spark)
    if ctx.streaming:
        reader = ctx.spark.readStream.schema(file_schema)
        if ctx.max_files_per_trigger is not None:
            reader = reader.option("maxFilesPerTrigger", ctx.max_files_per_trigger)
        rows = reader.format(fmt).load(ctx.path)
    else:
        paths = [ctx.path] if isinstance(ctx.path, str) else list(ctx.path)
        rows = ctx.spark.read.schema(file_schema).format(fmt).load(paths)
    data = ", ".join(ident(f.name) for f in file_schema.fields)
    narrowed = {f.name: _narrowed(f.name, f.dataType) for f in schema.fields}
    typed = "named_struct(" + ", ".join(f"{lit(c)}, {narrowed[c][0]}" for c in ctx.columns) + ")"
    seq_col = ctx.seq_column
    df = rows.selectExpr(
        "_metadata.file_path AS file",
        f"{C.file_number('_metadata.file_path')} AS file_no",
        f"{_row_number(fmt)} AS line",
        f"to_json(struct({data})) AS raw",
        f"{typed} AS _typed",
        f"{ident(ctx.kind_column) if ctx.kind_column else PLAIN_ROW_KIND} AS _kind_text",
        "true AS _record_ok",
        "false AS _tombstone",
        f"{ident(seq_col) if seq_col else 'CAST(NULL AS BIGINT)'} AS _seq_value",
        f"{ident(seq_col) + ' IS NOT NULL' if seq_col else 'false'} AS _seq_present",
        "CAST(NULL AS STRING) AS _seq_error",
        f"{C.errors_array(e for _, e in narrowed.values() if e != 'NULL')} AS _value_errors",
    )
    pk_errors = [when((f"{C.struct_field('_typed', k)} IS NULL",
                       lit(f"field '{k}': primary key is missing or null (in record)"))) for k in key]
    return _finish_rows(C.stage(df, _record_errors=f"concat(_value_errors, "
                                                     f"{C.errors_array(pk_errors)})"), ctx)
