"""The stateful processor of a keyed operator on Spark's state store
(``transformWithStateInPandas``; :mod:`.spark_keyed` runs it, its module
docstring has the state layout).

Spark starts a fresh Python process on the driver for every stateful
operator when a query starts (its "pre-init" runner), one after the other,
only to unpickle the processor and call :meth:`KeyGroupProcessor.init`,
which declares the state variables.  So this module imports nothing heavy at
its top, the operator travels pickled as bytes (unpickled when a task first
needs it), and the methods a task runs import the runtime's modules (pandas,
pyarrow, the operators) when they first run: the pre-init process pays
PySpark's imports only, not this package's operator modules with pandas and
pyarrow (about 0.4 CPU s per operator and query start; docs/runtime.md,
"Where the time goes").  The Python workers have those modules imported
already (``worker_daemon.preload``).
"""
from __future__ import annotations

import json
import pickle
import time
from typing import Callable, Iterator, Optional

from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

#: The state variables' schemas as types: given a DDL string, PySpark asks the
#: JVM to parse it, once when the variable is declared and once more for its
#: client (twice for a map state's key and value), one round trip each in
#: every task (docs/runtime.md, "The fixed cost of a micro-batch").  The same
#: fields as the DDL strings used before, so the same state layout.
META_SCHEMA = StructType([StructField("run_ids", StringType()), StructField("next_seq", LongType())])
RUN_ID_SCHEMA = StructType([StructField("run_id", StringType())])
BLOB_SCHEMA = StructType([StructField("blob", BinaryType())])



