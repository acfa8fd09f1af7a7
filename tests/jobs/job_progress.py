"""What the test jobs share: how a job starts (:func:`job_start`: its
arguments, the optional HANG_AFTER_BATCH after them, a Spark session), the
changelog Parquet files they read one per micro-batch
(:func:`changelog_files`), and the progress callback that prints
``committed k`` after batch k reached the sinks and, with ``hang_after == k``,
then hangs inside the batch (before Spark records it as done), so the test
can kill the job there and the restart must replay batch k."""
import sys
import time
from typing import Optional


def job_start(name: str, n_args: int):
    """(the job's first ``n_args`` arguments, HANG_AFTER_BATCH after them or
    None, a Spark session named ``name`` with two shuffle partitions)."""
    from spark_changelog.runtime.session import build_session
    args = sys.argv[1:1 + n_args]
    hang_after: Optional[int] = int(sys.argv[1 + n_args]) if len(sys.argv) > 1 + n_args else None
    spark = build_session(name, configs={"spark.sql.shuffle.partitions": "2"})
    return args, hang_after, spark


def changelog_files(spark, src: str, schema: str):
    """The changelog Parquet files under ``src`` (columns ``schema``, a DDL
    string) as a stream, one file per micro-batch."""
    return spark.readStream.format("parquet").option("maxFilesPerTrigger", 1).schema(schema).load(src)


def progress_printer(hang_after):
    def progress(report):
        done = report.batches - 1
        print(f"committed {done}", flush=True)
        if hang_after is not None and done == hang_after:
            time.sleep(3600)
    return progress
