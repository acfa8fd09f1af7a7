"""The ``SET`` options a script's statements see (docs/sql.md, "Settings")."""
from __future__ import annotations

import dataclasses
from typing import Optional

from ..model.watermark import duration_ms
from .script import SetOption

#: our own SET key (Flink drops late rows; it has no such option): where the
#: window operators' late rows go
LATE_OUTPUT_KEY = "spark-changelog.late-output.path"


@dataclasses.dataclass
class Settings:
    """The ``SET`` options in force at a statement."""

    materialize: str = "auto"
    require_on_conflict: bool = False
    state_ttl_ms: Optional[int] = None
    runtime_mode: Optional[str] = None
    allow_lateness_ms: int = 0
    idle_timeout_ms: Optional[int] = None
    late_output: Optional[str] = None
    mini_batch: bool = False
    #: rows of a bare SELECT printed at most (sql/tableau.py)
    max_rows: int = 100
    ignored: tuple = ()

    def apply(self, s: SetOption) -> "Settings":
        v = s.value.strip()
        if s.key == "table.exec.sink.upsert-materialize":
            return dataclasses.replace(self, materialize=v.lower())
        if s.key == "table.exec.sink.require-on-conflict":
            return dataclasses.replace(self, require_on_conflict=v.lower() == "true")
        if s.key == "table.exec.state.ttl":
            ms = duration_ms(int(v) if v.isdigit() else v)
            return dataclasses.replace(self, state_ttl_ms=ms or None)
        if s.key == "execution.runtime-mode":
            return dataclasses.replace(self, runtime_mode=v.lower())
        if s.key == "table.exec.emit.allow-lateness":
            return dataclasses.replace(self, allow_lateness_ms=duration_ms(
                int(v) if v.isdigit() else v))
        if s.key == "table.exec.source.idle-timeout":
            ms = duration_ms(int(v) if v.isdigit() else v)
            return dataclasses.replace(self, idle_timeout_ms=ms or None)
        if s.key == LATE_OUTPUT_KEY:
            return dataclasses.replace(self, late_output=v or None)
        if s.key == "sql-client.display.max-rows":
            if not v.isdigit() or int(v) < 1:
                raise ValueError(f"SET {s.key!r}: a positive number of rows, got {v!r}")
            return dataclasses.replace(self, max_rows=int(v))
        if s.key == "table.exec.mini-batch.enabled":
            return dataclasses.replace(self, mini_batch=v.lower() == "true")
        return dataclasses.replace(self, ignored=self.ignored + (s.key,))


__all__ = ["Settings", "LATE_OUTPUT_KEY"]
