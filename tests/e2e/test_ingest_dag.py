"""The ingest DAG run through Airflow (`airflow dags test`) against the real broker, Spark and catalog."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, table_of, write_pipeline
from tests.e2e.conftest import list_runs, metadata_rows, standalone, task_tries, through_spark_connect, wait_for_runs
from tidewater.config.parse import load_pipeline
from tidewater.table.summary import DAG_RUN_ID, OFFSETS, committed_state
from tidewater_dev.sample_data import pizza_events, produce

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def dags_test(env: dict[str, str], dag_id: str, conf: dict | None = None, expect: str = "success") -> str:
    cmd = ["airflow", "dags", "test", dag_id] + (["--conf", json.dumps(conf)] if conf else [])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    if expect == "success":
        assert proc.returncode == 0, out[-4000:]
    assert f"state={expect}" in out, out[-4000:]
    return out


def asset_events(env: dict[str, str]) -> list[tuple[str, dict, str]]:
    """(asset uri, extra, source DAG) of every asset event in the Airflow database, oldest first."""
    rows = metadata_rows(env, "SELECT a.uri, e.extra, e.source_dag_id FROM asset_event e JOIN asset a ON a.id = e.asset_id ORDER BY e.id")
    return [(uri, json.loads(extra or "{}"), dag) for uri, extra, dag in rows]


def test_dag_runs_twice_with_new_events_between_then_short_circuits(broker, topic, airflow_env):
    """Two DAG runs with 240 new events before each: 480 rows, two snapshots stamped with the DAG run id
    and exact offsets; a third run with nothing new skips write/validate/commit and adds no snapshot.
    Then the maintenance DAG compacts the 4 files into 1: same rows, same offsets."""
    pipeline = write_pipeline(
        Path(airflow_env["TIDEWATER_PIPELINES_DIR"]),
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        maintenance={"rewrite_data_files": {"min_input_files": 2}},
    )
    for i in range(2):
        produce(broker.bootstrap, topic, pizza_events(240, seed=50 + i), partitions=2)
        out = dags_test(airflow_env, "ingest_orders")
        # built-in checks only: the validate task leaves the page to the data_docs task next to the commit
        assert "Data Docs page rendered after the commit" in out
        page = re.search(r"Data Docs (file://\S+?\.html), in the Tidewater view: (http://\S+?\.html)", out)
        assert page and Path(page.group(1)[len("file://") :]).is_file()  # in the pipeline's GX site: .../<batch>/<time>/<table>.html
        batch = Path(page.group(1)).parts[-3]
        assert page.group(2) == f"http://localhost:8080/tidewater/data-docs/orders/{batch}.html"
    table = table_of(pipeline)
    assert table.scan().to_arrow().num_rows == 480
    snaps = sorted(table.snapshots(), key=lambda s: s.sequence_number)
    assert len(snaps) == 2
    for n, s in enumerate(snaps, start=1):
        props = s.summary.additional_properties
        assert props[DAG_RUN_ID].startswith("manual__")
        assert json.loads(props[OFFSETS]) == {topic: {"0": 120 * n, "1": 120 * n}}
    # each commit emitted an event on the table's asset with the batch, its rows and offsets
    from tidewater.table.summary import BATCH_ID

    uri = f"iceberg://{load_pipeline(pipeline).catalog.name}/rpc/orders"
    events = [e for u, e, dag in asset_events(airflow_env) if u == uri and dag == "ingest_orders"]
    assert [e["batch_id"] for e in events] == [s.summary.additional_properties[BATCH_ID] for s in snaps]
    assert [e["rows"] for e in events] == [240, 240] and [e["mode"] for e in events] == ["ingest", "ingest"]
    assert events[-1]["offsets"] == {topic: {"0": 240, "1": 240}} and events[-1]["dead_letters"] == 0
    assert events[-1]["snapshot_id"] == str(snaps[-1].snapshot_id) and events[-1]["valid_through"]
    # the commit task's XCom carries the snapshot id as a string (the UI would round a number above 2^53)
    xcoms = [
        json.loads(v)
        for (v,) in metadata_rows(
            airflow_env,
            "SELECT value FROM xcom WHERE dag_id = 'ingest_orders' AND task_id = 'commit' AND key = 'return_value' ORDER BY timestamp",
        )
    ]
    assert [x["snapshot_id"] for x in xcoms] == [str(s.snapshot_id) for s in snaps]
    out = dags_test(airflow_env, "ingest_orders")
    assert "Skipping downstream tasks" in out
    assert len(table_of(pipeline).snapshots()) == 2
    assert len([u for u, _, dag in asset_events(airflow_env) if dag == "ingest_orders"]) == 2  # an empty run emits none

    out = dags_test(airflow_env, "maintain_orders")
    assert "rewrite_data_files on rpc.orders: data files 4 -> 1" in out
    table = table_of(pipeline)
    assert len(table.inspect.files()) == 1
    assert table.scan().to_arrow().num_rows == 480
    assert committed_state(table).offsets == {topic: {0: 240, 1: 240}}


def test_dag_writes_through_a_spark_connect_connection(broker, topic, airflow_env, spark_connect):
    """The DAG's Spark connection is the provider's `spark_connect` type, pointing at the session's real Spark
    Connect server (no `spark.connect_url` in the pipeline). Expected: the write task takes the Connect path
    (no spark-submit), the batch commits with rows and offsets exact, and the log names the server."""
    env = through_spark_connect(airflow_env, spark_connect)
    pipeline = write_pipeline(Path(env["TIDEWATER_PIPELINES_DIR"]), topics=[topic], kafka={"bootstrap_servers": broker.bootstrap})
    produce(broker.bootstrap, topic, pizza_events(300, seed=60), partitions=2)
    out = dags_test(env, "ingest_orders")
    assert "through Spark Connect" in out and "spark-submit" not in out.replace("spark-submit.log", "")
    table = table_of(pipeline)
    assert table.scan().to_arrow().num_rows == 300
    assert committed_state(table).offsets == {topic: {0: 150, 1: 150}}


def test_replay_dag_from_its_form(broker, topic, airflow_env, spark_connect):
    """replay_<name> run through Airflow with the form's parameters (`--conf`): a dry run changes nothing,
    a replace replay leaves the table identical with unchanged offsets, and a range past the committed
    offset fails the run with a message naming the parameter. Writes through the session's Spark Connect server."""
    airflow_env = through_spark_connect(airflow_env, spark_connect)
    pipeline = write_pipeline(
        Path(airflow_env["TIDEWATER_PIPELINES_DIR"]),
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"metadata": "prefixed"},
    )
    produce(broker.bootstrap, topic, pizza_events(200, seed=70), partitions=2)
    dags_test(airflow_env, "ingest_orders")

    def rows():
        t = table_of(pipeline).scan().to_arrow()
        return sorted(
            zip(t.column("_kafka_partition").to_pylist(), t.column("_kafka_offset").to_pylist(), t.column("order_id").to_pylist())
        )

    before, snaps = rows(), len(table_of(pipeline).snapshots())
    form = {"topic": topic, "partitions": [1], "start_offset": 20, "end_offset": 60}
    out = dags_test(airflow_env, "replay_orders", {**form, "dry_run": True})
    assert f"{topic}[1] [20, 60): 40 offsets; rows now 40, to delete 40, to add at most 40" in out
    assert len(table_of(pipeline).snapshots()) == snaps
    dags_test(airflow_env, "replay_orders", form)  # the form's default is a dry run
    assert len(table_of(pipeline).snapshots()) == snaps
    dags_test(airflow_env, "replay_orders", {**form, "dry_run": False})
    table = table_of(pipeline)
    assert rows() == before and len(table.snapshots()) == snaps + 2
    assert json.loads(table.current_snapshot().summary.additional_properties["tidewater.replay"])["ranges"] == [[topic, 1, 20, 60]]
    assert committed_state(table).offsets == {topic: {0: 100, 1: 100}}
    out = dags_test(airflow_env, "replay_orders", {**form, "end_offset": 150, "dry_run": False}, expect="failed")
    assert "end_offset: 150 is beyond the committed offset 100" in out


