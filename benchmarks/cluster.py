"""Benchmark: the same streaming normalize on the embedded default
(``local[2]``) and on a two-worker standalone cluster started on this machine
(tests/cluster.py: a master and two one-core workers, each its own JVM, the
package shipped as a zip, docs/deploy.md "A standalone cluster, step by
step").

    scripts/bench cluster [--events 5000000] [--ids 1000000] [--files 4]
    scripts/bench cluster --packaging ROUNDS [--events ...]

Input: Debezium JSON files from ``benchmarks/whole_job.py``'s generator,
one micro-batch per file (``maxFilesPerTrigger`` 1).  Each run is a whole
job process (this file with ``--job``), one after the other:
``read_debezium`` -> ``normalize`` -> ``write_upsert`` into Delta.

Per run: the time of each micro-batch (between the run report's progress
calls, the first from the query's start), the whole process's time, and the
driver's peak memory: the resident set of the job's Python process plus its
JVM, sampled every 0.2 s (on ``local[2]`` that JVM also runs the tasks; the
Python workers are counted apart).  On the cluster the executors' peak too.
The two final tables are compared.  Results, with the machine's load before
and after, go to ``benchmarks/results/cluster-<time>.json``.

``--packaging ROUNDS`` compares, on one cluster, two ways of shipping the
package to the executors, alternating, ROUNDS runs each: the zip of sources
alone (``spark-changelog package --no-bytecode``), and the zip with
bytecode plus the preloading worker daemon (``spark-changelog package``,
``spark.python.daemon.module``; docs/deploy.md).  Besides the times it
records the executors' CPU seconds (their JVMs and Python processes,
sampled).  Results: ``benchmarks/results/cluster-packaging-<time>.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from whole_job import SCHEMA_DDL, cached_files, input_arguments, machine_load  # noqa: E402


def job(inp: str, out: str, ck: str) -> None:
    """The measured job; master and Spark settings from ``BENCH_MASTER`` and
    ``BENCH_CONFS`` (JSON)."""
    from spark_changelog.api import read_debezium
    from spark_changelog.runtime.session import build_session

    t0 = time.perf_counter()
    spark = build_session("bench-cluster", master=os.environ["BENCH_MASTER"],
                          configs=json.loads(os.environ.get("BENCH_CONFS", "{}")))
    ends = []
    stream = read_debezium(spark, inp, SCHEMA_DDL, ["id"], streaming=True, max_files_per_trigger=1)
    t_query = time.perf_counter()
    rep = stream.normalize().write_upsert(out, checkpoint=ck, dead_letter=out + "-dl",
                                          progress=lambda r: ends.append(time.perf_counter()))
    batches = [b - a for a, b in zip([t_query] + ends[:-1], ends)]
    print(json.dumps({"batches": batches, "setup": t_query - t0, "rows_in": rep.rows_in,
                      "changes_out": rep.changes_out}))
    spark.stop()


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _children() -> dict:
    out: dict = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            out.setdefault(ppid, []).append(int(d))
    return out


def _tree(children: dict, root: int) -> list:
    found, todo = [root], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _cpu_ticks(pid: int) -> int:
    """User + system CPU of ``pid`` itself, in clock ticks."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


