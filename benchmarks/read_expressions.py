"""A CDC read's projections: Spark's SQL parser against Column expressions,
cold and warm (docs/runtime.md, "From the process's start to the first
job's query").

    scripts/bench read-expressions [--repeats 2] [--format debezium-json]

A streaming read's plan is built from SQL text (``selectExpr``); a process's
first job parses it with a cold parser.  This measures, each in a fresh
process with the session started as the command starts it (*cold*: the
process's first build; *warm*: the next ones), the same expressions built
three ways:

* ``parse``: the texts the read's plan hands to ``selectExpr`` (recorded
  from the read), parsed by the session's SQL parser;
* ``columns``: the parsed trees rebuilt with PySpark's Column API
  (``pyspark.sql.functions``: ``call_function``, ``when``, ``transform``
  with lambdas, ``cast``, operators), node for node, counting py4j's round
  trips to the JVM;
* ``connect``: the same with Spark Connect's Column API (pure Python),
  serialized to protobuf and turned into Catalyst expressions by Spark
  Connect's planner in one JVM call per expression (``SparkConnectPlanner``
  run in the classic session: the cost of a projection that crosses to the
  JVM once, without the SQL parser).

The trees are taken from a parse in a separate process (``prepare``, the
Catalyst tree walked over py4j and kept as JSON), so the measured processes
start as cold as a command.  That process also checks that each rebuild is
the same read: a batch read built through it gives the rows (changes, dead
letters, skips) of the read built from the text.  Writes
``benchmarks/results/read-expressions-<time>.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import vs_flink  # noqa: E402
from whole_job import machine_load  # noqa: E402

CACHE = os.path.join(tempfile.gettempdir(), "spark-changelog-bench")
SCHEMA = vs_flink.COLS       # the suite's columns
WAYS = ("parse", "columns", "columns-untraced", "connect-untraced")
BUILDS = 3      # per process: the first (cold) and two warm

#: Catalyst's binary operators -> the Column method building them
_BINARY = {"And": "__and__", "Or": "__or__", "EqualTo": "__eq__", "EqualNullSafe": "eqNullSafe",
           "Add": "__add__", "Subtract": "__sub__", "Divide": "__truediv__", "Multiply": "__mul__",
           "LessThan": "__lt__", "LessThanOrEqual": "__le__", "GreaterThan": "__gt__",
           "GreaterThanOrEqual": "__ge__"}


def _session():
    from spark_changelog.runtime.session import SessionStart
    with SessionStart("read-expressions", background=False) as starting:
        return starting.session()


def _record_texts(spark, fmt: str, path: str) -> list[str]:
    """The expression texts a streaming read's plan hands to ``selectExpr``."""
    from pyspark.sql.classic.dataframe import DataFrame
    from spark_changelog.connectors.cdc_json import read_changes
    texts: list[str] = []
    select_expr = DataFrame.selectExpr

    def recording(self, *exprs):
        for e in exprs:
            texts.extend([e] if isinstance(e, str) else e)
        return select_expr(self, *exprs)

    DataFrame.selectExpr = recording
    try:
        read_changes(spark, path, fmt, SCHEMA, ["id"], streaming=True).rows.schema
    finally:
        DataFrame.selectExpr = select_expr
    return [t for t in texts if t != "*"]


