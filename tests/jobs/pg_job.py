"""A streaming normalize job writing to PostgreSQL, run as its own process by
tests/sinks/test_postgres_pipeline.py.

argv: INPUT_DIR CONNINFO TABLE CHECKPOINT [HANG_AFTER_BATCH]
With HANG_AFTER_BATCH=k the job prints ``committed k`` after batch k was
committed by the PostgreSQL sink and then hangs inside the batch, before Spark
records the batch as done: the test kills it there, so the restart must replay
batch k (and the sink must skip it).
"""
import pyarrow as pa

from job_progress import changelog_files, job_start, progress_printer
from spark_changelog.api import ChangelogStream
from spark_changelog.sinks.postgres import PostgresUpsertSink

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.int64())])


def main() -> None:
    (src, conninfo, table, ck), hang_after, spark = job_start("pg-crash-test-job", 4)
    df = changelog_files(spark, src, "id BIGINT, name STRING, score BIGINT, _kind TINYINT, _seq BIGINT")
    stream = ChangelogStream.from_dataframe(df, primary_key=["id"]).normalize(key_groups=4)
    sink = PostgresUpsertSink(conninfo, table, ["id"], SCHEMA)

    progress = progress_printer(hang_after)
    report = stream.write_upsert(sink, checkpoint=ck, progress=progress)
    print(f"finished batches={report.batches} replayed={report.replayed_batches} "
          f"upserted={report.upserted} deleted={report.deleted}", flush=True)
    sink.close()


if __name__ == "__main__":
    main()
