"""The planner: one plan, one lowering (docs/plan.md).

``nodes``: the plan nodes, each deriving its own changelog traits;
``expressions``: expressions as sqlglot trees and what they keep; ``rules``:
where a ChangelogNormalize and a SinkUpsertMaterializer go; ``explain``: the
text.  ``lower`` (imported on its own: it is the layer that touches Spark)
turns a planned tree into operators and DataFrames.
"""
from .explain import explain_plan
from .nodes import (Filter, Join, Materialize, Node, Normalize, Project, ProjectItem, Sink, Source,
                    Traits, WatermarkAssigner, infer)
from .rules import MaterializeDecision, PlanError, decide, materialize

__all__ = ["Traits", "Node", "Source", "Project", "ProjectItem", "Filter", "Normalize", "Join",
           "Materialize", "WatermarkAssigner", "Sink", "infer", "materialize", "decide",
           "MaterializeDecision", "PlanError", "explain_plan"]