class KeyGroupProcessor(StatefulProcessor):
    """One key group's RunStack in the state store (module docstring).
    Operators that wait for event time run in
    :mod:`~spark_changelog.runtime.spark_event_time` instead (the sources'
    watermarks, per partition, with idleness)."""

    def __init__(self, operator, columns, growth: float, max_runs: int,
                 time_zone: Optional[str] = None, key_groups: Optional[int] = None,
                 pack: Optional[Callable] = None, id_layout: Optional[str] = None):
        from pyspark import cloudpickle
        # the operator and ``pack`` (which packs the output for the next keyed
        # operator, ``spark_keyed.keyed_step``: the output rows as an Arrow
        # table -> (key group, packed rows) pairs) travel as bytes, unpickled
        # when a task first needs them (module docstring)
        self._parts = cloudpickle.dumps((operator, pack))
        self._unpickled: Optional[tuple] = None
        #: the query's key-group count, kept in ``meta``: a key's state is found
        #: by its key group, so a checkpoint cannot be read with another count
        self.key_groups = key_groups
        #: how the key-group indexes map to the grouping ids
        #: (``model.partitioning.key_group_ids``), kept in ``meta`` and checked
        #: like the count; None: not kept (the event-time operators' own ids)
        self.id_layout = id_layout
        self.columns = list(columns)
        self.time_zone = time_zone
        self.growth = growth
        self.max_runs = max_runs
        #: each link's runs' Arrow schema, from its operator: made when a task first saves
        self._run_schemas: dict = {}

    def __getstate__(self) -> dict:
        return dict(self.__dict__, _unpickled=None)

    @property
    def operator(self):
        if self._unpickled is None:
            self._unpickled = pickle.loads(self._parts)
        return self._unpickled[0]

    @property
    def pack(self) -> Optional[Callable]:
        self.operator   # noqa: B018 (unpickles both)
        return self._unpickled[1]

    def init(self, handle) -> None:
        self.handle = handle
        self.meta = handle.getValueState("meta", META_SCHEMA)
        self.runs = handle.getMapState("runs", RUN_ID_SCHEMA, BLOB_SCHEMA)

    # -- state: load and save the key group's run stack -------------------------
    def _link(self, link: int) -> tuple:
        """(operator, ``meta`` variable, ``runs`` variable) of a link of the
        key group's step: this processor has one, its operator."""
        return self.operator, self.meta, self.runs

    def _load(self, key, link: int = 0) -> tuple:
        from .checkpoint import damaged_state
        from .state_runs import RunStack, load_run
        op, meta_var, runs_var = self._link(link)
        meta = meta_var.get()   # None when absent (no exists() round trip)
        run_ids = self._run_ids(json.loads(meta[0]), op) if meta else []
        next_seq = int(meta[1]) if meta else 0
        loaded = []
        misses = 0
        for rid in run_ids:
            def read_blob(rid=rid):
                blob = runs_var.getValue((rid,))
                if blob is None:
                    raise damaged_state(op.name, int(key[0]), f"state run {rid} is missing")
                return bytes(blob[0])
            run, read = load_run(rid, op.key, read_blob)
            misses += read
            loaded.append(run)
        stack = RunStack(op.key, loaded, growth=self.growth, max_runs=self.max_runs)
        return stack, run_ids, next_seq, misses

    def _run_ids(self, stored, operator=None) -> list:
        """The run ids of ``meta`` (of ``operator``, by default this
        processor's): ``{"runs": [...], "key_groups": G, "key_group_ids":
        layout}`` (no layout: the plain ids, written before it was kept), or
        a bare list (written before the count was kept: not checked)."""
        operator = operator or self.operator
        if isinstance(stored, list):
            return stored
        written_with = stored.get("key_groups")
        if self.key_groups is not None and written_with is not None and written_with != self.key_groups:
            raise RuntimeError(
                f"{operator.name}: the checkpoint's state was written with {written_with} key groups "
                f"and the query now runs with {self.key_groups}; a key's state is found by its key group, "
                f"so it cannot be read with another count: run with key groups = {written_with} "
                "(--key-groups, key_groups=), or start from a new checkpoint")
        if self.id_layout is not None:
            from ..model.partitioning import PLAIN_IDS
            ids = stored.get("key_group_ids", PLAIN_IDS)
            if ids != self.id_layout:
                # another group's state would be read, or none
                raise RuntimeError(
                    f"{operator.name}: the checkpoint's state was written with {ids} key-group ids "
                    f"and the query now runs with {self.id_layout} ids; the checkpoint's "
                    "plan-fingerprint.json records the layout (key_group_ids): restore it, or "
                    "start from a new checkpoint")
        return stored["runs"]

    def _save(self, stack, run_ids: list, next_seq: int, key, link: int = 0) -> int:
        from .keyed_rows import operator_instance
        from .state_runs import drop_run, keep_run, name_new_runs, run_schema
        op, meta_var, runs_var = self._link(link)
        schemas = self._run_schemas
        if link not in schemas:
            schemas[link] = run_schema(op.state_schema)
        before = set(run_ids)
        scope = f"{operator_instance(op)}/{op.name}/{int(key[0])}"
        blobs = name_new_runs(stack.runs, scope, schemas[link])
        after = [r.id for r in stack.runs]
        written = 0
        for run in stack.runs:
            if run.id not in before:
                runs_var.updateValue((run.id,), (blobs[run.id],))
                keep_run(run, op.key)
                written += run.size
        # in the order of the stored list, never a set's (hash-seeded per
        # process): a replay writes the same state file, byte for byte
        kept = set(after)
        for rid in (r for r in run_ids if r not in kept):
            runs_var.removeKey((rid,))
            drop_run(rid)
        # the count and the key: what a rescale needs to regroup the state
        # (runtime/rescale.py) without the query's plan
        stored = {"runs": after, "key_groups": self.key_groups, "operator": op.name,
                  "key": list(op.key)}
        stored.update(self._layout_of(link))
        meta_var.update((json.dumps(stored), int(next_seq)))
        return written

    def _layout_of(self, link: int) -> dict:
        """What ``meta`` records of the state's layout besides the count."""
        return {} if self.id_layout is None else {"key_group_ids": self.id_layout}

    def _context(self, timerValues, next_seq: int):
        from ..operators.base import OpContext
        return OpContext(processing_time_ms=int(timerValues.getCurrentProcessingTimeInMs()),
                         next_seq=next_seq)

    # -- Spark callbacks ---------------------------------------------------------
    def _unpacked(self, rows):
        """The key group's rows of the batch (``spark_keyed.pack_key_groups``),
        as the operator's pandas frame."""
        from .arrow_packing import unpack
        from .keyed_rows import arrow_input
        # the packed column is the last (Spark renames columns starting with "_")
        blobs = [b for frame in rows for b in frame.iloc[:, -1]]
        return arrow_input(unpack(blobs), self.columns, self.time_zone)

    @property
    def output_operator(self):
        """The operator whose output the step emits."""
        return self.operator

    def _process(self, key, rows, timerValues) -> tuple:
        """(output, the side rows passed on before it, context, counters'
        extra) of the key group's batch; the context is None when no data
        row came (nothing ran)."""
        from .keygroup import process_key_group
        from .keyed_rows import split_upstream_metrics
        op = self.operator
        pdf, passed = split_upstream_metrics(self._unpacked(rows), op)
        if pdf.empty:
            return None, passed, None, None
        t0 = time.perf_counter()
        stack, run_ids, next_seq, misses = self._load(key)
        ctx = self._context(timerValues, next_seq)
        out = process_key_group(op, stack, pdf, ctx)
        written = self._save(stack, run_ids, ctx.next_seq, key)
        extra = {"state_rows": stack.size, "key_group": int(key[0]), "runs": len(stack.runs),
                 "rows_written": written, "cache_misses": misses, "seconds": time.perf_counter() - t0}
        return out, passed, ctx, extra

    def handleInputRows(self, key, rows, timerValues) -> Iterator:
        import numpy as np
        import pandas as pd

        from ..model import KIND_COL, PACKED_GROUP_COL, PACKED_KIND, PACKED_ROWS_COL
        from .keyed_rows import arrow_output, with_metrics
        out, passed, ctx, extra = self._process(key, rows, timerValues)
        op = self.output_operator
        if self.pack is None:
            if passed is not None:
                yield passed
            if ctx is not None:
                yield from with_metrics(out, op, ctx, extra)
            return
        if passed is None and ctx is None:
            return
        # the output as Arrow as the batch path makes it (the data rows without
        # a column of None to convert), packed for the next operator
        pairs = self.pack(arrow_output(out, passed, op, ctx, extra))
        if pairs:
            yield pd.DataFrame({KIND_COL: np.full(len(pairs), PACKED_KIND, dtype=np.int8),
                                PACKED_GROUP_COL: np.array([g for g, _ in pairs], dtype=np.int32),
                                PACKED_ROWS_COL: [b for _, b in pairs]})

    def close(self) -> None:
        pass


