"""A Flink SQL script as a small typed model (docs/sql.md).

:func:`parse_script` tokenizes the script with the :class:`~.dialect.Flink`
dialect, splits it at ``;``, parses each statement with sqlglot and turns it
into one of:

* :class:`TableDef` (``CREATE [TEMPORARY] TABLE``): columns with Flink and
  Spark types, computed columns (``c AS expr``, ``PROCTIME()``), primary key,
  watermark, and the ``WITH`` options resolved to a :class:`Connector`;
* :class:`ViewDef` (``CREATE [TEMPORARY] VIEW v AS query``);
* :class:`SetOption` (``SET 'key' = 'value'``), checked for the keys we use;
* :class:`InsertDef` (``INSERT INTO t query [ON CONFLICT DO ...]``);
* :class:`ExplainDef` (``EXPLAIN [CHANGELOG_MODE] statement``);
* :class:`StatementSet` (``EXECUTE STATEMENT SET BEGIN ... END`` or
  ``BEGIN STATEMENT SET; ... END;``).

Queries stay sqlglot trees; :mod:`.translate` turns them into a plan.  Every
statement keeps its position, and every error is a :class:`~.errors.SqlError`
with line and column.

Watermarks: Flink SQL's ``WATERMARK FOR ts AS ts - INTERVAL 'b' unit`` emits
``W = max(ts) - b``; our ``with_watermark(col, bound)`` is ``W = max - bound -
1 ms`` (the DataStream rule), so the SQL delay ``b`` maps to ``bound = b - 1 ms``
exactly (:attr:`WatermarkDef.bound_ms`).
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Union

from ..connectors.postgres_cdc import OPTIONS as POSTGRES_CDC_OPTIONS

from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from ..connectors.format_options import FormatOptions, format_option_keys, from_table_options
from ..connectors.kafka import KAFKA_OPTIONS
from ..model.watermark import duration_ms
from ..sinks.delta import TABLE_OPTIONS as DELTA_TABLE_OPTIONS, sink_options as delta_sink_options
from .dialect import Explain, Flink, MetadataColumnConstraint, StatementSetBegin
from .errors import SqlError, UnsupportedFeature

#: filesystem formats -> (reader format, changelog file format)
FILESYSTEM_FORMATS = {
    "debezium-json": ("debezium-json", None),
    "canal-json": ("canal-json", None),
    "maxwell-json": ("maxwell-json", None),
    "json": ("changelog", "json"),
    "csv": ("changelog", "csv"),
    "parquet": ("changelog", "parquet"),
    "avro": ("changelog", "avro"),
}
CONNECTORS = ("filesystem", "kafka", "postgres-cdc", "delta", "jdbc", "postgres", "print",
              "blackhole")
#: the connectors (resolved kinds) whose table CREATE TABLE ... AS SELECT may create
CREATABLE = ("delta", "postgres", "print", "blackhole")
#: a sink table that holds the SCD type 2 history of what is inserted (sql/history_sink.py)
HISTORY_OPTIONS = ("spark-changelog.scd-type", "spark-changelog.track-history",
                   "spark-changelog.ignore-null-updates", "spark-changelog.sequence-by")
#: formats a Kafka topic's records can have -> (reader format, changelog file format)
KAFKA_FORMATS = {f: FILESYSTEM_FORMATS[f] for f in ("debezium-json", "canal-json", "maxwell-json", "json")}
#: the WITH options each connector takes besides 'connector' (and 'path'/'format')
CONNECTOR_OPTIONS = {
    "filesystem": ("changelog.kind-column", "changelog.seq-column", "csv.field-delimiter",
                   "csv.quote-character", "csv.escape-character",
                   "source.max-files-per-trigger", "source.monitor-interval", "source.ordered",
                   "changelog.mode"),
    "kafka": KAFKA_OPTIONS,
    # and the sink's own, named as Delta's table properties
    "delta": HISTORY_OPTIONS + tuple(DELTA_TABLE_OPTIONS),
    "postgres": ("url", "table-name", "username", "password", "sink.max-retries") + HISTORY_OPTIONS,
    "print": ("print-identifier",),
    "blackhole": (),
    # Flink CDC's names (docs/sources.md, "Options")
    "postgres-cdc": tuple(POSTGRES_CDC_OPTIONS),
}

_BASE_OPTIONS = {"filesystem": ("path", "format"), "delta": ("path",)}

#: SET keys we act on, with their accepted values (None: free-form, checked below)
SETTINGS = {
    "table.exec.sink.upsert-materialize": ("auto", "none", "force"),
    "table.exec.state.ttl": None,
    "table.exec.sink.require-on-conflict": ("true", "false"),
    "execution.runtime-mode": ("streaming", "batch"),
    "table.exec.emit.allow-lateness": None,
    "table.exec.source.idle-timeout": None,
    "spark-changelog.late-output.path": None,
    # micro-batch folding (ChangelogStream.with_mini_batch); Spark's trigger is the batch
    "table.exec.mini-batch.enabled": ("true", "false"),
}
#: SET keys whose value is a duration
DURATION_SETTINGS = ("table.exec.state.ttl", "table.exec.emit.allow-lateness",
                     "table.exec.source.idle-timeout")

#: Spark SQL type of a Flink type where the spelling differs
_STRING_TYPES = {exp.DataType.Type.VARCHAR, exp.DataType.Type.CHAR, exp.DataType.Type.TEXT,
                 exp.DataType.Type.NVARCHAR, exp.DataType.Type.NCHAR}
#: Flink types Spark has no working form of here (docs/sql.md, "Types")
_UNSUPPORTED_TYPES = {exp.DataType.Type.TIME, exp.DataType.Type.TIMETZ}
_TIMESTAMP_TYPES = {exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ,
                    exp.DataType.Type.TIMESTAMPLTZ, exp.DataType.Type.TIMESTAMPNTZ,
                    exp.DataType.Type.DATETIME}

_STATEMENT_STARTS = {TokenType.CREATE, TokenType.INSERT, TokenType.SET, TokenType.EXECUTE,
                     TokenType.BEGIN, TokenType.END, TokenType.SELECT, TokenType.WITH,
                     TokenType.L_PAREN, TokenType.SHOW, TokenType.DESCRIBE, TokenType.DESC}


# --------------------------------------------------------------------------- model


@dataclasses.dataclass(frozen=True)
class Position:
    line: int
    col: int
    length: int = 1


@dataclasses.dataclass(frozen=True)
class ColumnDef:
    """A column of ``CREATE TABLE``.  ``expression``: a computed column's
    expression (``c AS expr``); ``proctime``: ``c AS PROCTIME()``;
    ``metadata_key``: a metadata column's key (``c STRING METADATA FROM
    'value.source.table'``; the column name when there is no ``FROM``), read
    from the record's envelope by the format (``virtual``: ``VIRTUAL``)."""

    name: str
    flink_type: Optional[str]
    spark_type: Optional[str]
    nullable: bool = True
    expression: Optional[exp.Expr] = None
    proctime: bool = False
    metadata_key: Optional[str] = None
    virtual: bool = False

    @property
    def computed(self) -> bool:
        return self.expression is not None or self.proctime


