"""Airflow across hosts: the CeleryExecutor with two workers, each on a test host of its own (a network namespace with
its own hostname and its own /tmp, home and `.data/`, tidewater_dev.hosts), the scheduler, DAG processor and
api-server on this machine, Redis (Debian's) as the Celery broker and PostgreSQL as Airflow's database and the
catalog (tidewater_dev.celery_hosts). Everything is real except the bucket: moto's S3 server, the stand-in for S3,
which cannot run here. Hosts are namespaces, not machines: no container runtime or second machine is available, and
namespaces are what a container is made of."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tidewater_dev import hosts

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(hosts.unavailable() is not None, reason=f"test hosts cannot be made here: {hosts.unavailable()}"),
]

PARTITIONS = 3


def _produce(bootstrap: str, topic: str, count: int, seed: int) -> None:
    from tidewater_dev.sample_data import pizza_events, produce

    produce(bootstrap, topic, pizza_events(count, seed=seed), partitions=PARTITIONS)


def _wait_for(what: str, seconds: float, check, deployment) -> object:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{what} did not happen within {seconds:.0f} s\n{deployment.logs()}")


def _spark_running(host: hosts.Host) -> bool:
    """Whether the write step's Spark job (spark-submit's JVM) is running on ``host``."""
    for pid in host.pids():
        try:
            if b"org.apache.spark.deploy.SparkSubmit" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def _running_elsewhere(deployment, dag: str, task: str, lost: hosts.Host) -> hosts.Host | None:
    """The host running the task's current try of the run `first`, once it is not the ``lost`` one (until Airflow
    finds the lost try's heartbeats stopped, the try still shows as running there)."""
    host = deployment.running_on(dag, "first", task)
    return host if host is not None and host.name != lost.name else None


class CatalogLock:
    """A transaction of this test holding PostgreSQL's EXCLUSIVE lock on the catalog's table list (`iceberg_tables`):
    reads go on, every commit waits. A commit step that reaches it is caught in the middle of committing."""

    def __init__(self, deployment) -> None:
        import psycopg2

        from tidewater_dev import postgres

        self.deployment = deployment
        self.conn = psycopg2.connect(host="127.0.0.1", port=deployment.postgres.port, user=postgres.USER, dbname="catalog")
        with self.conn.cursor() as cur:
            cur.execute("LOCK TABLE iceberg_tables IN EXCLUSIVE MODE")

    def waiting(self) -> int:
        """How many catalog connections wait for a lock (a commit blocked on this one)."""
        rows = self.deployment.query_catalog("SELECT count(*) FROM pg_stat_activity WHERE datname = 'catalog' AND wait_event_type = 'Lock'")
        return rows[0][0]

    def release(self) -> None:
        self.conn.rollback()
        self.conn.close()


def _audit(deployment, pipeline: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "tidewater.runtime.cli", "audit", "--pipeline", str(pipeline), "--deep", "--full", "--json"],
        env=deployment.machine_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_a_batch_moves_between_celery_worker_hosts_and_survives_losing_a_host_in_write_and_in_commit(tmp_path):
    """One ingest run on two Celery worker hosts that share no disk: the worker host running the write step is
    killed (every process in its namespace, SIGKILL) while Spark writes; then, with the catalog locked, the host
    running the commit step is killed while the commit waits. Airflow fails each lost try when its heartbeats stop
    and retries it on the other host (the lost one comes back only once the retry runs there). The run succeeds with
    every record exactly once (rows and offsets), the steps ran on both hosts, and `audit --deep` is clean. A second
    run after the hosts came back continues from those offsets."""
    from tidewater_dev.celery_hosts import CeleryDeployment

    work = tmp_path / "celery"
    work.mkdir()
    d = CeleryDeployment(work, workers=2)
    try:
        topic = "orders-on-hosts"
        _produce(d.broker.bootstrap, topic, 3000, seed=580)
        pipeline = d.add_pipeline(
            "hosts",
            d.pipeline(
                "hosts",
                [topic],
                table={"identifier": "rpc.orders_on_hosts"},
                format={"metadata": "prefixed"},
                airflow={"retries": 3, "retry_delay_seconds": 2, "dags": []},
            ),
        )
        dag = "ingest_hosts"
        d.trigger(dag, "first")

        # the write step's host is lost while its Spark job runs
        lost_in_write = _wait_for(
            "the write step's Spark job", 300, lambda: (h := d.running_on(dag, "first", "write")) and _spark_running(h) and h, d
        )
        time.sleep(3)
        assert lost_in_write.kill() > 0
        lock = CatalogLock(d)
        moved_write = _wait_for("the write's retry on the other host", 600, lambda: _running_elsewhere(d, dag, "write", lost_in_write), d)
        d.start_worker(lost_in_write)  # the host comes back, with its disk as it was

        # the commit step's host is lost while the commit waits for the catalog
        lost_in_commit = _wait_for(
            "a commit waiting for the catalog", 600, lambda: lock.waiting() > 0 and d.running_on(dag, "first", "commit"), d
        )
        assert lost_in_commit.kill() > 0
        lock.release()
        moved_commit = _wait_for(
            "the commit's retry on the other host", 600, lambda: _running_elsewhere(d, dag, "commit", lost_in_commit), d
        )
        d.start_worker(lost_in_commit)
        assert d.wait_run(dag, "first", 600) == "success", d.logs()

        tries = d.tries(dag, "first")
        by_task = {t: [(n, s, h) for task, n, s, h in tries if task == t] for t in ("plan", "write", "validate", "commit")}
        assert [s for _, s, _ in by_task["write"]] == ["failed", "success"], by_task
        assert [s for _, s, _ in by_task["commit"]] == ["failed", "success"], by_task
        assert [h for _, _, h in by_task["write"]] == [lost_in_write.name, moved_write.name]
        assert [h for _, _, h in by_task["commit"]] == [lost_in_commit.name, moved_commit.name]
        assert {h for _, _, h in sum(by_task.values(), [])} == set(d.workers), "the steps ran on both hosts"

        table, offsets = d.table_state("hosts")
        assert table.num_rows == 3000
        ids = table.column("order_id").to_pylist()
        assert len(set(ids)) == 3000, "no record twice"
        assert offsets == {topic: {p: 1000 for p in range(PARTITIONS)}}
        audit = _audit(d, pipeline)
        assert [f for f in audit["findings"] if f["severity"] == "error"] == [] and audit["batches"] == 1, audit

        _produce(d.broker.bootstrap, topic, 600, seed=581)
        d.trigger(dag, "second")
        assert d.wait_run(dag, "second", 600) == "success", d.logs()
        table, offsets = d.table_state("hosts")
        assert table.num_rows == 3600 and len(set(table.column("order_id").to_pylist())) == 3600
        assert offsets == {topic: {p: 1200 for p in range(PARTITIONS)}}
        audit = _audit(d, pipeline)
        assert [f for f in audit["findings"] if f["severity"] == "error"] == [] and audit["batches"] == 2, audit
    finally:
        d.stop()