DOWNSTREAM_DAG = """
import json

import pendulum
from airflow.sdk import Asset, dag, task


@dag(dag_id="downstream_orders", schedule=[Asset(name="tidewater.rpc.orders", uri="{uri}")],
     start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def downstream_orders():
    @task
    def read(**context):
        events = [e.extra for es in context["triggering_asset_events"].values() for e in es]
        with open("{seen}", "w") as f:
            json.dump(events, f)

    read()


downstream_orders()
"""


def test_lag_trigger_starts_a_batch_through_the_scheduler(broker, topic, airflow_env, tmp_path, spark_connect):
    """`trigger.pending_records: 50` and no cron schedule: with 30 records waiting nothing runs; once 80
    wait, Airflow's triggerer (`airflow standalone`) sees the lag without Spark and the scheduler starts an
    asset-triggered ingest run that lands all 80 records with exact offsets (written through the session's Spark
    Connect server)."""
    airflow_env = through_spark_connect(airflow_env, spark_connect)
    pipeline = write_pipeline(
        Path(airflow_env["TIDEWATER_PIPELINES_DIR"]),
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        schedule=None,
        trigger={"pending_records": 50, "poll_seconds": 2},
    )
    produce(broker.bootstrap, topic, pizza_events(30, seed=140), partitions=2)
    with standalone(airflow_env, tmp_path) as env:
        subprocess.run(["airflow", "dags", "unpause", "ingest_orders"], env=env, check=True, capture_output=True, timeout=120)
        time.sleep(15)  # several polls of the trigger
        assert list_runs(env, "ingest_orders") == []
        produce(broker.bootstrap, topic, pizza_events(50, seed=141), partitions=2, create=False)
        runs = wait_for_runs(env, "ingest_orders", 300)
    assert [r["state"] for r in runs] == ["success"], runs
    assert runs[0]["run_id"].startswith("asset_triggered__"), runs
    table = table_of(pipeline)
    assert table.scan().to_arrow().num_rows == 80
    assert committed_state(table).offsets == {topic: {0: 40, 1: 40}}


