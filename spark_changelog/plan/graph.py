"""A planned tree as a graph: Graphviz ``dot`` or Mermaid ``flowchart``
(``spark-changelog explain --format dot|mermaid``).  One box per node with its
label and traits (the lines of :func:`~.explain.explain_plan`), edges from
input to consumer; a sink's materializer decision is part of its box."""
from __future__ import annotations

from .nodes import Node, Sink


def _nodes(root: Node) -> list[tuple[Node, list[str]]]:
    out, seen = [], set()

    def walk(n: Node):
        if id(n) in seen:
            return
        seen.add(id(n))
        lines = [n.label(), n.traits.describe(), *[f"note: {x}" for x in n.traits.notes]]
        if isinstance(n, Sink) and n.decision is not None:
            word = "inserted" if n.decision.inserted else "not inserted"
            lines.append(f"upsert materializer: {word}: {n.decision.reason}")
        out.append((n, lines))
        for c in n.children:
            walk(c)
    walk(root)
    return out


def explain_dot(root: Node) -> str:
    nodes = _nodes(root)
    ids = {id(n): f"n{i}" for i, (n, _) in enumerate(nodes)}

    def esc(s: str) -> str:
        return s.replace("\\", "\\\\").replace('"', '\\"')
    lines = ["digraph plan {", "  rankdir=BT;", "  node [shape=box, fontname=monospace];"]
    for n, text in nodes:
        lines.append(f'  {ids[id(n)]} [label="{esc(chr(10).join(text))}"];'.replace("\n", "\\l"))
    for n, _ in nodes:
        for c in n.children:
            lines.append(f"  {ids[id(c)]} -> {ids[id(n)]};")
    lines.append("}")
    return "\n".join(lines)


def explain_mermaid(root: Node) -> str:
    nodes = _nodes(root)
    ids = {id(n): f"n{i}" for i, (n, _) in enumerate(nodes)}

    def esc(s: str) -> str:
        return s.replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")
    lines = ["flowchart BT"]
    for n, text in nodes:
        lines.append(f'  {ids[id(n)]}["{"<br/>".join(esc(t) for t in text)}"]')
    for n, _ in nodes:
        for c in n.children:
            lines.append(f"  {ids[id(c)]} --> {ids[id(n)]}")
    return "\n".join(lines)


__all__ = ["explain_dot", "explain_mermaid"]