@dataclasses.dataclass(frozen=True)
class WatermarkDef:
    """``WATERMARK FOR column AS column - INTERVAL 'delay'``.

    ``delay_ms``: Flink's ``b`` (``W = max - b``); :attr:`bound_ms` is the
    bound of our ``with_watermark`` giving the same watermark."""

    column: str
    delay_ms: int
    text: str
    position: Position

    @property
    def bound_ms(self) -> int:
        return self.delay_ms - 1


@dataclasses.dataclass(frozen=True)
class Connector:
    """The ``WITH`` options resolved: ``kind`` is one of :data:`CONNECTORS`
    (``jdbc`` and ``postgres`` are both ``postgres``); ``reader_format`` the
    format of :func:`spark_changelog.api.read_changes` for a filesystem source."""

    kind: str
    path: Optional[str] = None
    format: Optional[str] = None
    reader_format: Optional[str] = None
    changelog_file_format: Optional[str] = None
    options: tuple = ()            # the remaining options, (key, value) pairs
    #: the format's options and metadata columns, for the reader
    format_options: FormatOptions = FormatOptions()
    #: ``'scan.watermark.idle-timeout'``: the source's partitions go idle after it
    idle_timeout_ms: Optional[int] = None

    def option(self, key: str, default=None):
        return dict(self.options).get(key, default)


@dataclasses.dataclass(frozen=True)
class TableDef:
    name: str
    columns: tuple[ColumnDef, ...]
    primary_key: tuple[str, ...]
    watermark: Optional[WatermarkDef]
    connector: Connector
    options: tuple                 # all WITH options as written, (key, value) pairs
    temporary: bool
    position: Position

    @property
    def physical_columns(self) -> tuple[ColumnDef, ...]:
        return tuple(c for c in self.columns if not c.computed)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def kafka_partition_column(self) -> Optional[str]:
        """The column declared ``METADATA FROM 'partition'`` of a Kafka table:
        each of its values is a source partition with its own watermark and
        idleness (docs/sql.md, "Kafka and other streams")."""
        return next((c.name for c in self.columns if c.metadata_key == "partition"), None)

    def schema_ddl(self) -> str:
        """The physical columns as a Spark DDL string (``id BIGINT, name STRING``)."""
        return ", ".join(f"`{c.name}` {c.spark_type}" for c in self.physical_columns)


@dataclasses.dataclass(frozen=True)
class ViewDef:
    name: str
    query: exp.Expr
    temporary: bool
    position: Position


@dataclasses.dataclass(frozen=True)
class SetOption:
    key: str
    value: str
    position: Position


@dataclasses.dataclass(frozen=True)
class InsertDef:
    """``INSERT INTO table [(columns)] query [ON CONFLICT DO action]``;
    ``conflict``: ``deduplicate``/``error``/``nothing`` or None."""

    table: str
    query: exp.Expr
    conflict: Optional[str]
    position: Position
    columns: Optional[tuple[str, ...]] = None
    table_position: Optional[Position] = None


@dataclasses.dataclass(frozen=True)
class StatementSet:
    inserts: tuple[InsertDef, ...]
    position: Position


@dataclasses.dataclass(frozen=True)
class ExplainDef:
    statement: Union[InsertDef, StatementSet, "QueryDef"]
    details: tuple[str, ...]
    position: Position

    @property
    def changelog_mode(self) -> bool:
        return "CHANGELOG_MODE" in self.details


@dataclasses.dataclass(frozen=True)
class QueryDef:
    """A bare ``SELECT`` (only meaningful under ``EXPLAIN`` here)."""

    query: exp.Expr
    position: Position


@dataclasses.dataclass(frozen=True)
class ShowDef:
    """``SHOW TABLES`` / ``SHOW VIEWS``: the names defined so far."""

    what: str
    position: Position


@dataclasses.dataclass(frozen=True)
class DescribeDef:
    """``DESCRIBE t`` / ``DESC t``: a table's or view's columns."""

    name: str
    position: Position