def test_backfill_from_the_form_through_the_rest_api(broker, topic, airflow_env, tmp_path, postgres, spark_connect):
    """Backfills as Airflow's backfill form creates them (`POST /api/v2/backfills` with the form's body: no run
    configuration, since the form sends one only with "Override parameters on existing runs" on), run by a
    real scheduler (`airflow standalone`) over two hourly intervals, one of which a batch committed:
    - Reprocess Behavior "Missing Runs" (the form's default) makes new runs: the committed interval is left as
      it is (no replace), the one before it has no committed records (the embedded broker's timestamp lookup
      answers 0, see STACK.md) and is a no-op;
    - then "All Runs": Airflow clears those runs and runs them again, and the committed interval is re-ingested
      with replace (same rows, same offsets, one replace recorded with its interval); a downstream DAG
      scheduled on the table's asset runs after that commit;
    - then the maintenance DAG runs: its event is on its own asset, and the downstream DAG does not run again
      (one run in all: maintenance changes no row).
    Airflow's metadata is in PostgreSQL, as in production: on SQLite, the scheduler, DAG processor and API server
    contend for one write lock, and in CI the second backfill request answered 503 "database is locked", then 409
    "already a running backfill". The write tasks run on the session's Spark Connect server."""
    from datetime import datetime, timedelta

    from tests.e2e.conftest import admin_token, call_api

    airflow_env = {
        **through_spark_connect(airflow_env, spark_connect),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres.create_database("airflow_backfill"),
    }
    migrate = subprocess.run(["airflow", "db", "migrate"], env=airflow_env, capture_output=True, text=True, timeout=600)
    assert migrate.returncode == 0, migrate.stdout[-2000:] + migrate.stderr[-2000:]
    pipeline = write_pipeline(
        Path(airflow_env["TIDEWATER_PIPELINES_DIR"]),
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"metadata": "prefixed"},
        schedule="@hourly",
        maintenance={"schedule": None},
    )
    produce(broker.bootstrap, topic, pizza_events(100, seed=80), partitions=2)
    dags_test(airflow_env, "ingest_orders")  # a manual run: its interval is the hour before now
    table = table_of(pipeline)
    interval = table.current_snapshot().summary.additional_properties["tidewater.data-interval"]
    start = interval.split("/")[0]
    before = sorted(table.scan().to_arrow().column("order_id").to_pylist())

    # a downstream DAG scheduled on the table's asset: the backfill's replace commit must start it
    import shutil

    dags = tmp_path / "dags"
    dags.mkdir()
    for f in (REPO / "dags").glob("*.py"):
        shutil.copy(f, dags / f.name)
    seen = tmp_path / "downstream.json"
    uri = f"iceberg://{load_pipeline(pipeline).catalog.name}/rpc/orders"
    (dags / "downstream_orders.py").write_text(DOWNSTREAM_DAG.format(uri=uri, seen=str(seen)))

    def replays() -> list[dict]:
        return [
            json.loads(s.summary.additional_properties["tidewater.replay"])
            for s in table_of(pipeline).snapshots()
            if "tidewater.replay" in s.summary.additional_properties and s.summary.operation.value == "append"
        ]

    with standalone({**airflow_env, "AIRFLOW__CORE__DAGS_FOLDER": str(dags)}, tmp_path) as env:
        base = f"http://127.0.0.1:{env['AIRFLOW__API__PORT']}"
        token = admin_token(base, env["AIRFLOW_HOME"])
        first = (datetime.fromisoformat(start) - timedelta(hours=1)).isoformat()
        form = {
            "dag_id": "ingest_orders",
            "from_date": first,
            "to_date": start,
            "dag_run_conf": None,
            "max_active_runs": 1,
            "run_backwards": False,
            "run_on_latest_version": True,
        }

        def settled() -> None:
            """Wait until no run of the DAG is queued or running: unpausing makes the scheduler start a run for the
            latest interval, and a backfill created while that run is in flight skips its date ("in flight")."""
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                status, runs = call_api(f"{base}/api/v2/dags/ingest_orders/dagRuns", token)
                if status == 200 and all(r["state"] in ("success", "failed") for r in runs["dag_runs"]):
                    return
                time.sleep(3)

        def backfill(behavior: str, unpause: bool = False) -> dict[str, str]:
            settled()
            for _ in range(20):
                status, body = call_api(f"{base}/api/v2/backfills", token, {**form, "reprocess_behavior": behavior})
                if status not in (409, 503):
                    break
                # a 503 (a busy database) may come after the backfill was created, and a 409 ("already a running
                # backfill") may name it or the previous one, not yet marked complete: look for ours, else retry
                _, listed = call_api(f"{base}/api/v2/backfills?dag_id=ingest_orders", token)
                running = [
                    b
                    for b in (listed.get("backfills", []) if isinstance(listed, dict) else [])
                    if not b.get("completed_at") and b.get("reprocess_behavior") == behavior
                ]
                if running:
                    status, body = 200, running[0]
                    break
                time.sleep(3)
            assert status in (200, 201), body
            for dag_id in ("ingest_orders", "downstream_orders") if unpause else ():  # the form's "unpause" box
                subprocess.run(["airflow", "dags", "unpause", dag_id], env=env, check=True, capture_output=True, timeout=120)
            states: dict[str, str] = {}
            deadline = time.monotonic() + 420
            while time.monotonic() < deadline:
                status, runs = call_api(f"{base}/api/v2/dags/ingest_orders/dagRuns", token)
                states = (
                    {r["dag_run_id"]: r["state"] for r in runs["dag_runs"] if r["dag_run_id"].startswith("backfill__")}
                    if status == 200
                    else {}
                )
                status, bf = call_api(f"{base}/api/v2/backfills/{body['id']}", token)
                if len(states) == 2 and all(s in ("success", "failed") for s in states.values()) and bf.get("completed_at"):
                    break
                time.sleep(5)
            return states

        states = backfill("none", unpause=True)
        assert sorted(states.values()) == ["success", "success"], states
        assert replays() == [] and not seen.is_file()  # the committed interval was left as it is
        states = backfill("completed")
        assert sorted(states.values()) == ["success", "success"], states
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not seen.is_file():
            time.sleep(5)
        downstream_runs = maintained_without_new_data(env, base, token)
    assert seen.is_file(), "the downstream DAG scheduled on the table's asset did not run"
    assert len(downstream_runs) == 1, downstream_runs
    downstream = json.loads(seen.read_text())
    assert downstream and all(e["mode"] == "replace" and e["rows"] == 100 for e in downstream), downstream
    done = replays()
    assert [r["data_interval"] for r in done] == [interval.split("/")]
    assert done[0]["mode"] == "replace" and sorted(r[3] for r in done[0]["ranges"]) == [50, 50]
    table = table_of(pipeline)
    assert sorted(table.scan().to_arrow().column("order_id").to_pylist()) == before
    assert committed_state(table).offsets == {topic: {0: 50, 1: 50}}


