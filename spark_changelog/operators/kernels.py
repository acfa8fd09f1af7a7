"""Vectorized building blocks shared by the keyed operators.

Operators work on the rows of one key group at a time, sorted by key (then
``_seq``); these helpers answer "per run of equal keys" questions for all runs
at once with numpy, so no operator loops over keys or rows in Python
(docs/operators.md, "how operators are vectorized").
"""
from __future__ import annotations

import warnings
from decimal import Decimal
from typing import Optional, Sequence

import numpy as np
import pandas as pd


#: float64 holds every integer of at most this magnitude exactly (53-bit mantissa)
FLOAT64_EXACT = 2**53


def _beyond_float64(values: np.ndarray) -> bool:
    return bool(len(values)) and (int(values.max()) > FLOAT64_EXACT or int(values.min()) < -FLOAT64_EXACT)


def nullable_ints(values: np.ndarray, null: np.ndarray) -> np.ndarray:
    """Integers (numpy) with a null mask as the operators hold a nullable
    integer column in pandas: float64 with NaN while every value fits float64
    exactly, else object (Python ints and None), which keeps a BIGINT beyond
    2**53 exact (docs/operators.md, "BIGINT beyond 2**53")."""
    if not null.any():
        return values
    if _beyond_float64(values[~null]):
        out = values.astype(object)
        out[null] = None
        return out
    out = values.astype(np.float64)
    out[null] = np.nan
    return out


def _int_parts(col: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int64 values, null mask) of an integer column held as int64, float64
    with NaN or object (Python ints, maybe floats, and None/NaN)."""
    if col.dtype.kind in "iu":
        return col.astype(np.int64, copy=False), np.zeros(len(col), dtype=bool)
    null = np.asarray(pd.isna(col), dtype=bool)
    vals = np.zeros(len(col), dtype=np.int64)
    if not null.all():
        vals[~null] = col[~null].astype(np.int64)
    return vals, null


def concat_ints(parts: Sequence[np.ndarray]) -> np.ndarray:
    """The concatenation of integer column parts (int64, float64 with NaN or
    object) as :func:`nullable_ints` holds it: numpy would hold an int64
    part beside a float64 one as float64 (rounding beyond 2**53) and floats
    beside Python ints as object."""
    if len({p.dtype for p in parts}) <= 1:
        return np.concatenate(parts)
    split = [_int_parts(p) for p in parts]
    return nullable_ints(np.concatenate([v for v, _ in split]), np.concatenate([n for _, n in split]))


def arrow_to_pandas(table) -> pd.DataFrame:
    """``table.to_pandas()`` (maps as dicts) that keeps BIGINT values beyond
    2**53 exact: Arrow gives a 64-bit integer column with nulls to pandas as
    float64, which rounds them; such a column comes as :func:`nullable_ints`
    holds it (object) instead.  Every other column as Arrow gives it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    df = table.to_pandas(maps_as_pydicts="strict")
    for i, f in enumerate(table.schema):
        if not pa.types.is_int64(f.type):
            continue
        col = table.column(i)
        if not col.null_count or col.null_count == len(col):
            continue
        mm = pc.min_max(col).as_py()
        if mm["max"] > FLOAT64_EXACT or mm["min"] < -FLOAT64_EXACT:
            df[f.name] = col.to_pandas(integer_object_nulls=True).to_numpy()
    return df


def run_starts(x: np.ndarray) -> np.ndarray:
    """True where a run of equal values of the (grouped) array ``x`` begins."""
    first = np.ones(len(x), dtype=bool)
    if len(x) > 1:
        first[1:] = x[1:] != x[:-1]
    return first


def run_ends(x: np.ndarray) -> np.ndarray:
    """True where a run of equal values of the (grouped) array ``x`` ends."""
    last = np.ones(len(x), dtype=bool)
    if len(x) > 1:
        last[:-1] = x[1:] != x[:-1]
    return last


