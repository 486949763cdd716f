"""Batches staged on object storage (`batch.staging_dir: s3://...`): plan, manifest, quality report, replay
requests and spark-submit's log go to the bucket, and no step needs another step's local disk. Against the
local S3 endpoint (moto's server: the stand-in for S3/MinIO, which cannot run here); Kafka, the catalog and
Spark are real."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO, produce_to_partition, stage_inline, table_of, write_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.errors import ConfigError, TerminalError, TransientError
from tidewater.table.summary import committed_state
from tidewater_dev.sample_data import pizza_events, produce

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KEY, SECRET = "tidewater-stage-key", "tidewater-stage-secret-value"


def _fs(url: str):
    from pyarrow import fs

    return fs.S3FileSystem(
        endpoint_override=url, scheme="http", access_key=KEY, secret_key=SECRET, region="us-east-1", allow_bucket_creation=True
    )


def _objects(url: str, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix`` (bucket/key), read back whole."""
    from pyarrow import fs

    s3 = _fs(url)
    infos = s3.get_file_info(fs.FileSelector(prefix, recursive=True, allow_not_found=True))
    out = {}
    for info in infos:
        if info.type == fs.FileType.File:
            with s3.open_input_stream(info.path) as f:
                out[info.path[len(prefix) :].lstrip("/")] = f.read()
    return out


def _pipeline(
    home: Path,
    broker,
    topic: str,
    url: str,
    monkeypatch,
    bucket: str,
    warehouse_in_bucket: bool = True,
    storage_conn: bool = False,
    **overrides,
) -> Path:
    """A pipeline staging in ``s3://<bucket>/staging`` with the catalog's own `s3.*` settings (credentials
    through the environment); the warehouse in the bucket too, or on local disk with the staging settings
    given apart (`batch.staging_properties`, or with ``storage_conn`` an Airflow `aws` connection,
    `batch.staging_conn_id`)."""
    _fs(url).create_dir(bucket)
    monkeypatch.setenv("TEST_S3_KEY", KEY)
    monkeypatch.setenv("TEST_S3_SECRET", SECRET)
    s3 = {"s3.endpoint": url, "s3.access-key-id": "${TEST_S3_KEY}", "s3.secret-access-key": "${TEST_S3_SECRET}", "s3.region": "us-east-1"}
    batch = {"staging_dir": f"s3://{bucket}/staging", **overrides.pop("batch", {})}
    props = {"type": "sql", "uri": f"sqlite:///{home}/catalog.db"}
    if warehouse_in_bucket:
        props.update(warehouse=f"s3://{bucket}/warehouse", **s3)
    else:
        props.update(warehouse=f"file://{home}/warehouse")
        batch["staging_properties"] = s3
    if storage_conn:
        from tidewater.config import connections

        monkeypatch.setattr(connections, "_CACHE", {})
        monkeypatch.setenv(
            "AIRFLOW_CONN_STAGE_STORE",
            json.dumps({"conn_type": "aws", "login": KEY, "password": SECRET, "extra": {"endpoint_url": url, "region_name": "us-east-1"}}),
        )
        batch.pop("staging_properties", None)
        batch["staging_conn_id"] = "stage_store"
    return write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        catalog={"name": "tidewater", "properties": props},
        batch=batch,
        **overrides,
    )


def _spark_submit_logs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("tidewater-spark-submit-*.log")}


