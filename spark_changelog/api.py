"""The Python API: changelog streams over Spark DataFrames.

```python
from spark_changelog import build_session, read_debezium
spark = build_session()
src = read_debezium(spark, "cdc/", schema="id BIGINT, name STRING", primary_key=["id"])
report = src.normalize().write_upsert("table/", checkpoint="ck/")   # or streaming=False
```

A :class:`ChangelogStream` is a Spark DataFrame (data columns + ``_kind`` +
``_seq``) plus its :class:`~spark_changelog.model.StreamSchema`.  Operators
build new streams; nothing runs until a ``write_*``/``collect`` call.  The same
pipeline runs on a bounded DataFrame (batch) and as a Structured Streaming
query with a checkpoint, with the same operator code and the same final table.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Union

import pyarrow as pa

from .model import KIND_COL, SEQ_COL, ChangelogMode, StreamSchema, as_key
from .operators.base import KeyedOperator
from .operators.normalize import DAY_MS, ChangelogNormalize
from .runtime.spark_keyed import DEFAULT_KEY_GROUPS, apply_keyed


def arrow_schema_of(df) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema
    return to_arrow_schema(df.schema)


@dataclasses.dataclass
class ChangelogStream:
    """A changelog: a DataFrame with ``_kind``/``_seq`` and its schema facts."""

    df: object                      # pyspark.sql.DataFrame
    schema: StreamSchema
    source: Optional[object] = None  # the ReadResult it came from (dead letters)
    steps: tuple = ()               # operator names, for explain()

    @property
    def spark(self):
        return self.df.sparkSession

    @property
    def is_streaming(self) -> bool:
        return bool(self.df.isStreaming)

    @classmethod
    def from_dataframe(cls, df, primary_key: Union[str, Sequence[str], None] = None,
                       mode: ChangelogMode = ChangelogMode.RETRACT) -> "ChangelogStream":
        """Wrap a DataFrame that already has ``_kind`` (tinyint) and ``_seq`` (bigint)."""
        for c in (KIND_COL, SEQ_COL):
            if c not in df.columns:
                raise ValueError(f"DataFrame lacks the {c} column; columns: {df.columns}")
        cols = tuple(c for c in df.columns if c not in (KIND_COL, SEQ_COL))
        pk = as_key(primary_key)
        return cls(df, StreamSchema(cols, pk, pk or None, mode))

    def apply(self, operator: KeyedOperator, schema: StreamSchema, *,
              key_groups: int = DEFAULT_KEY_GROUPS) -> "ChangelogStream":
        out = apply_keyed(self._data_df(), operator, key_groups=key_groups)
        return ChangelogStream(out, schema, self.source, self.steps + (operator.name,))

    def normalize(self, key: Union[str, Sequence[str], None] = None, *,
                  state_ttl_ms: Optional[int] = None,
                  tombstone_retention_ms: Optional[int] = DAY_MS,
                  generate_update_before: bool = True,
                  key_groups: int = DEFAULT_KEY_GROUPS) -> "ChangelogStream":
        """ChangelogNormalize: keep the last change per key (spec section 5)."""
        key = as_key(key) or self.schema.primary_key
        if not key:
            raise ValueError("normalize needs a key: the stream has no primary key; pass key=[...]")
        op = ChangelogNormalize(arrow_schema_of(self._data_df()), key, state_ttl_ms=state_ttl_ms,
                                tombstone_retention_ms=tombstone_retention_ms,
                                generate_update_before=generate_update_before)
        out_schema = self.schema.with_(primary_key=key, upsert_key=key,
                                       mode=ChangelogMode.RETRACT if generate_update_before
                                       else ChangelogMode.UPSERT)
        return self.apply(op, out_schema, key_groups=key_groups)

    def _data_df(self):
        """The DataFrame without operator metric columns (input of the next operator)."""
        from .runtime.spark_keyed import METRICS_COL, METRICS_KIND
        from pyspark.sql import functions as F
        if METRICS_COL in self.df.columns:
            return self.df.where(F.col(KIND_COL) != F.lit(METRICS_KIND)).drop(METRICS_COL)
        return self.df

    def write_upsert(self, table: Union[str, "object"], *, checkpoint: Optional[str] = None,
                     changelog_path: Optional[str] = None, changelog_format: str = "parquet",
                     dead_letter: Optional[str] = None, strict: bool = False,
                     key: Union[str, Sequence[str], None] = None, progress=None):
        """Write the stream to an upsert table (a Delta path or an ``UpsertSink``);
        see :func:`spark_changelog.runtime.pipeline.run_to_sink`."""
        from .runtime.pipeline import run_to_sink
        return run_to_sink(self, table, checkpoint=checkpoint, changelog_path=changelog_path,
                           changelog_format=changelog_format, dead_letter=dead_letter,
                           strict=strict, key=key, progress=progress)

    def collect(self):
        """A bounded stream's emitted changelog as pandas (data rows, in ``_seq`` order)."""
        from .runtime.pipeline import collect_changes
        return collect_changes(self)

    def explain(self) -> str:
        s = self.schema
        return (f"{' -> '.join(('Source',) + self.steps)}\n"
                f"  changelog mode: {s.mode.value} {s.mode.kinds}\n"
                f"  primary key: {list(s.primary_key)}  upsert key: {list(s.upsert_key or [])}")


def read_changes(spark, path, format: str = "debezium-json", schema=None, primary_key=None,
                 streaming: bool = False, **kw) -> ChangelogStream:
    """Read CDC files (``debezium-json``, ``canal-json``, ``maxwell-json``, ``changelog``)."""
    from .connectors.cdc_json import read_changes as _read
    res = _read(spark, path, format=format, schema=schema, primary_key=primary_key,
                streaming=streaming, **kw)
    return ChangelogStream(res.changes, res.stream_schema, res)


def read_debezium(spark, path, schema=None, primary_key=None, **kw) -> ChangelogStream:
    return read_changes(spark, path, "debezium-json", schema, primary_key, **kw)


def read_canal(spark, path, schema=None, primary_key=None, **kw) -> ChangelogStream:
    return read_changes(spark, path, "canal-json", schema, primary_key, **kw)


def read_maxwell(spark, path, schema=None, primary_key=None, **kw) -> ChangelogStream:
    return read_changes(spark, path, "maxwell-json", schema, primary_key, **kw)
