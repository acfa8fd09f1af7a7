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


@pytest.fixture(scope="session")
def crashed(request, tmp_path_factory):
    """``crashed(NAME)``: the state after the shared crash of the tests marked
    ``shared_crash`` (tests/kill_restart.py): one job process for all."""
    from kill_restart import SharedCrashes
    return SharedCrashes(request, tmp_path_factory)
