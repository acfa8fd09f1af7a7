"""A streaming normalize job run as its own process by the crash test.

argv: INPUT_DIR TABLE CHECKPOINT CHANGELOG [HANG_AFTER_BATCH]
With HANG_AFTER_BATCH=k the job prints ``committed k`` after batch k reached
the sinks and then hangs inside the batch, before Spark records the batch as
done: the test kills it there, so the restart must replay batch k.
``KEY_GROUPS`` (environment, default 4): the normalize's key groups.
"""
import os

from job_progress import changelog_files, job_start, progress_printer
from spark_changelog.api import ChangelogStream


def main() -> None:
    (src, table, ck, log), hang_after, spark = job_start("crash-test-job", 4)
    df = changelog_files(spark, src, "id BIGINT, name STRING, score BIGINT, _kind TINYINT, _seq BIGINT")
    stream = ChangelogStream.from_dataframe(df, primary_key=["id"]).normalize(
        key_groups=int(os.environ.get("KEY_GROUPS", "4")))

    progress = progress_printer(hang_after)
    report = stream.write_upsert(table, checkpoint=ck, changelog_path=log, progress=progress)
    print(f"finished batches={report.batches} replayed={report.replayed_batches}", flush=True)


if __name__ == "__main__":
    main()
