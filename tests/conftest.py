"""One Spark session for the whole test run (starting one costs seconds)."""
from __future__ import annotations

import pytest

from pgserver import pg_server  # noqa: F401  (session fixture: a private PostgreSQL 15)


@pytest.fixture(scope="session")
def spark():
    from spark_changelog.runtime.session import build_session

    session = build_session("spark-changelog-tests", configs={"spark.sql.shuffle.partitions": "2",
                                                               "spark.default.parallelism": "2"})
    yield session
    session.stop()
