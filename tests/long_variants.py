"""The suite's long variants run only with ``SPARK_CHANGELOG_LONG_TESTS=1``
(README, "The two commands"): kill tests, clusters, the slow halves of a
streaming/batch pair.  One switch, read in one place."""
from __future__ import annotations

import os

import pytest

LONG = os.environ.get("SPARK_CHANGELOG_LONG_TESTS") == "1"


def long_only(reason: str) -> pytest.MarkDecorator:
    """Skip the test unless the long variants were asked for; ``reason`` says
    what makes it long."""
    return pytest.mark.skipif(not LONG, reason=f"long variant (SPARK_CHANGELOG_LONG_TESTS=1): {reason}")