def _walk(e) -> list:
    """A parsed (unresolved) Catalyst expression as JSON-able nested lists."""
    cls = e.getClass().getSimpleName()
    kids = [e.children().apply(i) for i in range(e.children().size())]
    if cls == "Literal":
        dtype = e.dataType().simpleString()
        v = e.value()
        return ["lit", None if v is None else (str(v) if dtype == "string" else v), dtype]
    if cls in ("UnresolvedAttribute", "UnresolvedNamedLambdaVariable"):
        return ["name", list(e.nameParts().mkString("\u0001").split("\u0001"))]
    if cls == "UnresolvedFunction":
        return ["fn", e.nameParts().mkString("."), [_walk(k) for k in kids]]
    if cls == "LambdaFunction":
        return ["lambda", _walk(e.function()),
                [e.arguments().apply(i).nameParts().mkString(".") for i in range(e.arguments().size())]]
    if cls == "CaseWhen":
        branches = [[_walk(b._1()), _walk(b._2())] for b in
                    (e.branches().apply(i) for i in range(e.branches().size()))]
        return ["case", branches, _walk(e.elseValue().get()) if e.elseValue().isDefined() else None]
    if cls == "Cast":
        return ["cast", _walk(e.child()), e.dataType().simpleString(), str(e.evalMode()) == "TRY"]
    if cls == "Alias":
        return ["alias", _walk(e.child()), [e.name()]]
    if cls == "MultiAlias":
        return ["alias", _walk(e.child()), [e.names().apply(i) for i in range(e.names().size())]]
    if cls == "StringTrim":
        return ["trim", _walk(e.srcStr()), _walk(e.trimStr().get())]
    if cls in ("Like", "RLike"):
        return [cls.lower(), _walk(kids[0]), _walk(kids[1])]
    if cls == "In":
        return ["in", _walk(e.value()), [_walk(k) for k in kids[1:]]]
    if cls in ("Not", "IsNull", "IsNotNull"):
        return [cls, _walk(kids[0])]
    if cls in _BINARY:
        return ["binary", cls, _walk(kids[0]), _walk(kids[1])]
    raise ValueError(f"no Column form for {cls}: {e}")


def _build(tree, F, scope: dict):
    """``tree`` (:func:`_walk`) as a Column of the API ``F`` (classic or Connect)."""
    kind = tree[0]
    if kind == "lit":
        return F.lit(tree[1])
    if kind == "name":
        parts = tree[1]
        if parts[0] in scope:
            c = scope[parts[0]]
            for p in parts[1:]:
                c = c.getField(p)
            return c
        return F.col(".".join("`" + p.replace("`", "``") + "`" for p in parts))
    if kind == "fn":
        name, args = tree[1], tree[2]
        if args and args[-1][0] == "lambda":
            body, names = args[-1][1], args[-1][2]
            hof = {"transform": F.transform, "filter": F.filter}[name]
            return hof(_build(args[0], F, scope), lambda x: _build(body, F, {**scope, names[0]: x}))
        return F.call_function(name, *[_build(a, F, scope) for a in args])
    if kind == "case":
        (c0, v0), *rest = tree[1]
        col = F.when(_build(c0, F, scope), _build(v0, F, scope))
        for c, v in rest:
            col = col.when(_build(c, F, scope), _build(v, F, scope))
        return col.otherwise(_build(tree[2], F, scope)) if tree[2] is not None else col
    if kind == "cast":
        child = _build(tree[1], F, scope)
        return child.try_cast(tree[2]) if tree[3] else child.cast(tree[2])
    if kind == "alias":
        return _build(tree[1], F, scope).alias(*tree[2])
    if kind == "trim":
        return F.call_function("trim", _build(tree[1], F, scope), _build(tree[2], F, scope))
    if kind == "like":
        return _build(tree[1], F, scope).like(tree[2][1])
    if kind == "rlike":
        return _build(tree[1], F, scope).rlike(tree[2][1])
    if kind == "in":
        return _build(tree[1], F, scope).isin(*[_build(v, F, scope) for v in tree[2]])
    if kind == "Not":
        return ~_build(tree[1], F, scope)
    if kind == "IsNull":
        return _build(tree[1], F, scope).isNull()
    if kind == "IsNotNull":
        return _build(tree[1], F, scope).isNotNull()
    if kind == "binary":
        return getattr(_build(tree[2], F, scope), _BINARY[tree[1]])(_build(tree[3], F, scope))
    raise ValueError(kind)


_KINDS = {"lit", "name", "fn", "lambda", "case", "cast", "alias", "trim", "like", "rlike", "in", "Not", "IsNull",
          "IsNotNull", "binary"}


def _nodes(tree) -> int:
    """Expression nodes in ``tree`` (:func:`_walk`)."""
    if not isinstance(tree, list):
        return 0
    own = 1 if tree and isinstance(tree[0], str) and tree[0] in _KINDS else 0
    return own + sum(_nodes(t) for t in tree[own:])


