"""The seed's statements over ``'connector' = 'postgres-cdc'`` tables (Flink
CDC's option names) into Delta: snapshot, then the log, equal to the join
PostgreSQL computes; declared columns that do not match the PostgreSQL table
are errors naming them (docs/sources.md, "PostgreSQL CDC")."""
from __future__ import annotations

import pytest

from pg_cdc_workload import Workload, create_tables, drop_slots, expected_join
from spark_changelog.sinks.delta import read_table
from spark_changelog.sql.errors import SqlError
from spark_changelog.sql.runner import run_script
from spark_changelog.sql.script import parse_script

pytestmark = pytest.mark.postgres

SCRIPT = """
CREATE TEMPORARY TABLE s1 (
  id BIGINT,
  level {level_type},
  PRIMARY KEY(id) NOT ENFORCED
) WITH ('connector' = 'postgres-cdc', 'hostname' = '{host}', 'port' = '{port}',
        'username' = '{user}', 'database-name' = '{db}', 'schema-name' = 'public',
        'table-name' = 's1', 'slot.name' = 'sql_s1', 'decoding.plugin.name' = 'pgoutput',
        'scan.startup.mode' = 'initial', 'snapshot.staging-dir' = '{stage}/s1');

CREATE TEMPORARY TABLE s2 (
  id BIGINT,
  attr VARCHAR,
  PRIMARY KEY(id) NOT ENFORCED
) WITH ('connector' = 'postgres-cdc', 'hostname' = '{host}', 'port' = '{port}',
        'username' = '{user}', 'database-name' = '{db}', 'table-name' = 's2',
        'slot.name' = 'sql_s2', 'snapshot.staging-dir' = '{stage}/s2');

CREATE TEMPORARY TABLE t1 (
  id BIGINT,
  level BIGINT,
  attr VARCHAR,
  PRIMARY KEY(id) NOT ENFORCED
) WITH ('connector' = 'delta', 'path' = '{out}');

INSERT INTO t1
SELECT
  s1.*, s2.attr
FROM s1 JOIN s2
ON s1.level = s2.id;
"""


def script(pg, db, tmp_path, level_type="BIGINT"):
    return parse_script(SCRIPT.format(host=pg.host, port=pg.port, user=pg.user, db=db,
                                      stage=tmp_path / "stage", out=tmp_path / "t1",
                                      level_type=level_type), "pgcdc.sql")


def test_seed_sql_over_postgres_cdc_tables(spark, pg_server, tmp_path):
    db = "pgcdc_sql"
    conninfo = pg_server.create_database(db)
    create_tables(conninfo)
    with pytest.raises(SqlError, match=r"column 'level' is declared INT but PostgreSQL's type maps "
                                       r"to BIGINT"):
        run_script(spark, script(pg_server, db, tmp_path, "INT"), batch=False,
                   checkpoint=str(tmp_path / "ck"), show_progress=False)
    with pytest.raises(SqlError, match="'postgres-cdc' is a streaming source"):
        run_script(spark, script(pg_server, db, tmp_path), batch=True, show_progress=False)
    run_script(spark, script(pg_server, db, tmp_path), batch=False,
               checkpoint=str(tmp_path / "ck"), show_progress=False)
    Workload(conninfo, threads=2, transactions=30).start().join()
    runs = run_script(spark, script(pg_server, db, tmp_path), batch=False,
                      checkpoint=str(tmp_path / "ck"), show_progress=False)
    assert "slot sql_s1 at" in runs[0].report.summary()
    got = sorted(tuple(r) for r in read_table(str(tmp_path / "t1"))[["id", "level", "attr"]]
                 .astype(object).values.tolist())
    assert got == expected_join(conninfo)
    drop_slots(conninfo)