@dataclasses.dataclass(frozen=True)
class CreateTableAsDef:
    """``CREATE TABLE t [(PRIMARY KEY (...) NOT ENFORCED)] WITH (...) AS query``:
    ``table`` without columns (they are the query's, known once it is
    planned) and the ``INSERT INTO t query`` that fills it."""

    table: TableDef
    insert: InsertDef
    position: Position


Statement = Union[TableDef, ViewDef, SetOption, InsertDef, StatementSet, ExplainDef, QueryDef,
                  ShowDef, DescribeDef, CreateTableAsDef]


@dataclasses.dataclass
class Script:
    """The statements of a script in order, with the text they came from."""

    statements: list
    sql: str
    path: Optional[str] = None

    @property
    def tables(self) -> dict:
        return {s.name: s for s in self.statements if isinstance(s, TableDef)}

    @property
    def views(self) -> dict:
        return {s.name: s for s in self.statements if isinstance(s, ViewDef)}

    def error(self, message: str, position: Optional[Position],
              cls: type = SqlError) -> SqlError:
        """A :class:`SqlError` at ``position`` of this script."""
        pos = position or Position(1, 1)
        return cls(message, pos.line, pos.col, sql=self.sql, path=self.path, length=pos.length)


# --------------------------------------------------------------------------- parsing


class _quiet_sqlglot:
    """Silences sqlglot's logger while a statement is parsed: its warnings
    (``... Falling back to parsing as a 'Command'``) name no line and are
    replaced by our own message (:meth:`_Builder.reject_command`)."""

    def __enter__(self):
        import logging
        self.logger = logging.getLogger("sqlglot")
        self.level = self.logger.level
        self.logger.setLevel(logging.ERROR)

    def __exit__(self, *exc):
        self.logger.setLevel(self.level)
        return False


def _token_position(token: Token, sql: str) -> Position:
    """Line and 1-based start column of a token (sqlglot's ``col`` is its end)."""
    line_start = sql.rfind("\n", 0, token.start) + 1
    return Position(token.line, token.start - line_start + 1, max(1, token.end - token.start + 1))


def _offset_position(offset: int, sql: str) -> Position:
    line = sql.count("\n", 0, offset) + 1
    return Position(line, offset - (sql.rfind("\n", 0, offset) + 1) + 1)


def node_position(node: exp.Expr, default: Position) -> Position:
    """Where a parsed node starts: the earliest position sqlglot recorded on it
    or its descendants (identifiers and functions carry one), else ``default``."""
    best = None
    for n in node.walk():
        meta = getattr(n, "_meta", None) or {}
        if "line" in meta and "start" in meta and (best is None or meta["start"] < best["start"]):
            best = meta
    if best is None:
        return default
    col = best["col"] - (best["end"] - best["start"])
    return Position(best["line"], max(1, col), best["end"] - best["start"] + 1)


def _friendly(description: str, highlight: str) -> str:
    """sqlglot's parse error text, in words a person can act on."""
    if description.startswith("Required keyword") or description.startswith("Invalid expression"):
        if highlight:
            return f"unexpected {highlight!r}"
        return "unexpected end of statement"
    if description == "Expecting )":
        if highlight == ")":
            return "unbalanced parentheses: expected another ')' (is a ')' or ',' missing earlier?)"
        return "expected ')'" + (f", found {highlight!r}" if highlight else "")
    if description == "Expecting (":
        return "expected '('" + (f", found {highlight!r}" if highlight else "")
    return description


def _chunks(tokens: list[Token]) -> list[list[Token]]:
    out: list[list[Token]] = [[]]
    for tok in tokens:
        if tok.token_type == TokenType.SEMICOLON:
            out.append([])
        else:
            out[-1].append(tok)
    return [c for c in out if c]


