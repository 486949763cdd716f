"""`make bench`: throughput, memory and fixed costs of Tidewater against raw librdkafka and a naive loop.

Everything runs in one invocation on the embedded broker, so the ratios compare like with like on this
machine at this moment. Results go to BENCHMARKS.md with the command, machine and date.

Cases: pizza events (Scenario 1), 6 partitions x 1M and 5M records, and 1 partition x 5M.
For each case:
  limit     - raw librdkafka consumption of the whole topic in one Python process (values read, nothing decoded)
  naive     - confluent-kafka loop, json.loads per record, pyiceberg append every 100k records
  tidewater - `tidewater run` of one batch covering the topic (plan, Spark job, validate, commit), and
              the Spark job's data path (first record read to last file written, from the manifest)
  Connect   - the same through a warm Spark Connect server (`make spark-connect-install`; started once, warmed
              with one small batch first, as a long-running server is), beside spark-submit in the same run
Peak RSS is sampled (every 0.2 s) for every process of a run: the CLI, spark-submit's JVM, the Spark
driver's Python and the Python workers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
ANALYSIS_MARK = "<!-- analysis: kept by scripts/bench.py -->"
BIN = Path(sys.executable).parent


@dataclass
class Result:
    case: str
    method: str
    records: int
    seconds: float
    bytes: int = 0
    rss_mb: dict[str, float] = field(default_factory=dict)
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def mbps(self) -> float:
        return self.bytes / self.seconds / 1e6 if self.seconds else 0.0


class RssSampler:
    """Peak RSS per process kind in the tree under ``pid`` (sampled)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak: dict[str, float] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def kind(p: psutil.Process) -> str:
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            return "other"
        if "java" in p.name() or "java" in cmd.split(" ")[0]:
            return "jvm (spark driver)"
        if "pyspark.daemon" in cmd or "pyspark/daemon" in cmd or "pyspark.worker" in cmd:
            return "python worker"
        if "ingest_batch.py" in cmd:
            return "python driver"
        if "tidewater" in cmd:
            return "tidewater cli"
        return "other"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                root = psutil.Process(self.pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                break
            for p in procs:
                try:
                    rss = p.memory_info().rss / 2**20
                except psutil.Error:
                    continue
                k = self.kind(p)
                self.peak[k] = max(self.peak.get(k, 0.0), rss)
            time.sleep(0.2)

    def __enter__(self) -> RssSampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(2)


# ---- data ---------------------------------------------------------------------------------------------


def produce_topic(bootstrap: str, topic: str, n: int, partitions: int, bad_every: int = 0, encode: Any = None) -> int:
    """Produce n pizza events (every ``bad_every``-th one truncated, if set; re-encoded by ``encode``, a registry
    format's framing, if given); returns total value bytes."""
    from tidewater_dev.sample_data import pizza_events, produce

    total = 0
    chunk = 500_000
    for i, start in enumerate(range(0, n, chunk)):
        vals = pizza_events(min(chunk, n - start), seed=1000 + i)
        if bad_every:
            vals = [v[: len(v) // 2] if (start + j) % bad_every == 0 else v for j, v in enumerate(vals)]
        if encode is not None:
            vals = encode(vals)
        total += sum(map(len, vals))
        produce(bootstrap, topic, vals, partitions=partitions, create=(i == 0))
    return total


def watermarks(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench"})
    md = c.list_topics(topic, timeout=10).topics[topic]
    out = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False) for p in md.partitions}
    c.close()
    return out


# ---- limit and naive ----------------------------------------------------------------------------------


LIMIT_CODE = r"""
import sys, time, json
from confluent_kafka import Consumer, TopicPartition
from tidewater.source.kafka import THROUGHPUT_DEFAULTS
bootstrap, topic = sys.argv[1], sys.argv[2]
ends = {int(k): v for k, v in json.loads(sys.argv[3]).items()}
c = Consumer({**THROUGHPUT_DEFAULTS, "bootstrap.servers": bootstrap, "group.id": "bench-limit",
              "enable.auto.commit": False, "isolation.level": "read_committed"})
c.assign([TopicPartition(topic, p, 0) for p in ends])
n = nbytes = 0
target = sum(ends.values())
t0 = time.monotonic()
first = None
while n < target:
    msgs = c.consume(num_messages=10000, timeout=1.0)
    if msgs and first is None:
        first = time.monotonic()
    for m in msgs:
        v = m.value()
        if v is not None:
            n += 1
            nbytes += len(v)
t1 = time.monotonic()
c.close()
print(json.dumps({"records": n, "bytes": nbytes, "seconds": t1 - t0}))
"""

NAIVE_CODE = r"""
import sys, time, json
import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition
from pyiceberg.catalog import load_catalog
bootstrap, topic, catalog_uri, warehouse, ident = sys.argv[1:6]
ends = {int(k): v for k, v in json.loads(sys.argv[6]).items()}
catalog = load_catalog("naive", type="sql", uri=catalog_uri, warehouse=warehouse)
catalog.create_namespace_if_not_exists("bench")
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-naive", "enable.auto.commit": False})
c.assign([TopicPartition(topic, p, 0) for p in ends])
target = sum(ends.values())
rows, n, nbytes, table = [], 0, 0, None
t0 = time.monotonic()
def flush():
    global rows, table
    if not rows:
        return
    batch = pa.Table.from_pylist(rows)
    if table is None:
        table = catalog.create_table_if_not_exists(ident, schema=batch.schema)
    table.append(batch)
    rows = []
while n < target:
    for m in c.consume(num_messages=1000, timeout=1.0):
        if m.error():
            continue
        rows.append(json.loads(m.value()))
        n += 1
        nbytes += len(m.value())
        if len(rows) >= 100_000:
            flush()
flush()
t1 = time.monotonic()
print(json.dumps({"records": n, "bytes": nbytes, "seconds": t1 - t0,
                  "files": len(table.inspect.files()) if table is not None else 0}))
"""


def run_python(code: str, args: list[str], env: dict[str, str]) -> tuple[dict, dict[str, float]]:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, env=env)
    with RssSampler(proc.pid) as s:
        out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark helper failed ({proc.returncode})")
    return json.loads(out.strip().splitlines()[-1]), {"process": round(max(s.peak.values()), 1)}


# ---- tidewater ----------------------------------------------------------------------------------------


def pipeline_file(directory: Path, name: str, topic: str, bootstrap: str, table: str, master: str, fmt: dict | None = None) -> Path:
    doc = {
        "format": fmt or {"value": "json"},
        "name": name,
        "topics": [topic],
        "kafka": {"bootstrap_servers": bootstrap, "read_timeout_seconds": 60},
        "table": {"identifier": table},
        "batch": {"max_records": 100_000_000},
        "validation": {"not_null": ["order_id", "store_id"]},
        "spark": {"master": master},
        "schedule": None,
    }
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def baseline_env(env: dict[str, str], tree: Path) -> dict[str, str]:
    """The environment that runs an earlier checkout's code (``--baseline``) with this venv."""
    return {**env, "PYTHONPATH": str(tree / "include"), "TIDEWATER_SPARK_APP": str(tree / "spark_apps" / "ingest_batch.py")}


def settle(limit: float = 20.0) -> None:
    """Wait until no Spark JVM of an earlier run is still stopping (`tidewater run` does not wait for it),
    so that one measurement does not pay for the previous one. The Spark Connect server's JVM (also started
    by spark-submit) runs for the whole benchmark and does not count."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if not any(
            "org.apache.spark.deploy.SparkSubmit" in cmd and "SparkConnectServer" not in cmd
            for cmd in (" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))
        ):
            return
        time.sleep(0.2)


def tidewater_run(path: Path, env: dict[str, str], master: str | None = None) -> tuple[dict, dict[str, float], float]:
    settle()
    cmd = [sys.executable, "-m", "tidewater.runtime.cli", "run", "--pipeline", str(path), "--json"]
    if master:
        cmd += ["--master", master]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    with RssSampler(proc.pid) as s:
        out, _ = proc.communicate()
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"tidewater run failed ({proc.returncode}): {out[-2000:]}")
    return json.loads(out.strip().splitlines()[-1]), {k: round(v, 1) for k, v in s.peak.items()}, wall


def breakdown(res: dict, wall: float) -> dict[str, float]:
    """One `tidewater run` split into its phases (seconds), from its JSON result and the measured wall time."""
    steps = res.get("steps", {})
    if not steps:  # a baseline without the breakdown: its wall time only
        return {"total (wall)": wall}
    out = {"CLI start, imports and exit": wall - res["seconds"], "plan (CLI)": steps["plan"]}
    out.update({f"write: {k}": v for k, v in res.get("write_breakdown", {}).items()})
    out["write: manifest read back (CLI)"] = steps["write"] - sum(res.get("write_breakdown", {}).values())
    out.update({"validate (CLI)": steps["validate"], "commit (CLI)": steps["commit"], "total (wall)": wall})
    return out


def build_cases(args: argparse.Namespace) -> list[tuple[str, int, int, int]]:
    """(case, records, partitions, every how many records one is undecodable) from the command line."""
    sizes = [int(s) for s in args.sizes.split(",") if s]
    cases = [(f"6 partitions x {n / 1e6:g}M", n, 6, 0) for n in sizes]
    if args.small:
        cases.append((f"6 partitions x {args.small / 1e6:g}M", args.small, 6, 0))
    if args.single:
        cases.append((f"1 partition x {args.single / 1e6:g}M", args.single, 1, 0))
    if args.bad_percent:
        n = sizes[0]
        cases.append((f"6 partitions x {n / 1e6:g}M, {args.bad_percent:g}% undecodable", n, 6, round(100 / args.bad_percent)))
    for n, name in ((args.avro, "Avro"), (args.json_schema, "JSON Schema"), (args.protobuf, "Protobuf")):
        if n:
            cases.append((f"6 partitions x {n / 1e6:g}M, {name}", n, 6, 0))
    return cases


def registry_formats(registry: Any) -> dict[str, tuple[str, Any]]:
    """Each registry case's format and encoder, its schema registered with the stand-in registry (the same events)."""
    import base64

    from tidewater_dev.sample_data import (
        PIZZA_JSON_SCHEMA,
        avro_framed,
        json_schema_framed,
        pizza_proto,
        protobuf_framed,
    )

    json_id = registry.register("pizza-json-value", {"schema": json.dumps(PIZZA_JSON_SCHEMA), "schemaType": "JSON"})["id"]
    proto = base64.standard_b64encode(pizza_proto()[0]).decode("ascii")
    proto_id = registry.register("pizza-proto-value", {"schema": proto, "schemaType": "PROTOBUF"})["id"]
    return {
        "Avro": ("avro", avro_framed),
        "JSON Schema": ("json_schema", lambda vals: json_schema_framed(vals, json_id)),
        "Protobuf": ("protobuf", lambda vals: protobuf_framed(vals, proto_id)),
    }


def measure_run(
    case: str,
    engine: str,
    n: int,
    nbytes: int,
    path: Path,
    env: dict[str, str],
    home: Path,
    results: list[Result],
    breakdowns: dict | None,
    bad_every: int,
) -> None:
    """One `tidewater run` of the case's batch on ``engine`` (a local master, or "Spark Connect" for a pipeline
    with spark.connect_url): end to end and its data path, and its phases into ``breakdowns`` when given.
    A Connect server's processes are not the CLI's children: their RSS is not sampled."""
    print(f"   tidewater run ({engine})", flush=True)
    res, rss, wall = tidewater_run(path, env)
    assert res["records"] == n, res
    assert res.get("dead_letters", 0) == (len(range(0, n, bad_every)) if bad_every else 0), res
    m = manifest_of(home, yaml.safe_load(path.read_text())["name"], res["batch_id"])
    secs, files, fbytes, tasks = data_path(m)
    extra = {"files": files, "file_mb": round(fbytes / 1e6, 1), "tasks": tasks}
    results.append(Result(case, f"tidewater run, {engine}", n, wall, nbytes, rss, extra))
    results.append(Result(case, f"tidewater data path, {engine}", n, secs, nbytes, {}, extra))
    if breakdowns is not None:
        breakdowns[case] = {**breakdown(res, wall), "records": n}


def manifest_of(home: Path, pipeline: str, batch_id: str) -> dict:
    return json.loads((home / "staging" / pipeline / batch_id / "manifest.json").read_text())


def data_path(manifest: dict) -> tuple[float, int, int, int]:
    t = manifest["task_timings"]
    secs = max(x["finished_at"] for x in t) - min(x["started_at"] for x in t)
    # version 2 manifests list every table's files under outputs (the table's own included); version 1 at the top
    files = [f for o in manifest.get("outputs") or [] for f in o["data_files"]] or manifest["data_files"]
    return secs, len(files), sum(f["file_size_in_bytes"] for f in files), len(t)


# ---- report -------------------------------------------------------------------------------------------


def fmt_rate(r: float) -> str:
    return f"{r / 1000:,.0f}k"


def write_report(results: list[Result], fixed: dict[str, float], args: argparse.Namespace, started: str) -> str:
    from tidewater_dev.broker import kafka_version

    by = {(r.case, r.method): r for r in results}
    lines = [
        "# Benchmarks",
        "",
        f"Produced by `{args.command_line}` on {started} (UTC).",
        f"Machine: {platform.node()}, {os.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}, "
        f"embedded broker (Apache Kafka {kafka_version()}, KRaft, one node) on 127.0.0.1. Shared, noisy machine: "
        "compare ratios within one run.",
        "",
        "Records are Scenario 1 pizza events (~200 B of JSON each).",
        "",
        "## Throughput",
        "",
        "| case | method | records | seconds | records/s | MB/s | vs limit | vs naive | peak RSS MB per process |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in results:
        lim = by.get((r.case, "limit"))
        nai = by.get((r.case, "naive"))
        vs_lim = f"{r.rate / lim.rate:.2f}" if lim and r.method != "limit" else ""
        vs_nai = f"{r.rate / nai.rate:.2f}" if nai and r.method not in ("limit", "naive") else ""
        rss = ", ".join(f"{k}: {v:,.0f}" for k, v in sorted(r.rss_mb.items()) if k != "other")
        lines.append(
            f"| {r.case} | {r.method} | {r.records:,} | {r.seconds:.1f} | {fmt_rate(r.rate)} | {r.mbps:.1f} | {vs_lim} | {vs_nai} | {rss} |"
        )
    lines += [
        "",
        "`tidewater run` is end to end (plan, Spark start, write, validate, commit). The data path is the",
        "Spark job from the first record read to the last file written (from the tasks' timings).",
        "",
    ]
    lines += ["## Files written", "", "| case | method | data files | MB | Spark tasks |", "| --- | --- | ---: | ---: | ---: |"]
    for r in results:
        if "files" in r.extra:
            lines.append(f"| {r.case} | {r.method} | {r.extra['files']} | {r.extra.get('file_mb', '')} | {r.extra.get('tasks', '')} |")
    lines += ["", "## Fixed cost of a batch", "", "| what | seconds |", "| --- | ---: |"]
    for k, v in fixed.items():
        lines.append(f"| {k} | {v:.2f} |")
    lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000000,5000000", help="records for the 6-partition cases")
    ap.add_argument("--single", type=int, default=5_000_000, help="records for the 1-partition case (0: skip)")
    ap.add_argument("--cores", default="1,2", help="local Spark cores to compare on the smallest case")
    ap.add_argument(
        "--bad-percent",
        type=float,
        default=1.0,
        help="extra case: the first size with this share of truncated records (dead letters); 0: skip",
    )
    ap.add_argument("--avro", type=int, default=1_000_000, help="extra case: Avro records, 6 partitions (0: skip)")
    ap.add_argument(
        "--json-schema",
        type=int,
        default=1_000_000,
        help="extra case: the same events in the JSON Schema wire format, 6 partitions (0: skip)",
    )
    ap.add_argument(
        "--protobuf", type=int, default=1_000_000, help="extra case: the same events in the Protobuf wire format, 6 partitions (0: skip)"
    )
    ap.add_argument("--small", type=int, default=100_000, help="extra case: a typical small batch, 6 partitions (0: skip)")
    ap.add_argument(
        "--baseline",
        default=None,
        metavar="TREE",
        help="a checkout of an earlier commit (git worktree add TREE COMMIT): its `tidewater run` is measured "
        "on the same topics in the same run, for before/after ratios",
    )
    ap.add_argument("--repeat", type=int, default=3, help="one-record batches measured per code version (median)")
    ap.add_argument("--no-naive", action="store_true")
    ap.add_argument("--no-connect", action="store_true", help="skip the Spark Connect rows")
    ap.add_argument("--no-dag", action="store_true", help="skip the empty-batch run through Airflow")
    ap.add_argument("--output", default=str(REPO / "BENCHMARKS.md"))
    args = ap.parse_args()
    extra = f' BENCH_ARGS="{" ".join(sys.argv[1:])}"' if sys.argv[1:] else ""
    args.command_line = "make bench" + extra if os.environ.get("MAKELEVEL") else " ".join(["python", *sys.argv])
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")

    from tidewater_dev import broker as embedded

    work = Path(os.environ.get("TIDEWATER_HOME", REPO / ".data")) / "bench"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    home = work / "home"
    home.mkdir()
    (home / "jars").symlink_to(REPO / ".data" / "jars") if (REPO / ".data" / "jars").is_dir() else None
    env = {**os.environ, "TIDEWATER_HOME": str(home), "TIDEWATER_LOG_LEVEL": "WARNING"}
    b = embedded.start(log_path=work / "broker.log")
    server = None if args.no_connect else start_connect(work, env, b.bootstrap)
    connect_breakdowns: dict[str, dict[str, float]] = {}  # the same phases through the Connect server
    results: list[Result] = []
    fixed: dict[str, float] = {}
    breakdowns: dict[str, dict[str, float]] = {}  # case -> phase -> seconds (`tidewater run`, local[2])
    base_breakdowns: dict[str, dict[str, float]] = {}
    baseline = Path(args.baseline).resolve() if args.baseline else None
    registry = None
    try:
        cases = build_cases(args)
        cores = [int(c) for c in args.cores.split(",") if c]
        from tidewater_dev.sample_data import PIZZA_AVRO_SCHEMA, LocalSchemaRegistry

        registry = LocalSchemaRegistry({1: PIZZA_AVRO_SCHEMA})
        registry_url = registry.start()
        framings = registry_formats(registry)
        for ci, (case, n, parts, bad_every) in enumerate(cases):
            topic = f"bench-{ci}"
            framing = framings.get(case.rpartition(", ")[2])
            framed = framing is not None  # a registry format: no naive loop, no phase breakdown (JSON's)
            fmt = {"value": framing[0], "registry_url": registry_url} if framing else None
            print(f"== {case}: producing", flush=True)
            nbytes = produce_topic(b.bootstrap, topic, n, parts, bad_every, framing[1] if framing else None)
            ends = {p: hi for p, (lo, hi) in watermarks(b.bootstrap, topic).items()}
            assert sum(ends.values()) == n, f"broker shows {sum(ends.values())} of {n} records"
            print("   limit", flush=True)
            out, rss = run_python(LIMIT_CODE, [b.bootstrap, topic, json.dumps(ends)], env)
            results.append(Result(case, "limit", out["records"], out["seconds"], out["bytes"], rss))
            if not args.no_naive and not bad_every and not framed:  # the naive loop reads clean JSON only
                print("   naive", flush=True)
                out, rss = run_python(
                    NAIVE_CODE,
                    [
                        b.bootstrap,
                        topic,
                        f"sqlite:///{work / 'naive.db'}",
                        f"file://{work / 'naive-wh'}",
                        f"bench.naive_{ci}",
                        json.dumps(ends),
                    ],
                    env,
                )
                results.append(Result(case, "naive", out["records"], out["seconds"], out["bytes"], rss, {"files": out["files"]}))
            masters = [f"local[{c}]" for c in cores] if ci == 0 else ["local[2]"]
            for master in masters:
                name = f"b{ci}_{master[6:-1]}"
                path = pipeline_file(work, name, topic, b.bootstrap, f"bench.t{ci}_{master[6:-1]}", master, fmt)
                measure_run(
                    case,
                    master,
                    n,
                    nbytes,
                    path,
                    env,
                    home,
                    results,
                    breakdowns if master == "local[2]" and not bad_every and not framed else None,
                    bad_every,
                )
                base_path = None
                if baseline is not None and master == "local[2]":
                    base_path = pipeline_file(work, f"{name}_base", topic, b.bootstrap, f"bench.t{ci}_base", master, fmt)
                    print(f"   baseline run ({master})", flush=True)
                    bres, brss, bwall = tidewater_run(base_path, baseline_env(env, baseline))
                    assert bres["records"] == n, bres
                    results.append(Result(case, f"baseline run, {master}", n, bwall, nbytes, brss))
                    if not bad_every and not framed:
                        base_breakdowns[case] = {"total (wall)": bwall}
                if server is not None and master == "local[2]":
                    measure_run(
                        case,
                        "Spark Connect",
                        n,
                        nbytes,
                        connect_pipeline(path, server.url),
                        env,
                        home,
                        results,
                        connect_breakdowns if not bad_every and not framed else None,
                        bad_every,
                    )
                if ci == 0 and master == masters[-1]:
                    print("   fixed costs", flush=True)
                    t0 = time.monotonic()
                    tidewater_run(path, env)
                    fixed["empty batch, `tidewater run` (no Spark start)"] = time.monotonic() - t0
                    one_record_batches(
                        b.bootstrap,
                        topic,
                        parts,
                        path,
                        base_path,
                        env,
                        baseline,
                        args.repeat,
                        fixed,
                        breakdowns,
                        base_breakdowns,
                        [(connect_pipeline(path, server.url), connect_breakdowns)] if server else [],
                    )
                    if not args.no_dag:
                        fixed.update(dag_runs(work, path, env, b.bootstrap, topic, parts))
    finally:
        b.stop()
        if server is not None:
            server.stop()
        if registry is not None:
            registry.stop()
    report = write_report(results, fixed, args, started) + breakdown_report(breakdowns, base_breakdowns, baseline)
    if connect_breakdowns:
        report += breakdown_report(connect_breakdowns, {}, None, "Spark Connect, a warm server on local[2]")
        report += targets_report(results, connect_breakdowns)
    out = Path(args.output)
    if out.is_file() and ANALYSIS_MARK in out.read_text():  # keep the hand-written analysis below the figures
        report += "\n" + ANALYSIS_MARK + out.read_text().split(ANALYSIS_MARK, 1)[1]
    out.write_text(report)
    print(report)
    return 0


ONE_RECORD = "1 record"


def one_record_batches(
    bootstrap: str,
    topic: str,
    parts: int,
    path: Path,
    base_path: Path | None,
    env: dict[str, str],
    baseline: Path | None,
    repeat: int,
    fixed: dict[str, float],
    breakdowns: dict,
    base_breakdowns: dict,
    connect: list[tuple[Path, dict]] | None = None,
) -> None:
    """One-record batches through `tidewater run`, this code, the baseline and (``connect``: its pipeline and
    breakdowns) the Spark Connect path alternating on the same records (medians)."""
    import statistics

    from tidewater_dev.sample_data import produce

    runs: dict[str, list[tuple[dict, float]]] = {"new": [], "base": [], "connect": []}
    for _ in range(repeat):
        produce(bootstrap, topic, [b'{"order_id": "one", "store_id": 1}'], partitions=parts, create=False)
        res, _, wall = tidewater_run(path, env)
        assert res["records"] == 1, res
        runs["new"].append((res, wall))
        for cpath, _ in connect or []:
            res, _, wall = tidewater_run(cpath, env)
            assert res["records"] == 1, res
            runs["connect"].append((res, wall))
        if base_path is not None and baseline is not None:
            res, _, wall = tidewater_run(base_path, baseline_env(env, baseline))
            assert res["records"] == 1, res
            runs["base"].append((res, wall))
    for key, into, label in [("new", breakdowns, ""), *[("connect", b, ", Spark Connect") for _, b in connect or []]]:
        per_phase: dict[str, list[float]] = {}
        for res, wall in runs[key]:
            for k, v in breakdown(res, wall).items():
                per_phase.setdefault(k, []).append(v)
        into[ONE_RECORD] = {k: statistics.median(v) for k, v in per_phase.items()}
        fixed[f"one-record batch, `tidewater run`{label} (median of {repeat})"] = into[ONE_RECORD]["total (wall)"]
    if runs["base"]:
        base = statistics.median(w for _, w in runs["base"])
        base_breakdowns[ONE_RECORD] = {"total (wall)": base}
        fixed[f"one-record batch, baseline `tidewater run` (median of {repeat})"] = base


def breakdown_report(
    breakdowns: dict[str, dict[str, float]], base: dict[str, dict[str, float]], baseline: Path | None, engine: str = "Spark local[2]"
) -> str:
    """Where the seconds of one batch go, per batch size (`tidewater run` on ``engine``)."""
    if not breakdowns:
        return ""
    cases = sorted(breakdowns, key=lambda c: (c != ONE_RECORD, "1 partition" in c, breakdowns[c].get("records", 1)))
    phases = list(dict.fromkeys(k for c in cases for k in breakdowns[c] if k != "records"))
    lines = [
        "",
        f"## Where a batch's time goes (`tidewater run`, {engine})",
        "",
        "Seconds per phase, in order. `write:` phases come from the Spark driver's milestones and the tasks' "
        "timings (manifest `driver_timings`, `task_timings`); the first task's set-up and the data path run on "
        "the critical path of the first task to start, other tasks run alongside.",
        "",
        "| phase | " + " | ".join(cases) + " |",
        "| --- |" + " ---: |" * len(cases),
    ]
    for ph in phases:
        lines.append(f"| {ph} | " + " | ".join(f"{breakdowns[c][ph]:.2f}" if ph in breakdowns[c] else "" for c in cases) + " |")
    if base and baseline is not None:
        commit = subprocess.run(["git", "-C", str(baseline), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        lines.append(
            "| baseline total (wall), commit "
            + commit
            + " | "
            + " | ".join(f"{base[c]['total (wall)']:.2f}" if c in base else "" for c in cases)
            + " |"
        )
        lines.append(
            "| baseline / now | "
            + " | ".join(f"{base[c]['total (wall)'] / breakdowns[c]['total (wall)']:.2f}x" if c in base else "" for c in cases)
            + " |"
        )
    return "\n".join(lines + [""]) + "\n"


# ---- Spark Connect ------------------------------------------------------------------------------------


def start_connect(work: Path, env: dict[str, str], bootstrap: str):
    """A Spark Connect server (local[2]) warmed with one small batch, as a long-running server is."""
    from tidewater_dev import spark_connect
    from tidewater_dev.sample_data import pizza_events, produce

    print("== starting and warming the Spark Connect server", flush=True)
    server = spark_connect.start(log_path=work / "spark-connect.log")
    produce(bootstrap, "bench-warmup", pizza_events(1000, seed=1), partitions=2)
    path = connect_pipeline(pipeline_file(work, "warmup", "bench-warmup", bootstrap, "bench.warmup", "local[2]"), server.url)
    res, _, _ = tidewater_run(path, env)
    assert res["records"] == 1000, res
    return server


def connect_pipeline(path: Path, url: str) -> Path:
    """The same pipeline writing through the Connect server, into its own table."""
    doc = yaml.safe_load(path.read_text())
    doc["name"] += "_connect"
    doc["table"]["identifier"] += "_connect"
    doc["spark"]["connect_url"] = url
    out = path.with_name(f"{doc['name']}.yaml")
    out.write_text(yaml.safe_dump(doc))
    return out


def targets_report(results: list[Result], connect: dict[str, dict[str, float]]) -> str:
    """Issue 23's targets against this run's figures (ratios within the run)."""
    by = {(r.case, r.method): r for r in results}

    def vs_naive(case: str, method: str) -> str:
        r, nai = by.get((case, method)), by.get((case, "naive"))
        return f"{r.rate / nai.rate:.2f}x" if r and nai else "not measured"

    one = connect.get(ONE_RECORD, {})
    setup = one.get("write: first task's set-up (catalog, table, clients)")
    rows = [
        ("one-record batch end to end through Connect", "<= 1.5 s", f"{one['total (wall)']:.2f} s" if one else "not measured"),
        ("6 partitions x 1M through Connect, vs naive", ">= 1.5x", vs_naive("6 partitions x 1M", "tidewater run, Spark Connect")),
        ("6 partitions x 5M through Connect, vs naive", ">= 3x", vs_naive("6 partitions x 5M", "tidewater run, Spark Connect")),
        ("6 partitions x 1M through spark-submit, vs naive", ">= 1.2x", vs_naive("6 partitions x 1M", "tidewater run, local[2]")),
        (
            "first task's set-up on a warm worker (one-record batch, Connect)",
            "<= 0.3 s",
            f"{setup:.3f} s" if setup is not None else "not measured",
        ),
    ]
    lines = ["", "## Spark Connect targets (this run)", "", "| what | target | measured |", "| --- | --- | ---: |"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines + [""]) + "\n"


def dag_runs(work: Path, path: Path, env: dict[str, str], bootstrap: str, topic: str, parts: int) -> dict[str, float]:
    """An empty batch and a one-record batch through the ingest DAG (`airflow dags test`): the wall time
    and each task's duration as Airflow recorded it."""
    import sqlite3

    from tidewater_dev.sample_data import produce

    af = work / "airflow"
    out: dict[str, float] = {}
    out["empty batch, ingest DAG (`airflow dags test`, wall)"] = dag_empty_run(work, path, env)
    name = yaml.safe_load(path.read_text())["name"]
    produce(bootstrap, topic, [b'{"order_id": "one", "store_id": 1}'], partitions=parts, create=False)
    aenv = dag_env(work, env)
    t0 = time.monotonic()
    proc = subprocess.run([str(BIN / "airflow"), "dags", "test", f"ingest_{name}"], env=aenv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError("one-record DAG run failed:\n" + (proc.stdout + proc.stderr)[-3000:])
    out["one-record batch, ingest DAG (`airflow dags test`, wall)"] = time.monotonic() - t0
    with sqlite3.connect(af / "airflow.db") as db:
        for (duration,) in db.execute("SELECT duration FROM task_instance WHERE dag_id = 'bench_noop'"):
            out["a task that does nothing, DAG task `noop` (Airflow's own cost of a task)"] = duration
        runs = [r[0] for r in db.execute("SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id", (f"ingest_{name}",))]
        for label, run_id in zip(("empty batch", "one-record batch"), runs[-2:]):
            for task_id, duration, state in db.execute(
                "SELECT task_id, duration, state FROM task_instance WHERE dag_id = ? AND run_id = ? ORDER BY start_date",
                (f"ingest_{name}", run_id),
            ):
                if duration is not None:
                    out[f"{label}, DAG task `{task_id}` ({state})"] = duration
    return out


NOOP_DAG = """
import pendulum
from airflow.sdk import dag, task


@dag(dag_id="bench_noop", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def bench_noop():
    @task(task_id="noop")
    def noop():
        return None

    noop()


bench_noop()
"""


def dag_env(work: Path, env: dict[str, str]) -> dict[str, str]:
    """Airflow on its own SQLite database, with the ingest DAG file and a one-task no-op DAG (Airflow's own
    cost of a task, the floor under ours)."""
    af, dags = work / "airflow", work / "dags"
    return {
        **env,
        "AIRFLOW_HOME": str(af),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{af / 'airflow.db'}",
        "TIDEWATER_PIPELINES_DIR": str(work / "pipelines"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
    }


def dag_empty_run(work: Path, path: Path, env: dict[str, str]) -> float:
    pipelines = work / "pipelines"
    pipelines.mkdir(exist_ok=True)
    shutil.copy(path, pipelines / path.name)
    (work / "airflow").mkdir(exist_ok=True)
    dags = work / "dags"
    dags.mkdir(exist_ok=True)
    shutil.copy(REPO / "dags" / "tidewater_dags.py", dags / "tidewater_dags.py")
    (dags / "bench_noop.py").write_text(NOOP_DAG)
    aenv = dag_env(work, env)
    subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=aenv, check=True, capture_output=True)
    subprocess.run([str(BIN / "airflow"), "dags", "test", "bench_noop"], env=aenv, check=True, capture_output=True)
    name = yaml.safe_load(path.read_text())["name"]
    t0 = time.monotonic()
    proc = subprocess.run([str(BIN / "airflow"), "dags", "test", f"ingest_{name}"], env=aenv, capture_output=True, text=True)
    took = time.monotonic() - t0
    if proc.returncode != 0 or "Skipping downstream tasks" not in proc.stdout + proc.stderr:
        raise RuntimeError("empty DAG run did not short-circuit:\n" + (proc.stdout + proc.stderr)[-3000:])
    return took


if __name__ == "__main__":
    sys.exit(main())
