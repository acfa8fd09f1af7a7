"""Debezium's default encodings of temporal and decimal columns, decoded
(docs/semantics.md, section 1, "Debezium's type encodings").

Debezium writes a DECIMAL as base64 bytes of its unscaled value
(``org.apache.kafka.connect.data.Decimal``, the scale in the schema's
``parameters``) or as ``{"scale": s, "value": base64}``
(``io.debezium.data.VariableScaleDecimal``), a DATE as days since 1970-01-01
(``io.debezium.time.Date``) and a TIMESTAMP as an epoch number whose unit is
named by its schema (``io.debezium.time.Timestamp`` ms, ``MicroTimestamp`` µs,
``NanoTimestamp`` ns, Kafka Connect's ``Timestamp`` ms) or as an ISO string
(``ZonedTimestamp``).  The JSON alone does not say which, so the envelope's
schema (``schemas.enable=true``) decides when it is there; otherwise the
declared column type and the options (``format_options``: a non-numeric
string in a DECIMAL column is base64 with the column's scale; an epoch number
in a TIMESTAMP column needs ``debezium-json.timestamp.unit``).

A decoded value that does not fit its column exactly (more digits than the
DECIMAL holds, nanoseconds a microsecond TIMESTAMP would drop) is NULL here,
which ``cdc_json.image_errors`` reports as a wrong-typed field: never rounded.

Everything is Spark SQL on the VARIANT path; these columns never take the
Arrow fast path (``debezium.FAST_TYPES``).
"""
from __future__ import annotations

from typing import Optional

from pyspark.sql import types as T

from spark_changelog.connectors import cdc_json as C
from spark_changelog.connectors.cdc_json import Sql, lit
from spark_changelog.connectors.format_options import FormatOptions

DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
DATES = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")
#: timestamp logical types -> the epoch number's unit
TIMESTAMP_UNITS = {"io.debezium.time.Timestamp": "millis", "org.apache.kafka.connect.data.Timestamp": "millis",
                   "io.debezium.time.MicroTimestamp": "micros", "io.debezium.time.NanoTimestamp": "nanos"}
_PLAIN_NUMBER = r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$"
_DECODED = (T.DecimalType, T.DateType, T.TimestampType, T.TimestampNTZType)


def decodes(dtype: T.DataType) -> bool:
    """Whether a column of ``dtype`` may hold one of Debezium's encodings."""
    return isinstance(dtype, _DECODED)


def field_types(line: Sql) -> Sql:
    """column -> ``struct<name string, scale int>`` of the row image's fields in
    the envelope's schema (the ``after`` field's, else ``before``'s), NULL
    without a schema."""
    fields = f"try_variant_get({line}, '$.schema.fields', 'array<variant>')"
    image = (f"coalesce(filter({fields}, f -> try_variant_get(f, '$.field', 'string') = 'after')[0], "
             f"filter({fields}, f -> try_variant_get(f, '$.field', 'string') = 'before')[0])")
    entries = (f"transform(try_variant_get({image}, '$.fields', 'array<variant>'), f -> struct("
               f"try_variant_get(f, '$.field', 'string') AS k, named_struct("
               f"'name', try_variant_get(f, '$.name', 'string'), "
               f"'scale', try_variant_get(f, '$.parameters.scale', 'int')) AS v))")
    return f"map_from_entries(filter({entries}, e -> e.k IS NOT NULL))"


