"""Regular (unbounded) stream-stream join (docs/semantics.md, section 4)."""
from .regular_join import JOIN_TYPES, SIDE_COL, JoinInputLayout, RegularJoin
from .state_views import (InputSideHasNoUniqueKey, InputSideHasUniqueKey, JoinKeyContainsUniqueKey,
                          choose_view)

__all__ = ["JoinInputLayout", "RegularJoin", "JOIN_TYPES", "SIDE_COL", "JoinKeyContainsUniqueKey",
           "InputSideHasUniqueKey", "InputSideHasNoUniqueKey", "choose_view"]
