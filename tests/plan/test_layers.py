"""The package's layers import downwards only (docs/plan.md, "Layers"):

    api, sql -> plan (nodes, rules, expressions, explain) -> plan.lower, plan.execute
             -> runtime -> connectors, sinks -> operators -> model

Every import is counted, including the ones inside functions (a lazy import
is still a dependency, and the way cycles used to hide).  Each module also
imports on its own in a fresh interpreter, which fails on a cycle.
"""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

import spark_changelog

ROOT = pathlib.Path(spark_changelog.__file__).parent

#: layer -> the layers it may import (besides itself)
ALLOWED = {
    "model": set(),
    "operators": {"model"},
    "connectors": {"model", "operators"},
    "sinks": {"model", "operators", "connectors"},
    "runtime": {"model", "operators", "connectors", "sinks"},
    "plan": {"model"},
    "plan.lower": {"model", "plan", "operators", "connectors", "sinks", "runtime"},
    # SQL builds its plan with the Python API's ChangelogStream (docs/sql.md)
    "sql": {"model", "api", "plan", "plan.lower", "operators", "connectors", "sinks", "runtime"},
    "api": {"model", "plan", "plan.lower", "operators", "connectors", "sinks", "runtime"},
    # Auto CDC's interface (create_auto_cdc_flow) over the Python API
    "auto_cdc": {"model", "api", "plan", "plan.lower", "operators", "connectors", "sinks",
                 "runtime"},
}
# entry points (and the CLI's error sorting): may import anything
TOP = {"cli", "demo", "class_archive_build", "errors", "__init__"}


def module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"] or ["__init__"]
    return ".".join(parts)


#: plan modules that touch Spark: the lowering layer
LOWERING = ("plan.lower", "plan.execute")


def layer_of(module: str) -> str:
    if module.startswith(LOWERING):
        return "plan.lower"
    return module.split(".")[0]


def imports_of(path: pathlib.Path) -> set[str]:
    """Package-relative names of the spark_changelog modules ``path`` imports."""
    module = module_name(path)
    package = module.split(".")[:-1] if path.name != "__init__.py" else module.split(".")
    if module == "__init__":
        package = []
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                target = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.startswith("spark_changelog"):
                target = node.module.split(".")[1:]
            else:
                continue
            if not node.module:     # from . import x
                out.update(".".join(target + [a.name]) for a in node.names)
            else:
                out.add(".".join(target))
        elif isinstance(node, ast.Import):
            out.update(".".join(a.name.split(".")[1:]) for a in node.names
                       if a.name.startswith("spark_changelog."))
    return {m for m in out if m}


MODULES = sorted(p for p in ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_go_down_the_layers(path):
    module = module_name(path)
    layer = layer_of(module)
    if layer in TOP:
        return
    assert layer in ALLOWED, f"{module}: unknown layer {layer!r}; add it to ALLOWED"
    bad = sorted(m for m in imports_of(path)
                 if layer_of(m) != layer and layer_of(m) not in ALLOWED[layer])
    assert not bad, f"{module} ({layer}) imports {bad}, above or beside its layer"


def test_every_module_imports_on_its_own():
    """One interpreter per module would take minutes; one interpreter that
    imports each module first in a fresh module table is equivalent for
    cycles (an ImportError names the partially initialised module)."""
    names = ["spark_changelog" + ("" if module_name(p) == "__init__" else "." + module_name(p))
             for p in MODULES]
    script = (
        "import importlib, sys\n"
        f"names = {names!r}\n"
        "failed = []\n"
        "for n in names:\n"
        "    for k in [k for k in sys.modules if k.startswith('spark_changelog')]:\n"
        "        del sys.modules[k]\n"
        "    try:\n"
        "        importlib.import_module(n)\n"
        "    except Exception as e:\n"
        "        failed.append(f'{n}: {type(e).__name__}: {e}')\n"
        "print('\\n'.join(failed))\n"
        "sys.exit(1 if failed else 0)\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=ROOT.parent, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr


#: packages whose modules must not import each other in a circle, even lazily
#: (a function-level import counts: ``imports_of`` walks the whole tree).
#: sql: docs/sql.md, opening section (translate dispatches to the query shapes,
#: which share sql.relation and sql.context and never import translate);
#: runtime: docs/runtime.md, "Layers of the runtime" (the keyed step's row
#: helpers, the keyed steps, then the pipeline and the sink writers)
ACYCLIC = ("sql", "runtime")


def _cycles(graph: dict) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("package", ACYCLIC)
def test_no_import_circle_inside_package(package):
    paths = [p for p in MODULES if module_name(p).split(".")[0] == package]
    names = {module_name(p) for p in paths}
    graph = {module_name(p): sorted(m for m in imports_of(p) if m in names) for p in paths}
    assert _cycles(graph) == []


def test_runtime_circle_would_be_found():
    """A lazy import back from spark_keyed's helpers into spark_keyed (the
    circle spark_keyed <-> spark_seen_keys had) is a circle for the test."""
    paths = [p for p in MODULES if module_name(p).split(".")[0] == "runtime"]
    names = {module_name(p) for p in paths}
    graph = {module_name(p): sorted(m for m in imports_of(p) if m in names) for p in paths}
    assert "runtime.spark_seen_keys" in graph["runtime.spark_keyed"]
    graph["runtime.spark_seen_keys"] = graph["runtime.spark_seen_keys"] + ["runtime.spark_keyed"]
    assert ["runtime.spark_keyed", "runtime.spark_seen_keys"] in _cycles(graph)


def test_cycle_finder_finds_a_circle():
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