def grouped_cumsum(x: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Inclusive cumsum restarting at every ``first``."""
    if not len(x):
        return x.copy()
    cs = np.cumsum(x)
    run = np.cumsum(first) - 1
    base = (cs - x)[first]
    return cs - base[run]


def grouped_cummin(x: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Cumulative min restarting at every ``first`` (offset trick, one pass)."""
    if not len(x):
        return x.copy()
    run = np.cumsum(first) - 1
    span = int(x.max() - x.min()) + 1
    shifted = x - span * run
    return np.minimum.accumulate(shifted) + span * run


def clamped_count(initial: np.ndarray, delta: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Running ``c = max(0, c + d)`` per run, for all runs at once.

    ``initial``: the count before the run, given at every position (constant
    within a run); ``delta``: +1/-1 (or 0) per position; ``first``: run starts.
    Returns the count *after* each position.  Reflection formula: with
    ``S_t = initial + sum(d[..t])``, ``c_t = S_t - min(0, min_{s<=t} S_s)``.
    A decrement at a count of zero is thus ignored (a retraction with nothing
    to retract)."""
    if not len(delta):
        return np.zeros(0, dtype=np.int64)
    s = grouped_cumsum(delta.astype(np.int64), first) + initial.astype(np.int64)
    low = np.minimum(grouped_cummin(s, first), 0)
    return s - low


def group_sum(values: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """Exact per-group sum (int stays int, unlike ``np.bincount`` weights)."""
    out = np.zeros(n_groups, dtype=values.dtype if values.dtype != bool else np.int64)
    np.add.at(out, group, values)
    return out


def ranges_to_indices(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(s, s + l)`` for each range, vectorized."""
    lens = np.asarray(lens, dtype=np.int64)
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(np.asarray(starts, dtype=np.int64)
                        - np.concatenate(([0], np.cumsum(lens)[:-1])), lens)
    return offsets + np.arange(total, dtype=np.int64)


def factorize_rows(df, cols: Sequence[str], codes: Optional[np.ndarray] = None) -> np.ndarray:
    """Dense int64 codes of the rows of ``df`` (anything indexable by column
    name with a length), equal iff all ``cols`` are equal (nulls equal
    nulls); ``codes``: codes of further columns to combine with (e.g. the
    key's)."""
    n = len(df)
    if codes is None:
        codes, card = np.zeros(n, dtype=np.int64), 1
    else:
        card = int(codes.max()) + 1 if n else 1
    for c in cols:
        k, uniq = pd.factorize(df[c], use_na_sentinel=False)
        m = max(len(uniq), 1)
        if card * m >= 2 ** 62:
            codes = pd.factorize(codes)[0].astype(np.int64)
            card = int(codes.max()) + 1 if n else 1
        codes = codes * m + k
        card *= m
    if card > 4 * n + 16:
        codes = pd.factorize(codes)[0].astype(np.int64)
    return codes


def key_codes(df: pd.DataFrame, key: Sequence[str]) -> tuple[np.ndarray, int]:
    """Codes 0..n-1 of the key of each row of ``df`` (sorted by key), in order
    of first appearance, and the number of distinct keys."""
    if not len(df):
        return np.zeros(0, dtype=np.int64), 0
    codes = factorize_rows(df, key)
    codes = pd.factorize(codes)[0].astype(np.int64)
    return codes, int(codes.max()) + 1


def grouped_cummax(x: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Cumulative max restarting at every ``first``."""
    if not len(x):
        return x.copy()
    return -grouped_cummin(-x, first)


def rows_equal(a: pd.DataFrame, b: pd.DataFrame, columns: Sequence[str]) -> np.ndarray:
    """Row-wise equality of aligned frames, nulls equal to nulls."""
    eq = np.ones(len(a), dtype=bool)
    for c in columns:
        x, y = a[c], b[c]
        if pd.api.types.is_datetime64_any_dtype(x.dtype) and x.dtype == y.dtype:
            # as int64 (NaT is one value, so null equals null): to_numpy()
            # of a zoned column boxes every value as a Timestamp object
            eq &= x.array.asi8 == y.array.asi8
            continue
        x, y = x.to_numpy(), y.to_numpy()
        both_null = pd.isna(x) & pd.isna(y)
        with np.errstate(invalid="ignore"):
            try:
                same = np.asarray(x == y, dtype=bool)
            except (ValueError, TypeError):
                # ARRAY/MAP/ROW values (numpy arrays, lists of pairs, dicts)
                # compare element by element, nulls inside equal to nulls
                same = np.fromiter((same_value(a, b) for a, b in zip(x, y)), dtype=bool,
                                   count=len(x))
        eq &= same | both_null
    return eq


def same_value(a, b) -> bool:
    """Equality of two values of an ARRAY, MAP or ROW column (as pandas
    holds them: numpy arrays, lists of (key, value) pairs, dicts), nested;
    null equals null."""
    if isinstance(a, dict) or isinstance(b, dict):
        return (isinstance(a, dict) and isinstance(b, dict) and list(a) == list(b)
                and all(same_value(a[k], b[k]) for k in a))
    if isinstance(a, (np.ndarray, list, tuple)) or isinstance(b, (np.ndarray, list, tuple)):
        return (isinstance(a, (np.ndarray, list, tuple)) and isinstance(b, (np.ndarray, list, tuple))
                and len(a) == len(b) and all(same_value(p, q) for p, q in zip(a, b)))
    a_null, b_null = a is None or (pd.api.types.is_scalar(a) and pd.isna(a)), \
        b is None or (pd.api.types.is_scalar(b) and pd.isna(b))
    if a_null or b_null:
        return a_null and b_null
    return bool(a == b)


def event_time_ms(col: pd.Series) -> np.ndarray:
    """Event times as int64 epoch milliseconds: integer columns are taken as
    milliseconds, timestamps are converted.  Nulls are an error (an event
    time is needed to place the row)."""
    if col.isna().any():
        raise ValueError(f"event time column {col.name!r} has {int(col.isna().sum())} null "
                         "value(s); every row needs an event time")
    if pd.api.types.is_datetime64_any_dtype(col.dtype):
        if getattr(col.dt, "tz", None) is not None:
            col = col.dt.tz_convert("UTC").dt.tz_localize(None)
        return col.astype("datetime64[ms]").to_numpy().view(np.int64)
    return col.to_numpy(dtype=np.int64)


def concat_frames(frames) -> pd.DataFrame:
    """``pd.concat`` of the non-empty frames (the first frame if all are
    empty).  All-null columns are expected (tombstones, cleared values), so
    pandas' warning about them changing dtypes is silenced."""
    frames = list(frames)
    nonempty = [f for f in frames if len(f)]
    if len(nonempty) <= 1:
        return (nonempty or frames[:1])[0].reset_index(drop=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return pd.concat(nonempty, ignore_index=True)


def fifo_survivors(slot: np.ndarray, delta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Queues of equal entries where an add (``delta`` +1) appends and a
    retraction (-1) removes the *oldest* entry, or is ignored when the queue
    is empty.  ``slot``: the queue of each position, positions sorted by slot
    then time.  Returns ``(alive, ignored)``: the adds whose entry survives,
    and the retractions that found nothing.

    As removals always take the oldest, the survivors of a queue are its last
    ``c`` adds, ``c`` its final length (:func:`clamped_count`)."""
    n = len(slot)
    if not n:
        return np.zeros(0, dtype=bool), np.zeros(0, dtype=bool)
    first, last = run_starts(slot), run_ends(slot)
    delta = np.asarray(delta, dtype=np.int64)
    count = clamped_count(np.zeros(n, dtype=np.int64), delta, first)
    before = np.where(first, 0, np.r_[0, count[:-1]])
    ignored = (delta < 0) & (before == 0)
    run = np.cumsum(first) - 1
    final = count[last]
    is_add = delta > 0
    adds_to_end = grouped_cumsum(is_add[::-1].astype(np.int64), last[::-1])[::-1]
    return is_add & (adds_to_end <= final[run]), ignored


def last_change_per_key(key_arrays: Sequence[np.ndarray], seq: np.ndarray,
                        is_add: np.ndarray) -> np.ndarray:
    """Positions (ascending) of each key's last change: the largest ``_seq``,
    at equal ``_seq`` the addition (retractions sort before additions,
    docs/semantics.md, section 1), then the later position.  ``key_arrays``:
    one array per key column whose values are equal iff the key column is
    (values, or codes of them); one ``lexsort``, no per-key loop."""
    n = len(seq)
    if not n:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((np.arange(n), np.asarray(is_add, dtype=np.int8), seq)
                       + tuple(reversed([np.asarray(a) for a in key_arrays])))
    last = np.zeros(n, dtype=bool)
    last[-1] = True
    for a in key_arrays:
        s = np.asarray(a)[order]
        last[:-1] |= s[1:] != s[:-1]
    return np.sort(order[last])


def arrow_key_arrays(table, key: Sequence[str]) -> list[np.ndarray]:
    """numpy arrays of the ``key`` columns of the Arrow ``table`` for
    :func:`last_change_per_key`: integer and temporal columns as their values,
    other types (strings, ...) and columns with nulls as dictionary codes
    (equal iff the values are; nulls equal nulls)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    out = []
    for k in key:
        col = table[k].combine_chunks() if isinstance(table[k], pa.ChunkedArray) else table[k]
        t = col.type
        if col.null_count == 0 and pa.types.is_integer(t):
            out.append(col.to_numpy())
        elif col.null_count == 0 and pa.types.is_temporal(t) and t.bit_width in (32, 64):
            out.append(col.view(pa.int64() if t.bit_width == 64 else pa.int32()).to_numpy())
        else:
            enc = pc.dictionary_encode(col, null_encoding="encode")
            out.append(enc.indices.to_numpy(zero_copy_only=False))
    return out


def sort_arrays(df: pd.DataFrame, columns: Sequence[str]) -> list[np.ndarray]:
    """One numpy array per column of ``df`` whose ascending order is pandas'
    order of that column (nulls last), for :func:`stable_order`: numbers as
    they are (NaN sorts last in numpy as in pandas), timestamps as int64,
    anything else (strings, columns with NaT or NA) as codes of its sorted
    distinct values with nulls after them (``pd.factorize(sort=True)``, the
    order pandas' own multi-column sort uses)."""
    out = []
    for c in columns:
        col = df[c]
        dtype = col.dtype
        if isinstance(dtype, np.dtype) and dtype.kind in "biuf":
            out.append(col.to_numpy())
            continue
        if (isinstance(dtype, pd.DatetimeTZDtype) or (isinstance(dtype, np.dtype) and dtype.kind == "M")) \
                and not col.isna().any():
            out.append(col.array.asi8)
            continue
        codes, uniques = pd.factorize(col, sort=True)
        out.append(np.where(codes < 0, len(uniques), codes))
    return out


def stable_order(df: pd.DataFrame, columns: Sequence[str]) -> np.ndarray:
    """The permutation ``df.sort_values(columns, kind="stable")`` applies, as
    positions: one ``np.lexsort`` over :func:`sort_arrays` (pandas factorizes
    and sorts every key column's values first, ~3x slower on integer keys)."""
    return stable_order_ties(df, columns)[0]


def stable_order_ties(df: pd.DataFrame, columns: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`stable_order` and, in that order, ``tied[i]``: row ``i + 1``
    equals row ``i`` on every column (nulls equal nulls), from the same
    arrays."""
    if not len(df):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    arrays = sort_arrays(df, columns)
    order = np.lexsort(tuple(reversed(arrays)))
    tied = np.ones(len(df) - 1, dtype=bool)
    for a in arrays:
        s = a[order]
        same = s[1:] == s[:-1]
        if s.dtype.kind == "f":
            same |= np.isnan(s[1:]) & np.isnan(s[:-1])
        tied &= same
    return order, tied


def value_sort_arrays(col: pd.Series) -> list[np.ndarray]:
    """Like :func:`sort_arrays`, for one column of any type: arrays whose
    lexicographic order is a total order of its values, equal iff the values
    are (for :func:`break_ties`).  Floats add their sign bit (``-0.0`` and
    ``0.0`` compare equal but are different bytes); ARRAY, MAP and ROW values
    (numpy arrays, lists of pairs, dicts: unhashable) are ordered by a
    canonical text of the value (:func:`canonical_text`)."""
    dtype = col.dtype
    if isinstance(dtype, np.dtype) and dtype.kind == "f":
        values = col.to_numpy()
        return [values, np.signbit(values)]
    frame = col.to_frame("c")
    try:
        return sort_arrays(frame, ["c"])
    except TypeError:
        codes, uniques = pd.factorize(col.map(canonical_text, na_action="ignore"), sort=True)
        return [np.where(codes < 0, len(uniques), codes)]


def canonical_text(value) -> str:
    """A text equal for equal ARRAY/MAP/ROW values (nested numpy arrays,
    lists, tuples and dicts as pandas holds them) and different otherwise."""
    return repr(_plain_value(value))


def _plain_value(value):
    if isinstance(value, dict):
        return tuple((k, _plain_value(v)) for k, v in value.items())
    if isinstance(value, (np.ndarray, list, tuple)):
        return tuple(_plain_value(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Decimal):
        return ("decimal", str(value))
    return value


def break_ties(df: pd.DataFrame, order: np.ndarray, tied: np.ndarray, columns: Sequence[str],
               leading: Sequence[np.ndarray] = ()) -> np.ndarray:
    """``order`` (a permutation of the rows of ``df``; ``tied[i]``: its
    ``i + 1``-th row ties with its ``i``-th on the order so far) with each run
    of tied rows ordered by the ``leading`` arrays (one value per row of
    ``df``), then by ``columns`` (:func:`value_sort_arrays`), left to right;
    other rows keep their place.  Only the tied rows are looked at, and a
    column only while ties remain, so the cost follows the ties, not the batch
    (an update's ``-U``/``+U`` pair is ordered by its kinds alone)."""
    order = np.array(order, dtype=np.int64)
    if len(order) < 2 or not tied.any():
        return order
    involved = np.zeros(len(order), dtype=bool)
    involved[1:] |= tied
    involved[:-1] |= tied
    pos = np.flatnonzero(involved)
    rows = order[pos]
    keys = [np.cumsum(np.r_[True, ~tied])[pos]]
    sources = [[np.asarray(a)[rows]] for a in leading] + list(columns)
    for source in sources:
        keys += source if isinstance(source, list) else value_sort_arrays(df[source].take(rows))
        sub = np.lexsort(tuple(reversed(keys)))
        still = np.ones(len(pos) - 1, dtype=bool)
        for k in keys:
            s = k[sub]
            still &= (s[1:] == s[:-1]) | (pd.isna(s[1:]) & pd.isna(s[:-1]))
        if not still.any():
            break
    order[pos] = rows[sub]
    return order