def test_a_batch_staged_in_the_bucket_lands_exactly_and_nothing_is_staged_on_local_disk(broker, home, topic, s3_endpoint, monkeypatch):
    """`tidewater run` through spark-submit with staging and warehouse in the bucket: every record once, exact
    offsets; the plan, manifest, quality report and spark-submit's log are objects of the batch's prefix; the
    local staging directory was never made and the log's temporary copy is gone; no secret in any object or
    progress line."""
    from tidewater.runtime.progress import BatchProgress
    from tidewater.steps.lifecycle import run_once

    path = _pipeline(home, broker, topic, s3_endpoint, monkeypatch, "stage1")
    produce(broker.bootstrap, topic, pizza_events(120, seed=61), partitions=3)
    logs_before = _spark_submit_logs()
    lines: list[str] = []
    result = run_once(path, progress=BatchProgress(lines.append))
    assert (result["status"], result["records"]) == ("committed", 120)
    table = table_of(path)
    assert table.scan().to_arrow().num_rows == 120
    assert committed_state(table).offsets == {topic: {0: 40, 1: 40, 2: 40}}
    staged = _objects(s3_endpoint, "stage1/staging")
    names = {k.split("/", 2)[-1] for k in staged}
    assert {"plan.json", "manifest.json", "spark-submit.log"} <= names, names
    assert any(n.startswith("validation") or "quality" in n for n in names), names
    batch_dirs = {k.split("/")[1] for k in staged}
    assert batch_dirs == {result["batch_id"]}
    manifest = json.loads(staged[f"{load_pipeline(path).name}/{result['batch_id']}/manifest.json"])
    assert manifest["batch_id"] == result["batch_id"]
    assert "wrote 120 records" in staged[f"{load_pipeline(path).name}/{result['batch_id']}/spark-submit.log"].decode()
    assert not (home / "staging").exists()
    assert _spark_submit_logs() <= logs_before, "the log's local copy was removed once uploaded"
    assert not any(SECRET.encode() in b or KEY.encode() in b for b in staged.values())
    assert any(line.startswith("[4/4] commit") for line in lines) and not any(SECRET in line for line in lines)


WRITE_THEN_HANG = """
import sys, time
from tidewater.config.parse import load_pipeline
from tidewater.steps.lifecycle import plan_step
from tidewater.steps.write import run_write_step
spec = load_pipeline(sys.argv[1])
plan, path = plan_step(spec)
run_write_step(spec, path)
print("written", str(path), flush=True)
time.sleep(600)
"""


