"""`make bench-dag`: how long a one-record batch takes through the ingest DAG on a running scheduler, and where the
time goes, on Spark Connect and on spark-submit.

Real components on 127.0.0.1, as `make soak` starts them (scripts/soak.py's Services): Debian's PostgreSQL
(Airflow's metadata and the Iceberg catalog), the embedded broker, a Spark Connect server, and Airflow's api-server,
DAG processor and scheduler (LocalExecutor) as separate processes. Two pipelines of 6 partitions each, one writing
through the Connect server and one through spark-submit (local[2]), and a DAG of four chained tasks that do nothing
(`bench_noop_chain`: Airflow's own floor for the ingest DAG's plan, write, validate and commit).

Each round produces one record per pipeline and triggers the DAGs one after another (never two at once), waiting for
each run to end. Latency is from the run's queued time to the commit task's end. Per task, from the metadata
database: the scheduling gap (the previous task's end, or the run's start, until the task is queued), the wait in the
executor (queued until started) and the task's run (start to end); the no-op chain shows what Airflow alone costs
for the same steps. The medians of ``--rounds`` rounds (after one warm-up round) go to BENCHMARKS.md.

    make bench-dag [BENCH_ARGS="--rounds 5"]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts.benchlib import command_line, write_section
from scripts.soak import REPO, Services, metadata_query, trigger

BEGIN, END = "<!-- dag latency: begin -->", "<!-- dag latency: end -->"
PARTITIONS = 6
STEPS = ("plan", "write", "validate", "commit")
NOOP_CHAIN = """
import pendulum
from airflow.sdk import dag, task


