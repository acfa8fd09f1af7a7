"""What the planner can tell from a Spark column expression's text.

Spark prints a ``Column`` as ``Column<'...'>``: ``a``, ``a AS b``,
``CAST(a AS BIGINT) AS z``, ``concat(a, b)``, ``rand(42)``.  That is enough to
recognise references, renames and casts (which keep a key only when the cast
is injective) and the usual non-deterministic functions.  Anything else is an
expression that drops keys; that is conservative (a lost key means a
materializer may be inserted where it was not needed, never the opposite).
"""
from __future__ import annotations

import re
from typing import Mapping, Optional

from .traits import ProjectItem

#: functions whose value differs between evaluations of the same row
NONDETERMINISTIC_FUNCTIONS = (
    "current_timestamp", "current_date", "now", "localtimestamp", "current_time", "rand", "randn",
    "random", "uuid", "shuffle", "monotonically_increasing_id", "spark_partition_id",
    "input_file_name", "unix_timestamp", "curdate", "try_reflect", "reflect",
)
_ND = re.compile(r"\b(" + "|".join(NONDETERMINISTIC_FUNCTIONS) + r")\s*\(", re.IGNORECASE)
_IDENT = r"`[^`]+`|[A-Za-z_][A-Za-z0-9_]*"
_ALIAS = re.compile(rf"^(?P<expr>.*?)\s+AS\s+(?P<alias>{_IDENT})$", re.IGNORECASE | re.DOTALL)
_CAST = re.compile(rf"^CAST\((?P<src>{_IDENT}) AS (?P<type>[A-Za-z0-9_(), ]+)\)$", re.IGNORECASE)

# integral widening is injective; so is any integer -> decimal/string/double(small ints)
_RANK = {"tinyint": 1, "byte": 1, "smallint": 2, "short": 2, "int": 3, "integer": 3,
         "bigint": 4, "long": 4}


def _unquote(name: str) -> str:
    return name[1:-1] if name.startswith("`") and name.endswith("`") else name


def is_nondeterministic(text: str) -> bool:
    return bool(_ND.search(text))


def cast_is_injective(from_type: Optional[str], to_type: str) -> bool:
    """A cast that maps distinct values to distinct values (keys survive it)."""
    if from_type is None:
        return False
    f, t = from_type.lower().strip(), to_type.lower().strip()
    if f == t:
        return True
    if f in _RANK and t in _RANK:
        return _RANK[t] >= _RANK[f]
    if f in _RANK and (t in ("string", "varchar") or t.startswith("decimal")):
        if t.startswith("decimal("):
            p, s = (int(x) for x in t[8:-1].split(","))
            return p - s >= {1: 3, 2: 5, 3: 10, 4: 19}[_RANK[f]]
        return True
    if f == "float" and t == "double":
        return True
    return False


def expression_text(col) -> str:
    s = str(col)
    m = re.match(r"^Column<'(.*)'>$", s, re.DOTALL)
    return m.group(1) if m else s


def classify(text: str, name: Optional[str], input_types: Mapping[str, str],
             deterministic: Optional[bool] = None) -> ProjectItem:
    """The :class:`ProjectItem` of one expression (``text`` as Spark prints it).

    ``name``: the output name if given separately (else the alias in ``text``,
    else the text).  ``input_types``: input column -> Spark simple type string.
    ``deterministic``: overrides the detection when the caller knows.
    """
    expr, alias = text.strip(), None
    m = _ALIAS.match(expr)
    if m and m.group("expr").count("(") == m.group("expr").count(")"):
        expr, alias = m.group("expr").strip(), _unquote(m.group("alias"))
    out = name or alias or expr
    nd = is_nondeterministic(expr) if deterministic is None else not deterministic
    reads = tuple(c for c in input_types if re.search(rf"(?<![A-Za-z0-9_`]){re.escape(c)}(?![A-Za-z0-9_`])", expr)
                  or f"`{c}`" in expr)
    ref = _unquote(expr)
    if ref in input_types:
        return ProjectItem(out, ref, True, not nd, ref if ref == out else f"{ref} AS {out}", (ref,))
    c = _CAST.match(expr)
    if c:
        src = _unquote(c.group("src"))
        if src in input_types:
            inj = cast_is_injective(input_types.get(src), c.group("type"))
            return ProjectItem(out, src, inj, not nd, expr if out == expr else f"{expr} AS {out}", (src,))
    return ProjectItem(out, None, False, not nd, f"{expr} AS {out}" if out != expr else expr, reads)


__all__ = ["classify", "expression_text", "is_nondeterministic", "cast_is_injective",
           "NONDETERMINISTIC_FUNCTIONS"]
