"""A streaming window aggregate with per-partition watermarks and idleness, run
as its own process by tests/runtime/test_windows_spark.py (kill and restart).

argv: INPUT_DIR TABLE CHECKPOINT CHANGELOG LATE [HANG_AFTER_BATCH]  (see job_progress)
"""
from job_progress import job_start, progress_printer
from windows_data import window_stream


def main() -> None:
    (src, table, ck, log, late), hang_after, spark = job_start("window-crash-test-job", 5)
    report = window_stream(spark, src, True).write_upsert(
        table, checkpoint=ck, changelog_path=log, late_output=late,
        progress=progress_printer(hang_after))
    print(f"finished batches={report.batches} replayed={report.replayed_batches} "
          f"late={report.late_rows}", flush=True)


if __name__ == "__main__":
    main()
