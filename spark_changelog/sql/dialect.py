"""A sqlglot dialect for Flink SQL (docs/sql.md).

Flink SQL is Calcite's SQL with Flink's DDL.  Its expressions (backquoted
identifiers, ``STRING``, ``||``, ``CAST``, ``INTERVAL '5' SECOND``) are close
to Spark SQL, so the dialect extends sqlglot's Spark dialect and only adds what
Flink has on top, in the way sqlglot's RisingWave dialect adds ``WATERMARK FOR``:

* ``WATERMARK FOR ts AS ts - INTERVAL '5' SECOND`` in ``CREATE TABLE``;
* metadata columns ``c STRING METADATA [FROM 'key'] [VIRTUAL]``;
* ``PRIMARY KEY (...) NOT ENFORCED`` (table and column constraint);
* ``INSERT ... ON CONFLICT DO DEDUPLICATE | DO ERROR | DO NOTHING`` (Flink 2.3);
* ``EXPLAIN [CHANGELOG_MODE | ESTIMATED_COST | ...] <statement>``;
* ``EXECUTE STATEMENT SET BEGIN <insert>; ...; END`` and the SQL client's
  ``BEGIN STATEMENT SET; ...; END``: the parser returns markers
  (:class:`StatementSetBegin`, ``exp.EndStatement``) that
  :mod:`spark_changelog.sql.script` groups, because sqlglot parses a script
  one ``;``-separated chunk at a time;
* window table functions ``TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL
  '1' MINUTE))`` (and ``HOP``, ``CUMULATE``, ``SESSION``), positional or with
  named arguments (``DATA => TABLE t``);
* strings escape a quote by doubling it (``'it''s'``), not with a backslash.

Nothing here decides what a statement means; :mod:`.script` does.
"""
from __future__ import annotations

from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.parsers.spark import SparkParser
from sqlglot.tokens import TokenType


class StatementSetBegin(exp.Expression):
    """``EXECUTE STATEMENT SET BEGIN`` (``this``: the first statement of the
    set, when it follows on the same chunk) or ``BEGIN STATEMENT SET``."""

    arg_types = {"this": False}


class Explain(exp.Expression):
    """``EXPLAIN [detail, ...] <statement>``: ``this`` is the statement,
    ``details`` the explain details (``CHANGELOG_MODE``, ...) as upper-case names."""

    arg_types = {"this": True, "details": False}


class TableArgument(exp.Expression):
    """``TABLE t`` as a table function argument (``this``: the table;
    ``partition_by``: SESSION's ``PARTITION BY`` columns)."""

    arg_types = {"this": True, "partition_by": False}


class MetadataColumnConstraint(exp.Expression):
    """``METADATA [FROM 'key'] [VIRTUAL]`` of a column (``this``: the key
    literal, None when the column's name is the key)."""

    arg_types = {"this": False, "virtual": False}


class Descriptor(exp.Expression):
    """``DESCRIPTOR(col, ...)``: column names passed to a table function."""

    arg_types = {"expressions": True}


#: Flink 2.3 window table functions (``FROM TABLE(TUMBLE(...))``)
WINDOW_TVFS = ("TUMBLE", "HOP", "CUMULATE", "SESSION")
#: Flink 2.3's built-in process table functions read here (docs/sql.md, "Connectors")
FROM_CHANGELOG = "FROM_CHANGELOG"
#: the words ``EXPLAIN`` accepts before its statement
EXPLAIN_DETAILS = ("CHANGELOG_MODE", "ESTIMATED_COST", "JSON_EXECUTION_PLAN", "PLAN_ADVICE")
CONFLICT_ACTIONS = ("DEDUPLICATE", "ERROR", "NOTHING")