@dag(dag_id="bench_noop_chain", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def bench_noop_chain():
    previous = None
    for step in ("plan", "write", "validate", "commit"):
        current = task(task_id=step)(lambda: None)()
        if previous is not None:
            previous >> current
        previous = current


bench_noop_chain()
"""


class LatencyServices(Services):
    """The soak's services with a DAGs folder of our own: the two-line DAG file and the no-op chain."""

    def env(self) -> dict[str, str]:
        env = super().env()
        env["AIRFLOW__CORE__DAGS_FOLDER"] = str(self.work / "dags")
        env["AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL"] = "5"
        return env


def pipelines(svc: Services) -> dict[str, Path]:
    folder, dags = svc.work / "pipelines", svc.work / "dags"
    folder.mkdir(exist_ok=True)
    dags.mkdir(exist_ok=True)
    shutil.copy(REPO / "dags" / "tidewater_dags.py", dags / "tidewater_dags.py")
    (dags / "bench_noop_chain.py").write_text(NOOP_CHAIN)
    common = {
        "kafka": {"bootstrap_servers": svc.broker.bootstrap},
        "catalog": {"name": "lake", "properties": {"type": "sql", "uri": svc.catalog_url, "warehouse": f"file://{svc.work / 'warehouse'}"}},
        "schedule": None,
        "maintenance": {"schedule": None},
        "audit": {"schedule": None},
        "validation": {"not_null": ["order_id"]},
        "airflow": {"retries": 0},
    }
    out = {}
    for name, spark in (("lat_connect", {"master": "local[2]", "connect_url": svc.connect.url}), ("lat_submit", {"master": "local[2]"})):
        path = folder / f"{name}.yaml"
        path.write_text(
            yaml.safe_dump({"name": name, "topics": [f"{name}-events"], "table": {"identifier": f"rpc.{name}"}, "spark": spark, **common})
        )
        out[name] = path
    return out


def trigger_and_wait(svc: Services, dag_id: str, timeout: float = 600) -> str:
    run_id = f"bench__{dag_id}__{time.time_ns()}"
    trigger(svc, dag_id, run_id=run_id)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = metadata_query(svc, f"SELECT state FROM dag_run WHERE dag_id = '{dag_id}' AND run_id = '{run_id}'")
        if rows and rows[0][0] in ("success", "failed"):
            if rows[0][0] != "success":
                raise RuntimeError(f"{dag_id} run {run_id} {rows[0][0]}: see {svc.work}/airflow/logs")
            return run_id
        time.sleep(0.5)
    raise RuntimeError(f"{dag_id} run {run_id} did not end within {timeout:.0f} s")


def breakdown(svc: Services, dag_id: str, run_id: str) -> dict[str, float]:
    """Seconds of one run: total (queued to the commit's end) and per step: gap, wait, run."""
    ((queued, started),) = metadata_query(
        svc, f"SELECT queued_at, start_date FROM dag_run WHERE dag_id = '{dag_id}' AND run_id = '{run_id}'"
    )
    tis = {
        t: (q, s, e)
        for t, q, s, e in metadata_query(
            svc, f"SELECT task_id, queued_dttm, start_date, end_date FROM task_instance WHERE dag_id = '{dag_id}' AND run_id = '{run_id}'"
        )
    }
    out = {"run queued until the run started": (started - queued).total_seconds()}
    previous_end = started
    for step in STEPS:
        q, s, e = tis[step]
        out[f"{step}: scheduling gap (previous end to queued)"] = (q - previous_end).total_seconds()
        out[f"{step}: wait in the executor (queued to started)"] = (s - q).total_seconds()
        out[f"{step}: run (started to ended)"] = (e - s).total_seconds()
        previous_end = e
    out["total: run queued to the commit's end"] = (tis["commit"][2] - queued).total_seconds()
    return out


def measure(work: Path, rounds: int) -> dict[str, dict[str, float]]:
    from tidewater_dev.sample_data import produce

    os.environ["TIDEWATER_HOME"] = str(work / "home")
    svc = LatencyServices(work)
    try:
        files = pipelines(svc)
        for name in files:
            produce(svc.broker.bootstrap, f"{name}-events", [b'{"order_id": "warm", "store_id": 1}'] * PARTITIONS, partitions=PARTITIONS)
        svc.start_airflow()
        results: dict[str, list[dict[str, float]]] = {}
        for i in range(rounds + 1):  # the first round warms up (tables created, the Connect server's workers started)
            for dag_id in ("bench_noop_chain", *(f"ingest_{n}" for n in files)):
                name = dag_id.removeprefix("ingest_")
                if name in files:
                    produce(
                        svc.broker.bootstrap, f"{name}-events", [b'{"order_id": "one", "store_id": 1}'], partitions=PARTITIONS, create=False
                    )
                run_id = trigger_and_wait(svc, dag_id)
                if i:
                    results.setdefault(dag_id, []).append(breakdown(svc, dag_id, run_id))
            print(f"round {i}/{rounds} done", flush=True)
        return {dag: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for dag, runs in results.items()}
    finally:
        svc.stop()


def report(medians: dict[str, dict[str, float]], rounds: int) -> str:
    dags = ["ingest_lat_connect", "ingest_lat_submit", "bench_noop_chain"]
    labels = {
        "ingest_lat_connect": "ingest, Spark Connect",
        "ingest_lat_submit": "ingest, spark-submit",
        "bench_noop_chain": "four no-op tasks (Airflow's floor)",
    }
    lines = [
        BEGIN,
        "## A one-record batch through the ingest DAG on a running scheduler",
        "",
        f"Command: `{command_line('make bench-dag')}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; medians of "
        f"{rounds} rounds after a warm-up. Airflow's api-server, DAG processor and scheduler (LocalExecutor) on "
        "PostgreSQL, the runs triggered one at a time; seconds from the metadata database.",
        "",
        "| seconds | " + " | ".join(labels[d] for d in dags) + " |",
        "| --- |" + " ---: |" * len(dags),
    ]
    for key in medians[dags[0]]:
        lines.append(f"| {key} | " + " | ".join(f"{medians[d][key]:.2f}" for d in dags) + " |")
    lines.append(END)
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--markdown", default=str(REPO / "BENCHMARKS.md"))
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs) afterwards")
    args = ap.parse_args()
    work = REPO / ".data" / "bench-dag"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if (REPO / ".data" / "jars").is_dir():
        (work / "home").mkdir()
        (work / "home" / "jars").symlink_to(REPO / ".data" / "jars")
    medians = measure(work, args.rounds)
    (work / "medians.json").write_text(json.dumps(medians, indent=1))
    write_section(args.markdown, BEGIN, END, report(medians, args.rounds))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