class _Builder:
    """Turns parsed statements into the model, with positions for errors."""

    def __init__(self, sql: str, path: Optional[str]):
        self.sql, self.path = sql, path
        self.option_positions: dict = {}   # WITH option key -> Position (current table)

    def error(self, message: str, pos: Position, cls: type = SqlError) -> SqlError:
        return cls(message, pos.line, pos.col, sql=self.sql, path=self.path, length=pos.length)

    # -- one statement -----------------------------------------------------------
    def parse_chunk(self, chunk: list[Token]) -> exp.Expr:
        first = chunk[0]
        pos = _token_position(first, self.sql)
        if first.token_type not in _STATEMENT_STARTS and first.text.upper() != "EXPLAIN":
            raise self.error(
                f"expected a statement (CREATE TABLE, CREATE VIEW, INSERT INTO, SET, EXPLAIN, "
                f"EXECUTE STATEMENT SET), found {first.text!r}", pos)
        self.reject_placeholder(chunk)
        try:
            with _quiet_sqlglot():
                parsed = Flink().parser().parse(chunk, self.sql)
        except ParseError as e:
            err = e.errors[0] if e.errors else {}
            highlight = err.get("highlight") or ""
            line = err.get("line") or pos.line
            col = max(1, (err.get("col") or pos.col) - len(highlight) + 1) if highlight \
                else (err.get("col") or pos.col) + 1
            raise SqlError(_friendly(err.get("description") or str(e), highlight), line, col,
                           sql=self.sql, path=self.path, length=len(highlight) or 1) from None
        if isinstance(parsed[0], exp.Command) and first.token_type != TokenType.SHOW:
            self.reject_command(chunk, pos)
        return parsed[0]

    def reject_command(self, chunk: list[Token], pos: Position) -> None:
        """sqlglot could not parse the statement and kept it as an opaque
        command.  Most often a ``;`` is missing, so the next statement runs
        into this one: point at it; otherwise say the statement is not
        supported yet (sqlglot's own "Falling back to parsing as a 'Command'"
        is silenced: it names no line)."""
        for prev, tok in zip(chunk, chunk[1:]):
            starts = tok.token_type in (TokenType.CREATE, TokenType.INSERT, TokenType.EXECUTE) \
                or (tok.token_type == TokenType.SET and tok.line > prev.line)
            if starts:
                at = _token_position(tok, self.sql)
                raise self.error(f"missing ';' before line {at.line}: a new statement "
                                 f"({tok.text.upper()} ...) starts here inside the statement "
                                 f"of line {pos.line}", at)
        raise self.error(f"{chunk[0].text.upper()} statement not supported yet (or not valid "
                         "Flink SQL)", pos, UnsupportedFeature)

    def reject_placeholder(self, chunk: list[Token]) -> None:
        """``WITH (...)``, as the articles write it, is not an option list."""
        types = [t.token_type for t in chunk]
        dots = [TokenType.L_PAREN, TokenType.DOT, TokenType.DOT, TokenType.DOT, TokenType.R_PAREN]
        for i, tok in enumerate(chunk):
            if tok.token_type == TokenType.WITH and types[i + 1:i + 6] == dots:
                raise self.error(
                    "WITH (...) is a placeholder: give the connector options, e.g. WITH "
                    "('connector' = 'filesystem', 'path' = 'cdc/s1', 'format' = 'debezium-json') "
                    "or ('connector' = 'delta', 'path' = 'out/t1')",
                    _token_position(chunk[i + 1], self.sql))

    def statement(self, node: exp.Expr, pos: Position) -> Statement:
        if isinstance(node, exp.Create):
            kind = (node.args.get("kind") or "").upper()
            if kind == "TABLE":
                return self.table(node, pos)
            if kind == "VIEW":
                return self.view(node, pos)
            raise self.error(f"CREATE {kind} is not supported (CREATE [TEMPORARY] TABLE and "
                             "CREATE [TEMPORARY] VIEW are)", pos, UnsupportedFeature)
        if isinstance(node, exp.Set):
            return self.set_option(node, pos)
        if isinstance(node, exp.Insert):
            return self.insert(node, pos)
        if isinstance(node, Explain):
            inner = node.this
            if isinstance(inner, StatementSetBegin):
                raise self.error("EXPLAIN STATEMENT SET is not supported: EXPLAIN each INSERT",
                                 pos, UnsupportedFeature)
            stmt = self.statement(inner, node_position(inner, pos))
            if not isinstance(stmt, (InsertDef, QueryDef)):
                raise self.error("EXPLAIN takes an INSERT INTO or SELECT statement", pos)
            return ExplainDef(stmt, tuple(d.name for d in node.args.get("details") or ()), pos)
        if isinstance(node, exp.Query):
            return QueryDef(node, pos)
        if isinstance(node, exp.Command) and str(node.this).upper() == "SHOW":
            what = str(node.expression.this if node.expression is not None else "").strip().upper()
            if what not in ("TABLES", "VIEWS"):
                raise self.error(f"SHOW {what} is not supported yet (SHOW TABLES and SHOW VIEWS "
                                 "are)", pos, UnsupportedFeature)
            return ShowDef(what, pos)
        if isinstance(node, exp.Describe) and isinstance(node.this, exp.Table):
            return DescribeDef(node.this.name, pos)
        raise self.error(f"unsupported statement {node.key.upper()}", pos, UnsupportedFeature)

    # -- CREATE TABLE -------------------------------------------------------------
    def table(self, node: exp.Create, pos: Position) -> Union[TableDef, CreateTableAsDef]:
        schema = node.this
        if node.expression is not None:
            return self.table_as(node, pos)
        if not isinstance(schema, exp.Schema):
            raise self.error("CREATE TABLE needs a column list: CREATE TABLE t (id BIGINT, ...)",
                             pos)
        name = schema.this.name
        props = node.args.get("properties")
        temporary = bool(props and any(isinstance(p, exp.TemporaryProperty)
                                       for p in props.expressions))
        columns, pk, watermark = [], None, None
        for item in schema.expressions:
            ipos = node_position(item, pos)
            if isinstance(item, exp.ColumnDef):
                col, col_pk = self.column(item, ipos)
                columns.append(col)
                if col_pk:
                    if pk is not None:
                        raise self.error("a table has one PRIMARY KEY", ipos)
                    pk = (col.name,)
            elif isinstance(item, exp.PrimaryKey):
                if pk is not None:
                    raise self.error("a table has one PRIMARY KEY", ipos)
                self.require_not_enforced(item, ipos)
                pk = tuple(e.name for e in item.expressions)
            elif isinstance(item, exp.WatermarkColumnConstraint):
                if watermark is not None:
                    raise self.error("a table has one WATERMARK", ipos)
                watermark = self.watermark(item, ipos)
            else:
                raise self.error(f"unsupported table element {item.sql(dialect=Flink)!r}", ipos,
                                 UnsupportedFeature)
        names = [c.name for c in columns]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise self.error(f"duplicate column(s) {dup} in table {name}", pos)
        for k in pk or ():
            if k not in names:
                raise self.error(f"primary key column {k!r} is not a column of {name} "
                                 f"(columns: {', '.join(names)})", pos)
        if watermark is not None:
            if watermark.column not in names:
                raise self.error(f"watermark column {watermark.column!r} is not a column of "
                                 f"{name}", watermark.position)
            wcol = next(c for c in columns if c.name == watermark.column)
            if wcol.proctime:
                raise self.error(f"WATERMARK FOR {wcol.name}: a PROCTIME() column is a "
                                 "processing-time attribute; a watermark needs an event-time "
                                 "TIMESTAMP column", watermark.position)
            if wcol.spark_type is not None and wcol.spark_type != "TIMESTAMP":
                raise self.error(f"WATERMARK FOR {wcol.name}: the column is {wcol.flink_type}; "
                                 "the event-time column must be a TIMESTAMP(3) (or a computed "
                                 f"column, e.g. {wcol.name}_ts AS TO_TIMESTAMP_LTZ({wcol.name}, 3))",
                                 watermark.position)
        options = self.with_options(props, pos)
        with_pos = node_position(props, pos) if props is not None else pos
        metadata = tuple((c.name, c.metadata_key) for c in columns if c.metadata_key is not None)
        connector = self.connector(name, options, with_pos, metadata)
        return TableDef(name, tuple(columns), pk or (), watermark, connector, options, temporary,
                        pos)

    def table_as(self, node: exp.Create, pos: Position) -> CreateTableAsDef:
        """``CREATE TABLE t WITH (...) AS query`` (Flink's CTAS): the columns
        and types are the query's; the only table element allowed is the
        primary key (as in Flink); the connector must be one that creates
        its table (a sink)."""
        query, target, pk = node.expression, node.this, ()
        if not isinstance(query, exp.Query):
            raise self.error("CREATE TABLE ... AS needs a SELECT", pos)
        if isinstance(target, exp.Schema):
            for item in target.expressions:
                ipos = node_position(item, pos)
                if not isinstance(item, exp.PrimaryKey):
                    raise self.error(
                        "CREATE TABLE ... AS SELECT takes its columns from the query: declaring "
                        f"them ({item.sql(dialect=Flink)!r}) is not supported yet; only "
                        "PRIMARY KEY (...) NOT ENFORCED may be given", ipos, UnsupportedFeature)
                if pk:
                    raise self.error("a table has one PRIMARY KEY", ipos)
                self.require_not_enforced(item, ipos)
                pk = tuple(e.name for e in item.expressions)
            target = target.this
        name = target.name
        props = node.args.get("properties")
        temporary = bool(props and any(isinstance(p, exp.TemporaryProperty)
                                       for p in props.expressions))
        options = self.with_options(props, pos)
        with_pos = node_position(props, pos) if props is not None else pos
        connector = self.connector(name, options, with_pos, ())
        if connector.kind not in CREATABLE:
            raise self.error(
                f"CREATE TABLE {name} ... AS SELECT: connector {dict(options)['connector']!r} "
                "cannot create a table here (it is a source); CREATE TABLE AS writes to "
                "'delta', 'jdbc'/'postgres', 'print' or 'blackhole'", with_pos,
                UnsupportedFeature)
        table = TableDef(name, (), pk, None, connector, options, temporary, pos)
        qpos = node_position(query, pos)
        return CreateTableAsDef(table, InsertDef(name, query, None, qpos, None,
                                                 node_position(target, pos)), pos)

    def column(self, node: exp.ColumnDef, pos: Position) -> tuple[ColumnDef, bool]:
        kind = node.args.get("kind")
        nullable, is_pk, expression, proctime = True, False, None, False
        metadata_key, virtual = None, False
        for c in node.constraints:
            k = c.args.get("kind")
            if isinstance(k, MetadataColumnConstraint):
                metadata_key = k.this.this if k.this is not None else node.name
                virtual = bool(k.args.get("virtual"))
            elif isinstance(k, exp.NotNullColumnConstraint):
                nullable = bool(k.args.get("allow_null"))
            elif isinstance(k, exp.PrimaryKeyColumnConstraint):
                is_pk = True
                self.require_not_enforced(k, pos)
            elif isinstance(k, exp.ComputedColumnConstraint):
                expression = k.this
                if isinstance(expression, exp.Anonymous) and expression.name.upper() == "PROCTIME":
                    expression, proctime = None, True
            elif isinstance(k, exp.CommentColumnConstraint):
                pass
            else:
                raise self.error(f"unsupported column constraint {c.sql(dialect=Flink)!r} on "
                                 f"{node.name}", pos, UnsupportedFeature)
        if kind is None and expression is None and not proctime:
            raise self.error(f"column {node.name!r} needs a type (or AS expression)", pos)
        if kind is not None and any(t.this in _UNSUPPORTED_TYPES for t in kind.find_all(exp.DataType)):
            raise self.error(f"column {node.name!r}: type TIME is not supported (Spark's TIME "
                             "needs 'spark.sql.timeType.enabled' and Delta tables have no TIME "
                             "type; docs/sql.md, \"Types\"): store the time of day as a STRING or "
                             "an INT of seconds (Debezium's io.debezium.time.Time/MicroTime/"
                             "NanoTime numbers read into BIGINT)",
                             node_position(node, pos), UnsupportedFeature)
        if metadata_key is not None and (kind is None or expression is not None or proctime):
            raise self.error(f"metadata column {node.name!r} needs a type and no AS expression", pos)
        return ColumnDef(node.name, kind.sql(dialect=Flink) if kind is not None else None,
                         spark_type(kind) if kind is not None else None, nullable, expression,
                         proctime, metadata_key, virtual), is_pk

    def require_not_enforced(self, node: exp.Expr, pos: Position) -> None:
        # sqlglot keeps NOT ENFORCED in the constraint's options; Flink requires it
        options = [str(o.this if isinstance(o, exp.Expr) else o).upper()
                   for o in node.args.get("options") or ()]
        if "NOT ENFORCED" not in options:
            raise self.error("Flink supports PRIMARY KEY ... NOT ENFORCED only: add NOT ENFORCED "
                             "(the key is not checked on input; it is the key of the changelog)",
                             pos)

    def watermark(self, node: exp.WatermarkColumnConstraint, pos: Position) -> WatermarkDef:
        column = node.this.name
        e = node.expression
        text = e.sql(dialect=Flink)
        delay = None
        if isinstance(e, exp.Column) and e.name == column:
            delay = 0
        elif isinstance(e, exp.Sub) and isinstance(e.this, exp.Column) and e.this.name == column \
                and isinstance(e.expression, exp.Interval):
            delay = interval_ms(e.expression)
        if delay is None:
            raise self.error(f"unsupported watermark expression {text!r}: use "
                             f"{column} - INTERVAL 'n' unit (a bounded out-of-orderness "
                             f"watermark) or {column} itself", node_position(e, pos),
                             UnsupportedFeature)
        if delay < 1:
            raise self.error(
                f"WATERMARK FOR {column} AS {text}: a watermark without delay (W = max({column})) "
                "is not supported yet; use a delay of at least INTERVAL '1' MILLISECOND",
                pos, UnsupportedFeature)
        return WatermarkDef(column, delay, text, pos)

    def with_options(self, props: Optional[exp.Properties], pos: Position) -> tuple:
        out = []
        self.option_positions = {}
        for p in (props.expressions if props else ()):
            if isinstance(p, exp.TemporaryProperty):
                continue
            if isinstance(p, exp.Property) and isinstance(p.this, exp.Literal) and \
                    p.this.is_string and isinstance(p.args.get("value"), exp.Literal):
                out.append((p.this.this, str(p.args["value"].this)))
                self.option_positions[p.this.this] = node_position(p, pos)
                continue
            raise self.error(f"unsupported table property {p.sql(dialect=Flink)!r}: WITH takes "
                             "'key' = 'value' pairs", node_position(p, pos))
        keys = [k for k, _ in out]
        dup = sorted({k for k in keys if keys.count(k) > 1})
        if dup:
            raise self.error(f"option(s) {dup} given twice in WITH", pos)
        return tuple(out)

    def connector(self, table: str, options: tuple, pos: Position, metadata: tuple = ()) -> Connector:
        opts = dict(options)
        if "connector" not in opts:
            raise self.error(f"table {table}: WITH needs 'connector' (one of "
                             f"{', '.join(CONNECTORS)})", pos)
        kind = opts.pop("connector").lower()
        if kind not in CONNECTORS:
            raise self.error(f"table {table}: unknown connector {kind!r}: expected one of "
                             f"{', '.join(CONNECTORS)}", pos, UnsupportedFeature)
        path = opts.pop("path", None)
        idle = self.watermark_options(table, opts, pos) if kind in ("filesystem", "kafka") \
            else None
        return dataclasses.replace(self._connector(table, kind, path, opts, pos, metadata),
                                   idle_timeout_ms=idle)

    def watermark_options(self, table: str, opts: dict, pos: Position) -> Optional[int]:
        """Flink's watermark options of a source table (FLIP-296; docs/sql.md,
        "Watermarks"), removed from ``opts``: the idle timeout (ms) of
        ``'scan.watermark.idle-timeout'``.  ``'scan.watermark.emit.strategy'``
        is ``'on-periodic'`` (a watermark after each piece of a micro-batch);
        watermark alignment is refused."""
        align = sorted(k for k in opts if k.startswith("scan.watermark.alignment."))
        if align:
            raise self.error(
                f"table {table}: {align[0]!r}: watermark alignment (pausing a source that runs "
                "ahead) is not supported: Spark's sources cannot be paused per partition",
                self.option_positions.get(align[0], pos), UnsupportedFeature)
        emit = opts.pop("scan.watermark.emit.strategy", "on-periodic")
        if emit.lower() != "on-periodic":
            raise self.error(
                f"table {table}: 'scan.watermark.emit.strategy' = {emit!r}: only 'on-periodic' is "
                "supported (the watermark is generated after each piece of a micro-batch, not "
                "after each row)", self.option_positions.get("scan.watermark.emit.strategy", pos),
                UnsupportedFeature)
        idle = opts.pop("scan.watermark.idle-timeout", None)
        if idle is None:
            return None
        try:
            ms = duration_ms(idle if not idle.strip().isdigit() else int(idle))
        except (TypeError, ValueError):
            raise self.error(f"table {table}: 'scan.watermark.idle-timeout' = {idle!r} is not a "
                             "duration (e.g. '5 s', '1 min', '500 ms')",
                             self.option_positions.get("scan.watermark.idle-timeout", pos)) from None
        return ms or None

    def _connector(self, table: str, kind: str, path: Optional[str], opts: dict, pos: Position,
                   metadata: tuple) -> Connector:
        if kind == "filesystem":
            fmt = opts.pop("format", None)
            if fmt is None or fmt.lower() not in FILESYSTEM_FORMATS:
                raise self.error(f"table {table}: connector 'filesystem' needs 'format', one of "
                                 f"{', '.join(FILESYSTEM_FORMATS)}" +
                                 (f" (got {fmt!r})" if fmt else ""), pos)
            if path is None:
                raise self.error(f"table {table}: connector 'filesystem' needs 'path'", pos)
            fmt = fmt.lower()
            reader, file_format = FILESYSTEM_FORMATS[fmt]
            self.check_options(table, "filesystem", opts, pos, format_option_keys(fmt))
            return Connector("filesystem", path, fmt, reader, file_format,
                             tuple(sorted(opts.items())),
                             self.format_options(table, fmt, opts, metadata, pos))
        if kind == "kafka":
            return self.kafka(table, opts, pos, metadata)
        if metadata:
            raise self.error(f"table {table}: metadata column {metadata[0][0]!r}: connector "
                             f"{kind!r} has no metadata (format metadata is read by the "
                             "'filesystem' connector's debezium-json, canal-json and "
                             "maxwell-json formats)", pos, UnsupportedFeature)
        if kind == "delta" and path is None:
            raise self.error(f"table {table}: connector 'delta' needs 'path' (the table "
                             "directory)", pos)
        if kind == "delta":
            for name in DELTA_TABLE_OPTIONS:
                try:
                    delta_sink_options({name: opts.get(name)})
                except ValueError as err:
                    raise self.error(f"table {table}: {err}", self.option_positions.get(name, pos)) from None
        if kind in ("jdbc", "postgres"):
            if "url" not in opts:
                raise self.error(f"table {table}: connector {kind!r} needs 'url' (e.g. "
                                 "'jdbc:postgresql://host:5432/db' or a libpq conninfo)", pos)
            retries = opts.get("sink.max-retries")
            if retries is not None and not retries.strip().isdigit():
                raise self.error(f"table {table}: 'sink.max-retries' must be a whole number of "
                                 f"retries (0 or more), got {retries!r}",
                                 self.option_positions.get("sink.max-retries", pos))
            kind = "postgres"
        elif path is not None and kind != "delta":
            opts["path"] = path
        self.check_options(table, kind, opts, pos)
        return Connector(kind, path, None, None, None, tuple(sorted(opts.items())))

    def kafka(self, table: str, opts: dict, pos: Position, metadata: tuple) -> Connector:
        """``'connector' = 'kafka'`` (Flink's option names; connectors/kafka.py
        maps them to Spark's Kafka source).  The format is ``format`` or
        ``value.format``; with ``value.format`` its options may carry Flink's
        ``value.`` prefix (``value.debezium-json.ignore-parse-errors``)."""
        fmt = opts.get("value.format") or opts.get("format")
        if fmt is None or fmt.lower() not in KAFKA_FORMATS:
            raise self.error(f"table {table}: connector 'kafka' needs 'format' (or 'value.format'), "
                             f"one of {', '.join(KAFKA_FORMATS)}" + (f" (got {fmt!r})" if fmt else ""), pos)
        fmt = fmt.lower()
        opts.pop("format", None)
        plain = {k[len("value."):] if k.startswith("value.") and k != "value.format" else k: v
                 for k, v in opts.items()}
        keys = format_option_keys(fmt)
        broker = {k: v for k, v in plain.items() if k not in keys}
        unknown = sorted(k for k in broker if k not in KAFKA_OPTIONS and not k.startswith("properties."))
        if unknown:
            raise self.error(f"table {table}: unsupported option(s) {', '.join(map(repr, unknown))} for "
                             f"connector 'kafka' (supported: 'topic', 'properties.*', 'format', "
                             f"{', '.join(repr(k) for k in KAFKA_OPTIONS if k != 'topic')} and the "
                             f"format's options)", self.option_positions.get(unknown[0], pos))
        reader, file_format = KAFKA_FORMATS[fmt]
        return Connector("kafka", None, fmt, reader, file_format, tuple(sorted(broker.items())),
                         self.format_options(table, fmt, plain, metadata, pos))

    def format_options(self, table: str, fmt: str, opts: dict, metadata: tuple,
                       pos: Position) -> FormatOptions:
        """The format's options (connectors/format_options.py), with an error
        at the option (or the table) for a value it does not take."""
        try:
            return from_table_options(fmt, opts, metadata)
        except ValueError as e:
            key = next((k for k in opts if f"'{k}'" in str(e)), None)
            raise self.error(f"table {table}: {e}", self.option_positions.get(key, pos)) from None

    def check_options(self, table: str, kind: str, opts: dict, pos: Position,
                      format_keys: tuple = ()) -> None:
        allowed = CONNECTOR_OPTIONS[kind] + format_keys
        unknown = sorted(k for k in opts if k not in allowed)
        if unknown:
            pos = self.option_positions.get(unknown[0], pos)
            raise self.error(
                f"table {table}: unsupported option(s) {', '.join(repr(k) for k in unknown)} for "
                f"connector {kind!r} (supported: "
                f"{', '.join(repr(k) for k in ('connector',) + _BASE_OPTIONS.get(kind, ()) + allowed)})",
                pos)

    # -- CREATE VIEW / SET / INSERT ----------------------------------------------
    def view(self, node: exp.Create, pos: Position) -> ViewDef:
        props = node.args.get("properties")
        temporary = bool(props and any(isinstance(p, exp.TemporaryProperty)
                                       for p in props.expressions))
        query = node.expression
        if not isinstance(query, exp.Query):
            raise self.error("CREATE VIEW needs AS SELECT ...", pos)
        return ViewDef(node.this.name, query, temporary, pos)

    def set_option(self, node: exp.Set, pos: Position) -> SetOption:
        items = node.expressions
        if len(items) != 1 or not isinstance(items[0].this, exp.EQ):
            raise self.error("SET takes one 'key' = 'value'", pos)
        eq = items[0].this
        key = eq.this.this if isinstance(eq.this, exp.Literal) else eq.this.sql(dialect=Flink)
        value = eq.expression.this if isinstance(eq.expression, exp.Literal) \
            else eq.expression.sql(dialect=Flink)
        key, value = str(key), str(value)
        allowed = SETTINGS.get(key)
        vpos = node_position(eq.expression, pos)
        if allowed is not None and value.lower() not in allowed:
            raise self.error(f"SET {key!r}: expected one of {', '.join(allowed)}, got {value!r}",
                             vpos)
        if key in DURATION_SETTINGS:
            try:
                duration_ms(value if not value.strip().isdigit() else int(value))
            except (TypeError, ValueError):
                raise self.error(f"SET {key!r}: {value!r} is not a duration (e.g. '1 h', "
                                 "'30 min', '3600000' ms)", vpos) from None
        return SetOption(key, value, pos)

    def insert(self, node: exp.Insert, pos: Position) -> InsertDef:
        target = node.this
        columns = None
        if isinstance(target, exp.Schema):
            columns = tuple(e.name for e in target.expressions)
            target = target.this
        if not isinstance(target, exp.Table):
            raise self.error("INSERT INTO needs a table name", pos)
        if node.args.get("overwrite"):
            raise self.error("INSERT OVERWRITE is not supported (changelog sinks are upsert "
                             "tables): use INSERT INTO", pos, UnsupportedFeature)
        query = node.expression
        if not isinstance(query, (exp.Query, exp.Values)):
            raise self.error("INSERT INTO t needs a SELECT or VALUES", pos)
        conflict = node.args.get("conflict")
        action = conflict.args["action"].name.lower() if conflict is not None else None
        return InsertDef(target.name, query, action, pos, columns,
                         node_position(target, pos))