class FlinkParser(SparkParser):
    CONSTRAINT_PARSERS = {
        **SparkParser.CONSTRAINT_PARSERS,
        "WATERMARK": lambda self: self._parse_watermark(),
        "METADATA": lambda self: self._parse_metadata_column(),
    }
    SCHEMA_UNNAMED_CONSTRAINTS = {*SparkParser.SCHEMA_UNNAMED_CONSTRAINTS, "WATERMARK"}

    FUNC_TOKENS = {*SparkParser.FUNC_TOKENS, TokenType.SESSION}

    STATEMENT_PARSERS = {
        **SparkParser.STATEMENT_PARSERS,
        TokenType.EXECUTE: lambda self: self._parse_execute(),
        TokenType.BEGIN: lambda self: self._parse_begin(),
    }

    FUNCTION_PARSERS = {
        **SparkParser.FUNCTION_PARSERS,
        **{name: (lambda self, _n=name: self._parse_window_tvf(_n))
           for name in (*WINDOW_TVFS, FROM_CHANGELOG)},
        "DESCRIPTOR": lambda self: self.expression(
            Descriptor(expressions=self._parse_csv(self._parse_id_var))),
    }

    # -- CREATE TABLE --------------------------------------------------------
    def _parse_watermark(self) -> exp.Expr:
        if not self._match(TokenType.FOR):
            self.raise_error("Expected FOR after WATERMARK (WATERMARK FOR ts AS ts - INTERVAL "
                             "'5' SECOND)")
        column = self._parse_column()
        if not self._match(TokenType.ALIAS):
            self.raise_error("Expected AS <expression> after WATERMARK FOR column")
        expression = self._parse_disjunction()
        if expression is None:
            self.raise_error("Expected a watermark expression, e.g. ts - INTERVAL '5' SECOND")
        return self.expression(exp.WatermarkColumnConstraint(this=column, expression=expression))

    def _parse_metadata_column(self) -> exp.Expr:
        key = None
        if self._match(TokenType.FROM):
            key = self._parse_string()
            if key is None:
                self.raise_error("Expected a quoted metadata key after METADATA FROM "
                                 "(e.g. METADATA FROM 'value.source.table')")
        virtual = self._match_text_seq("VIRTUAL")
        return self.expression(MetadataColumnConstraint(this=key, virtual=virtual))

    # -- INSERT ... ON CONFLICT ----------------------------------------------
    def _parse_on_conflict(self) -> exp.OnConflict | None:
        if not self._match_text_seq("ON", "CONFLICT"):
            return None
        if not self._match_text_seq("DO"):
            self.raise_error("Expected DO after ON CONFLICT (ON CONFLICT DO DEDUPLICATE | "
                             "DO ERROR | DO NOTHING)")
        if not self._match_texts(CONFLICT_ACTIONS):
            self.raise_error("Expected DEDUPLICATE, ERROR or NOTHING after ON CONFLICT DO")
        return self.expression(exp.OnConflict(action=exp.var(self._prev.text.upper())))

    # -- EXPLAIN / STATEMENT SET ---------------------------------------------
    def _parse_statement(self) -> exp.Expr | None:
        if self._curr and self._curr.token_type == TokenType.VAR and \
                self._curr.text.upper() == "EXPLAIN":
            self._advance()
            return self._parse_explain()
        if self._curr and self._curr.token_type == TokenType.END and \
                self._index + 1 >= self._tokens_size:
            self._advance()
            return self.expression(exp.EndStatement())
        return super()._parse_statement()

    def _parse_explain(self) -> Explain:
        details = []
        while self._curr and self._curr.text.upper() in EXPLAIN_DETAILS:
            details.append(exp.var(self._curr.text.upper()))
            self._advance()
            self._match(TokenType.COMMA)
        if self._match_text_seq("PLAN", "FOR"):
            pass
        start = self._curr
        stmt = self._parse_statement()
        if stmt is None:
            self.raise_error("Expected a statement after EXPLAIN", start)
        return self.expression(Explain(this=stmt, details=details))

    def _parse_execute(self) -> exp.Expr:
        if self._match_text_seq("STATEMENT", "SET"):
            if not self._match(TokenType.BEGIN):
                self.raise_error("Expected BEGIN after EXECUTE STATEMENT SET")
            # the node's position is that of its first statement (for errors)
            start = self._curr
            first = self._parse_statement() if start else None
            return self.expression(StatementSetBegin(this=first), start)
        self.raise_error("Expected STATEMENT SET BEGIN after EXECUTE (EXECUTE STATEMENT SET "
                         "BEGIN INSERT ...; INSERT ...; END;)")
        return exp.Command(this="EXECUTE")

    def _parse_begin(self) -> exp.Expr:
        if self._match_text_seq("STATEMENT", "SET"):
            return self.expression(StatementSetBegin())
        self.raise_error("Expected STATEMENT SET after BEGIN (transactions are not supported)")
        return exp.Command(this="BEGIN")

    # -- window table functions ---------------------------------------------
    def _parse_tvf_argument(self) -> exp.Expr | None:
        name = None
        if self._curr and self._next and self._next.token_type == TokenType.FARROW:
            name = self._curr.text.upper()
            self._advance(2)
        if self._match(TokenType.TABLE):
            value: exp.Expr | None = self.expression(TableArgument(
                this=self._parse_table_parts(),
                partition_by=self._match(TokenType.PARTITION_BY) and (
                    self._parse_wrapped_csv(self._parse_column)
                    if self._match(TokenType.L_PAREN, advance=False) else [self._parse_column()])))
        else:
            value = self._parse_disjunction()
        if name is not None:
            return self.expression(exp.Kwarg(this=exp.var(name), expression=value))
        return value

    def _parse_window_tvf(self, name: str) -> exp.Expr:
        token = self._tokens[self._index - 2]       # the name, before "("
        node = self.expression(exp.Anonymous(this=name,
                                             expressions=self._parse_csv(self._parse_tvf_argument)))
        # errors about the call point at its name
        node.meta.update(line=token.line, col=token.col, start=token.start, end=token.end)
        return node


class Flink(Spark):
    """Flink SQL (the subset in docs/sql.md)."""

    class Tokenizer(Spark.Tokenizer):
        STRING_ESCAPES = ["'"]
        # EXPLAIN and EXECUTE are statements here, not opaque commands
        # ROW<a INT, b STRING> is Flink's STRUCT (ROW(1, 'b') stays a constructor)
        KEYWORDS = {**{k: v for k, v in Spark.Tokenizer.KEYWORDS.items() if k != "EXPLAIN"},
                    "BYTES": TokenType.VARBINARY, "ROW": TokenType.STRUCT}
        COMMANDS = Spark.Tokenizer.COMMANDS - {TokenType.EXECUTE}

    Parser = FlinkParser


__all__ = ["Flink", "FlinkParser", "StatementSetBegin", "Explain", "TableArgument", "Descriptor",
           "MetadataColumnConstraint",
           "WINDOW_TVFS", "FROM_CHANGELOG", "CONFLICT_ACTIONS"]
