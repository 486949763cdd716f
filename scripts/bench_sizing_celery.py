"""`make bench-sizing-celery`: what pipelines cost Airflow with the CeleryExecutor across hosts, beside the
LocalExecutor's figures of `make bench-sizing` (docs/explanation/sizing.md).

The deployment of tests/e2e/test_celery_hosts.py (tidewater_dev.celery_hosts): scheduler, DAG processor and
api-server on this machine, two Celery workers (two task slots each: the LocalExecutor runs use parallelism 4) on test
hosts of their own (network namespaces, no shared disk), Redis as the Celery broker, PostgreSQL for Airflow and the
catalog, moto's S3 server for the warehouse, staging and Data Docs. Pipelines on a one-minute schedule, caught up
(each run is the plan task, which short-circuits), then with data flowing (each run writes a batch through
spark-submit on local[1], on a worker). CPU is each component's own plus its children's (live and reaped, /proc via
psutil), the workers' being everything on their hosts; sampled over ``--window`` seconds after ``--warmup``.

    make bench-sizing-celery [BENCH_ARGS="--counts 1,20 --window 120"]

Needs root (network namespaces). Writes its section of docs/explanation/sizing.md and BENCHMARKS.md, and its figures
to docs/img/bench-sizing-celery.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts.bench_sizing import Flow, cpu_seconds, window_runs
from scripts.benchlib import command_line, write_section

REPO = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- sizing-celery: begin -->", "<!-- sizing-celery: end -->"
PAGE = REPO / "docs" / "explanation" / "sizing.md"
FIGURES = REPO / "docs" / "img" / "bench-sizing-celery.json"
MACHINE = ("scheduler", "dag-processor", "api-server")


def set_pipelines(d, names: list[str], prefix: str) -> None:
    """The pipelines folder (the machine's and each worker's copy) holds exactly ``names``'s files, one topic each."""
    from tidewater_dev.sample_data import ensure_topic

    for n in names:
        ensure_topic({"bootstrap.servers": d.broker.bootstrap}, f"{n}-events", 1)
    folders = [d.work / "pipelines", *(h.home / "pipelines" for h in d.workers.values())]
    for folder in folders:
        for old in folder.glob(f"{prefix}*.yaml"):
            old.unlink()
    for n in names:
        doc = d.pipeline(
            n,
            [f"{n}-events"],
            table={"identifier": f"rpc.{n}"},
            schedule="* * * * *",
            maintenance={"schedule": None},
            audit={"schedule": None},
            airflow={"retries": 0, "dags": []},
            spark={"master": "local[1]"},
        )
        for folder in folders:
            (folder / f"{n}.yaml").write_text(json.dumps(doc))


def host_cpu(host) -> float:
    """CPU seconds of everything on a test host (its processes and their reaped children)."""
    import psutil

    total = 0.0
    for pid in host.pids():
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def measure(d, label: str, names: list[str], warmup: float, window: float, rate: int = 0) -> dict:
    time.sleep(warmup)
    started = datetime.now(timezone.utc)
    before = {c: cpu_seconds(d.procs[c].pid)[1] for c in MACHINE} | {h: host_cpu(x) for h, x in d.workers.items()}
    t0 = time.monotonic()
    time.sleep(window)
    after = {c: cpu_seconds(d.procs[c].pid)[1] for c in MACHINE} | {h: host_cpu(x) for h, x in d.workers.items()}
    seconds = time.monotonic() - t0
    runs = window_runs(d.query, names, started, started + timedelta(seconds=seconds))
    used = {k: after[k] - before[k] for k in after}
    row = {
        "label": label,
        "pipelines": len(names),
        "rate": rate,
        "window_s": round(seconds, 1),
        "runs": runs["runs"],
        "failed_runs": runs["failed_runs"],
        "start_delay_s": runs["start_delay_s"],
        **{c: used[c] for c in MACHINE},
        "workers": sum(used[h] for h in d.workers),
    }
    print(json.dumps(row), flush=True)
    return row


def pause(d, prefix: str) -> None:
    d.query("UPDATE dag SET is_paused = true WHERE dag_id LIKE %s RETURNING dag_id", f"ingest_{prefix}%")


