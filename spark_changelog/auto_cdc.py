"""Auto CDC: Spark's ``create_auto_cdc_flow`` on our operators (docs/operators.md, "Auto CDC").

Spark 4.3's ``pyspark.pipelines.create_auto_cdc_flow`` (and Databricks' AUTO
CDC) turn a CDC feed into an SCD type 1 table or an SCD type 2 history.  Here
the same arguments, by the same names, build a plan on a
:class:`~spark_changelog.api.ChangelogStream` and run it into an upsert sink
(a Delta path or a PostgreSQL table), exactly once:

* type 1: ChangelogNormalize (keep the last change per key, by sequence),
  or, with partial updates or a sequence of several columns,
  :class:`~spark_changelog.operators.scd2.ScdType1Table` (the current
  versions of the history);
* type 2: :class:`~spark_changelog.operators.scd2.ScdType2History` (one row
  per version, ``__START_AT``/``__END_AT``), written to a table keyed by the
  keys and ``__START_AT``.

``source`` is any changelog stream (a Debezium read, a join, an aggregation)
or a DataFrame of change events (each row an upsert unless
``apply_as_deletes`` says it is a delete).  Unlike Spark's, ``sequence_by``
may be omitted: the source's own sequence (``_seq``: log position, file and
line) then orders the changes.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Optional, Sequence, Union

from .api import ChangelogStream
from .model import KIND_COL, SEQ_COL, ChangelogMode, RowKind, as_key
from .model.history import history_columns

Names = Union[str, Sequence[str], None]


def _sequence(sequence_by) -> tuple[str, ...]:
    """``"ts"``, ``["ts", "id"]`` or ``"struct(ts, id)"`` as column names."""
    if sequence_by is None:
        return ()
    if isinstance(sequence_by, str):
        m = re.fullmatch(r"\s*struct\s*\((.*)\)\s*", sequence_by, re.I)
        return as_key(m.group(1) if m else sequence_by)
    return tuple(str(c) for c in sequence_by)


def _stream(source, keys: tuple) -> ChangelogStream:
    if isinstance(source, ChangelogStream):
        return source
    from pyspark.sql import functions as F
    df = source
    if KIND_COL not in df.columns:      # change events: each an upsert
        df = df.withColumn(KIND_COL, F.lit(int(RowKind.UPDATE_AFTER)).cast("tinyint"))
    if SEQ_COL not in df.columns:
        df = df.withColumn(SEQ_COL, F.lit(0).cast("bigint"))
    return ChangelogStream.from_dataframe(df, keys, mode=ChangelogMode.UPSERT, name="cdc")


def auto_cdc_stream(source, keys: Names, sequence_by=None, apply_as_deletes=None,
                    apply_as_truncates=None, column_list: Optional[Sequence[str]] = None,
                    except_column_list: Optional[Sequence[str]] = None,
                    stored_as_scd_type: Union[int, str] = 1, *,
                    track_history_column_list: Optional[Sequence[str]] = None,
                    track_history_except_column_list: Optional[Sequence[str]] = None,
                    ignore_null_updates: bool = False,
                    key_groups: Optional[int] = None) -> ChangelogStream:
    """The stream :func:`create_auto_cdc_flow` writes (for ``explain``, or to
    write it elsewhere)."""
    scd = str(stored_as_scd_type)
    if scd not in ("1", "2"):
        raise ValueError(f"stored_as_scd_type must be 1 or 2, got {stored_as_scd_type!r}")
    if column_list is not None and except_column_list is not None:
        raise ValueError("pass column_list or except_column_list, not both")
    if scd != "2" and (track_history_column_list is not None
                       or track_history_except_column_list is not None):
        raise ValueError("track_history_column_list / track_history_except_column_list need "
                         "stored_as_scd_type=2")
    keys = as_key(keys)
    if not keys:
        raise ValueError("create_auto_cdc_flow needs keys")
    stream = _stream(source, keys)
    seq = _sequence(sequence_by)
    have = stream.traits.columns
    missing = [c for c in keys + seq if c not in have]
    if missing:
        raise ValueError(f"create_auto_cdc_flow: column(s) {missing} not among {list(have)}")
    if column_list is not None:
        columns = tuple(column_list)
    elif except_column_list is not None:
        columns = tuple(c for c in have if c not in set(except_column_list))
    else:
        columns = tuple(have)
    # type 1 is ChangelogNormalize (one state row per key) where it is exact:
    # no partial updates, one sequence column (it becomes _seq)
    normalize = scd == "1" and not ignore_null_updates and len(seq) <= 1
    if apply_as_deletes is not None or apply_as_truncates is not None or (normalize and seq):
        stream = stream.apply_as(apply_as_deletes, apply_as_truncates, key=keys, sequence_by=seq,
                                 resequence=normalize and bool(seq))
    if normalize:
        if columns != tuple(have):
            stream = stream.select(*columns)
        return stream.normalize(keys, key_groups=key_groups)
    history = stream.history(keys, sequence_by=seq, columns=columns,
                             track_history=track_history_column_list,
                             track_history_except=track_history_except_column_list,
                             ignore_null_updates=ignore_null_updates, key_groups=key_groups)
    if scd == "1":      # the current versions: ScdType1Table
        return stream._derive(dataclasses.replace(history.node, scd_type=1))
    return history


def create_auto_cdc_flow(target, source, keys: Names, sequence_by=None, apply_as_deletes=None,
                         apply_as_truncates=None, column_list: Optional[Sequence[str]] = None,
                         except_column_list: Optional[Sequence[str]] = None,
                         stored_as_scd_type: Union[int, str] = 1, name: Optional[str] = None, *,
                         track_history_column_list: Optional[Sequence[str]] = None,
                         track_history_except_column_list: Optional[Sequence[str]] = None,
                         ignore_null_updates: bool = False, checkpoint: Optional[str] = None,
                         changelog_path: Optional[str] = None, dead_letter: Optional[str] = None,
                         strict: bool = False, key_groups: Optional[int] = None):
    """Run an Auto CDC flow from ``source`` into ``target`` (a Delta path or
    an ``UpsertSink`` such as ``PostgresUpsertSink``); arguments as Spark's
    ``create_auto_cdc_flow`` (module docstring), plus Databricks'
    ``apply_as_truncates`` and ``ignore_null_updates``, and the run's
    ``checkpoint`` (a streaming source; resumable, exactly once).  The
    type 2 target is keyed by ``keys`` + ``__START_AT``.  ``name`` (the
    flow's name in a Spark pipeline graph) is accepted for the same call to
    work; a run here is one flow.  Returns the run report."""
    stream = auto_cdc_stream(source, keys, sequence_by, apply_as_deletes, apply_as_truncates,
                             column_list, except_column_list, stored_as_scd_type,
                             track_history_column_list=track_history_column_list,
                             track_history_except_column_list=track_history_except_column_list,
                             ignore_null_updates=ignore_null_updates, key_groups=key_groups)
    key = as_key(keys)
    if str(stored_as_scd_type) == "2":
        key = key + history_columns(_sequence(sequence_by))[0]
    return stream.write_upsert(target, key=key, checkpoint=checkpoint,
                               changelog_path=changelog_path, dead_letter=dead_letter,
                               strict=strict)


__all__ = ["create_auto_cdc_flow", "auto_cdc_stream"]