def maintained_without_new_data(env: dict[str, str], base: str, token: str) -> list[dict]:
    """Run the maintenance DAG through the scheduler, then check what it announced: one event on its own asset
    (`tidewater://maintenance/orders`, every action's report in it) and none on the table's, since no row changed.
    Returns the downstream DAG's runs 30 s after the maintenance run (scheduler loops that would have started one)."""
    from tests.e2e.conftest import call_api

    subprocess.run(["airflow", "dags", "unpause", "maintain_orders"], env=env, check=True, capture_output=True, timeout=120)
    status, run = call_api(f"{base}/api/v2/dags/maintain_orders/dagRuns", token, {"logical_date": None})
    assert status in (200, 201), run
    deadline = time.monotonic() + 400
    state = None
    while time.monotonic() < deadline and state not in ("success", "failed"):
        time.sleep(5)
        state = call_api(f"{base}/api/v2/dags/maintain_orders/dagRuns/{run['dag_run_id']}", token)[1].get("state")
    assert state == "success", state
    status, events = call_api(f"{base}/api/v2/assets/events?source_dag_id=maintain_orders", token)
    assert status == 200, events
    assert [e["uri"] for e in events["asset_events"]] == ["tidewater://maintenance/orders"], events
    assert set(events["asset_events"][0]["extra"]["actions"]) == {
        "rewrite_data_files",
        "rewrite_manifests",
        "expire_snapshots",
        "remove_orphan_files",
    }
    time.sleep(30)
    status, runs = call_api(f"{base}/api/v2/dags/downstream_orders/dagRuns", token)
    assert status == 200, runs
    return runs["dag_runs"]


