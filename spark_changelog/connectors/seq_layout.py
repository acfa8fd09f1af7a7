"""The bit layout of ``_seq`` (the ``cdc_json`` module docstring, "Sequence
encoding"), without a Spark import: the SQL readers (``cdc_json``) and the
Debezium line task (``debezium_arrow``, in the Python workers) encode positions
with the same widths."""

PHASE_BEFORE = 0
PHASE_AFTER = 1

#: bit widths of the position parts
POSITION_BITS = 62
LSN_BITS = 62
BINLOG_FILE_BITS, BINLOG_OFFSET_BITS = 28, 34
TS_MS_BITS, TS_LINE_BITS = 42, 20
FILE_NO_BITS, FILE_LINE_BITS = 34, 28
#: PostgreSQL CDC (connectors/pgoutput.py): commit end LSN | position in transaction
PG_COMMIT_LSN_BITS, PG_TX_POSITION_BITS = 42, 20