def spark_type(kind: exp.DataType) -> str:
    """The Spark SQL type of a Flink column type (docs/sql.md, "Types")."""
    if kind.this in _STRING_TYPES:
        return "STRING"
    if kind.this in _TIMESTAMP_TYPES:
        return "TIMESTAMP"
    return kind.sql(dialect="spark")


_INTERVAL_MS = {"MILLISECOND": 1, "SECOND": 1000, "MINUTE": 60_000, "HOUR": 3_600_000,
                "DAY": 86_400_000}


def interval_ms(node: exp.Interval) -> Optional[int]:
    """Milliseconds of ``INTERVAL 'n' unit`` (None if not a fixed duration)."""
    unit = (node.args.get("unit").name if node.args.get("unit") is not None else "").upper()
    unit = unit[:-1] if unit.endswith("S") and unit[:-1] in _INTERVAL_MS else unit
    value = node.this
    if not isinstance(value, exp.Literal):
        return None
    text = str(value.this).strip()
    if not unit:
        try:
            return duration_ms(text)
        except ValueError:
            return None
    if unit not in _INTERVAL_MS:
        return None
    try:
        return int(round(float(text) * _INTERVAL_MS[unit]))
    except ValueError:
        return None


def parse_script(sql: str, path: Optional[str] = None) -> Script:
    """Parse a Flink SQL script (see the module docstring).  Raises
    :class:`SqlError` with line and column for the first error."""
    b = _Builder(sql, path)
    tokenizer = Flink().tokenizer()
    try:
        tokens = tokenizer.tokenize(sql)
    except TokenError as e:
        # the start of the token being read (sqlglot's message shows only context)
        start = getattr(getattr(tokenizer, "_core", None), "_start", None)
        pos = _offset_position(start, sql) if isinstance(start, int) else Position(1, 1)
        quote = sql[start] if isinstance(start, int) and start < len(sql) else ""
        what = {"'": "string", "`": "quoted name", '"': "string"}.get(quote)
        raise b.error(f"this {what} is not closed: add the closing {quote}" if what else
                      f"cannot read the SQL here ({e.__cause__ or e})", pos) from None
    statements: list = []
    open_set: Optional[tuple[list, Position]] = None
    for chunk in _chunks(tokens):
        pos = _token_position(chunk[0], sql)
        node = b.parse_chunk(chunk)
        if isinstance(node, StatementSetBegin):
            if open_set is not None:
                raise b.error("a STATEMENT SET is already open (missing END?)", pos)
            open_set = ([], pos)
            if node.this is not None:
                meta = node.meta
                pos = Position(meta["line"], meta["col"] - (meta["end"] - meta["start"]),
                               meta["end"] - meta["start"] + 1) if "line" in meta else pos
                node = node.this
            else:
                continue
        elif isinstance(node, exp.EndStatement):
            if open_set is None:
                raise b.error("END without BEGIN STATEMENT SET", pos)
            inserts, spos = open_set
            if not inserts:
                raise b.error("an empty STATEMENT SET: put INSERT INTO statements between "
                              "BEGIN and END", spos)
            statements.append(StatementSet(tuple(inserts), spos))
            open_set = None
            continue
        stmt = b.statement(node, pos)
        if open_set is not None:
            if not isinstance(stmt, InsertDef):
                raise b.error("a STATEMENT SET holds INSERT INTO statements only", pos)
            open_set[0].append(stmt)
        else:
            statements.append(stmt)
    if open_set is not None:
        raise b.error("STATEMENT SET is not closed: add END;", open_set[1])
    return Script(statements, sql, path)


def read_script(path: str) -> Script:
    with open(path, encoding="utf-8") as f:
        return parse_script(f.read(), path)


__all__ = ["parse_script", "read_script", "Script", "TableDef", "ColumnDef", "WatermarkDef",
           "Connector", "ViewDef", "SetOption", "InsertDef", "StatementSet", "ExplainDef",
           "QueryDef", "ShowDef", "DescribeDef", "CreateTableAsDef", "Position", "spark_type", "interval_ms", "node_position", "SETTINGS",
           "FILESYSTEM_FORMATS", "CONNECTORS", "CONNECTOR_OPTIONS"]
