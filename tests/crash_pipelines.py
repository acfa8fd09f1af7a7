"""The pipelines of the kill-and-restart tests, each a function
``(spark, args, progress=None) -> run report`` of string arguments.  A test
run's crashes all run in one job process, each in its own thread, killed
inside a micro-batch (tests/jobs/crash_job.py, tests/kill_restart.py); each
test then runs its pipeline again in the test process, resuming from the
checkpoint the kill left."""
from __future__ import annotations

import re

import pyarrow as pa

CUSTOMERS = "id BIGINT, name STRING, score BIGINT, _kind TINYINT, _seq BIGINT"
PG_CUSTOMERS = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.int64())])
PG_HISTORY = pa.schema([("id", pa.int64()), ("name", pa.string()), ("city", pa.string()),
                        ("__START_AT", pa.int64()), ("__END_AT", pa.int64())])


#: failures of a loaded machine, not of the query: a Python process Spark
#: started did not connect back within Spark's fixed 10 s
TRANSIENT = re.compile(r"Python worker failed to connect back|CANNOT_OPEN_SOCKET|"
                       r"SocketTimeoutException")


def retrying(run, attempts: int = 3):
    """``run()``, again from its checkpoint (a replay, as after a kill) when
    it failed with a :data:`TRANSIENT` error: the job processes of the kill
    tests run several queries at once."""
    for attempt in range(attempts):
        try:
            return run()
        except Exception as e:                              # noqa: BLE001 (re-raised unless transient)
            if attempt == attempts - 1 or not TRANSIENT.search(str(e)):
                raise
            print(f"retrying after a transient failure: {str(e).splitlines()[0][:200]}", flush=True)


def changelog_files(spark, src: str, schema: str):
    """The changelog Parquet files under ``src`` (columns ``schema``, a DDL
    string) as a stream, one file per micro-batch."""
    return spark.readStream.format("parquet").option("maxFilesPerTrigger", 1).schema(schema).load(src)


def normalize(spark, args, progress=None):
    """A normalize into Delta.  args: INPUT TABLE CHECKPOINT CHANGELOG [KEY_GROUPS (4)]."""
    from spark_changelog.api import ChangelogStream
    src, table, ck, log, *kg = args
    stream = ChangelogStream.from_dataframe(changelog_files(spark, src, CUSTOMERS),
                                            primary_key=["id"]).normalize(key_groups=int(kg[0]) if kg else 4)
    return stream.write_upsert(table, checkpoint=ck, changelog_path=log, progress=progress)


def normalize_materialize(spark, args, progress=None):
    """A normalize and the upsert materializer on (name, id), chained in one
    keyed step (docs/runtime.md, "Chained keyed operators"), into Delta.
    args: INPUT TABLE CHECKPOINT CHANGELOG."""
    from spark_changelog.api import ChangelogStream
    src, table, ck, log = args
    stream = ChangelogStream.from_dataframe(changelog_files(spark, src, CUSTOMERS),
                                            primary_key=["id"]).normalize(key_groups=4)
    return stream.write_upsert(table, checkpoint=ck, changelog_path=log, key=["name", "id"],
                               materialize="force", progress=progress)


def normalize_pg(spark, args, progress=None):
    """A normalize into PostgreSQL (PostgresUpsertSink).  args: INPUT CONNINFO TABLE CHECKPOINT."""
    from spark_changelog.api import ChangelogStream
    from spark_changelog.sinks.postgres import PostgresUpsertSink
    src, conninfo, table, ck = args
    stream = ChangelogStream.from_dataframe(changelog_files(spark, src, CUSTOMERS),
                                            primary_key=["id"]).normalize(key_groups=4)
    sink = PostgresUpsertSink(conninfo, table, ["id"], PG_CUSTOMERS)
    try:
        return stream.write_upsert(sink, checkpoint=ck, progress=progress)
    finally:
        sink.close()


def conflict(spark, args, progress=None):
    """``ON CONFLICT DO NOTHING`` (source watermarks, buffered changes) into
    Delta.  args: INPUT TABLE CHECKPOINT CHANGELOG."""
    from spark_changelog.api import ChangelogStream
    src, table, ck, log = args
    df = changelog_files(spark, src, "uk BIGINT, pk BIGINT, v STRING, t BIGINT, _kind TINYINT, _seq BIGINT")
    stream = (ChangelogStream.from_dataframe(df, primary_key=["uk"])
              .with_column("rt", "timestamp_millis(t)").with_watermark("rt", 0))
    return stream.write_upsert(table, key="pk", conflict="nothing", checkpoint=ck, changelog_path=log,
                               progress=progress, key_groups=4)


def window(spark, args, progress=None):
    """A window aggregate with per-partition watermarks and idleness
    (tests/windows_data.py) into Delta.  args: INPUT TABLE CHECKPOINT CHANGELOG LATE."""
    from windows_data import window_stream
    src, table, ck, log, late = args
    return window_stream(spark, src, True).write_upsert(table, checkpoint=ck, changelog_path=log,
                                                        late_output=late, progress=progress)


def history(spark, args, progress=None):
    """SCD type 2 history into PostgreSQL, or Delta when CONNINFO is
    ``delta`` (TABLE is then its path).  args: INPUT CONNINFO TABLE CHECKPOINT."""
    from spark_changelog.api import ChangelogStream
    from spark_changelog.sinks.postgres import PostgresUpsertSink
    src, conninfo, table, ck = args
    df = changelog_files(spark, src, "id BIGINT, name STRING, city STRING, _kind TINYINT, _seq BIGINT")
    stream = ChangelogStream.from_dataframe(df, primary_key=["id"]).history(key_groups=4)
    sink = table if conninfo == "delta" else PostgresUpsertSink(conninfo, table, ["id", "__START_AT"],
                                                                PG_HISTORY)
    try:
        return stream.write_upsert(sink, key=["id", "__START_AT"], checkpoint=ck, progress=progress)
    finally:
        if conninfo != "delta":
            sink.close()


PIPELINES = {f.__name__: f for f in (normalize, normalize_materialize, normalize_pg, conflict, window, history)}