def run_all(work: Path, counts: list[int], flowing: list[int], rate: int, warmup: float, window: float) -> list[dict]:
    from tidewater_dev.celery_hosts import CeleryDeployment

    d = CeleryDeployment(
        work,
        workers=2,
        concurrency=2,
        settings={"AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False", "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "20"},
    )
    rows = []
    try:
        for n in counts:
            names = [f"s{i:03d}" for i in range(n)]
            set_pipelines(d, names, "s")
            rows.append(measure(d, f"{n} pipeline{'s' if n > 1 else ''}", names, warmup, window))
        pause(d, "s")
        for n in flowing:
            names = [f"f{i:03d}" for i in range(n)]
            set_pipelines(d, names, "f")
            with Flow(d.broker.bootstrap, [f"{x}-events" for x in names], rate):
                rows.append(measure(d, f"{n} pipeline{'s' if n > 1 else ''}, data flowing", names, warmup, window, rate))
            pause(d, "f")
    finally:
        d.stop()
    return rows


def report(run: dict) -> str:
    local = (
        json.loads((REPO / "docs" / "img" / "bench-sizing.json").read_text())
        if (REPO / "docs" / "img" / "bench-sizing.json").is_file()
        else None
    )
    lines = [
        BEGIN,
        "## With the CeleryExecutor across hosts (`make bench-sizing-celery`)",
        "",
        f"Command: `{run['command']}` ({run['day']}, {os.cpu_count()} cores, all hosts on this machine). Two "
        "Celery workers on test hosts of their own (two task slots each), Redis, PostgreSQL, the bucket on "
        "moto's S3 server; CPU in cores (CPU-seconds a second) over a "
        f"{run['window']:.0f}-second window; the workers' column is everything on their hosts.",
        "",
        "| configuration | ingest runs a minute (asked) | failed | median start delay | scheduler | DAG processor | "
        "API server | workers | all |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in run["rows"]:
        w = r["window_s"]
        total = sum(r[c] for c in (*MACHINE, "workers"))
        lines.append(
            f"| {r['label']} | {r['runs'] / (w / 60):.1f} ({r['pipelines']}) | {r['failed_runs']} | "
            f"{r['start_delay_s']:.1f} s | {r['scheduler'] / w:.2f} | {r['dag-processor'] / w:.2f} | "
            f"{r['api-server'] / w:.2f} | {r['workers'] / w:.2f} | {total / w:.2f} |"
        )
    lines += [
        "",
        "The LocalExecutor's figures above come from another run ("
        + (local["day"] if local else "none")
        + "), so no ratio is drawn between the two tables: read them side by side. Under Celery the task "
        "processes run on the workers (the workers' column), not under the scheduler, which keeps only its "
        "loop; each task also pays its start on a worker that parses the DAG file.",
        END,
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--counts", default="1,20", help="caught-up pipelines of each configuration")
    ap.add_argument("--flowing", default="1", help="pipelines with data flowing of each configuration (empty: none)")
    ap.add_argument("--rate", type=int, default=6000, help="records a minute a topic, with data flowing")
    ap.add_argument("--warmup", type=float, default=60)
    ap.add_argument("--window", type=float, default=120)
    ap.add_argument("--output", default=str(REPO / "BENCHMARKS.md"))
    ap.add_argument("--from-json", help="write the report from a run's figures, measuring nothing")
    args = ap.parse_args(argv)
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: the deployment's hosts and servers go too
    if args.from_json:
        run = json.loads(Path(args.from_json).read_text())
    else:
        work = Path(tempfile.mkdtemp(prefix="tidewater-bench-celery-", dir="/var/tmp"))
        try:
            rows = run_all(
                work,
                [int(x) for x in args.counts.split(",") if x],
                [int(x) for x in args.flowing.split(",") if x],
                args.rate,
                args.warmup,
                args.window,
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)
        run = {
            "command": command_line("make bench-sizing-celery"),
            "day": time.strftime("%Y-%m-%d", time.gmtime()),
            "window": args.window,
            "rows": rows,
        }
        FIGURES.write_text(json.dumps(run, indent=1))
    section = report(run)
    for output in (args.output, PAGE):
        write_section(output, BEGIN, END, section)


if __name__ == "__main__":
    main()
