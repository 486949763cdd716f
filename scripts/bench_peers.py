"""`make bench-peers`: Tidewater beside the Apache Iceberg Kafka Connect sink and Spark Structured Streaming, draining
the same backlog on the same Apache Kafka, catalog, warehouse and cores.

One run, one machine: the embedded broker (one node), one PostgreSQL database as the JDBC/SQL catalog that all the
systems share (pyiceberg's SqlCatalog for Tidewater, Iceberg's JdbcCatalog for the peers: each system's table is
created by one and read by the other), one local warehouse folder. For each size, ``--records`` pizza events (JSON)
over 6 partitions are produced first; then each system drains the topic into its own table:

  tidewater (spark-submit)   `tidewater run`, one batch, spark-submit local[2]: cold, as a scheduled task runs it
  tidewater (Spark Connect)  `tidewater run` through a warm Spark Connect server (local[2]), warmed once
  Kafka Connect sink         a connector created on a running distributed worker (one worker), exactly-once as the
                             sink does it (control topic, a coordinator's commit per interval)
  Structured Streaming       scripts/peer_streaming.py under spark-submit local[2], checkpointed, started cold

Each is timed from its start (the CLI started, the connector created, spark-submit started) until a poll of the
table (every second, by this process) sees every record; CPU-seconds are the machine's busy time over that window
(scripts/peers.py ``Processes``: every process, the broker's and PostgreSQL's included), less this process's own.
Peak RSS is the largest sum over the system's own processes. Afterwards every table is read back: its rows, and its distinct
order ids (each event has its own), so a duplicate or a loss shows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import pipeline_file, produce_topic, settle, start_connect
from bench import watermarks as topic_watermarks
from benchlib import REPO, command_line, fresh_home, write_section
from peers import SINK, ConnectWorker, Processes, create_topic, jar_version, streaming_command

BEGIN, END = "<!-- peers:begin -->", "<!-- peers:end -->"
CHART = REPO / "docs" / "img" / "bench-peers.png"
PAGE = REPO / "docs" / "explanation" / "peers.md"
POLL_S = 1.0


@dataclass
class Drain:
    """One system's drain of one topic."""

    system: str
    setting: str
    records: int
    seconds: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    peak_rss_mb: float = 0.0
    commits: int = 0
    files: int = 0
    bytes: int = 0
    rows: int = 0
    distinct: int = 0
    note: str = ""
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def cpu_total(self) -> float:
        """The machine's CPU-seconds over the drain: every process, the broker and PostgreSQL included."""
        return self.cpu["machine"]


class Shared:
    """What every system uses: the broker, the catalog database and the warehouse."""

    def __init__(self, home: Path) -> None:
        from pyiceberg.catalog import load_catalog

        from tidewater_dev import broker, postgres

        self.home = home
        self.broker = broker.start(log_path=home / "broker.log")
        self.pg = postgres.start(home / "postgres.log")
        self.pg.create_database("peers")
        self.warehouse = f"file://{home / 'warehouse'}"
        self.sql_uri = self.pg.url("peers")
        self.jdbc = {
            "catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
            "uri": f"jdbc:postgresql://127.0.0.1:{self.pg.port}/peers",
            "jdbc.user": "tidewater",
            "warehouse": self.warehouse,
        }
        self.catalog = load_catalog("peers", type="sql", uri=self.sql_uri, warehouse=self.warehouse)
        self.catalog.create_namespace_if_not_exists("peers")

    def shared_roots(self) -> dict[str, int]:
        return {"broker": self.broker.pid, "catalog (PostgreSQL)": self.pg.pid}

    def total_records(self, ident: str) -> int:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            snap = self.catalog.load_table(ident).current_snapshot()
        except NoSuchTableError:
            return 0
        return int(snap.summary["total-records"]) if snap is not None else 0

    def wait_visible(self, ident: str, n: int, t0: float, timeout: float, check: Any = None) -> float:
        """Seconds from ``t0`` until a poll sees ``n`` records in the table; ``check()`` raises on a peer's failure."""
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            if self.total_records(ident) >= n:
                return time.monotonic() - t0
            if check is not None:
                check()
            time.sleep(POLL_S)
        raise RuntimeError(f"{ident}: {self.total_records(ident):,} of {n:,} records visible after {timeout:.0f} s")

    def stop(self) -> None:
        self.broker.stop()
        self.pg.stop()