class KeyedChainProcessor(KeyGroupProcessor):
    """Keyed operators chained in one key group (``runtime.keyed_chain``,
    docs/runtime.md, "Chained keyed operators"): each link's run stack and
    emission counter in its own pair of variables (:func:`chain_variables`),
    in the key groups of the chain's key; ``meta`` records that key
    (``group_key``: the columns of the link's state that make its key group)
    beside the link's own key, which is what a rescale regroups the link's
    state by.  One call per key group runs every link."""

    @property
    def chain(self):
        return self.operator

    @property
    def output_operator(self):
        return self.chain.last

    def init(self, handle) -> None:
        self.handle = handle
        self.variables = []
        # (imported here: this module imports nothing of the package at its
        # top, so the driver's pre-init process unpickles it without pandas)
        from .checkpoint import chain_variables
        for i in range(len(self.chain.operators)):
            meta, runs = chain_variables(i)
            self.variables.append((handle.getValueState(meta, META_SCHEMA),
                                   handle.getMapState(runs, RUN_ID_SCHEMA, BLOB_SCHEMA)))
        self.meta, self.runs = self.variables[0]

    def _link(self, link: int) -> tuple:
        return (self.chain.operators[link],) + self.variables[link]

    def _layout_of(self, link: int) -> dict:
        return {**super()._layout_of(link), "group_key": list(self.chain.group_keys[link])}

    def _process(self, key, rows, timerValues) -> tuple:
        from .arrow_packing import unpack
        from .keyed_rows import arrow_rows, split_upstream_metrics_arrow
        chain = self.chain
        # the chain's feeds pick each link's rows in Arrow (``keyed_chain``)
        blobs = [b for frame in rows for b in frame.iloc[:, -1]]
        table, passed = split_upstream_metrics_arrow(
            arrow_rows(unpack(blobs), self.columns, self.time_zone), chain.last)
        if not table.num_rows:
            return None, passed, None, None
        opened = {}

        def open_link(i):
            t0 = time.perf_counter()
            stack, run_ids, next_seq, misses = self._load(key, i)
            ctx = self._context(timerValues, next_seq)
            opened[i] = (stack, run_ids, ctx, misses, t0)
            return stack, ctx

        out, ran = chain.process(table, open_link)
        # a link's seconds: from its load to the next link's (its step, and
        # the next link's feed), plus its save: the links' seconds add up
        ends = [opened[i][4] for i in ran[1:]] + [time.perf_counter()]
        links = []
        for i, end in zip(ran, ends):
            stack, run_ids, ctx, misses, t0 = opened[i]
            saving = time.perf_counter()
            written = self._save(stack, run_ids, ctx.next_seq, key, i)
            seconds = end - t0 + time.perf_counter() - saving
            links.append((i, ctx, {"state_rows": stack.size, "key_group": int(key[0]),
                                   "runs": len(stack.runs), "rows_written": written,
                                   "cache_misses": misses, "seconds": seconds}))
        passed = chain.passed_rows(passed, links)
        last = len(chain.operators) - 1
        if not links or links[-1][0] != last:
            return None, passed, None, None
        _, ctx, extra = links[-1]
        return out, passed, ctx, extra


__all__ = ["KeyGroupProcessor", "KeyedChainProcessor", "META_SCHEMA", "RUN_ID_SCHEMA",
           "BLOB_SCHEMA"]