def test_skip_dag_from_its_form_steps_past_a_blocking_record(broker, topic, airflow_env, spark_connect):
    """dead_letter.policy fail, a truncated record at offset 4: the ingest DAG fails. The skip DAG's form:
    a dry run changes nothing; the real run dead-letters offset 4 (OperatorSkip, the reason and the
    triggering user), ingests offsets 0-3 first and moves the offset to 5; a range before the committed
    offset fails the run naming start_offset; the next ingest run lands the rest. Writes through the session's
    Spark Connect server."""
    airflow_env = through_spark_connect(airflow_env, spark_connect)
    from tidewater.table.catalog import load_catalog, load_table

    pipeline = write_pipeline(
        Path(airflow_env["TIDEWATER_PIPELINES_DIR"]),
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        dead_letter={"policy": "fail"},
    )
    good = pizza_events(6, seed=83)
    produce(broker.bootstrap, topic, good[:4] + [b'{"order_id": '] + good[4:], partitions=1)
    dags_test(airflow_env, "ingest_orders", expect="failed")
    form = {"topic": topic, "partition": 0, "start_offset": 4, "end_offset": 5, "reason": "truncated by a bad deploy"}
    dags_test(airflow_env, "skip_orders", {**form, "dry_run": True})
    assert table_of(pipeline) is None
    dags_test(airflow_env, "skip_orders", {**form, "dry_run": False})
    table = table_of(pipeline)
    assert table.scan().to_arrow().num_rows == 4 and committed_state(table).offsets == {topic: {0: 5}}
    from tidewater.config.parse import load_pipeline

    spec = load_pipeline(pipeline)
    dlq = load_table(load_catalog(spec), spec.dead_letter_table()).scan().to_arrow().to_pylist()
    assert [(r["offset"], r["error_class"]) for r in dlq] == [(4, "OperatorSkip")]
    assert "truncated by a bad deploy" in dlq[0]["error_message"]
    out = dags_test(airflow_env, "skip_orders", {**form, "start_offset": 1, "end_offset": 2, "dry_run": False}, expect="failed")
    assert "start_offset: 1 is before the next offset to ingest" in out
    dags_test(airflow_env, "ingest_orders")
    assert table_of(pipeline).scan().to_arrow().num_rows == 6


def _statsd_lines(env: dict[str, str], sock) -> list[str]:
    """Run the ingest DAG with Airflow's StatsD metrics sent to ``sock``; the lines it received."""
    env = {
        **env,
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(sock.getsockname()[1]),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
    }
    dags_test(env, "ingest_orders")
    lines: list[str] = []
    while True:
        try:
            lines += sock.recv(65535).decode().splitlines()
        except TimeoutError:
            return lines


