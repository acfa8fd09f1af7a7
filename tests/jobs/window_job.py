"""A streaming window aggregate with per-partition watermarks and idleness, run
as its own process by tests/runtime/test_windows_spark.py (kill and restart).

argv: INPUT_DIR TABLE CHECKPOINT CHANGELOG LATE [HANG_AFTER_BATCH]  (see job_progress)
"""
import sys

from job_progress import progress_printer
from spark_changelog.runtime.session import build_session
from windows_data import window_stream


def main() -> None:
    src, table, ck, log, late = sys.argv[1:6]
    hang_after = int(sys.argv[6]) if len(sys.argv) > 6 else None
    spark = build_session("window-crash-test-job", configs={"spark.sql.shuffle.partitions": "2"})
    report = window_stream(spark, src, True).write_upsert(
        table, checkpoint=ck, changelog_path=log, late_output=late,
        progress=progress_printer(hang_after))
    print(f"finished batches={report.batches} replayed={report.replayed_batches} "
          f"late={report.late_rows}", flush=True)


if __name__ == "__main__":
    main()