def read_back(shared: Shared, ident: str, drain: Drain) -> None:
    """Rows, distinct order ids, and the commits that added rows (files and bytes) of the drained table."""
    import pyarrow.compute as pc

    table = shared.catalog.load_table(ident)
    column = table.scan(selected_fields=("order_id",)).to_arrow()["order_id"]
    drain.rows, drain.distinct = len(column), pc.count_distinct(column).as_py()
    for snap in table.snapshots():
        summary = snap.summary
        if summary is not None and int(summary.get("added-records", 0) or 0) > 0:
            drain.commits += 1
            drain.files += int(summary.get("added-data-files", 0) or 0)
            drain.bytes += int(summary.get("added-files-size", 0) or 0)


def tidewater_drain(shared: Shared, path: Path, env: dict[str, str], drain: Drain, ident: str, server_pid: int | None) -> None:
    """One `tidewater run`; its CPU is the machine's until the Spark JVM it leaves stopping has exited (``settle``)."""
    settle()
    drain.config = {"pipeline file": yaml.safe_load(path.read_text())}
    roots = shared.shared_roots() | ({"Spark Connect server": server_pid} if server_pid else {})
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidewater.runtime.cli", "run", "--pipeline", str(path), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    procs = Processes(roots | {"tidewater": proc.pid}).start()
    out, _ = proc.communicate()
    drain.seconds = time.monotonic() - t0
    settle()
    cpu = procs.finish()
    if proc.returncode != 0:
        raise RuntimeError(f"tidewater run failed ({proc.returncode}): {out[-2000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    assert result["records"] == drain.records, result
    drain.cpu = cpu
    drain.peak_rss_mb = procs.peak_rss_mb["tidewater"] + procs.peak_rss_mb.get("Spark Connect server", 0.0)
    read_back(shared, ident, drain)


def like_tidewater(shared: Shared, source: str, ident: str, kafka_columns: bool) -> None:
    """A peer's table with the Tidewater table's columns and types (without the Kafka metadata columns when the
    peer does not write them), created through pyiceberg in the shared catalog."""
    from pyiceberg.schema import Schema

    schema = shared.catalog.load_table(source).schema()
    fields = [f for f in schema.fields if kafka_columns or not f.name.startswith("_kafka_")]
    shared.catalog.create_table(ident, schema=Schema(*fields))


def connect_drain(
    shared: Shared, worker: ConnectWorker, topic: str, ident: str, drain: Drain, config: dict[str, str], timeout: float
) -> None:
    name = f"sink-{ident.split('.')[-1]}"
    connector = {
        "connector.class": SINK,
        "topics": topic,
        "iceberg.tables": ident,
        "iceberg.catalog": "peers",
        **{f"iceberg.catalog.{k}": v for k, v in shared.jdbc.items()},
        "iceberg.control.topic": f"control-{name}",
        "iceberg.tables.auto-create-enabled": "false",
        **config,
    }
    drain.config = {"worker properties": worker.props, "connector": connector}
    create_topic(shared.broker.bootstrap, connector["iceberg.control.topic"], 1)
    procs = Processes(shared.shared_roots() | {"Kafka Connect worker": worker.proc.pid}).start()
    t0 = time.monotonic()
    worker.create(name, connector)

    def check() -> None:
        failed = worker.failed_tasks(name)
        if failed:
            raise RuntimeError(f"connector {name} failed: {failed[0]}")

    until_visible(shared, ident, drain, (t0, timeout), procs, "Kafka Connect worker", check, lambda: worker.delete(name))


def until_visible(
    shared: Shared, ident: str, drain: Drain, clock: tuple[float, float], procs: Processes, own: str, check: Any, stop: Any
) -> None:
    """A peer's drain from ``clock`` (its start, its timeout) until every record is visible; its CPU and peak RSS
    (``own``: the peer's process tree), then ``stop()`` the peer and read its table back."""
    try:
        drain.seconds = shared.wait_visible(ident, drain.records, *clock, check)
    finally:
        drain.cpu = procs.finish()
        drain.peak_rss_mb = procs.peak_rss_mb[own]
        stop()
    read_back(shared, ident, drain)


def streaming_drain(shared: Shared, topic: str, ident: str, drain: Drain, trigger_s: float, env: dict[str, str], timeout: float) -> None:
    checkpoint = shared.home / "checkpoints" / ident
    # Spark names the table through its catalog: peers (catalog).peers (namespace).name
    cmd = streaming_command(shared.broker.bootstrap, topic, f"peers.{ident}", checkpoint, trigger_s, shared.jdbc)
    drain.config = {
        "spark-submit": " ".join(cmd[1:-5]),
        "query": "scripts/peer_streaming.py: readStream kafka (startingOffsets earliest, read_committed, "
        "failOnDataLoss) -> from_json(value, the table's columns) + topic, partition, offset, timestamp "
        "-> writeStream iceberg, append, checkpointLocation; trigger: "
        + ("Spark's default" if not trigger_s else f"processingTime {trigger_s:g} s"),
    }
    log = open(shared.home / f"{ident}.log", "wb")
    settle()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    procs = Processes(shared.shared_roots() | {"Structured Streaming": proc.pid}).start()

    def check() -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"the streaming query exited ({proc.returncode}): see {log.name}")

    def stop() -> None:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()

    until_visible(shared, ident, drain, (t0, timeout), procs, "Structured Streaming", check, stop)