#: lines the read sends to its VARIANT path (every check, dead letters and skips), added to
#: the equality check's copy of one input file
_BAD_LINES = {
    "debezium-json": ['not json', '{"op":"u","after":{"id":1,"g":2,"v":3}}', '{"op":"x"}',
                      '{"op":"c","after":{"id":"a","g":1.5,"v":1}}', '{"op":"c","after":{"g":1,"v":1}}', 'null',
                      '{"op":"t"}', '{"op":"m"}', '{"op":"d","before":{"id":2,"g":1,"v":1},"ts_ms":-1}'],
    "changelog": ['not json', '{"id":1,"g":2,"v":3}', '{"id":1,"g":2,"v":3,"op":"+X"}',
                  '{"id":"a","g":1.5,"v":1,"op":"+I"}', '{"g":1,"v":1,"op":"-D"}', 'null'],
}


def _rebuilt_reads_equal(spark, fmt: str, path: str) -> dict:
    """Whether the read built through each rebuild (every ``selectExpr`` text
    parsed, walked and rebuilt as Columns) gives the rows of the read built
    from the text: a batch read of one input file with lines of every kind of
    error and skip."""
    import shutil
    from pyspark.sql import functions as F
    from pyspark.sql.classic.column import Column
    from pyspark.sql.classic.dataframe import DataFrame
    from pyspark.sql.connect import functions as CF
    from spark_changelog.connectors.cdc_json import read_changes
    work = tempfile.mkdtemp(prefix="read-expressions-check-")
    shutil.copy(os.path.join(path, sorted(os.listdir(path))[0]), os.path.join(work, "part-0.json"))
    with open(os.path.join(work, "part-9.json"), "w") as fh:
        fh.write("\n".join(_BAD_LINES[fmt]) + "\n")
    parser = spark._jsparkSession.sessionState().sqlParser()
    jvm = spark._jvm
    holder = jvm.org.apache.spark.sql.connect.service.SessionHolder.apply("check", "check", spark._jsparkSession)
    planner = jvm.org.apache.spark.sql.connect.planner.SparkConnectPlanner(holder, jvm.scala.Option.empty())
    proto = jvm.org.apache.spark.connect.proto.Expression
    select_expr = DataFrame.selectExpr

    def column(text: str, way: str):
        tree = _walk(parser.parseExpression(text))
        if way == "columns":
            return _build(tree, F, {})
        blob = _build(tree, CF, {}).to_plan(None).SerializeToString()
        return Column(jvm.org.apache.spark.sql.classic.ExpressionUtils.column(
            planner.transformExpression(proto.parseFrom(blob))))

    def rows(way: str) -> list:
        if way != "parse":
            DataFrame.selectExpr = lambda self, *exprs: self.select(
                *[F.col("*") if e == "*" else column(e, way) for e in exprs])
        try:
            read = read_changes(spark, work, fmt, SCHEMA, ["id"], streaming=False)
            return sorted(map(tuple, read.rows.collect()), key=repr)
        finally:
            DataFrame.selectExpr = select_expr

    expected = rows("parse")
    assert sum(1 for r in expected if r[3] == -1) >= len(_BAD_LINES[fmt]) - 1, expected
    result = {way: rows(way) == expected for way in ("columns", "connect")}
    shutil.rmtree(work)
    return result


def prepare(fmt: str, path: str, out: str) -> None:
    spark = _session()
    texts = _record_texts(spark, fmt, path)
    parser = spark._jsparkSession.sessionState().sqlParser()
    json.dump({"texts": texts, "trees": [_walk(parser.parseExpression(t)) for t in texts],
               "rebuilt_reads_equal": _rebuilt_reads_equal(spark, fmt, path)}, open(out, "w"))


