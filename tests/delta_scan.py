"""A reader of Delta tables that is not the sink's: delta-rs' DataFusion scan
(``deltalake.QueryBuilder``), which applies deletion vectors.  delta-rs
1.6.6's ``DeltaTable.to_pyarrow_table``/``to_pandas`` refuse tables with
the ``deletionVectors`` reader feature (docs/sinks.md, "The table other
readers open")."""
from __future__ import annotations

import deltalake
import pyarrow as pa


def scan_delta(path) -> pa.Table:
    """Every live row of the table at ``path``, in the table's Arrow schema
    (the scan's string views cast back), in no particular order."""
    dt = deltalake.DeltaTable(str(path))
    rows = pa.table(deltalake.QueryBuilder().register("t", dt).execute("SELECT * FROM t"))
    return rows.cast(pa.schema(dt.schema().to_arrow()))