def tidewater_pipeline(shared: Shared, home: Path, topic: str, ident: str, connect_url: str | None) -> Path:
    path = pipeline_file(home, ident.split(".")[-1], topic, shared.broker.bootstrap, ident, "local[2]")
    doc = yaml.safe_load(path.read_text())
    if connect_url:
        doc["spark"]["connect_url"] = connect_url
    doc["catalog"] = {"name": "peers", "properties": {"type": "sql", "uri": shared.sql_uri, "warehouse": shared.warehouse}}
    path.write_text(yaml.safe_dump(doc))
    return path


def connect_settings(args: argparse.Namespace, workers: dict[str, ConnectWorker], first: bool) -> list[tuple[str, dict, Any]]:
    """(label, connector settings, worker) of each Kafka Connect row: tuned, and (``first`` size only: it waits for
    commits five minutes apart) Connect's and the sink's defaults on a worker of their own."""
    out = [
        (
            "tuned: tasks.max 2 (the cores), commit interval "
            f"{args.connect_interval_ms / 1000:g} s, worker offset flush {args.connect_flush_ms / 1000:g} s",
            {"tasks.max": "2", "iceberg.control.commit.interval-ms": str(args.connect_interval_ms)},
            workers["tuned"],
        )
    ]
    if "defaults" in workers and first:
        out.append(("defaults: tasks.max 1, commit interval 300 s, worker offset flush 60 s", {}, workers["defaults"]))
    return out


def drain_all(
    shared: Shared, home: Path, n: int, args: argparse.Namespace, env: dict[str, str], server: Any, workers: dict[str, ConnectWorker]
) -> list[Drain]:
    topic = f"pizzas_{n}"
    print(f"== {n:,} records into {topic}", flush=True)
    produce_topic(shared.broker.bootstrap, topic, n, 6)
    assert sum(hi for _, hi in topic_watermarks(shared.broker.bootstrap, topic).values()) == n
    out = []
    first = f"peers.tidewater_submit_{n}"
    for label, ident, url in [
        ("spark-submit local[2], cold", first, None),
        ("Spark Connect, a warm server on local[2]", f"peers.tidewater_connect_{n}", server.url if server else None),
    ]:
        if ident != first and server is None:
            continue
        print(f"   tidewater ({label})", flush=True)
        d = Drain("Tidewater", label, n)
        tidewater_drain(shared, tidewater_pipeline(shared, home, topic, ident, url), env, d, ident, server.pid if url else None)
        out.append(d)
    if workers:
        for i, (label, config, worker) in enumerate(connect_settings(args, workers, n == args.sizes[0])):
            ident = f"peers.connect_{i}_{n}"
            print(f"   Kafka Connect sink ({label})", flush=True)
            like_tidewater(shared, first, ident, kafka_columns=False)
            d = Drain("Kafka Connect Iceberg sink", label, n, note="no Kafka metadata columns")
            connect_drain(shared, worker, topic, ident, d, config, args.timeout)
            out.append(d)
    if not args.no_streaming:
        ident = f"peers.streaming_{n}"
        label = "default trigger (back-to-back micro-batches), local[2], cold"
        print(f"   Structured Streaming ({label})", flush=True)
        like_tidewater(shared, first, ident, kafka_columns=True)
        d = Drain("Spark Structured Streaming", label, n)
        streaming_drain(shared, topic, ident, d, 0.0, env, args.timeout)
        out.append(d)
    for d in out:
        print(
            f"      {d.system} ({d.setting}): {d.seconds:.1f} s, {d.cpu_total:.1f} CPU-s, "
            f"{d.peak_rss_mb:.0f} MB, {d.rows:,} rows, {d.distinct:,} distinct",
            flush=True,
        )
    return out


