"""Airflow 3.3's retry policies on the ingest DAG (`airflow dags test`, the real broker, catalog and Spark Connect
server): an error retrying cannot help fails its task in one try, an error worth retrying is retried with a growing
delay until the cause is gone (runtime/retries.py)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import table_of, write_pipeline
from tests.e2e.conftest import free_port, task_tries, through_spark_connect
from tests.e2e.test_ingest_dag import dags_test
from tidewater.dev.sample_data import pizza_events, produce
from tidewater.table.summary import committed_state

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@contextlib.contextmanager
def forwarder(port: int, upstream: str):  # noqa: ANN201
    """A TCP port forwarding every connection to ``upstream`` (host:port): the broker "coming back" on the address a
    pipeline was given. Kafka clients bootstrap through it, then reach the broker at its advertised address."""
    host, up_port = upstream.rsplit(":", 1)
    server = socket.create_server(("127.0.0.1", port))
    stop = threading.Event()

    def pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def serve() -> None:
        server.settimeout(0.5)
        while not stop.is_set():
            try:
                client, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            remote = socket.create_connection((host, int(up_port)))
            for a, b in ((client, remote), (remote, client)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()


def test_a_misspelled_topic_fails_in_one_try_and_an_unreachable_broker_is_retried_until_it_is_back(
        broker, topic, airflow_env, spark_connect):
    """`airflow.retries: 3`, one second's delay. A misspelled topic (a ConfigError: retrying cannot help): the plan
    task fails on its first try, its log giving the policy's reason with the topic, and nothing is written. Then the
    pipeline's bootstrap address is a port where no broker listens: the plan task's first try fails with a transient
    error, the policy retries it; once the port forwards to the broker, a retry succeeds and the batch commits with
    rows and offsets exact. Writes through the session's Spark Connect server."""
    env = through_spark_connect(airflow_env, spark_connect)
    pipelines = Path(env["TIDEWATER_PIPELINES_DIR"])
    produce(broker.bootstrap, topic, pizza_events(40, seed=400), partitions=2)
    settings = {"airflow": {"retries": 3, "retry_delay_seconds": 1}}

    write_pipeline(pipelines, topics=[f"{topic}-ordres"], kafka={"bootstrap_servers": broker.bootstrap}, **settings)
    out = dags_test(env, "ingest_orders", expect="failed")
    assert task_tries(env, "ingest_orders")["plan"] == ("failed", 1), out[-3000:]
    assert f"ConfigError (retrying cannot help): topics: topic '{topic}-ordres' is not available" in out, out[-3000:]

    port = free_port()
    pipeline = write_pipeline(pipelines, topics=[topic], kafka={"bootstrap_servers": f"127.0.0.1:{port}"}, **settings)
    assert table_of(pipeline) is None
    run = subprocess.Popen(["airflow", "dags", "test", "ingest_orders"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and run.poll() is None:
            state, tries = task_tries(env, "ingest_orders").get("plan", (None, 0))
            if state == "up_for_retry" or tries >= 2:
                break
            time.sleep(0.5)
        assert run.poll() is None, "the run ended before the plan task was retried"
        with forwarder(port, broker.bootstrap):
            out, _ = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0 and "state=success" in out, out[-4000:]
    state, tries = task_tries(env, "ingest_orders")["plan"]
    assert state == "success" and tries >= 2, (state, tries)
    assert "TransientError (worth retrying; try 1 of at most 4, the next in 1 s): cannot read topic metadata" in out \
        or "KafkaReadError (worth retrying; try 1 of at most 4" in out, out[-4000:]
    table = table_of(pipeline)
    assert table.scan().to_arrow().num_rows == 40
    assert committed_state(table).offsets == {topic: {0: 20, 1: 20}}
