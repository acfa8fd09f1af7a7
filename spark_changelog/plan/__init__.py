"""The planner: changelog traits of plan nodes, the materializer rule, explain.

``traits``: nodes and the pure functions inferring changelog mode, unique keys
and upsert key; ``rules``: where a SinkUpsertMaterializer goes;
``expressions``: what a Spark column expression keeps; ``explain``: the text.
"""
from .explain import explain_plan
from .rules import MaterializeDecision, PlanError, decide, materialize
from .traits import (Filter, Join, Materialize, Node, Normalize, Project, ProjectItem, Sink, Source, Traits,
                     infer)

__all__ = ["Traits", "Node", "Source", "Project", "ProjectItem", "Filter", "Normalize", "Join", "Materialize",
           "Sink", "infer", "materialize", "decide", "MaterializeDecision", "PlanError",
           "explain_plan"]
