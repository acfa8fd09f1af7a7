"""A streaming ``ON CONFLICT DO NOTHING`` job (source watermarks, buffered changes) run as its own
process by tests/operators/test_conflict_spark.py.

argv: INPUT_DIR TABLE CHECKPOINT CHANGELOG [HANG_AFTER_BATCH]  (see job_progress)
"""
from job_progress import changelog_files, job_start, progress_printer
from spark_changelog.api import ChangelogStream


def main() -> None:
    (src, table, ck, log), hang_after, spark = job_start("conflict-crash-test-job", 4)
    df = changelog_files(spark, src, "uk BIGINT, pk BIGINT, v STRING, t BIGINT, _kind TINYINT, _seq BIGINT")
    stream = (ChangelogStream.from_dataframe(df, primary_key=["uk"])
              .with_column("rt", "timestamp_millis(t)").with_watermark("rt", 0))
    report = stream.write_upsert(table, key="pk", conflict="nothing", checkpoint=ck,
                                 changelog_path=log, progress=progress_printer(hang_after),
                                 key_groups=4)
    print(f"finished batches={report.batches} replayed={report.replayed_batches}", flush=True)


if __name__ == "__main__":
    main()
