"""Running a planned sink: lower it and hand it to the runtime.

The API's ``write_upsert`` and the SQL front end's ``INSERT INTO`` both end
here: the tree from ``rules.plan_sink`` is lowered (``lower.lower``), its
DataFrame runs into the table (``runtime.pipeline.run_to_sink``; the bad
input of every source leaf travels in it as side rows to the dead-letter
output), and the report carries the explain text and the plan warnings.
"""
from __future__ import annotations

import warnings as _warnings
from typing import Optional

from ..model.partitioning import SPREAD_IDS
from ..runtime.keyed_rows import arrow_schema_of
from ..runtime.spark_keyed import key_group_id_layout, session_key_groups
from .chains import chaining, keyed_chains
from .explain import explain_plan
from .fingerprint import (check_checkpoint, checkpoint_key_group_ids, checkpoint_key_groups,
                          checkpoint_keyed_chains, is_streaming, with_key_groups)
from .lower import lower
from .nodes import Sink, source_leaves
from .rules import plan_warnings, sink_keys_emitted_once


class PlanWarning(UserWarning):
    """A plan-time warning (e.g. non-deterministic columns without an upsert key)."""


def run_sink(sink: Sink, table, *, checkpoint: Optional[str] = None,
             changelog_path: Optional[str] = None, changelog_format: str = "parquet",
             dead_letter: Optional[str] = None, strict: bool = False, progress=None,
             late_output: Optional[str] = None, warn_stacklevel: int = 2,
             trigger: Optional[str] = None, until=None):
    """Run the planned ``sink`` into ``table`` (a Delta path or an
    ``UpsertSink``); returns the :class:`~spark_changelog.runtime.pipeline.RunReport`.
    Plan warnings are issued as :class:`PlanWarning` and listed first in the
    report's ``warnings``."""
    from ..runtime.pipeline import run_to_sink
    from ..runtime.keyed_rows import operator_instance
    warns = plan_warnings(sink)
    # without a checkpoint: the ids and chains of a new one (chains as the
    # caller's block says, plan.chains.keyed_chains)
    layout, chains = SPREAD_IDS, chaining()
    if checkpoint is not None and is_streaming(sink):
        from pyspark.sql import SparkSession
        # active() falls back to the default session: a query started from
        # another thread than the session's has no active session there
        fresh = session_key_groups(SparkSession.active())
        changed = check_checkpoint(checkpoint, sink, fresh)
        if changed:
            warns.append(changed)
        # keyed operators run with the key-group count their state was
        # written with (docs/runtime.md, "Key groups and rescaling").  One
        # that sets none runs with the session's default (``keyed_step``), so
        # only another recorded count needs new nodes: new nodes are lowered
        # again, and the plan the front end lowered already (its readers' line
        # tasks, its keyed steps) would be built and analyzed a second time
        groups = checkpoint_key_groups(checkpoint, fresh)
        if groups != fresh:
            sink = with_key_groups(sink, groups)
        # and with the layout of their ids (a checkpoint written before it was
        # recorded: the plain ids; lowering is memoized per layout)
        layout = checkpoint_key_group_ids(checkpoint)
        # and chained where they were (plan/chains.py: a checkpoint written
        # unchained has a stateful operator for each)
        chains = checkpoint_keyed_chains(checkpoint)
    for w in warns:
        _warnings.warn(w, PlanWarning, stacklevel=warn_stacklevel)
    with key_group_id_layout(layout), keyed_chains(chains):
        low = lower(sink)
        plan = explain_plan(sink)
    report = run_to_sink(_sink_frame(low, sink.key), table, key=sink.key,
                         schema=arrow_schema_of(low.data_df),
                         checkpoint=checkpoint, changelog_path=changelog_path,
                         changelog_format=changelog_format, dead_letter=dead_letter,
                         strict=strict, progress=progress, late_output=late_output,
                         entry_instances=tuple(operator_instance(op) for op in low.entry),
                         keys_emitted_once=sink_keys_emitted_once(sink),
                         trigger=trigger, until=until,
                         source_positions={s.name: s.reader.progress for s in source_leaves(sink)
                                           if hasattr(s.reader, "progress")})
    report.plan = plan
    report.warnings[:0] = warns
    return report


def _sink_frame(low, key) -> object:
    """What the sink writers read: the last keyed operator's output packed
    by its processor (``runtime/sink_writers.py``, ``pack_output``) when the
    sink reads that output as it is or through a projection that only picks
    and renames its columns, and every change of a sink key is in one key
    group's output: the sink key holds, under any name, the columns of one
    of the operator's ``output_keys`` (its key; a join's key columns of a
    side never null-padded), or there is no sink key; else the rows.
    Packed, the changes skip a round trip through Spark rows
    (docs/runtime.md, "Sink writers on the executors")."""
    if low.packs is None or low.df is not low.packs[0] or not low.operators:
        return low.df
    op = low.operators[-1]
    if key:
        names = dict(low.packed_names or ((k, k) for k in key))
        held = {names.get(k) for k in key}
        if not any(set(cols) <= held for cols in op.output_keys):
            return low.df
    from ..runtime.sink_writers import pack_output
    return low.packs[1](pack_output, low.df.schema)


__all__ = ["run_sink", "PlanWarning"]
