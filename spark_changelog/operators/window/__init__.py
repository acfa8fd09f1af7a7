"""Event-time windows (docs/windows.md): assigners and the window aggregate."""
from ...model.windows import Cumulate, Hop, Session, Tumble, WindowAssigner, cumulate, hop, session, tumble

__all__ = ["WindowAssigner", "Tumble", "Hop", "Cumulate", "Session", "tumble", "hop", "cumulate",
           "session"]