def results_table(drains: list[Drain]) -> list[str]:
    lines = [
        "| records | system | setting | seconds | records/s | CPU-s | CPU-s per 1M | of which broker + catalog "
        "| peak RSS (MB) | commits | files per commit | MB per commit | rows (distinct) |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for d in drains:
        shared = d.cpu.get("broker", 0.0) + d.cpu.get("catalog (PostgreSQL)", 0.0)
        lines.append(
            f"| {d.records:,} | {d.system} | {d.setting} | {d.seconds:.1f} | {d.records / d.seconds / 1000:,.0f}k | "
            f"{d.cpu_total:.1f} | {d.cpu_total / d.records * 1e6:.1f} | {shared:.1f} | {d.peak_rss_mb:.0f} | "
            f"{d.commits} | {d.files / max(d.commits, 1):.1f} | {d.bytes / max(d.commits, 1) / 1e6:.1f} | "
            f"{d.rows:,} ({d.distinct:,}){'; ' + d.note if d.note else ''} |"
        )
    return lines


def method(when: str, versions: dict[str, str]) -> str:
    return (
        f"Produced by `{command_line('make bench-peers')}` on {when} (UTC) on {os.cpu_count()} cores; every "
        f"figure is from that run. The same Apache Kafka {versions['kafka']} broker (one node), the same "
        "PostgreSQL database as the catalog (pyiceberg's SQL catalog and Iceberg "
        f"{versions['iceberg']}'s JdbcCatalog on the same tables), the same local warehouse, the same JSON pizza "
        "events over 6 partitions, already in the topic. Seconds: from the system's start (the CLI, the "
        "connector's creation, spark-submit) until every record is visible in the table (polled every second). "
        "CPU: the machine's busy CPU-seconds over that window (every process involved, the broker and "
        "PostgreSQL included; the other systems' servers idle meanwhile, in every row alike; the benchmark's own "
        "polling left out). Duplicates and losses: rows and distinct order ids read back."
    )


def report(drains: list[Drain], when: str, versions: dict[str, str]) -> str:
    lines = [
        BEGIN,
        "## Compared with the Kafka Connect sink and Structured Streaming (issue 56)",
        "",
        method(when, versions) + " Each system's configuration is on [the comparison page](docs/explanation/peers.md).",
        "",
        *results_table(drains),
        "",
        *ratios(drains),
        "",
        f"![peers](docs/img/{CHART.name})",
        "",
        END,
    ]
    return "\n".join(lines)


def page(drains: list[Drain], when: str, versions: dict[str, str], redact: dict[str, str]) -> str:
    """The comparison page's generated part: the results and every configuration that produced them."""
    lines = [
        BEGIN,
        "## Results",
        "",
        method(when, versions),
        "",
        *results_table(drains),
        "",
        *ratios(drains),
        "",
        f"![Seconds and CPU-seconds per million records](../img/{CHART.name})",
        "",
        "## Each system's configuration in that run",
        "",
        "Addresses are shown as `<broker>`, `<catalog>`, `<warehouse>`, `<spark-connect>` and `<worker>`.",
        "",
    ]
    seen = set()
    for d in drains:
        if (d.system, d.setting) in seen:
            continue
        seen.add((d.system, d.setting))
        text = yaml.safe_dump(d.config, sort_keys=False, width=120)
        for value, name in redact.items():
            text = text.replace(value, name)
        lines += [f"### {d.system}: {d.setting}", "", "```yaml", text.rstrip(), "```", ""]
    return "\n".join([*lines, END])


def ratios(drains: list[Drain]) -> list[str]:
    """Each size's best Tidewater row against each peer's best row, in this run."""
    out = []
    for n in sorted({d.records for d in drains}):
        rows = [d for d in drains if d.records == n]
        ours = [d for d in rows if d.system == "Tidewater"]
        if not ours:
            continue
        best_cpu = min(ours, key=lambda d: d.cpu_total)
        best_time = min(ours, key=lambda d: d.seconds)
        for peer in sorted({d.system for d in rows} - {"Tidewater"}):
            p_cpu = min((d for d in rows if d.system == peer), key=lambda d: d.cpu_total)
            p_time = min((d for d in rows if d.system == peer), key=lambda d: d.seconds)
            out.append(
                f"- {n:,} records, {peer}: its CPU-seconds are {p_cpu.cpu_total / best_cpu.cpu_total:.2f}x "
                f"Tidewater's ({best_cpu.setting}); its time {p_time.seconds / best_time.seconds:.2f}x "
                f"Tidewater's ({best_time.setting}). "
                + ("Tidewater uses less CPU." if best_cpu.cpu_total < p_cpu.cpu_total else f"**{peer} uses less CPU.**")
            )
    return out


def chart(drains: list[Drain]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{d.system}\n{d.setting.split(',')[0]}\n{d.records / 1e6:g}M" for d in drains]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    a.barh(labels, [d.seconds for d in drains], color="#3b7dd8")
    a.set_xlabel("seconds until every record is visible")
    b.barh(labels, [d.cpu_total / d.records * 1e6 for d in drains], color="#d8893b")
    b.set_xlabel("CPU-seconds per million records (all processes)")
    b.set_yticklabels([])
    a.invert_yaxis()
    b.invert_yaxis()
    fig.tight_layout()
    CHART.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(CHART, dpi=90)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", default="1000000,5000000", help="comma-separated backlog sizes")
    ap.add_argument("--connect-interval-ms", type=int, default=10_000, help="the Kafka Connect sink's commit interval in its tuned setting")
    ap.add_argument(
        "--connect-flush-ms", type=int, default=1000, help="the Connect worker's offset.flush.interval.ms (Connect's default: 60000)"
    )
    ap.add_argument(
        "--no-connect-defaults",
        action="store_true",
        help="leave out the sink at its and Connect's defaults (one task, a commit every 300 s, offsets "
        "flushed every 60 s, on a second worker; first size only)",
    )
    ap.add_argument("--no-connect", action="store_true", help="leave out the Kafka Connect sink")
    ap.add_argument("--no-streaming", action="store_true", help="leave out Structured Streaming")
    ap.add_argument("--no-spark-connect", action="store_true", help="leave out Tidewater through Spark Connect")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds a peer may take to drain one topic")
    ap.add_argument(
        "--output",
        default=str(REPO / "BENCHMARKS.md"),
        help="the report's file; the chart and docs/explanation/peers.md are written only with the default",
    )
    args = ap.parse_args()
    args.sizes = [int(s) for s in args.records.split(",") if s]
    home = fresh_home("bench-peers")
    sys.path.insert(0, str(REPO / "include"))
    from tidewater_dev.broker import free_port, kafka_version

    env = {**os.environ, "TIDEWATER_HOME": str(home), "TIDEWATER_LOG_LEVEL": "WARNING"}
    shared = Shared(home)
    server = None
    workers: dict[str, ConnectWorker] = {}
    drains: list[Drain] = []
    try:
        if not args.no_spark_connect:
            server = start_connect(home, env, shared.broker.bootstrap)
        if not args.no_connect:
            print("== starting the Kafka Connect worker", flush=True)
            workers["tuned"] = ConnectWorker(shared.broker.bootstrap, home / "connect", port=free_port(), flush_ms=args.connect_flush_ms)
            if not args.no_connect_defaults:
                workers["defaults"] = ConnectWorker(
                    shared.broker.bootstrap, home / "connect-defaults", port=free_port(), flush_ms=None, name="peers-connect-defaults"
                )
        for n in args.sizes:
            drains += drain_all(shared, home, n, args, env, server, workers)
    finally:
        for worker in workers.values():
            worker.stop()
        if server is not None:
            server.stop()
        shared.stop()
        shutil.rmtree(home / "warehouse", ignore_errors=True)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")
    versions = {"kafka": kafka_version(), "iceberg": jar_version("connect", "iceberg-kafka-connect")}
    write_section(args.output, BEGIN, END, report(drains, when, versions))
    if Path(args.output).resolve() != (REPO / "BENCHMARKS.md").resolve():
        return 0  # a trial into another file leaves the chart and the comparison page as the last full run left them
    chart(drains)
    redact = {
        shared.jdbc["uri"]: "<catalog>",
        shared.sql_uri: "<catalog>",
        shared.warehouse: "<warehouse>",
        shared.broker.bootstrap: "<broker>",
        str(REPO) + "/": "",
        str(home): "<home>",
        **({server.url: "<spark-connect>"} if server else {}),
        **{w.url: "<worker>" for w in workers.values()},
    }
    write_section(PAGE, BEGIN, END, page(drains, when, versions, redact))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
