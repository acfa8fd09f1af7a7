from .rowkind import RowKind
from .schema import (KIND_COL, METADATA_COLUMNS, METRICS_COL, METRICS_KIND, PACKED_GROUP_COL, PACKED_KIND,
                     PACKED_ROWS_COL, SEQ_COL, ChangelogMode, StreamSchema, as_key, join_output_names)
from .watermark import (END_OF_INPUT_MS, BoundedOutOfOrderness, WatermarkStrategy, duration_ms,
                        monotonous_timestamps)

__all__ = ["RowKind", "ChangelogMode", "StreamSchema", "WatermarkStrategy",
           "BoundedOutOfOrderness", "monotonous_timestamps", "duration_ms", "END_OF_INPUT_MS",
           "KIND_COL", "SEQ_COL", "METADATA_COLUMNS", "METRICS_COL", "METRICS_KIND",
           "PACKED_KIND", "PACKED_GROUP_COL", "PACKED_ROWS_COL", "as_key", "join_output_names"]
