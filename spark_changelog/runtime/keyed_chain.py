"""Keyed operators chained in one key group (docs/runtime.md, "Chained keyed
operators").

When a keyed operator reads the output of keyed operators whose keys its own
key contains (the sink upsert materializer on ``(g, id)`` after the
normalize on ``id``; the join on ``id`` after a normalize on ``id`` on each
side), every row of one of its keys comes out of one key group of the
operators before it.  So they run in ONE call per key group, on the key
groups of the first: the first operators' output for the key group goes
straight into the next operator's step, with no shuffle, stage, state store
or Python call between them, and the next operator's state lives in the
same key group beside theirs.

:class:`KeyedChain` only composes: each link is an operator with its
existing step (``keygroup.process_key_group``) and its own state (a run
stack and an emission counter, kept by the runtime); a *feed* says what rows
a link reads (the chain's input, a join side of it, an earlier link's
output, the union of two).  Both Spark runtimes run it the same way: the
streaming one (``key_group_processor.KeyedChainProcessor``) with each link's
state in the state store, the batch one without state.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import pandas as pd
import pyarrow as pa

from ..operators.base import KeyedOperator, OpContext
from ..operators.kernels import arrow_to_pandas
from .keygroup import process_key_group
from .keyed_rows import FROM_PANDAS, metrics_row, split_upstream_metrics
from .state_runs import RunStack


def conform_rows(rows: pd.DataFrame, schema: pa.Schema) -> pd.DataFrame:
    """``rows`` as the next operator reads them in an unchained run: through
    Arrow in its input ``schema`` and back (the pandas types of a key
    group's rows after Spark, ``keyed_rows.arrow_input``), so a chained
    operator gets the very frame it would get after a shuffle.  Columns of
    numpy integer, boolean or float types that are the schema's own (a
    normalize's output of such columns) are that frame already: the
    conversion would give back the same values in the same types (a float's
    NaN returns as NaN), so it is skipped."""
    if list(rows.columns) == schema.names and all(
            _same_numpy_type(rows[f.name].dtype, f.type) for f in schema):
        return rows.reset_index(drop=True)
    # nthreads=1: keyed_rows.FROM_PANDAS
    table = pa.Table.from_pandas(rows, schema=schema, **FROM_PANDAS)
    return arrow_to_pandas(table)


def _same_numpy_type(dtype, arrow_type: pa.DataType) -> bool:
    """Whether Arrow's ``to_pandas`` of ``arrow_type`` gives numpy ``dtype``
    for any values a column of ``dtype`` holds (integers and booleans hold no
    nulls; floats hold theirs as NaN either way)."""
    if not isinstance(dtype, np.dtype) or dtype.kind not in "iubf":
        return False
    if not (pa.types.is_integer(arrow_type) or pa.types.is_boolean(arrow_type)
            or pa.types.is_floating(arrow_type)):
        return False
    return arrow_type.to_pandas_dtype() == dtype.type


def _to_pandas(table: pa.Table) -> pd.DataFrame:
    return arrow_to_pandas(table)


class ChainInput:
    """A link reading the chain's input rows (Arrow) as they are."""

    #: the rows come in the shuffle's arrival order
    ordered = False

    def __call__(self, rows: pa.Table, outputs: list) -> pd.DataFrame:
        return _to_pandas(rows)


class LinkOutput:
    """A link reading the output of link ``index`` (in the link's input schema)."""

    #: the rows come in the order that link emitted them: a function of its
    #: sorted input and its state, so the same in any replay
    ordered = True

    def __init__(self, index: int, schema: pa.Schema):
        self.index, self.schema = index, schema

    def __call__(self, rows: pa.Table, outputs: list) -> pd.DataFrame:
        out = outputs[self.index]
        return out if out.empty else conform_rows(out, self.schema)


class JoinSide:
    """A link reading one side's rows of the chain's input, which is a
    join's union of its two inputs (``JoinInputLayout.spark_union``): the
    rows of ``side``, its columns under their input names, in the link's
    input ``schema``.  Picked in Arrow, then converted once: the union as
    pandas holds each side's columns null in the other side's rows (float64
    for an integer column), which cost a conversion of every union column
    and a round trip through Arrow per side (docs/runtime.md, "Chained keyed
    operators")."""

    ordered = False

    def __init__(self, layout, side: int, schema: pa.Schema):
        self.layout, self.side, self.schema = layout, side, schema

    def _sources(self) -> list:
        """Per column of ``schema``, the union's column it is read from."""
        from ..model import KIND_COL, SEQ_COL
        from ..operators.join.regular_join import LEFT
        if self.side == LEFT:
            names = {c: c for c in self.layout.left_columns}
        else:
            names = {src.name: f.name for src, f in zip(self.layout.right_source_fields,
                                                        self.layout.right_fields)}
        names.update({KIND_COL: KIND_COL, SEQ_COL: SEQ_COL})
        return [names[f.name] for f in self.schema]

    def __call__(self, rows: pa.Table, outputs: list) -> pd.DataFrame:
        import pyarrow.compute as pc

        from ..operators.join.regular_join import SIDE_COL
        mine = rows.filter(pc.equal(rows.column(SIDE_COL), self.side))
        if not mine.num_rows:
            return pd.DataFrame()
        columns = [mine.column(src).cast(f.type) for src, f in zip(self._sources(), self.schema)]
        return _to_pandas(pa.Table.from_arrays(columns, schema=self.schema))


class JoinUnion:
    """A link (the join) reading the outputs of links ``left`` and
    ``right`` as its union rows (``JoinInputLayout.union_pandas``), in its
    input ``schema``."""

    ordered = True

    def __init__(self, layout, left: int, right: int, schema: pa.Schema):
        self.layout, self.left, self.right, self.schema = layout, left, right, schema

    def __call__(self, rows: pa.Table, outputs: list) -> pd.DataFrame:
        left, right = outputs[self.left], outputs[self.right]
        if left.empty and right.empty:
            return left.iloc[:0]
        union = self.layout.union_pandas(None if left.empty else left, None if right.empty else right)
        return conform_rows(union, self.schema)


class KeyedChain:
    """Keyed operators run one after the other in one key group (module
    docstring).  ``operators``: the links, each after the links it reads;
    ``feeds``: per link, what it reads (:class:`ChainInput`,
    :class:`LinkOutput`, ...); the last link's output is the chain's.
    ``packing``: the operator whose key (columns of the chain's input) makes
    the key groups, and whose pre-fold may drop input rows before the chain
    (``spark_keyed.pack_key_groups``).  ``group_keys``: per link, the
    columns of its state rows that make its key group (what a rescale
    regroups the link's state by)."""

    def __init__(self, operators: tuple, feeds: tuple, packing: KeyedOperator, group_keys: tuple):
        if not len(operators) == len(feeds) == len(group_keys) or len(operators) < 2:
            raise ValueError("a chain has two or more links, each with its feed and group key")
        self.operators, self.feeds, self.packing = tuple(operators), tuple(feeds), packing
        self.group_keys = tuple(tuple(k) for k in group_keys)

    @classmethod
    def linear(cls, operators: tuple) -> "KeyedChain":
        """Each operator reading the one before as it is; the key groups are
        the first's (every later key contains its key, by name)."""
        first = operators[0]
        missing = [op.name for op in operators[1:] if not set(first.key) <= set(op.key)]
        if missing:
            raise ValueError(f"{missing}: the key does not contain {list(first.key)}")
        feeds = (ChainInput(),) + tuple(LinkOutput(i, op.input_schema)
                                        for i, op in enumerate(operators[1:]))
        return cls(operators, feeds, first, (first.key,) * len(operators))

    @classmethod
    def join(cls, left: KeyedOperator, right: KeyedOperator, join: KeyedOperator, layout) -> "KeyedChain":
        """A normalize on each input and the join on their keys: the
        chain's input is the union of the two inputs' rows in the join's
        layout, its key groups the join's (each normalize's key is its
        side's join key)."""
        feeds = (JoinSide(layout, 0, left.input_schema), JoinSide(layout, 1, right.input_schema),
                 JoinUnion(layout, 0, 1, join.input_schema))
        return cls((left, right, join), feeds, join, (left.key, right.key, join.key))

    @property
    def last(self) -> KeyedOperator:
        return self.operators[-1]

    # -- one key group --------------------------------------------------------
    def process(self, rows: pa.Table,
                open_link: Callable[[int], tuple[Optional[RunStack], OpContext]]) -> tuple:
        """Run every link on the key group's ``rows`` (the chain's input,
        Arrow, without side rows: ``keyed_rows.split_upstream_metrics_arrow``).
        ``open_link(i)`` gives link ``i``'s state (None: no state, a bounded
        run) and context; it is called only for a link
        that gets rows, so a link with none is not loaded, run, nor saved.
        Returns (the last link's output, the indexes of the links that ran)."""
        outputs: list = []
        ran = []
        for i, (op, feed) in enumerate(zip(self.operators, self.feeds)):
            inp = feed(rows, outputs)
            if inp.empty:
                outputs.append(op.empty_output())
                continue
            stack, ctx = open_link(i)
            outputs.append(process_key_group(op, stack, inp, ctx, ordered=feed.ordered))
            ran.append(i)
        return outputs[-1], ran

    def passed_rows(self, passed: Optional[pd.DataFrame], links: list) -> Optional[pd.DataFrame]:
        """The side rows the chain emits before its output: the input's side
        rows passed through (``passed``, already in the last link's output
        schema) and the counters row of every link but the last that ran
        (``links``: (index, context, extra)), in the last link's output
        schema as a side row passing through it would be."""
        parts = [] if passed is None else [passed]
        for i, ctx, extra in links:
            if i == len(self.operators) - 1:
                continue
            row = metrics_row(self.operators[i], ctx.metrics, extra)
            parts.append(split_upstream_metrics(row, self.last)[1])
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)


__all__ = ["KeyedChain", "ChainInput", "LinkOutput", "JoinSide", "JoinUnion", "conform_rows"]