class PeakMemory:
    """Peak resident memory (MiB) of process groups, sampled every 0.2 s:
    ``driver`` (the job's Python process and its JVM), ``python_workers``
    (the Python processes below them: the local run's Python workers),
    ``executors`` (the workers' executor JVMs and their Python workers).
    Also ``executor_cpu_s``: the CPU seconds of every process seen below
    the workers (each one's last sample: a process living less than 0.2 s
    may be missed)."""

    def __init__(self, job_pid: int, worker_pids=()):
        self.job_pid, self.worker_pids = job_pid, list(worker_pids)
        self.peak = {"driver": 0, "python_workers": 0, "executors": 0}
        self._cpu: dict = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _poll(self):
        while not self._stop.wait(0.2):
            children = _children()
            driver = workers = 0
            for pid in _tree(children, self.job_pid):
                argv = _cmdline(pid).split(" ")
                if os.path.basename(argv[0]).startswith("python") and pid != self.job_pid:
                    workers += _rss_kb(pid)
                else:
                    driver += _rss_kb(pid)
            below = [p for w in self.worker_pids for p in _tree(children, w)[1:]]
            executors = sum(_rss_kb(p) for p in below)
            for p in below:
                self._cpu[p] = max(self._cpu.get(p, 0), _cpu_ticks(p))
            for k, v in (("driver", driver), ("python_workers", workers), ("executors", executors)):
                self.peak[k] = max(self.peak[k], v // 1024)

    @property
    def executor_cpu_s(self) -> float:
        return round(sum(self._cpu.values()) / os.sysconf("SC_CLK_TCK"), 1)


def run(label: str, inp: str, work: str, master: str, confs: dict, worker_pids=()) -> dict:
    out, ck = os.path.join(work, label, "table"), os.path.join(work, label, "ck")
    env = dict(os.environ, BENCH_MASTER=master, BENCH_CONFS=json.dumps(confs),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    load = machine_load()
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--job", inp, out, ck], env=env,
                            stdout=subprocess.PIPE, stderr=open(os.path.join(work, f"{label}.log"), "a"),
                            text=True)
    with PeakMemory(proc.pid, worker_pids) as mem:
        stdout, _ = proc.communicate()
    seconds = time.perf_counter() - t
    if proc.returncode:
        raise SystemExit(f"{label} failed ({proc.returncode}); see {work}/{label}.log\n{stdout}")
    res = json.loads(stdout.strip().splitlines()[-1])
    res.update(process_seconds=seconds, peak_mib=mem.peak, load_before=load, load_after=machine_load(),
               table=out)
    if worker_pids:
        res["executor_cpu_s"] = mem.executor_cpu_s
    print(f"{label}: {seconds:.1f} s, batches {[round(b, 1) for b in res['batches']]} s, "
          f"driver peak {mem.peak['driver']} MiB"
          + (f", executors' CPU {res['executor_cpu_s']} s" if worker_pids else "")
          + f" (load {load} -> {res['load_after']})", flush=True)
    return res


def _test_cluster_module():
    """tests/cluster.py, which starts the standalone cluster (by path: this
    file has the same module name)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("test_cluster_support",
                                                  os.path.join(ROOT, "tests", "cluster.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_results(results: dict, name: str) -> str:
    os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
    path = os.path.join(ROOT, "benchmarks", "results", time.strftime(f"{name}-%Y-%m-%dT%H%M%S%z.json"))
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    return path


def packaging(inp: str, work: str, rounds: int, results: dict) -> None:
    """The zip of sources against the zip with bytecode and the preloading
    daemon, alternating on one cluster."""
    from spark_changelog.runtime.py_files import write_package_zip
    cl = _test_cluster_module()
    standalone = cl.StandaloneCluster(os.path.join(work, "cluster"))
    source_zip = os.path.join(work, "source-only", "spark_changelog.zip")
    os.makedirs(os.path.dirname(source_zip))
    write_package_zip(source_zip, bytecode=False)
    variants = {"source zip": dict(standalone.job_confs(), **{"spark.submit.pyFiles": source_zip}),
                "bytecode zip + preloading daemon": dict(standalone.job_confs(),
                                                         **cl.PRELOADING_DAEMON)}
    variants["source zip"].pop("spark.python.daemon.module", None)
    variants["source zip"].pop("spark.executorEnv.PYTHONPATH", None)
    for name in variants:
        results[name] = []
    try:
        standalone.start()
        for i in range(rounds):
            for name, confs in variants.items():
                res = run(f"{name.split()[0]}-{i}", inp, work, standalone.url, confs,
                          worker_pids=[w.pid for w in standalone.workers])
                res.pop("table")
                results[name].append(res)
    finally:
        standalone.stop()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    input_arguments(ap, events=5_000_000, ids=1_000_000)
    ap.add_argument("--packaging", type=int, metavar="ROUNDS",
                    help="compare the source zip with the bytecode zip and preloading daemon")
    ap.add_argument("--job", nargs=3, metavar=("INPUT", "TABLE", "CHECKPOINT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.job:
        job(*args.job)
        return
    if args.packaging:
        inp = cached_files(args.cache, args.events, args.ids, args.files)
        work = tempfile.mkdtemp(prefix="bench-cluster-")
        results = {"events": args.events, "ids": args.ids, "files": args.files,
                   "uptime_before": open("/proc/loadavg").read().strip()}
        packaging(inp, work, args.packaging, results)
        results["uptime_after"] = open("/proc/loadavg").read().strip()
        print(f"results: {_write_results(results, 'cluster-packaging')}")
        return
    from spark_changelog.sinks.delta import read_table
    cl = _test_cluster_module()

    inp = cached_files(args.cache, args.events, args.ids, args.files)
    work = tempfile.mkdtemp(prefix="bench-cluster-")
    results = {"events": args.events, "ids": args.ids, "files": args.files,
               "micro_batches": args.files, "uptime_before": open("/proc/loadavg").read().strip()}
    results["local[2]"] = run("local", inp, work, "local[2]", {})
    standalone = cl.StandaloneCluster(os.path.join(work, "cluster"))
    try:
        standalone.start()
        results["standalone (2 workers x 1 core)"] = run(
            "cluster", inp, work, standalone.url, standalone.job_confs(),
            worker_pids=[w.pid for w in standalone.workers])
    finally:
        standalone.stop()
    a = read_table(results["local[2]"].pop("table"))
    b = read_table(results["standalone (2 workers x 1 core)"].pop("table"))
    results["tables_equal"] = bool(a.equals(b))
    results["uptime_after"] = open("/proc/loadavg").read().strip()
    path = _write_results(results, "cluster")
    print(f"tables equal: {results['tables_equal']}; results: {path}")


if __name__ == "__main__":
    main()
