from .rowkind import RowKind
from .schema import (KIND_COL, METADATA_COLUMNS, SEQ_COL, ChangelogMode, StreamSchema,
                     WatermarkStrategy, as_key)

__all__ = ["RowKind", "ChangelogMode", "StreamSchema", "WatermarkStrategy", "KIND_COL",
           "SEQ_COL", "METADATA_COLUMNS", "as_key"]