def convert(v: Sql, dtype: T.DataType, logical: Sql, options: FormatOptions) -> Optional[Sql]:
    """``v`` (a variant) of a ``dtype`` column decoded from Debezium's
    encodings, else converted as any JSON value (``cdc_json.coerce_variant``);
    ``logical`` is the column's ``struct<name, scale>`` of :func:`field_types`
    (NULL without schema).  None for types without an encoding here."""
    plain = C.coerce_variant(v, dtype)
    kind = f"schema_of_variant({v})"
    name = f"{logical}.name"
    if isinstance(dtype, T.DecimalType):
        text = f"try_variant_get({v}, '$', 'string')"
        if options.decimal_handling == "precise":
            base64_string = "true"
        elif options.decimal_handling == "string":
            base64_string = "false"
        else:
            base64_string = f"NOT ({text} RLIKE {lit(_PLAIN_NUMBER)})"
        by_schema = f"{name} = {lit(DECIMAL)}"
        return C.when(
            (f"{kind} LIKE 'OBJECT<%'", unscaled_decimal(f"try_variant_get({v}, '$.value', 'string')",
                                                    f"try_variant_get({v}, '$.scale', 'int')", dtype)),
            (f"{kind} = 'STRING' AND ({by_schema} OR ({name} IS NULL AND {base64_string}))",
             unscaled_decimal(text, f"coalesce({logical}.scale, {dtype.scale})", dtype)),
            otherwise=plain)
    number = f"{kind} = 'BIGINT'"
    n = f"try_variant_get({v}, '$', 'bigint')"
    if isinstance(dtype, T.DateType):
        return C.when((f"({number}) AND ({name} IS NULL OR {C.is_in(name, DATES)})",
                       f"date_add(DATE'1970-01-01', CAST({n} AS INT))"), otherwise=plain)
    if isinstance(dtype, (T.TimestampType, T.TimestampNTZType)):
        units = [(f"{name} = {lit(t)}", lit(u)) for t, u in TIMESTAMP_UNITS.items()]
        units.append((f"{C.is_in(name, DATES)}", lit("days")))
        fallback = lit(options.timestamp_unit) if options.timestamp_unit else "CAST(NULL AS STRING)"
        unit = C.when(*units, otherwise=f"CASE WHEN {name} IS NULL THEN {fallback} END")
        instant = C.when(
            (f"{unit} = 'millis'", f"timestamp_millis({n})"),
            (f"{unit} = 'micros'", f"timestamp_micros({n})"),
            # a TIMESTAMP holds microseconds: nanoseconds that are not whole ones are not rounded away
            (f"{unit} = 'nanos' AND {n} % 1000 = 0", f"timestamp_micros({n} div 1000)"),
            (f"{unit} = 'days'", f"timestamp_micros(try_multiply({n}, {86_400_000_000}))"))
        if isinstance(dtype, T.TimestampNTZType):
            # the epoch number is the wall clock as if in UTC (Debezium's rule for zoneless columns)
            instant = f"convert_timezone(current_timezone(), 'UTC', CAST({instant} AS TIMESTAMP_NTZ))"
        return C.when((number, instant), otherwise=plain)
    return None


def unscaled_decimal(base64: Sql, scale: Sql, dtype: T.DecimalType) -> Sql:
    """The DECIMAL of base64 bytes holding a big-endian two's-complement
    unscaled value and ``scale``; NULL when the bytes do not decode or the
    value does not fit ``dtype`` exactly (at most 16 bytes: DECIMAL(38))."""
    b = f"try_to_binary({base64}, 'base64')"
    byte = "CAST(conv(hex(substr(_b, i, 1)), 16, 10) AS INT)"
    # a negative value is -(~bytes + 1): the magnitude fits in 38 digits where
    # two's complement would not
    negative = f"({byte.replace('_b, i', '_b, 1')} >= 128)"
    digit = f"CASE WHEN {negative} THEN 255 - {byte} ELSE {byte} END"
    magnitude = (f"aggregate(sequence(1, length(_b)), CAST(0 AS DECIMAL(38,0)), "
                 f"(acc, i) -> try_add(try_multiply(acc, CAST(256 AS DECIMAL(38,0))), CAST({digit} AS DECIMAL(38,0))))")
    unscaled = f"CASE WHEN {negative} THEN -(try_add({magnitude}, CAST(1 AS DECIMAL(38,0)))) ELSE {magnitude} END"
    # the unscaled digits with the point put in: exact, whatever the scale
    # (lpad also cuts a longer string: only pad a shorter one)
    digits = f"CASE WHEN _u IS NOT NULL THEN lpad(CAST(abs(_u) AS STRING), greatest(_s + 1, length(CAST(abs(_u) AS STRING))), '0') END"
    text = (f"concat(CASE WHEN _u < 0 THEN '-' ELSE '' END, substr(_d, 1, length(_d) - _s), "
            f"CASE WHEN _s > 0 THEN concat('.', substr(_d, length(_d) - _s + 1)) ELSE '' END)")
    value = f"try_cast(_t AS {dtype.simpleString()})"
    exact = f"try_cast(_t AS {C.exact_decimal(dtype)})"
    body = f"CASE WHEN {exact} = {value} THEN {value} END"
    # one-element transforms name the intermediate values (each used several times)
    for name, expr in (("_t", text), ("_d", digits), ("_u", unscaled), ("_s", scale), ("_b", b)):
        body = f"element_at(transform(array({expr}), {name} -> {body}), 1)"
    return f"CASE WHEN length({b}) BETWEEN 1 AND 16 AND {scale} >= 0 THEN {body} END"
