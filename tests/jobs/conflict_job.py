"""A streaming ``ON CONFLICT DO NOTHING`` job (source watermarks, buffered changes) run as its own
process by tests/operators/test_conflict_spark.py.

argv: INPUT_DIR TABLE CHECKPOINT CHANGELOG [HANG_AFTER_BATCH]  (see job_progress)
"""
import sys

from job_progress import progress_printer
from spark_changelog.api import ChangelogStream
from spark_changelog.runtime.session import build_session


def main() -> None:
    src, table, ck, log = sys.argv[1:5]
    hang_after = int(sys.argv[5]) if len(sys.argv) > 5 else None
    spark = build_session("conflict-crash-test-job", configs={"spark.sql.shuffle.partitions": "2"})
    df = (spark.readStream.format("parquet").option("maxFilesPerTrigger", 1)
          .schema("uk BIGINT, pk BIGINT, v STRING, t BIGINT, _kind TINYINT, _seq BIGINT").load(src))
    stream = (ChangelogStream.from_dataframe(df, primary_key=["uk"])
              .with_column("rt", "timestamp_millis(t)").with_watermark("rt", 0))
    report = stream.write_upsert(table, key="pk", conflict="nothing", checkpoint=ck,
                                 changelog_path=log, progress=progress_printer(hang_after),
                                 key_groups=4)
    print(f"finished batches={report.batches} replayed={report.replayed_batches}", flush=True)


if __name__ == "__main__":
    main()
