from .rowkind import RowKind
from .schema import (KIND_COL, METADATA_COLUMNS, SEQ_COL, ChangelogMode, StreamSchema, as_key,
                     join_output_names)
from .watermark import (END_OF_INPUT_MS, BoundedOutOfOrderness, WatermarkStrategy, duration_ms,
                        monotonous_timestamps)

__all__ = ["RowKind", "ChangelogMode", "StreamSchema", "WatermarkStrategy",
           "BoundedOutOfOrderness", "monotonous_timestamps", "duration_ms", "END_OF_INPUT_MS",
           "KIND_COL", "SEQ_COL", "METADATA_COLUMNS", "as_key", "join_output_names"]
