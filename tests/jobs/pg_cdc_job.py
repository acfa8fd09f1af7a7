"""The seed's join over two PostgreSQL CDC sources into a PostgreSQL upsert
table, run as its own process by tests/connectors/test_postgres_cdc_kill.py.

argv: HOST PORT USER DB STAGING CHECKPOINT MODE
MODE ``loop``: run the streaming query again and again (each run reads what the
slots hold, in micro-batches) until killed; ``once``: one run, then exit.
Per micro-batch it prints ``committed <batch> superseded=<n>`` (changes the
ChangelogNormalize dropped as already applied: a change delivered twice would
count there).
"""
import sys

import pyarrow as pa

from spark_changelog.api import read_postgres_cdc
from spark_changelog.runtime.session import build_session
from spark_changelog.sinks.postgres import PostgresUpsertSink

T1 = pa.schema([("id", pa.int64()), ("level", pa.int64()), ("attr", pa.string())])


def main() -> None:
    host, port, user, db, staging, ck, mode = sys.argv[1:8]
    spark = build_session("pg-cdc-kill-job", configs={"spark.sql.shuffle.partitions": "2"})

    def source(table):
        return read_postgres_cdc(spark, table, hostname=host, port=int(port), username=user,
                                 database_name=db, slot_name=f"kill_{table}",
                                 **{"snapshot.staging-dir": f"{staging}/{table}",
                                    "scan.max-changes-per-batch": 1000,
                                    "scan.incremental.snapshot.chunk.size": 64})
    query = source("s1").join(source("s2"), on=[("level", "id")]).select("id", "level", "attr")
    sink = PostgresUpsertSink(f"host={host} port={port} user={user} dbname={db}", "t1", ["id"], T1,
                              create=True)
    seen = {"superseded": 0}

    def progress(report):
        total = report.counters.get("superseded", 0)
        print(f"committed {report.batches - 1} superseded={total - seen['superseded']}", flush=True)
        seen["superseded"] = total

    while True:
        seen["superseded"] = 0
        query.write_upsert(sink, key="id", checkpoint=ck, progress=progress)
        print("run done", flush=True)
        if mode == "once":
            break
    sink.close()


if __name__ == "__main__":
    main()
