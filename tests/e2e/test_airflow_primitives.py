"""Airflow's own primitives on the ingest DAG, with the real broker, catalog and Spark Connect server: retry policies
(`airflow dags test`: an error retrying cannot help fails its task in one try, an error worth retrying is retried
with a growing delay until the cause is gone; runtime/retries.py) and freshness deadlines (a scheduler and triggerer:
`airflow standalone`; runtime/deadlines.py)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, table_of, write_pipeline
from tests.e2e.conftest import free_port, list_runs, standalone, task_tries, through_spark_connect, wait_for_runs
from tests.e2e.test_ingest_dag import dags_test
from tidewater.table.summary import committed_state
from tidewater_dev.sample_data import pizza_events, produce

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@contextlib.contextmanager
def forwarder(port: int, upstream: str):
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
    broker, topic, airflow_env, spark_connect, tmp_path
):
    """`airflow.retries: 3`, one second's delay. A misspelled topic (a ConfigError: retrying cannot help): the plan
    task fails on its first try, its log giving the policy's reason with the topic, and nothing is written. Then the
    pipeline's bootstrap address is a port where no broker listens: the plan task's first try fails with a transient
    error, the policy retries it; once the port forwards to the broker, a retry succeeds and the batch commits with
    rows and offsets exact. Writes through the session's Spark Connect server. `airflow.on_failure` names a notifier
    class of the tests: it hears of the failed plan task once, with its error, and of nothing in the run that passes."""
    failures = tmp_path / "failures.jsonl"
    env = {
        **through_spark_connect(airflow_env, spark_connect),
        "TIDEWATER_TEST_FAILURE_FILE": str(failures),
        "PYTHONPATH": str(REPO) + os.pathsep + airflow_env.get("PYTHONPATH", ""),
    }
    pipelines = Path(env["TIDEWATER_PIPELINES_DIR"])
    produce(broker.bootstrap, topic, pizza_events(40, seed=400), partitions=2)
    settings = {"airflow": {"retries": 3, "retry_delay_seconds": 1, "on_failure": "tests.e2e.late_hook.FailureFile"}}

    write_pipeline(pipelines, topics=[f"{topic}-ordres"], kafka={"bootstrap_servers": broker.bootstrap}, **settings)
    out = dags_test(env, "ingest_orders", expect="failed")
    assert task_tries(env, "ingest_orders")["plan"] == ("failed", 1), out[-3000:]
    assert f"ConfigError (retrying cannot help): topics: topic '{topic}-ordres' is not available" in out, out[-3000:]
    heard = [json.loads(line) for line in failures.read_text().splitlines()] if failures.is_file() else []
    assert [(h["dag_id"], h["task_id"]) for h in heard] == [("ingest_orders", "plan")], out[-3000:]
    assert f"topic '{topic}-ordres' is not available" in heard[0]["exception"]

    port = free_port()
    pipeline = write_pipeline(pipelines, topics=[topic], kafka={"bootstrap_servers": f"127.0.0.1:{port}"}, **settings)
    assert table_of(pipeline) is None
    run = subprocess.Popen(
        ["airflow", "dags", "test", "ingest_orders"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
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
    assert (
        "TransientError (worth retrying; try 1 of at most 4, the next in 1 s): cannot read topic metadata" in out
        or "KafkaReadError (worth retrying; try 1 of at most 4" in out
    ), out[-4000:]
    table = table_of(pipeline)
    assert table.scan().to_arrow().num_rows == 40
    assert committed_state(table).offsets == {topic: {0: 20, 1: 20}}
    assert len(failures.read_text().splitlines()) == 1  # the retried try was no failure of the task


def test_a_run_still_unfinished_at_its_freshness_deadline_calls_on_late_once(broker, topic, airflow_env, tmp_path, spark_connect):
    """`airflow.freshness: 5s` and `airflow.on_late` naming a callable of the tests: a triggered ingest run takes longer
    than that (plan, write, validate, commit), so Airflow's scheduler marks its deadline missed and its triggerer calls
    Tidewater: the triggerer's log has the warning naming the pipeline and the run, `on_late` receives the run once,
    and the batch itself commits with rows and offsets exact."""
    late_file = tmp_path / "late.jsonl"
    env = {
        **through_spark_connect(airflow_env, spark_connect),
        "TIDEWATER_TEST_LATE_FILE": str(late_file),
        "PYTHONPATH": str(REPO) + os.pathsep + airflow_env.get("PYTHONPATH", ""),
    }
    pipeline = write_pipeline(
        Path(env["TIDEWATER_PIPELINES_DIR"]),
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        airflow={"freshness": "5s", "on_late": "tests.e2e.late_hook.record"},
    )
    produce(broker.bootstrap, topic, pizza_events(50, seed=410), partitions=2)
    with standalone(env, tmp_path) as env:
        for cmd in (["dags", "unpause", "ingest_orders"], ["dags", "trigger", "ingest_orders"]):
            subprocess.run(["airflow", *cmd], env=env, check=True, capture_output=True, timeout=120)
        runs = wait_for_runs(env, "ingest_orders", 300)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not late_file.is_file():
            time.sleep(2)
        time.sleep(5)  # a second call, if there were one, would have come with the first
        runs = list_runs(env, "ingest_orders")
    assert [r["state"] for r in runs] == ["success"], runs
    assert late_file.is_file(), "on_late was not called: " + (tmp_path / "standalone.log").read_text()[-3000:]
    calls = [json.loads(line) for line in late_file.read_text().splitlines()]
    assert len(calls) == 1, calls
    (late,) = calls
    assert late["pipeline"] == "orders" and late["freshness"] == "5s"
    assert late["dag_run"]["dag_run_id"] == runs[0]["run_id"] and late["dag_run"]["dag_id"] == "ingest_orders"
    assert f"ingest run {runs[0]['run_id']} is still unfinished 5s after it was queued" in late["message"]
    log = (tmp_path / "standalone.log").read_text()
    assert late["message"] in log  # the triggerer's warning
    assert "ProgrammingError" not in log  # the callback's output is stored (Airflow keeps it as text)
    table = table_of(pipeline)
    assert table.scan().to_arrow().num_rows == 50
    assert committed_state(table).offsets == {topic: {0: 25, 1: 25}}


def test_a_quarantined_batch_waits_in_required_actions_and_a_drop_there_is_applied_once(
    broker, topic, airflow_env, tmp_path, spark_connect
):
    """`validation.on_failure: quarantine` with a suite the batch fails, under `airflow standalone`: the scheduled
    ingest run fails (its commit put the batch on a quarantine branch, main empty, offsets moved) and opens run
    `decide__<batch>` of quarantine_orders, whose `decide` task waits in Airflow's Required actions with the failed
    expectation, the rows, the ranges and the Data Docs link. In Chromium, logged in as admin, the Tidewater view on
    the ingest DAG's tab shows the batch's decision as open, linking to it; the person enters a
    reason and presses Drop on the task's Required action; `apply` then drops the batch once: the branch is gone,
    main has no rows and records the drop with the reason and the user, the offsets stay where the batch left them.
    A screenshot of the Required action is kept in the test artifacts."""
    from playwright.sync_api import sync_playwright

    from tests.e2e.conftest import admin_token, call_api
    from tests.e2e.test_ui import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, _login
    from tidewater.table.summary import DROPPED

    pipelines = Path(airflow_env["TIDEWATER_PIPELINES_DIR"])
    (pipelines / "strict.json").write_text(
        json.dumps(
            {
                "expectations": [
                    {"type": "expect_column_values_to_be_between", "kwargs": {"column": "store_id", "min_value": 1, "max_value": 5}}
                ]
            }
        )
    )
    pipeline = write_pipeline(
        pipelines,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        validation={"suite": "strict.json", "on_failure": "quarantine"},
    )
    produce(broker.bootstrap, topic, pizza_events(30, seed=460), partitions=2)
    env = through_spark_connect(airflow_env, spark_connect)
    with standalone(env, tmp_path) as env:
        for cmd in (["dags", "unpause", "ingest_orders"], ["dags", "unpause", "quarantine_orders"], ["dags", "trigger", "ingest_orders"]):
            subprocess.run(["airflow", *cmd], env=env, check=True, capture_output=True, timeout=120)
        assert [r["state"] for r in wait_for_runs(env, "ingest_orders", 300)] == ["failed"]
        base = f"http://127.0.0.1:{env['AIRFLOW__API__PORT']}"
        token = admin_token(base, env["AIRFLOW_HOME"])
        runs = list_runs(env, "quarantine_orders")
        assert [r["run_id"].split("__")[0] for r in runs] == ["decide"], runs
        run_id = runs[0]["run_id"]
        batch_id = run_id.split("__", 1)[1]
        detail_url = f"{base}/api/v2/dags/quarantine_orders/dagRuns/{run_id}/taskInstances/decide/-1/hitlDetails"
        detail: dict = {}
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # the route task, then decide writes its request and waits
            status, detail = call_api(detail_url, token)
            if status == 200:
                break
            time.sleep(3)
        assert status == 200, detail
        assert detail["options"] == ["Publish", "Drop"] and batch_id in detail["subject"]
        assert "expect_column_values_to_be_between(column='store_id'" in detail["body"], detail["body"]
        assert f"- `{topic}` [0] 0-15" in detail["body"] and "**Rows:** 30." in detail["body"]
        assert f"/tidewater/data-docs/orders/{batch_id}.html" in detail["body"]

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            try:
                password = json.loads((Path(env["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated").read_text())
                _login(page, base, "admin", password["admin"])
                # the Tidewater view on the ingest DAG's tab shows the open decision and links to it
                page.goto(f"{base}/dags/ingest_orders/plugin/tidewater-pipeline")
                decision = page.locator(".decision[data-state=running]")
                decision.wait_for(timeout=60_000)
                assert decision.inner_text() == "open in Required actions"
                assert decision.get_attribute("href", timeout=10_000).endswith(
                    f"/dags/quarantine_orders/runs/{run_id}/tasks/decide/required_actions"
                )
                page.goto(f"{base}/dags/quarantine_orders/runs/{run_id}/tasks/decide/required_actions")
                page.get_by_text("Publish or drop?", exact=False).first.wait_for(timeout=60_000)
                page.locator("input[name=element_reason]").fill("store ids out of range")
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "airflow-required-action-quarantine.png"), full_page=True)
                page.get_by_test_id("hitl-option-Drop").click()
                page.get_by_text("Response received", exact=False).first.wait_for(timeout=60_000)
            except Exception:
                (ARTIFACTS / "airflow-required-action-quarantine.html").write_text(page.content())
                page.screenshot(path=str(ARTIFACTS / "airflow-required-action-quarantine-failed.png"), full_page=True)
                raise
            finally:
                browser.close()
        decided = wait_for_runs(env, "quarantine_orders", 240)
        status, detail = call_api(detail_url, token)
    assert [r["state"] for r in decided] == ["success"], decided
    assert detail["chosen_options"] == ["Drop"] and detail["responded_by_user"]["name"] == "admin", detail
    assert detail["params_input"] == {"reason": "store ids out of range"}
    table = table_of(pipeline)
    assert table.snapshot_by_name(f"quarantine-{batch_id}") is None  # the branch is gone
    assert table.scan().to_arrow().num_rows == 0  # main never got the batch's rows
    assert committed_state(table).offsets == {topic: {0: 15, 1: 15}}
    dropped = json.loads(table.current_snapshot().summary.additional_properties[DROPPED])
    assert dropped == {
        "batch": batch_id,
        "rows": 30,
        "ranges": [[topic, 0, 0, 15], [topic, 1, 0, 15]],
        "reason": "store ids out of range",
        "by": "admin",
    }
