"""Flink's JSON format options for the CDC readers (docs/sql.md, "Format options").

A table's ``WITH`` options that belong to its format (``canal-json.table.include``,
``debezium-json.ignore-parse-errors``, ``json.ignore-parse-errors``, ...) and its
``METADATA FROM`` columns become one :class:`FormatOptions`, which the format
modules read (``cdc_json.ReadContext.options``).  The Python API takes the same
object (``read_changes(..., options=FormatOptions(...))``).

What each option does here, and where it differs from Flink:

``<format>.ignore-parse-errors``  Flink skips a record it cannot read.  Here the
    record still goes to the dead-letter output with its reason when there is
    one (``--dead-letter``); without one it is counted as skipped (category
    ``invalid``) instead of stopping the run.  ``--strict`` still stops.
``canal-json.database.include``, ``canal-json.table.include``  a Java regular
    expression that must match the whole ``database``/``table`` field (Flink's
    ``Pattern.matcher(...).matches()``); other records are skipped (category
    ``ignored``, the reason names the option).  ``maxwell-json.database.include``
    and ``maxwell-json.table.include`` do the same for Maxwell (not in Flink),
    as do ``debezium-json.*`` on ``source.db``/``source.table``.
``<format>.allow-non-numeric-numbers`` (``json.allow-non-numeric-numbers``)
    bare ``NaN``, ``Infinity``, ``-Infinity`` (Jackson's
    ``ALLOW_NON_NUMERIC_NUMBERS``) read as the DOUBLE/FLOAT values they name.
    Without it such a record is malformed JSON.  (Flink has no option: its
    parser rejects them.)
``debezium-json.schema-include``  accepted; both envelope forms are always read.
``<format>.timestamp-format.standard``  ``SQL`` or ``ISO-8601``: both
    spellings are always read.
``debezium-json.decimal.handling-mode`` (ours): how a string in a DECIMAL
    column of a Debezium envelope without schema is read: ``auto`` (default:
    a plain number like ``"12.34"`` is that number, any other string is
    Debezium's ``precise`` encoding, base64 bytes of the unscaled value with
    the column's scale), ``precise`` (every string is base64) or ``string``
    (every string is a number).  With the envelope's schema the schema decides
    (``org.apache.kafka.connect.data.Decimal`` with its ``scale`` parameter;
    ``io.debezium.data.VariableScaleDecimal`` objects carry their scale).
``debezium-json.timestamp.unit`` (ours): ``millis``, ``micros`` or ``nanos``:
    the unit of an epoch number in a TIMESTAMP column of an envelope without
    schema.  Unset, such a number is invalid (it could be any of the three);
    with the schema its logical type (``io.debezium.time.Timestamp``,
    ``MicroTimestamp``, ``NanoTimestamp``) decides.  DATE columns take
    Debezium's days since 1970-01-01 (``io.debezium.time.Date``) always.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Mapping, Optional

__all__ = ["FormatOptions", "METADATA_KEYS", "format_option_keys", "from_table_options",
           "metadata_key"]

#: the metadata keys of each format (Flink's names) and their Flink types
METADATA_KEYS: dict[str, dict[str, str]] = {
    "debezium-json": {
        "schema": "STRING",
        "ingestion-timestamp": "TIMESTAMP_LTZ(3)",
        "source.timestamp": "TIMESTAMP_LTZ(3)",
        "source.database": "STRING",
        "source.schema": "STRING",
        "source.table": "STRING",
        "source.properties": "MAP<STRING, STRING>",
    },
    "canal-json": {
        "database": "STRING",
        "table": "STRING",
        "sql-type": "MAP<STRING, INT>",
        "pk-names": "ARRAY<STRING>",
        "ingestion-timestamp": "TIMESTAMP_LTZ(3)",
        "event-timestamp": "TIMESTAMP_LTZ(3)",
    },
    "maxwell-json": {
        "database": "STRING",
        "table": "STRING",
        "primary-key-columns": "ARRAY<STRING>",
        "ingestion-timestamp": "TIMESTAMP_LTZ(3)",
    },
}

#: option suffixes each format takes after ``<format>.``
_COMMON = ("ignore-parse-errors", "allow-non-numeric-numbers", "timestamp-format.standard",
           "map-null-key.mode", "map-null-key.literal", "encode.decimal-as-plain-number",
           "fail-on-missing-field")
_SUFFIXES = {
    "debezium-json": _COMMON + ("schema-include", "database.include", "table.include",
                                "decimal.handling-mode", "timestamp.unit"),
    "canal-json": _COMMON + ("database.include", "table.include"),
    "maxwell-json": _COMMON + ("database.include", "table.include"),
    "json": _COMMON,
    "csv": ("ignore-parse-errors",),
    "parquet": (),
}
_BOOLEANS = ("ignore-parse-errors", "allow-non-numeric-numbers", "schema-include",
             "encode.decimal-as-plain-number", "fail-on-missing-field")
_CHOICES = {
    "timestamp-format.standard": ("sql", "iso-8601"),
    "decimal.handling-mode": ("auto", "precise", "string"),
    "timestamp.unit": ("millis", "micros", "nanos"),
    "map-null-key.mode": ("fail", "drop", "literal"),
}


@dataclasses.dataclass(frozen=True)
class FormatOptions:
    """A source's format options (module docstring).  ``metadata``: (column,
    metadata key) pairs of the ``METADATA FROM`` columns, which are columns of
    the read schema filled from the envelope instead of the row image."""

    ignore_parse_errors: bool = False
    allow_non_numeric_numbers: bool = False
    database_include: Optional[str] = None
    table_include: Optional[str] = None
    decimal_handling: str = "auto"
    timestamp_unit: Optional[str] = None
    metadata: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        for name in ("database_include", "table_include"):
            pattern = getattr(self, name)
            if pattern is not None:
                try:
                    re.compile(pattern)
                except re.error as e:
                    raise ValueError(f"{name.replace('_', '.')}: {pattern!r} is not a regular "
                                     f"expression ({e})") from None
        if self.decimal_handling not in _CHOICES["decimal.handling-mode"]:
            raise ValueError(f"decimal.handling-mode: expected one of "
                             f"{_CHOICES['decimal.handling-mode']}, got {self.decimal_handling!r}")
        if self.timestamp_unit not in (None,) + _CHOICES["timestamp.unit"]:
            raise ValueError(f"timestamp.unit: expected one of "
                             f"{_CHOICES['timestamp.unit']}, got {self.timestamp_unit!r}")

    @property
    def metadata_columns(self) -> dict[str, str]:
        """column -> metadata key."""
        return dict(self.metadata)


def format_option_keys(fmt: str) -> tuple[str, ...]:
    """The ``WITH`` keys a table of format ``fmt`` takes for its format."""
    prefixes = (fmt,) + (("json",) if fmt.endswith("-json") else ())
    return tuple(f"{p}.{s}" for p in prefixes for s in _SUFFIXES.get(fmt, ()))


def metadata_key(fmt: str, key: str) -> str:
    """The format's metadata key of ``METADATA FROM 'key'``: Kafka's
    ``value.`` prefix is optional; ``topic``, ``partition``, ``offset`` and
    ``timestamp`` are the Kafka record's.  ValueError naming the keys there are."""
    from spark_changelog.connectors.kafka import KAFKA_METADATA
    if key in KAFKA_METADATA:
        return key            # the Kafka record's own fields (Flink's Kafka connector keys)
    keys = METADATA_KEYS.get(fmt)
    if keys is None:
        raise ValueError(f"format {fmt!r} has no metadata columns (debezium-json, canal-json and "
                         f"maxwell-json have)")
    bare = key[len("value."):] if key.startswith("value.") else key
    if bare not in keys:
        raise ValueError(f"unknown metadata key {key!r} for format {fmt!r}: expected one of "
                         f"{', '.join(repr('value.' + k) for k in keys)}")
    return bare