def test_killed_after_a_write_staged_in_the_bucket_then_rerun_commits_each_record_once(broker, home, topic, s3_endpoint, monkeypatch):
    """The process running a batch is SIGKILLed after its write step (manifest on the bucket), before the
    commit: nothing committed; the rerun plans the same offsets under a new batch id and commits 600 records
    once; the killed batch's files are not in the table."""
    from tidewater.steps.lifecycle import run_once

    path = _pipeline(home, broker, topic, s3_endpoint, monkeypatch, "stage2")
    produce(broker.bootstrap, topic, pizza_events(600, seed=62), partitions=3)
    env = {**os.environ, "TIDEWATER_HOME": str(home)}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITE_THEN_HANG, str(path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    said, staged_plan = proc.stdout.readline().split()
    assert said == "written" and staged_plan.startswith("s3://stage2/staging/")
    proc.kill()
    proc.wait()
    manifests = [k for k in _objects(s3_endpoint, "stage2/staging") if k.endswith("/manifest.json")]
    assert len(manifests) == 1
    assert table_of(path).snapshots() == [], "nothing was committed before the kill"
    killed = manifests[0].split("/")[1]

    result = run_once(path)
    assert result["status"] == "committed" and result["batch_id"] != killed
    table = table_of(path)
    rows = table.scan().to_arrow()
    assert rows.num_rows == 600 and len(set(rows.column("order_id").to_pylist())) == 600
    assert committed_state(table).offsets == {topic: {0: 200, 1: 200, 2: 200}}
    assert not any(killed in t.file.file_path for t in table.scan().plan_files())


def test_a_batch_through_spark_connect_is_staged_in_the_bucket(broker, home, topic, s3_endpoint, monkeypatch, spark_connect):
    """The write step on the real Spark Connect server (the session's): this process, its client, reads the plan
    from the bucket and stages the manifest there; the server's workers never see the staging area. The bucket's
    credentials come from an Airflow connection (`batch.staging_conn_id`), and no secret reaches the staged files."""
    from tidewater.steps.lifecycle import run_once

    path = _pipeline(
        home,
        broker,
        topic,
        s3_endpoint,
        monkeypatch,
        "stage9",
        warehouse_in_bucket=False,
        storage_conn=True,
        spark={"connect_url": spark_connect.url},
    )
    assert KEY not in path.read_text() and "staging_properties" not in path.read_text()
    produce(broker.bootstrap, topic, pizza_events(90, seed=71), partitions=3)
    result = run_once(path)
    assert (result["status"], result["records"]) == ("committed", 90)
    table = table_of(path)
    assert table.scan().to_arrow().num_rows == 90
    assert committed_state(table).offsets == {topic: {0: 30, 1: 30, 2: 30}}
    staged = _objects(s3_endpoint, f"stage9/staging/orders/{result['batch_id']}")
    names = {k.rsplit("/", 1)[-1] for k in staged}
    assert {"plan.json", "manifest.json"} <= names, names
    assert not any(SECRET.encode() in b or KEY.encode() in b for b in staged.values())
    assert not (home / "staging").exists()


def test_two_committers_and_a_retry_read_the_staged_batch_from_the_bucket_and_commit_it_once(broker, home, topic, s3_endpoint, monkeypatch):
    """A batch staged in the bucket is committed by two committers at once, each loading the plan and the
    manifest from the bucket by the location text Airflow passes (XCom), then once more after success:
    one 'committed', the others 'already-committed'; rows and offsets exact."""
    from tidewater.steps.lifecycle import commit_step
    from tidewater.steps.write import load_manifest, load_plan

    path = _pipeline(home, broker, topic, s3_endpoint, monkeypatch, "stage3", warehouse_in_bucket=False)
    produce(broker.bootstrap, topic, pizza_events(300, seed=63), partitions=3)
    spec = load_pipeline(path)
    plan, _ = stage_inline(spec)
    location = f"s3://stage3/staging/{spec.name}/{plan.batch_id}/plan.json"
    barrier, results = threading.Barrier(2), []

    def committer() -> None:
        own = load_pipeline(path)  # its own catalog connection and file layer, as another worker's
        p, m = load_plan(location, own), load_manifest(location, own)
        barrier.wait()
        results.append(commit_step(own, p, m).status)

    threads = [threading.Thread(target=committer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == ["already-committed", "committed"]
    again = commit_step(spec, load_plan(location, spec), load_manifest(location, spec))
    assert again.status == "already-committed"
    table = table_of(path)
    assert table.scan().to_arrow().num_rows == 300 and len(table.snapshots()) == 1
    assert committed_state(table).offsets == {topic: {0: 100, 1: 100, 2: 100}}


def test_a_replay_through_spark_is_staged_in_the_bucket_and_adds_only_the_lost_rows(broker, home, topic, s3_endpoint, monkeypatch):
    """An append-missing replay through spark-submit: its plan is staged in the bucket, the write tasks ask the table
    which offsets it already holds; only the lost rows come back, offsets unmoved."""
    from tests.conftest import ingest_inline
    from tidewater.ops.replay import run_replay
    from tidewater.plan.replay import ReplayRequest

    path = _pipeline(
        home,
        broker,
        topic,
        s3_endpoint,
        monkeypatch,
        "stage4",
        warehouse_in_bucket=False,
        format={"metadata": "prefixed"},
        validation={"not_null": ["id"]},
    )
    produce_to_partition(broker.bootstrap, topic, 0, [json.dumps({"id": i}).encode() for i in range(50)])
    spec = load_pipeline(path)
    assert ingest_inline(spec).records == 50
    table_of(path).delete("_kafka_offset >= 10 and _kafka_offset < 17")
    result = run_replay(spec, ReplayRequest(topic=topic, partitions=(0,), start_offset=0, end_offset=50, mode="append-missing"), out=None)
    assert (result["rows"], result["already_present"]) == (7, 43)
    ids = sorted(table_of(path).scan().to_arrow().column("id").to_pylist())
    assert ids == list(range(50))
    assert committed_state(table_of(path)).offsets == {topic: {0: 50}}
    staged = _objects(s3_endpoint, "stage4/staging")
    assert any(k.endswith("/plan.json") for k in staged), sorted(staged)
    assert not (home / "staging").exists()


def test_maintenance_finds_in_flight_batches_and_removes_stale_staging_in_the_bucket(broker, home, topic, s3_endpoint, monkeypatch):
    """Orphan removal's view of the staging area on the bucket: a batch staged but not committed protects its
    data files; batches older than the cutoff are removed whole (a dry run only counts them). The cutoff is
    moved rather than the objects' age (an object's modification time cannot be set on S3); the full
    maintenance run over a local staging directory is in test_maintenance.py."""
    from tests.conftest import ingest_inline
    from tidewater.ops.maintenance import in_flight_files, remove_stale_staging

    path = _pipeline(home, broker, topic, s3_endpoint, monkeypatch, "stage5", warehouse_in_bucket=False)
    spec = load_pipeline(path)
    produce(broker.bootstrap, topic, pizza_events(40, seed=65), partitions=2)
    ingest_inline(spec)
    produce(broker.bootstrap, topic, pizza_events(30, seed=66), partitions=2)
    _, pending = stage_inline(spec)
    before = _objects(s3_endpoint, "stage5/staging")
    assert len({k.split("/")[1] for k in before}) == 2
    protected = in_flight_files(spec, time.time() - 3600)
    assert pending.data_files and {f.file_path for f in pending.data_files} <= protected
    assert remove_stale_staging(spec, time.time() - 3600) == 0
    assert remove_stale_staging(spec, time.time() + 5, dry_run=True) == 2
    assert _objects(s3_endpoint, "stage5/staging") == before
    assert remove_stale_staging(spec, time.time() + 5) == 2
    assert _objects(s3_endpoint, "stage5/staging") == {}


def test_a_manifest_that_cannot_be_read_whole_is_never_committed(broker, home, topic, s3_endpoint, monkeypatch):
    """The Airflow tasks of a batch whose manifest object was cut short (a copy or a tool that broke off):
    validate and commit fail at once naming the manifest (a terminal error, which the tasks' retry policy fails
    without retrying), and nothing is committed."""
    from tidewater.batch import manifest_path, write_json_atomic
    from tidewater.runtime.airflow import commit_task, plan_task, validate_task
    from tidewater.source.kafka import kafka_settings
    from tidewater.steps.write import load_plan
    from tidewater.write.job import run_inline

    path = _pipeline(home, broker, topic, s3_endpoint, monkeypatch, "stage6", warehouse_in_bucket=False)
    produce(broker.bootstrap, topic, pizza_events(60, seed=67), partitions=2)
    spec = load_pipeline(path)
    planned = plan_task(str(path))
    assert planned is not None and planned["plan_path"].startswith("s3://stage6/")
    manifest = run_inline(load_plan(planned["plan_path"], spec), spec, kafka_settings(spec))
    staged = manifest_path(spec.stage(planned["plan_path"]))
    write_json_atomic(staged, manifest.to_json())
    whole = staged.read_bytes()
    staged.write_bytes(whole[: len(whole) // 2])
    for task in (validate_task, lambda p, pl: commit_task(p, pl, dag_run_id="manual__cut")):
        with pytest.raises(TerminalError, match=r"manifest\.json is not a whole JSON document"):
            task(str(path), planned)
    table = table_of(path)
    assert table is None or table.snapshots() == []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_bucket_is_transient_and_a_missing_one_terminal_naming_the_setting(broker, home, topic, s3_endpoint, monkeypatch):
    """The plan step stages its plan: an endpoint nobody listens on is worth retrying, a bucket that does not
    exist is not; both errors name `batch.staging_dir`, and neither carries the secret key."""
    from tidewater.steps.lifecycle import plan_step

    produce(broker.bootstrap, topic, pizza_events(10, seed=68), partitions=1)
    path = _pipeline(home, broker, topic, s3_endpoint, monkeypatch, "stage7", warehouse_in_bucket=False)
    spec = load_pipeline(path)
    down = load_pipeline(
        write_pipeline(
            home,
            name="down",
            topics=[topic],
            kafka={"bootstrap_servers": broker.bootstrap},
            batch={
                **spec_batch(spec),
                "staging_properties": {
                    **spec.batch.staging_properties,
                    "s3.endpoint": f"http://127.0.0.1:{_free_port()}",
                    "s3.connect-timeout": "2",
                },
            },
        )
    )
    with pytest.raises(TransientError, match=r"batch\.staging_dir") as e:
        plan_step(down)
    assert SECRET not in str(e.value)
    missing = load_pipeline(
        write_pipeline(
            home,
            name="missing",
            topics=[topic],
            kafka={"bootstrap_servers": broker.bootstrap},
            batch={**spec_batch(spec), "staging_dir": "s3://no-such-bucket/staging"},
        )
    )
    with pytest.raises(ConfigError, match=r"batch\.staging_dir") as e2:
        plan_step(missing)
    assert SECRET not in str(e2.value)


def spec_batch(spec) -> dict:
    return {"staging_dir": spec.batch.staging_dir, "staging_properties": dict(spec.batch.staging_properties)}


def test_refused_credentials_are_a_terminal_error(broker, home, topic, monkeypatch):
    """A local S3 endpoint that checks credentials (moto's server with authentication on: the stand-in for a
    bucket whose policy refuses the key) refuses the staging write: a terminal error naming the setting."""
    from tidewater.steps.lifecycle import plan_step

    port = _free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"}
    proc = subprocess.Popen(
        [str(REPO / ".data" / "moto" / "bin" / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=2).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "the second S3 endpoint did not start"
                time.sleep(0.2)
        monkeypatch.setenv("TEST_S3_SECRET", SECRET)
        produce(broker.bootstrap, topic, pizza_events(5, seed=69), partitions=1)
        spec = load_pipeline(
            write_pipeline(
                home,
                topics=[topic],
                kafka={"bootstrap_servers": broker.bootstrap},
                batch={
                    "staging_dir": "s3://guarded/staging",
                    "staging_properties": {
                        "s3.endpoint": f"http://127.0.0.1:{port}",
                        "s3.region": "us-east-1",
                        "s3.access-key-id": "AKIAUNKNOWN",
                        "s3.secret-access-key": "${TEST_S3_SECRET}",
                    },
                },
            )
        )
        with pytest.raises(ConfigError, match=r"batch\.staging_dir: the store refused access") as e:
            plan_step(spec)
        assert SECRET not in str(e.value)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_cluster_deploy_mode_on_a_standalone_master_is_a_terminal_error_saying_what_works(
    broker, home, topic, s3_endpoint, monkeypatch, tmp_path
):
    """Spark itself refuses a Python driver in cluster deploy mode on a standalone master (YARN and Kubernetes,
    which run such drivers, cannot run here). Set in the pipeline, `tidewater validate` refuses it; set in the
    cluster's spark-defaults.conf, the write step says so and what to use instead, rather than retrying.
    spark-submit refuses before it reaches the master, so none is started."""
    from tidewater.steps.lifecycle import plan_step
    from tidewater.steps.write import run_write_step

    spark = {"master": "spark://127.0.0.1:1"}
    with pytest.raises(ConfigError, match=r"spark\.conf spark\.submit\.deployMode: Spark runs a Python driver"):
        load_pipeline(
            _pipeline(
                home,
                broker,
                topic,
                s3_endpoint,
                monkeypatch,
                "stage8",
                warehouse_in_bucket=False,
                spark={**spark, "conf": {"spark.submit.deployMode": "cluster"}},
            )
        )
    (tmp_path / "spark-defaults.conf").write_text("spark.submit.deployMode cluster\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    path = _pipeline(home, broker, topic, s3_endpoint, monkeypatch, "stage8", warehouse_in_bucket=False, spark=spark)
    produce(broker.bootstrap, topic, pizza_events(5, seed=70), partitions=1)
    spec = load_pipeline(path)
    _, plan_path = plan_step(spec)
    with pytest.raises(ConfigError, match="cluster deploy mode on YARN and Kubernetes only") as e:
        run_write_step(spec, plan_path)
    assert "spark.connect_url" in str(e.value) and "batch.staging_dir" in str(e.value)


def test_data_docs_live_in_the_bucket_and_the_tidewater_view_serves_them_from_there(broker, home, topic, s3_endpoint, monkeypatch):
    """`validation.data_docs_dir` in the bucket: each batch's report and page go there (rendered in a private
    temporary copy of the project, nothing under the home), the site's index lists the batches; with the store
    limited to two results, the oldest result and its page leave the bucket. The Tidewater view (its FastAPI app;
    Airflow's authentication is overridden here, the UI test covers it with a real api-server) redirects a batch's
    page into the site and serves the page and the index from the bucket."""
    from fastapi.testclient import TestClient

    from tests.conftest import ingest_inline
    from tidewater.quality import data_docs
    from tidewater.runtime.ui import create_app

    path = _pipeline(
        home,
        broker,
        topic,
        s3_endpoint,
        monkeypatch,
        "docs1",
        warehouse_in_bucket=False,
        validation={"not_null": ["order_id"], "data_docs_dir": "s3://docs1/data-docs"},
    )
    spec = load_pipeline(path)
    monkeypatch.setattr(data_docs, "INDEX_ROWS", 2)
    batches = []
    for i in range(3):
        produce(broker.bootstrap, topic, pizza_events(20, seed=80 + i), partitions=1, create=i == 0)
        batch = ingest_inline(spec).batch_id  # saves the report; renders the page too when GX is already loaded
        data_docs.render_pending(spec, batch)
        page = data_docs.page_of(spec, batch)
        assert str(page).startswith("s3://docs1/data-docs/orders/gx/uncommitted/data_docs/local_site/validations/")
        assert batch in page.read_text() and not data_docs.report_path(spec, batch).is_file()
        batches.append(batch)
    index = (data_docs.site_dir(spec) / "index.html").read_text()
    assert batches[1] in index and batches[2] in index
    assert data_docs.page_of(spec, batches[0]) is None, "the oldest result left the store, its page the site"
    results = [k for k in _objects(s3_endpoint, "docs1/data-docs/orders/gx/uncommitted/validations") if k.endswith(".json")]
    assert len(results) == 2 and not any(batches[0] in k for k in results)
    assert not (home / "data-docs").exists()

    monkeypatch.setenv("TIDEWATER_PIPELINES_DIR", str(path.parent))
    from airflow.api_fastapi.core_api.security import get_user

    from tidewater.runtime import ui

    app = create_app()
    for dep in app.router.dependencies:
        app.dependency_overrides[dep.dependency] = lambda: None
    app.dependency_overrides[get_user] = lambda: None  # the signed-in user, and the auth manager letting them read the DAG
    monkeypatch.setattr(ui, "_readable", lambda user, dag_ids: set(dag_ids))
    client = TestClient(app)
    moved = client.get(f"/data-docs/orders/{batches[2]}.html", follow_redirects=False)
    assert moved.status_code == 307 and moved.headers["location"].startswith("validations/")
    page = client.get(f"/data-docs/orders/{moved.headers['location']}")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html") and batches[2] in page.text
    assert client.get("/data-docs/orders/index.html").status_code == 200
    assert client.get("/data-docs/orders/validations/../../../../docs1.json").status_code == 404
    assert client.get(f"/data-docs/orders/{batches[0]}.html").status_code == 404
