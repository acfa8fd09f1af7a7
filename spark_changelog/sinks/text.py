"""Values as text for people: Flink's ``print`` format and exact JSON lines
(docs/sinks.md, "Values as text").

A DECIMAL is always written with its digits and its type's scale (``1.10``,
``12345678901234567890.1234567890``), never through a float; an integer
column that holds nulls stays an integer (pandas would make it ``3.0``).
"""
from __future__ import annotations

import datetime
import decimal
import json
import math
from typing import Optional

import numpy as np
import pandas as pd
import pyarrow as pa

from ..model.decimals import plain


def _java_double(v: float) -> str:
    """Java's ``Double.toString``: ``1.5``, ``100.0``, ``1.0E7``, ``1.0E-4``,
    ``NaN``, ``Infinity`` (the shortest digits that give ``v`` back, as
    Python's ``repr``)."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    if v == 0 or 1e-3 <= abs(v) < 1e7:
        r = repr(v)
        return r if "." in r else r + ".0"
    sign, digits, exp = decimal.Decimal(repr(v)).as_tuple()
    text = "".join(map(str, digits)).rstrip("0") or "0"
    mantissa = text[0] + "." + (text[1:] or "0")
    return ("-" if sign else "") + f"{mantissa}E{exp + len(digits) - 1}"


def _java_time(t: datetime.time) -> str:
    """Java's ``LocalTime.toString``: ``10:00``, ``10:00:01``, ``10:00:00.500``,
    ``10:00:00.000001`` (fractions in groups of three digits)."""
    text = f"{t.hour:02d}:{t.minute:02d}"
    if t.second or t.microsecond:
        text += f":{t.second:02d}"
    if t.microsecond:
        text += "." + (f"{t.microsecond // 1000:03d}" if t.microsecond % 1000 == 0
                       else f"{t.microsecond:06d}")
    return text


def flink_text(v, t: Optional[pa.DataType] = None) -> str:
    """One value as Flink 2.3's ``print`` connector writes it (checked against
    a Flink run, ``tests/sinks/test_text.py``): ``null``, ``true``, integers
    as integers (never ``3.0``), DECIMAL as Java's ``BigDecimal.toString``
    (``1.10``, ``1E-10``: exact, the same algorithm as Python's), DOUBLE as
    ``Double.toString``, TIMESTAMP as ``LocalDateTime.toString`` in UTC
    (``2024-01-02T10:00:00.500``), DATE ``2024-01-01``, TIME ``10:11:12``,
    BYTES as Java's signed byte list ``[0, -1]``, ARRAY ``[1, 2]``, MAP
    ``{a=1}`` (``{}`` when empty), ROW ``+I[1, b]``, nested as Flink nests
    them (``[+I[1], +I[2]]``; ``statements.json`` P1).  ``t``: the value's
    Arrow type, which tells an empty MAP from an empty ARRAY (both come as
    an empty list); without it the value's Python form decides."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, float):
        return _java_double(v)
    if isinstance(v, datetime.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return v.date().isoformat() + "T" + _java_time(v.time())
    if isinstance(v, datetime.time):
        return _java_time(v)
    if isinstance(v, datetime.date):
        return v.isoformat()
    if isinstance(v, bytes):
        return "[" + ", ".join(str(b - 256 if b > 127 else b) for b in v) + "]"
    if isinstance(v, list):
        if (t is not None and pa.types.is_map(t)) or (t is None and v and isinstance(v[0], tuple)):
            # a MAP comes as (key, value) pairs
            kt, it = (t.key_type, t.item_type) if t is not None else (None, None)
            return "{" + ", ".join(f"{flink_text(k, kt)}={flink_text(x, it)}" for k, x in v) + "}"
        et = t.value_type if t is not None and pa.types.is_list(t) else None
        return "[" + ", ".join(flink_text(x, et) for x in v) + "]"
    if isinstance(v, dict):                   # a ROW
        types = [f.type for f in t] if t is not None and pa.types.is_struct(t) else [None] * len(v)
        return "+I[" + ", ".join(flink_text(x, ft) for x, ft in zip(v.values(), types)) + "]"
    return str(v)


def json_value(v) -> str:
    """One value as a JSON value: a DECIMAL as a JSON number with exactly
    its digits (JSON numbers have no precision limit; a float would round
    ``DECIMAL(38, 10)``), timestamps as ISO strings, bytes as hex strings."""
    if v is None or v is pd.NaT or v is pd.NA:
        return "null"
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return "null"
    if isinstance(v, decimal.Decimal):
        return plain(v)
    if isinstance(v, (pd.Timestamp, datetime.datetime, datetime.date, datetime.time)):
        return json.dumps(v.isoformat())
    if isinstance(v, bytes):
        return json.dumps(v.hex())
    if isinstance(v, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{json_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list) and v and all(isinstance(x, tuple) and len(x) == 2 for x in v):
        return json_value(dict(v))            # a MAP: (key, value) pairs
    if isinstance(v, (list, tuple, np.ndarray)):
        return "[" + ",".join(json_value(x) for x in v) + "]"
    return json.dumps(v)


def json_lines(table: pa.Table):
    """Each row of the Arrow ``table`` as one JSON object (``cat --format
    json``), from its exact Python values (a ROW's integer field stays an
    integer, a MAP is an object)."""
    names = [json.dumps(str(c)) for c in table.column_names]
    columns = [table.column(c).to_pylist() for c in table.column_names]
    for row in zip(*columns):
        yield "{" + ",".join(f"{n}:{json_value(v)}" for n, v in zip(names, row)) + "}"


def csv_ready(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its DECIMAL columns as plain digit strings, for
    ``to_csv`` (``str`` of a Decimal may use an exponent: ``1E-10``)."""
    out = df
    for c in df.columns:
        col = df[c]
        if col.dtype == object and any(isinstance(v, decimal.Decimal) for v in col):
            out = out.copy() if out is df else out
            out[c] = [plain(v) if isinstance(v, decimal.Decimal) else v for v in col]
    return out


__all__ = ["flink_text", "json_value", "json_lines", "csv_ready"]
