"""`make bench-sizing`: how many pipelines one Airflow carries. The CPU that pipelines on a one-minute schedule cost
Airflow's scheduler (with its LocalExecutor workers and their task processes), its DAG processor and its API server,
with 1, 20 and 50 pipelines, and one routed pipeline over 20 topics against 20 pipelines of one topic each; then
1 and 4 pipelines with data flowing, and one routed pipeline over 4 topics with data flowing.

Real components on 127.0.0.1, as `make bench-dag` starts them (scripts/soak.py's Services, without the object store,
the schema registry and the Spark Connect server, which these runs do not use): Debian's PostgreSQL (Airflow's
metadata and the Iceberg catalog), the embedded broker, and Airflow's api-server, DAG processor and scheduler
(LocalExecutor, parallelism 4) as separate processes.

First the pipelines are caught up (their topics hold no new record), so each minute's ingest run is the plan task,
which finds nothing to do and short-circuits the others: what a pipeline costs Airflow whatever its data. Then data
flows (``--flowing``, ``--flowing-routed``: ``--rate`` records a minute a topic, produced every 5 seconds), so each run
plans, writes through spark-submit (local[1], on the worker), validates and commits a batch: what a pipeline with
data costs, the write step's engine included.

Each configuration runs ``--warmup`` seconds (the DAG processor finds the new files, the first runs start), then CPU
is sampled over ``--window`` seconds: each component's own CPU plus its children's (live and reaped), from /proc
(psutil). The ingest runs that ended in the window and the tasks that ran come from the metadata database.

    make bench-sizing [BENCH_ARGS="--counts 1,20 --window 120"]

A run's figures are kept in docs/img/bench-sizing.json; ``--from-json`` writes the report from them again.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts.benchlib import command_line, write_section
from scripts.soak import REPO, Services, metadata_query

BEGIN, END = "<!-- sizing: begin -->", "<!-- sizing: end -->"
PAGE = REPO / "docs" / "explanation" / "sizing.md"
FIGURES = REPO / "docs" / "img" / "bench-sizing.json"  # the figures of the report
COMPONENTS = ("scheduler", "dag-processor", "api-server")


class SizingServices(Services):
    """PostgreSQL, the broker and Airflow: the soak's services without what these runs do not use."""

    def __init__(self, work: Path) -> None:
        from tidewater_dev import broker, postgres
        from tidewater_dev.broker import free_port

        self.work = work
        self.postgres = postgres.start(work / "postgres.log")
        self.broker = broker.start(log_path=work / "broker.log")
        self.catalog_url = self.postgres.create_database("sizing_catalog")
        self.metadata_url = self.postgres.create_database("sizing_airflow")
        self.airflow = {}
        self.api_port = free_port()

    def env(self) -> dict[str, str]:
        return {**super().env(), "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "20"}

    def stop(self) -> None:
        self.stop_airflow()
        self.broker.stop()
        self.postgres.stop()


def write_pipelines(svc: Services, names: list[str], routed: bool, routed_name: str = "routed") -> None:
    """The pipelines folder holds exactly ``names``'s files (one topic each), or, ``routed``, one pipeline
    (``routed_name``) reading the topics of ``names`` into one table per topic."""
    from confluent_kafka.admin import AdminClient, NewTopic

    folder = svc.work / "pipelines"
    folder.mkdir(exist_ok=True)
    for old in folder.glob("*.yaml"):
        old.unlink()
    admin = AdminClient({"bootstrap.servers": svc.broker.bootstrap})
    new = [t for t in (f"{n}-events" for n in names) if t not in admin.list_topics(timeout=10).topics]
    for fut in admin.create_topics([NewTopic(t, num_partitions=1, replication_factor=1) for t in new]).values() if new else []:
        fut.result(timeout=60)
    common = {
        "kafka": {"bootstrap_servers": svc.broker.bootstrap},
        "catalog": {"name": "lake", "properties": {"type": "sql", "uri": svc.catalog_url, "warehouse": f"file://{svc.work / 'warehouse'}"}},
        "schedule": "* * * * *",
        "maintenance": {"schedule": None},
        "audit": {"schedule": None},
        "airflow": {"retries": 0},
        "spark": {"master": "local[1]"},
    }
    if routed:
        doc = {
            "name": routed_name,
            "topics": [f"{n}-events" for n in names],
            "routing": {"namespace": "rpc"},
            "tables": [{"identifier": f"rpc.{n}", "topics": [f"{n}-events"]} for n in names],
            **common,
        }
        (folder / f"{routed_name}.yaml").write_text(yaml.safe_dump(doc))
        return
    for n in names:
        (folder / f"{n}.yaml").write_text(
            yaml.safe_dump({"name": n, "topics": [f"{n}-events"], "table": {"identifier": f"rpc.{n}"}, **common})
        )


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(CPU seconds of a process alone, of it and all its descendants, live and reaped: a reaped child's time is in
    its parent's ``children_*``)."""
    import psutil

    own, total = 0.0, 0.0
    try:
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            try:
                t = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += t.user + t.system + t.children_user + t.children_system
            own += t.user + t.system if p.pid == pid else 0.0
    except psutil.NoSuchProcess:
        pass
    return own, total


class Flow:
    """Records produced to ``topics`` while the block it opens runs: ``rate`` a minute a topic, in a produce every 5
    seconds (pizza events of about 200 bytes), so that each one-minute run of a pipeline reading them writes a batch."""

    def __init__(self, bootstrap: str, topics: list[str], rate: int) -> None:
        import threading

        self.bootstrap, self.topics, self.rate = bootstrap, topics, rate
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from tidewater_dev.sample_data import pizza_events, produce

        seed = 0
        while not self.stopped.wait(5.0):
            for topic in self.topics:
                seed += 1
                produce(self.bootstrap, topic, pizza_events(max(1, self.rate // 12), seed=seed), partitions=1, create=False)

    def __enter__(self) -> Flow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(timeout=60)


def measure(svc: Services, label: str, names: list[str], topics: int, warmup: float, window: float, rate: int = 0) -> dict:
    """CPU per component over ``window`` seconds after ``warmup``; the ingest runs of pipelines ``names`` that ended
    in it, their tasks, and how late the runs started (the median of start minus the time the run was due).
    ``rate``: records a minute produced to each topic meanwhile (0: the pipelines are caught up)."""
    time.sleep(warmup)
    started = datetime.now(timezone.utc)
    before = {c: cpu_seconds(svc.airflow[c].pid) for c in COMPONENTS}
    t0 = time.monotonic()
    time.sleep(window)
    after = {c: cpu_seconds(svc.airflow[c].pid) for c in COMPONENTS}
    seconds = time.monotonic() - t0
    ended = started + timedelta(seconds=seconds)
    runs = window_runs(lambda sql: metadata_query(svc, sql), names, started, ended)
    row = {
        "label": label,
        "pipelines": len(names),
        "topics": topics,
        "rate": rate,
        "start_delay_s": runs["start_delay_s"],
        "window_s": round(seconds, 1),
        "runs": runs["runs"],
        "tasks": runs["tasks"],
        "failed_runs": runs["failed_runs"],
        **{c: after[c][1] - before[c][1] for c in COMPONENTS},
        "scheduler_loop": after["scheduler"][0] - before["scheduler"][0],
    }
    print(json.dumps(row), flush=True)
    return row


def window_runs(query, names: list[str], started: datetime, ended: datetime) -> dict:
    """The ingest runs of pipelines ``names`` that ended between ``started`` and ``ended``, from Airflow's metadata
    database (``query``: SQL -> rows): successful runs, their median start delay (start minus the time the run was
    due), their successful tasks, and failed runs."""
    dags = ", ".join(f"'ingest_{n}'" for n in names)
    between = f"end_date >= '{started.isoformat()}' AND end_date < '{ended.isoformat()}'"
    ((runs, late),) = query(
        "SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM "
        f"start_date - run_after)) FROM dag_run WHERE dag_id IN ({dags}) AND state = 'success' "
        f"AND {between}"
    )
    ((tasks,),) = query(f"SELECT count(*) FROM task_instance WHERE dag_id IN ({dags}) AND state = 'success' AND {between}")
    ((failed,),) = query(f"SELECT count(*) FROM dag_run WHERE dag_id IN ({dags}) AND state = 'failed' AND {between}")
    return {"runs": runs, "start_delay_s": float(late or 0), "tasks": tasks, "failed_runs": failed}


def pause_dags(svc: Services, pattern: str = "ingest_s%") -> None:
    """Pause the ingest DAGs whose id is LIKE ``pattern`` in Airflow's metadata database (the scheduler reads it
    there): pipelines whose files are gone stay scheduled until the DAG processor notices."""
    import psycopg2

    conn = psycopg2.connect(svc.metadata_url.replace("postgresql+psycopg2", "postgresql"))
    try:
        with conn, conn.cursor() as cur:  # committed on leaving the block
            cur.execute("UPDATE dag SET is_paused = true WHERE dag_id LIKE %s", (pattern,))
    finally:
        conn.close()


def run_all(
    work: Path,
    counts: list[int],
    routed_topics: int,
    warmup: float,
    window: float,
    flowing: list[int] = (),
    flowing_routed: int = 0,
    rate: int = 0,
) -> list[dict]:
    os.environ["TIDEWATER_HOME"] = str(work / "home")
    svc = SizingServices(work)
    rows = []
    try:
        write_pipelines(svc, ["s000"], routed=False)
        svc.start_airflow()
        rows += caught_up(svc, counts, routed_topics, warmup, window)
        rows += with_data(svc, flowing, flowing_routed, rate, warmup, window)
    finally:
        svc.stop()
    return rows


def caught_up(svc: Services, counts: list[int], routed_topics: int, warmup: float, window: float) -> list[dict]:
    """The caught-up configurations: ``counts`` pipelines, then one routed pipeline over ``routed_topics``."""
    rows = []
    for n in counts:
        names = [f"s{i:03d}" for i in range(n)]
        write_pipelines(svc, names, routed=False)
        rows.append(measure(svc, f"{n} pipeline{'s' if n > 1 else ''}", names, n, warmup, window))
    if routed_topics:
        write_pipelines(svc, [f"s{i:03d}" for i in range(routed_topics)], routed=True)
        # the plain pipelines' DAGs stay scheduled until the DAG processor finds their files gone: paused here
        # at once, so that their runs do not share the routed pipeline's window
        pause_dags(svc)
        rows.append(measure(svc, f"1 routed pipeline, {routed_topics} topics", ["routed"], routed_topics, warmup, window))
        pause_dags(svc, "ingest_routed")
    return rows


def with_data(svc: Services, counts: list[int], routed_topics: int, rate: int, warmup: float, window: float) -> list[dict]:
    """Pipelines whose topics get ``rate`` records a minute, so that every run plans, writes (spark-submit on
    local[1]), validates and commits a batch: ``counts`` pipelines (topics f000...), then one routed pipeline over
    ``routed_topics`` topics of their own (g000...). The earlier configurations' DAGs are paused first."""
    rows = []
    pause_dags(svc, "ingest_s%")
    for n in counts:
        names = [f"f{i:03d}" for i in range(n)]
        write_pipelines(svc, names, routed=False)
        with Flow(svc.broker.bootstrap, [f"{x}-events" for x in names], rate):
            rows.append(measure(svc, f"{n} pipeline{'s' if n > 1 else ''}, data flowing", names, n, warmup, window, rate))
        pause_dags(svc, "ingest_f%")
    if routed_topics:
        names = [f"g{i:03d}" for i in range(routed_topics)]
        write_pipelines(svc, names, routed=True, routed_name="groute")
        with Flow(svc.broker.bootstrap, [f"{x}-events" for x in names], rate):
            rows.append(
                measure(svc, f"1 routed pipeline, {routed_topics} topics, data flowing", ["groute"], routed_topics, warmup, window, rate)
            )
    return rows


def report(rows: list[dict], cmd: str, window: float, day: str) -> str:
    n_cores = os.cpu_count() or 1
    lines = [
        BEGIN,
        "## How many pipelines one Airflow carries (`make bench-sizing`)",
        "",
        f"Command: `{cmd}` ({day}, {n_cores} cores). Pipelines on a one-minute schedule, caught up (their "
        "topics get no record) or with data flowing (each run writes a batch through spark-submit on local[1]); "
        f"LocalExecutor on PostgreSQL; CPU in cores (CPU-seconds a second) over a {window:.0f}-second window.",
        "",
        "| configuration | ingest runs a minute (asked) | median start delay | scheduler's loop | its workers and "
        "tasks | DAG processor | API server | all |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        minutes = r["window_s"] / 60
        total = sum(r[c] for c in COMPONENTS)
        w = r["window_s"]
        lines.append(
            f"| {r['label']} | {r['runs'] / minutes:.1f} ({r['pipelines']}) | {r['start_delay_s']:.1f} s | "
            f"{r['scheduler_loop'] / w:.2f} | {(r['scheduler'] - r['scheduler_loop']) / w:.2f} | "
            f"{r['dag-processor'] / w:.2f} | {r['api-server'] / w:.2f} | {total / w:.2f} |"
        )
    lines += ["", *verdict(rows), END]
    return "\n".join(lines)


def verdict(rows: list[dict]) -> list[str]:
    """What the figures say: Airflow's fixed cost and a pipeline's, pipelines per core, where this machine saturates,
    and the routed pipeline against as many pipelines."""
    plain = sorted((r for r in rows if r["pipelines"] == r["topics"] and r["runs"] and not r.get("rate")), key=lambda r: r["pipelines"])
    if len(plain) < 2:
        return ["Fewer than two configurations ran: no slope to draw."]

    late = [r for r in plain if r["start_delay_s"] > 30 or r["runs"] < 0.75 * r["pipelines"] * r["window_s"] / 60]
    # the slope from the smallest configuration to the largest one the machine kept up with (contention inflates a
    # saturated one's CPU per run)
    low, high = plain[0], ([r for r in plain if r not in late] or plain)[-1]
    per_run = (cores(high) - cores(low)) * 60 / (high["runs"] / (high["window_s"] / 60) - low["runs"] / (low["window_s"] / 60))
    base = cores(low) - per_run * low["runs"] / low["window_s"]
    out = [
        f"Airflow's own cost, without the runs, is about {base:.2f} cores (the scheduler's loop, the DAG "
        f"processor, the API server; from the {low['label']} row). Each further caught-up pipeline on a one-minute "
        f"schedule adds one run a minute of about {per_run:.1f} CPU-seconds (the slope from {low['pipelines']} to {high['pipelines']} "
        f"pipelines): one core carries about {60 / per_run:.0f} such pipelines before their batches do any work."
    ]
    if late:
        r = late[0]
        out.append(
            f"At {r['pipelines']} pipelines this {os.cpu_count()}-core machine ran "
            f"{r['runs'] / (r['window_s'] / 60):.1f} runs a minute of the {r['pipelines']} asked, starting them "
            f"{r['start_delay_s']:.0f} s late (median): it is saturated."
        )
    out += _routed_line([r for r in rows if not r.get("rate")], plain)
    return out + flowing_verdict(rows, base, per_run)


def cores(r: dict) -> float:
    return sum(r[c] for c in COMPONENTS) / r["window_s"]


def _routed_line(rows: list[dict], plain: list[dict]) -> list[str]:
    """One routed pipeline against as many pipelines of one topic each (``rows`` of one kind: caught up or not)."""
    routed = [r for r in rows if r["pipelines"] == 1 and r["topics"] > 1]
    twin = [r for r in plain if routed and r["pipelines"] == routed[0]["topics"]]
    if not (routed and twin):
        return []
    a, b = cores(routed[0]), cores(twin[0])
    return [
        f"One routed pipeline over {routed[0]['topics']} topics costs {a:.2f} cores against {b:.2f} for "
        f"{twin[0]['pipelines']} pipelines of one topic each ({b / a:.1f}x)."
    ]


def flowing_verdict(rows: list[dict], base: float, idle_run: float) -> list[str]:
    """With data flowing: a run's CPU when it writes a batch, pipelines per core, and the routed pipeline's."""
    flow = sorted((r for r in rows if r.get("rate") and r["pipelines"] == r["topics"] and r["runs"]), key=lambda r: r["pipelines"])
    if not flow:
        return []
    r = flow[-1]
    runs = r["runs"] / (r["window_s"] / 60)
    per_run = (cores(r) - base) * 60 / runs
    out = [
        f"With data flowing ({r['rate']:,} records a minute a topic) every run plans, writes, validates and commits "
        f"a batch: at {r['pipelines']} such pipelines a run cost about {per_run:.0f} CPU-seconds (the row less "
        f"Airflow's own cost), {per_run / idle_run:.1f}x a caught-up run's, so one core carries about "
        f"{60 / per_run:.1f} pipelines with data on a one-minute schedule. The difference is the write, validate "
        "and commit tasks, the write step's spark-submit starting a JVM a batch among them (a warm Spark Connect "
        "server takes that JVM off the workers: [Spark Connect](../how-to/spark-connect.md))."
    ]
    if runs < 0.95 * r["pipelines"]:
        out.append(
            f"At {r['pipelines']} pipelines with data this machine ran {runs:.1f} runs a minute of the "
            f"{r['pipelines']} asked, with {cores(r):.2f} of its {os.cpu_count()} cores busy: a run's tasks "
            "follow one another and a DAG runs one run at a time, so a run longer than the interval delays "
            "the next whatever the CPU (`make bench-dag` breaks a run down)."
        )
    return out + _routed_line([x for x in rows if x.get("rate")], flow)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--counts", default="1,20,50", help="pipelines of each configuration")
    ap.add_argument("--routed", type=int, default=20, help="topics of the routed pipeline (0: skip it)")
    ap.add_argument("--flowing", default="1,4", help="pipelines of each configuration with data flowing (empty: none)")
    ap.add_argument("--flowing-routed", type=int, default=4, help="topics of the routed pipeline with data flowing (0: skip it)")
    ap.add_argument("--rate", type=int, default=6000, help="records a minute a topic, with data flowing")
    ap.add_argument("--warmup", type=float, default=90)
    ap.add_argument("--window", type=float, default=240)
    ap.add_argument("--output", default=str(REPO / "BENCHMARKS.md"))
    ap.add_argument("--from-json", help="write the report from a run's rows.json (its command and day kept), measuring nothing")
    args = ap.parse_args(argv)
    from scripts.benchlib import fresh_home

    if args.from_json:
        run = json.loads(Path(args.from_json).read_text())
    else:
        work = fresh_home("bench-sizing")
        rows = run_all(
            work,
            [int(x) for x in args.counts.split(",") if x],
            args.routed,
            args.warmup,
            args.window,
            [int(x) for x in args.flowing.split(",") if x],
            args.flowing_routed,
            args.rate,
        )
        run = {
            "command": command_line("make bench-sizing"),
            "day": time.strftime("%Y-%m-%d", time.gmtime()),
            "window": args.window,
            "rows": rows,
        }
        (work / "rows.json").write_text(json.dumps(run, indent=1))
        FIGURES.write_text(json.dumps(run, indent=1))
    section = report(run["rows"], run["command"], run["window"], run["day"])
    for output in (args.output, PAGE):
        write_section(output, BEGIN, END, section)


if __name__ == "__main__":
    main()
