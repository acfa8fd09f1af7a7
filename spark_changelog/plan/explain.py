"""Plan text with changelog traits, in the shape of Flink's ``EXPLAIN CHANGELOG_MODE``.

One line per node (children indented with ``+-``/``:-`` like Flink), followed
by its traits (``changelogMode``, ``uniqueKeys``, ``upsertKey``), the notes of
the inference (why a key was lost, what was inserted automatically), and for a
sink the materializer decision with its reason.  Join inputs show the shuffle
(``Exchange(distribution=[hash[...]])``) that decides whether a side keeps its
upsert key.  A keyed operator run in one keyed step with the one it reads
says so and why (``chains.chain_reason``).
"""
from __future__ import annotations

from .chains import chain_reason
from .rules import plan_warnings, state_warnings
from .nodes import Join, Node, Sink, exchange_upsert_key, fmt_key


def _lines(node: Node, prefix: str, child_prefix: str, out: list) -> None:
    t = node.traits
    out.append(f"{prefix}{node.label()}, {t.describe()}")
    pad = child_prefix + ("|     " if node.children else "      ")
    for note in t.notes:
        out.append(f"{pad}note: {note}")
    chained = chain_reason(node)
    if chained:
        out.append(f"{pad}{chained}")
    if isinstance(node, Sink) and node.decision is not None:
        d = node.decision
        word = "inserted" if d.inserted else "not inserted"
        out.append(f"{pad}upsert materializer: {word}: {d.reason}")
    if isinstance(node, Join):
        exchanges = []
        for child, keys in ((node.left, node.left_keys), (node.right, node.right_keys)):
            up, _ = exchange_upsert_key(child.traits, keys)
            exchanges.append((child, f"Exchange(distribution=[hash[{', '.join(keys)}]]), "
                                     f"upsertKey={fmt_key(up)}"))
        for i, (child, label) in enumerate(exchanges):
            last = i == len(exchanges) - 1
            p = child_prefix + ("+- " if last else ":- ")
            cp = child_prefix + ("   " if last else ":  ")
            out.append(p + label)
            _lines(child, cp + "+- ", cp + "   ", out)
        return
    for i, child in enumerate(node.children):
        last = i == len(node.children) - 1
        _lines(child, child_prefix + ("+- " if last else ":- "),
               child_prefix + ("   " if last else ":  "), out)


def explain_plan(node: Node) -> str:
    out: list[str] = []
    _lines(node, "", "", out)
    for w in plan_warnings(node) + state_warnings(node):
        out.append(f"WARNING: {w}")
    return "\n".join(out)


__all__ = ["explain_plan"]