def from_table_options(fmt: str, options: Mapping[str, str],
                       metadata: tuple[tuple[str, str], ...] = ()) -> FormatOptions:
    """The :class:`FormatOptions` of a table's ``WITH`` options (the keys of
    :func:`format_option_keys`; others are ignored here).  ValueError for a
    value that is not one the option takes."""
    values: dict[str, str] = {}
    for key in format_option_keys(fmt):
        if key in options:
            suffix = key.split(".", 1)[1]
            value = str(options[key]).strip()
            if suffix in _BOOLEANS and value.lower() not in ("true", "false"):
                raise ValueError(f"option {key!r}: expected 'true' or 'false', got {value!r}")
            if suffix in _CHOICES and value.lower() not in _CHOICES[suffix]:
                raise ValueError(f"option {key!r}: expected one of "
                                 f"{', '.join(repr(c) for c in _CHOICES[suffix])}, got {value!r}")
            # the format's own prefix wins over ``json.``
            if suffix not in values or key.startswith(fmt + "."):
                values[suffix] = value

    def flag(suffix: str) -> bool:
        return values.get(suffix, "false").lower() == "true"

    return FormatOptions(
        ignore_parse_errors=flag("ignore-parse-errors"),
        allow_non_numeric_numbers=flag("allow-non-numeric-numbers"),
        database_include=values.get("database.include"),
        table_include=values.get("table.include"),
        decimal_handling=values.get("decimal.handling-mode", "auto").lower(),
        timestamp_unit=values["timestamp.unit"].lower() if "timestamp.unit" in values else None,
        metadata=tuple((c, metadata_key(fmt, k)) for c, k in metadata),
    )
