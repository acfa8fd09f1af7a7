"""A streaming SCD type 2 history job writing to PostgreSQL or Delta, run as
its own process by tests/operators/test_scd2_spark.py.

argv: INPUT_DIR CONNINFO TABLE CHECKPOINT [HANG_AFTER_BATCH]
(CONNINFO ``delta``: TABLE is the path of a Delta table)
With HANG_AFTER_BATCH=k the job prints ``committed k`` after batch k was
committed by the sink and then hangs inside the batch, before Spark records
it as done: the test kills it there, so the restart replays batch k.
"""
import pyarrow as pa

from job_progress import changelog_files, job_start, progress_printer
from spark_changelog.api import ChangelogStream
from spark_changelog.sinks.postgres import PostgresUpsertSink

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("city", pa.string()),
                    ("__START_AT", pa.int64()), ("__END_AT", pa.int64())])


def main() -> None:
    (src, conninfo, table, ck), hang_after, spark = job_start("history-crash-test-job", 4)
    df = changelog_files(spark, src, "id BIGINT, name STRING, city STRING, _kind TINYINT, _seq BIGINT")
    stream = ChangelogStream.from_dataframe(df, primary_key=["id"]).history(key_groups=4)
    sink = table if conninfo == "delta" else \
        PostgresUpsertSink(conninfo, table, ["id", "__START_AT"], SCHEMA)

    progress = progress_printer(hang_after)
    report = stream.write_upsert(sink, key=["id", "__START_AT"], checkpoint=ck, progress=progress)
    print(f"finished batches={report.batches} replayed={report.replayed_batches}", flush=True)
    if conninfo != "delta":
        sink.close()


if __name__ == "__main__":
    main()
