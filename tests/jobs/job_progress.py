"""What the test jobs share: the progress callback that prints ``committed k``
after batch k reached the sinks and, with ``hang_after == k``, then hangs
inside the batch (before Spark records it as done), so the test can kill the
job there and the restart must replay batch k."""
import time


def progress_printer(hang_after):
    def progress(report):
        done = report.batches - 1
        print(f"committed {done}", flush=True)
        if hang_after is not None and done == hang_after:
            time.sleep(3600)
    return progress
