"""A streaming normalize job run as its own process by the crash test.

argv: INPUT_DIR TABLE CHECKPOINT CHANGELOG [HANG_AFTER_BATCH]
With HANG_AFTER_BATCH=k the job prints ``committed k`` after batch k reached
the sinks and then hangs inside the batch, before Spark records the batch as
done: the test kills it there, so the restart must replay batch k.
``KEY_GROUPS`` (environment, default 4): the normalize's key groups.
"""
import os
import sys

from job_progress import progress_printer
from spark_changelog.api import ChangelogStream
from spark_changelog.runtime.session import build_session


def main() -> None:
    src, table, ck, log = sys.argv[1:5]
    hang_after = int(sys.argv[5]) if len(sys.argv) > 5 else None
    spark = build_session("crash-test-job", configs={"spark.sql.shuffle.partitions": "2"})
    df = (spark.readStream.format("parquet").option("maxFilesPerTrigger", 1)
          .schema("id BIGINT, name STRING, score BIGINT, _kind TINYINT, _seq BIGINT").load(src))
    stream = ChangelogStream.from_dataframe(df, primary_key=["id"]).normalize(
        key_groups=int(os.environ.get("KEY_GROUPS", "4")))

    progress = progress_printer(hang_after)
    report = stream.write_upsert(table, checkpoint=ck, changelog_path=log, progress=progress)
    print(f"finished batches={report.batches} replayed={report.replayed_batches}", flush=True)


if __name__ == "__main__":
    main()