def test_metrics_reach_statsd_through_airflows_stats(broker, topic, airflow_env, spark_connect):
    """With Airflow's StatsD metrics on, an ingest run sends the pipeline's lag per partition (plan task), rows,
    records, bytes, dead letters (in all and per class), commit retries, freshness and the commit and batch durations
    (commit task) under Airflow's prefix: on plain StatsD with the pipeline, topic, partition and class in the names;
    with `statsd_influxdb_enabled` under tag-free names with those as tags (`name,pipeline=orders,...`). No StatsD
    server is installed here: a UDP socket of the test receives the packets Airflow sends. The write runs on the
    session's Spark Connect server."""
    airflow_env = through_spark_connect(airflow_env, spark_connect)
    import socket

    write_pipeline(Path(airflow_env["TIDEWATER_PIPELINES_DIR"]), topics=[topic], kafka={"bootstrap_servers": broker.bootstrap})
    produce(broker.bootstrap, topic, pizza_events(90, seed=60) + [b'{"order_id": "x", "store_id": '], partitions=3)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.5)
    try:
        lines = _statsd_lines(airflow_env, sock)
        metrics = {ln.split(":", 1)[0]: ln.split(":", 1)[1] for ln in lines if ln.startswith("airflow.tidewater.orders")}
        assert sorted(metrics[f"airflow.tidewater.orders.lag.{topic}.{p}"] for p in range(3)) == ["30|g", "30|g", "31|g"]
        assert metrics["airflow.tidewater.orders.lag"] == "91|g"
        assert metrics["airflow.tidewater.orders.rows"] == "90|c" and metrics["airflow.tidewater.orders.records"] == "91|c"
        assert metrics["airflow.tidewater.orders.dead_letters"] == "1|c"
        assert metrics["airflow.tidewater.orders.dead_letters.InvalidJson"] == "1|c"
        assert metrics["airflow.tidewater.orders.commit_retries"] == "0|c"
        assert int(metrics["airflow.tidewater.orders.bytes"].removesuffix("|c")) > 1000
        assert metrics["airflow.tidewater.orders.freshness_seconds"].endswith("|g")
        assert metrics["airflow.tidewater.orders.commit_seconds"].endswith("|ms")
        assert metrics["airflow.tidewater.orders.batch_seconds"].endswith("|ms")

        produce(broker.bootstrap, topic, pizza_events(30, seed=61), partitions=3, create=False)
        tagged = _statsd_lines({**airflow_env, "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True"}, sock)
    finally:
        sock.close()
    metrics = {ln.split(":", 1)[0]: ln.split(":", 1)[1] for ln in tagged if ln.startswith("airflow.tidewater.")}
    assert not any(name.startswith("airflow.tidewater.orders") for name in metrics), metrics
    for p in range(3):
        assert metrics[f"airflow.tidewater.partition_lag,pipeline=orders,topic={topic},partition={p}"] == "10|g", metrics
    assert metrics["airflow.tidewater.lag,pipeline=orders"] == "30|g"
    assert metrics["airflow.tidewater.rows,pipeline=orders"] == "30|c"
    assert metrics["airflow.tidewater.dead_letters,pipeline=orders"] == "0|c"
    assert metrics["airflow.tidewater.freshness_seconds,pipeline=orders"].endswith("|g")


def test_the_audit_dag_passes_on_a_clean_table_fails_on_a_discrepancy_and_the_view_shows_it(broker, topic, airflow_env):
    """`audit_orders` (deep: every row's source offset) after a batch: success, and the verdict the Tidewater view
    shows is clean. After rows appended outside Tidewater (a copy of 5 committed rows): the run fails without
    retrying, its log names the outside append and the offsets now in the table twice, and the view's verdict
    says so."""
    from tests.conftest import ingest_inline
    from tidewater.ops.overview import overview

    pipeline = write_pipeline(
        Path(airflow_env["TIDEWATER_PIPELINES_DIR"]),
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"metadata": "prefixed"},
        audit={"deep": True},
    )
    produce(broker.bootstrap, topic, pizza_events(60, seed=200), partitions=2)
    spec = load_pipeline(pipeline)
    ingest_inline(spec)
    out = dags_test(airflow_env, "audit_orders")
    assert "audit of rpc.orders: clean (1 batches)" in out
    verdict = overview(spec)["audit"]
    assert verdict["clean"] and verdict["deep"] and verdict["batches"] == 1
    table = table_of(pipeline)
    table.append(table.scan(limit=5).to_arrow())
    out = dags_test(airflow_env, "audit_orders", expect="failed")
    assert "made outside Tidewater: 5 rows added" in out and "offsets in the table twice" in out
    assert "TerminalError (retrying cannot help): audit of rpc.orders" in out  # the retry policy: no second try
    assert task_tries(airflow_env, "audit_orders")["audit"] == ("failed", 1)
    verdict = overview(spec)["audit"]
    assert not verdict["clean"] and verdict["errors"] >= 2 and any("outside Tidewater" in f for f in verdict["first"])