def child(way: str, prepared: str) -> None:
    data = json.load(open(prepared))
    t0 = time.time()
    spark = _session()
    result = {"session_ready": time.time() - t0, "builds": []}
    if way.endswith("-untraced"):
        # every PySpark API function otherwise sends its Python call site to
        # the JVM (``pyspark.errors.utils._with_origin``: several round trips);
        # as a session built with the static
        # ``spark.python.sql.dataFrameDebugging.enabled=false`` has it
        from pyspark.errors import utils as error_utils
        error_utils._enable_debugging_cache = False
        way = way[:-len("-untraced")]
    from py4j import clientserver
    calls = [0]
    send = clientserver.ClientServerConnection.send_command

    def counted(self, *a, **k):
        calls[0] += 1
        return send(self, *a, **k)

    clientserver.ClientServerConnection.send_command = counted
    if way == "parse":
        parser = spark._jsparkSession.sessionState().sqlParser()

        def build():
            return [parser.parseExpression(t) for t in data["texts"]]
    elif way == "columns":
        from pyspark.sql import functions as F

        def build():
            return [_build(t, F, {})._jc for t in data["trees"]]
    else:
        jvm = spark._jvm
        from pyspark.sql.classic.column import Column
        from pyspark.sql.connect import functions as CF
        holder = jvm.org.apache.spark.sql.connect.service.SessionHolder.apply(
            "read-expressions", "read-expressions", spark._jsparkSession)

        def build():
            planner = jvm.org.apache.spark.sql.connect.planner.SparkConnectPlanner(holder, jvm.scala.Option.empty())
            proto = jvm.org.apache.spark.connect.proto.Expression
            blobs = [_build(t, CF, {}).to_plan(None).SerializeToString() for t in data["trees"]]
            return [Column(jvm.org.apache.spark.sql.classic.ExpressionUtils.column(
                planner.transformExpression(proto.parseFrom(b)))) for b in blobs]
    for _ in range(BUILDS):
        calls[0] = 0
        t = time.time()
        build()
        result["builds"].append({"seconds": time.time() - t, "py4j_calls": calls[0]})
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--format", default="debezium-json", choices=("debezium-json", "changelog"))
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--prepare", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.prepare:
        return prepare(*args.prepare)
    if args.child:
        return child(*args.child)
    files = vs_flink.ensure_inputs(1_000_000, 100_000, 4, CACHE)   # the suite's (cached)
    path = files["main"] if args.format == "debezium-json" else files["insert_only"]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory(prefix="read-expressions-") as work:
        prepared = os.path.join(work, "trees.json")
        subprocess.run([sys.executable, __file__, "--prepare", args.format, path, prepared], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        data = json.load(open(prepared))
        shape = {"expressions": len(data["texts"]), "characters": sum(map(len, data["texts"])),
                 "nodes": sum(_nodes(t) for t in data["trees"])}
        shape["rebuilt_reads_equal"] = data["rebuilt_reads_equal"]
        print(f"{args.format} read: {shape['expressions']} expressions, {shape['characters']} characters, "
              f"{shape['nodes']} nodes; the rebuilt reads' rows equal the parsed read's: "
              f"{data['rebuilt_reads_equal']}", flush=True)
        runs = {w: [] for w in WAYS}
        for _ in range(args.repeats):
            for way in WAYS:
                load0 = machine_load()
                out = subprocess.run([sys.executable, __file__, "--child", way, prepared], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True).stdout
                r = json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1][7:])
                r["load"] = f"{load0}-{machine_load()}"
                runs[way].append(r)
                b = r["builds"]
                print(f"{way:<8} cold {b[0]['seconds']:5.3f} s ({b[0]['py4j_calls']} py4j calls), warm "
                      f"{b[1]['seconds']:5.3f} s, {b[2]['seconds']:5.3f} s ({b[1]['py4j_calls']} calls) | "
                      f"load {r['load']}", flush=True)
    med = {w: {"cold": round(statistics.median(r["builds"][0]["seconds"] for r in rs), 3),
               "warm": round(statistics.median(b["seconds"] for r in rs for b in r["builds"][1:]), 3)}
           for w, rs in runs.items()}
    for w, m in med.items():
        print(f"median, {w}: cold {m['cold']:.3f} s, warm {m['warm']:.3f} s")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = os.path.join(HERE, "results", f"read-expressions-{stamp}.json")
    with open(path, "w") as fh:
        json.dump({"time_utc": stamp, "format": args.format, "schema": SCHEMA, "shape": shape, "runs": runs,
                   "median": med}, fh, indent=1)
    print(f"written: {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    main()
