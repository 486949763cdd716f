"""Production-shaped: every step of a batch in its own process, with its own private `TIDEWATER_HOME`, working
directory and temporary directory, each removed after its step, as on Celery or Kubernetes workers that share no
disk. The steps share only what deployments share: the broker, a PostgreSQL catalog (Debian's server, started by
the tests on a local port) and the bucket (the local S3 endpoint: moto's server, the stand-in for S3/MinIO,
which cannot run here). Each step gets its own copy of the pipeline file, as each worker has its own copy of
the DAG bundle."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import produce_to_partition
from tidewater.config.parse import load_pipeline
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import REPLAY, committed_state
from tidewater_dev.changes import apply, change_stream, encode
from tidewater_dev.sample_data import pizza_events, produce

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

KEY, SECRET = "tidewater-prod-key", "tidewater-prod-secret-value"

# One Airflow task's work, as the DAG's tasks call it (the write step as the Spark operator runs it: spark-submit
# from the task's process, client mode). Prints the task's result on its last line.
STEP = """
import json, sys
task, pipeline, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
from tidewater.config.parse import load_pipeline
from tidewater.runtime import airflow as tasks
if task == "plan":
    out = tasks.plan_task(pipeline)
elif task == "replay_plan":
    out = tasks.replay_plan_task(pipeline, args)
elif task == "write":
    from tidewater.steps.write import run_write_step
    spec = load_pipeline(pipeline)
    out = {"records": run_write_step(spec, spec.stage(args["plan_path"])).records}
elif task == "validate":
    out = tasks.validate_task(pipeline, args)
elif task == "commit":
    out = tasks.commit_task(pipeline, args, dag_run_id="scheduled__production_shape")
elif task == "data_docs":
    out = tasks.data_docs_task(pipeline, args)
print("RESULT " + json.dumps(out, default=str))
"""


class Deployment:
    """The shared services of one test and a way to run a step on a "worker" of its own."""

    def __init__(self, tmp_path: Path, broker, postgres, s3_endpoint: str, bucket: str) -> None:
        from pyarrow import fs

        fs.S3FileSystem(
            endpoint_override=s3_endpoint, scheme="http", access_key=KEY, secret_key=SECRET, region="us-east-1", allow_bucket_creation=True
        ).create_dir(bucket)
        self.root, self.broker, self.bucket, self.endpoint = tmp_path, broker, bucket, s3_endpoint
        self.catalog_url = postgres.create_database(f"catalog_{bucket.replace('-', '_')}")
        self.steps = 0

    def pipeline(self, name: str, catalog_conn: str | None = None, **sections: object) -> str:
        """A pipeline file's text: catalog in PostgreSQL, warehouse and staging in the bucket, secrets by reference
        (``${ENV}``), or the whole catalog from the Airflow connection ``catalog_conn`` (``catalog_connection``)."""
        doc = {
            "name": name,
            "kafka": {"bootstrap_servers": self.broker.bootstrap},
            "catalog": {"name": "lake", "conn_id": catalog_conn}
            if catalog_conn
            else {
                "name": "lake",
                "properties": {
                    "type": "sql",
                    "uri": self.catalog_url,
                    "warehouse": f"s3://{self.bucket}/warehouse",
                    "s3.endpoint": self.endpoint,
                    "s3.access-key-id": "${TEST_S3_KEY}",
                    "s3.secret-access-key": "${TEST_S3_SECRET}",
                    "s3.region": "us-east-1",
                },
            },
            "batch": {"staging_dir": f"s3://{self.bucket}/staging"},
            "spark": {"master": "local[2]"},
            **sections,
        }
        doc["validation"] = {**doc.get("validation", {}), "data_docs_dir": f"s3://{self.bucket}/data-docs"}
        return json.dumps(doc)  # JSON is YAML

    def catalog_connection(self) -> str:
        """This deployment's catalog as an Airflow connection (``AIRFLOW_CONN_<ID>``'s JSON form): PostgreSQL in
        its fields, the warehouse and the bucket's credentials in its extra."""
        from urllib.parse import urlparse

        url = urlparse(self.catalog_url)
        return json.dumps(
            {
                "conn_type": "postgres",
                "host": url.hostname,
                "port": url.port,
                "login": url.username,
                "schema": url.path.lstrip("/"),
                "extra": {
                    "warehouse": f"s3://{self.bucket}/warehouse",
                    "s3.endpoint": self.endpoint,
                    "s3.access-key-id": KEY,
                    "s3.secret-access-key": SECRET,
                    "s3.region": "us-east-1",
                },
            }
        )

    def step(self, task: str, pipeline_text: str, args: object = None) -> object:
        """Run one task in a new process on a private directory (home, working directory, temporary files, Spark's
        local directories), removed afterwards; returns the task's result."""
        self.steps += 1
        private = self.root / f"worker-{self.steps}-{task}"
        (private / "pipelines").mkdir(parents=True)
        (private / "tmp").mkdir()
        pipeline = private / "pipelines" / "pipeline.yaml"
        pipeline.write_text(pipeline_text)
        env = {
            **os.environ,
            "TIDEWATER_HOME": str(private / "home"),
            "TIDEWATER_PIPELINES_DIR": str(pipeline.parent),
            "TMPDIR": str(private / "tmp"),
            "SPARK_LOCAL_DIRS": str(private / "tmp"),
            "TEST_S3_KEY": KEY,
            "TEST_S3_SECRET": SECRET,
        }
        proc = subprocess.run(
            [sys.executable, "-c", STEP, task, str(pipeline), json.dumps(args)],
            cwd=private,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{task}: {out[-4000:]}"
        assert SECRET not in out, f"{task} printed the secret key"
        shutil.rmtree(private)
        result = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        return json.loads(result[-1][len("RESULT ") :])

    def batch(self, pipeline_text: str, planned: dict | None = None) -> dict:
        """plan (unless given), write, validate, commit and the Data Docs page, each on its own worker."""
        planned = planned or self.step("plan", pipeline_text)
        assert planned and planned["plan_path"].startswith(f"s3://{self.bucket}/staging/"), planned
        self.step("write", pipeline_text, planned)
        self.step("validate", pipeline_text, planned)
        commit = self.step("commit", pipeline_text, planned)
        return {"planned": planned, "commit": commit, "pages": self.step("data_docs", pipeline_text, planned)}

    def table(self, pipeline_text: str):
        path = self.root / "reader.yaml"
        path.write_text(pipeline_text)
        spec = load_pipeline(path)
        return load_table(load_catalog(spec), spec.table.identifier)

    def staged(self) -> dict[str, bytes]:
        from pyarrow import fs

        s3 = fs.S3FileSystem(endpoint_override=self.endpoint, scheme="http", access_key=KEY, secret_key=SECRET, region="us-east-1")
        out = {}
        for info in s3.get_file_info(fs.FileSelector(f"{self.bucket}/staging", recursive=True, allow_not_found=True)):
            if info.type == fs.FileType.File:
                with s3.open_input_stream(info.path) as f:
                    out[info.path] = f.read()
        return out


def _temp_entries() -> set[str]:
    """What Tidewater, Spark or the JVM could leave in the shared temporary directory."""
    prefixes = ("tidewater", "spark", "blockmgr", "pyspark", "tmp")
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(prefixes)}


def test_ingest_change_and_replay_batches_with_every_step_on_its_own_worker(
    broker, topic, postgres, s3_endpoint, home, tmp_path, monkeypatch
):
    """An ingest batch (240 pizza events, 3 partitions), two change batches (Debezium, upserts by key) and a
    replace replay, every step in its own process and private directory: rows and offsets exact, the change
    table equal to the reference model of its source, the replay's rows identical and offsets unmoved; the
    batches' plans and manifests are in the bucket, nothing in the test's own home, and no step left anything in
    the shared temporary directory."""
    monkeypatch.setenv("TEST_S3_KEY", KEY)
    monkeypatch.setenv("TEST_S3_SECRET", SECRET)
    before = _temp_entries()
    d = Deployment(tmp_path, broker, postgres, s3_endpoint, "production")
    orders = d.pipeline(
        "orders", topics=[topic], table={"identifier": "rpc.orders"}, format={"metadata": "prefixed"}, validation={"not_null": ["order_id"]}
    )
    produce(broker.bootstrap, topic, pizza_events(240, seed=170), partitions=3)
    first = d.batch(orders)
    assert first["commit"]["status"] == "committed"
    table = d.table(orders)
    ids = table.scan().to_arrow().column("order_id").to_pylist()
    assert len(ids) == len(set(ids)) == 240
    assert committed_state(table).offsets == {topic: {0: 80, 1: 80, 2: 80}}
    assert d.step("plan", orders) is None, "nothing new: the plan step stages nothing"

    changes_topic = f"{topic}-changes"
    prices = d.pipeline(
        "prices",
        topics=[changes_topic],
        format={"value": "debezium"},
        validation={"not_null": ["id"]},
        table={"identifier": "rpc.prices", "id_columns": ["id"], "upsert": True},
    )
    model: dict[int, dict] = {}
    for b in range(2):
        changes = change_stream(model, 60, keys=20, seed=171 + b)
        produce_to_partition(broker.bootstrap, changes_topic, 0, [v for _, v in encode(changes, model, "debezium")])
        assert d.batch(prices)["commit"]["status"] == "committed"
        model = apply(model, changes)
    rows = {r["id"]: r["item"] for r in d.table(prices).scan(selected_fields=("id", "item")).to_arrow().to_pylist()}
    assert rows == {k: v["item"] for k, v in model.items()}

    content = sorted(
        d.table(orders).scan(selected_fields=("_kafka_partition", "_kafka_offset", "order_id")).to_arrow().to_pylist(),
        key=lambda r: (r["_kafka_partition"], r["_kafka_offset"]),
    )
    planned = d.step("replay_plan", orders, {"topic": topic, "partitions": "1", "start_offset": 10, "end_offset": 50, "mode": "replace"})
    replay = d.batch(orders, planned)
    assert replay["commit"]["status"] == "committed"
    table = d.table(orders)
    after = sorted(
        table.scan(selected_fields=("_kafka_partition", "_kafka_offset", "order_id")).to_arrow().to_pylist(),
        key=lambda r: (r["_kafka_partition"], r["_kafka_offset"]),
    )
    assert after == content
    assert json.loads(table.current_snapshot().summary.additional_properties[REPLAY])["ranges"] == [[topic, 1, 10, 50]]
    assert committed_state(table).offsets == {topic: {0: 80, 1: 80, 2: 80}}

    staged = d.staged()
    for run in (first, replay):
        prefix = run["planned"]["plan_path"][len("s3://") :].rsplit("/", 1)[0]
        assert {f"{prefix}/plan.json", f"{prefix}/manifest.json"} <= set(staged), sorted(staged)
        page = run["pages"] or []  # rendered by its own worker, kept in the bucket
        assert len(page) == 1 and page[0].startswith("s3://production/data-docs/orders/gx/uncommitted/data_docs/")
        assert run["planned"]["batch_id"] in page[0]
    assert not any(SECRET.encode() in b for b in staged.values())
    assert not (home / "staging").exists()
    assert _temp_entries() <= before, _temp_entries() - before


def test_the_ingest_dag_through_airflows_local_executor_on_postgresql(broker, topic, postgres, s3_endpoint, tmp_path, monkeypatch):
    """The ingest DAG run by Airflow's scheduler with PostgreSQL as its metadata database and its LocalExecutor
    (`airflow standalone`: each task a separate process), staging in the bucket and the catalog in PostgreSQL, the
    catalog and the bucket's credentials from an Airflow connection (`catalog.conn_id`; the spark-submit driver gets
    them from the write task): one triggered run lands 150 records once with exact offsets; its tasks ran in separate
    processes; nothing was staged under the Airflow workers' TIDEWATER_HOME, the batch's plan and manifest are in the
    bucket; XCom carries the plan's location and no credential, and no task log shows the secret key."""
    import psycopg2

    from tests.conftest import REPO
    from tests.e2e.conftest import standalone, wait_for_runs

    d = Deployment(tmp_path, broker, postgres, s3_endpoint, "airflow-shape")
    monkeypatch.setenv("AIRFLOW_CONN_TIDEWATER_CATALOG", d.catalog_connection())  # this process reads the table too
    orders = d.pipeline(
        "orders",
        catalog_conn="tidewater_catalog",
        topics=[topic],
        table={"identifier": "rpc.orders"},
        schedule=None,
        validation={"not_null": ["order_id"]},
    )
    assert SECRET not in orders and KEY not in orders
    pipelines, af, tw_home = tmp_path / "pipelines", tmp_path / "airflow", tmp_path / "tidewater-home"
    for p in (pipelines, af, tw_home):
        p.mkdir()
    (pipelines / "orders.yaml").write_text(orders)
    metadata = postgres.create_database("airflow_shape")
    env = {
        **os.environ,
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        "AIRFLOW_HOME": str(af),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata,
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW_CONN_TIDEWATER_SPARK": '{"conn_type": "spark", "host": "local[2]"}',
        "TIDEWATER_PIPELINES_DIR": str(pipelines),
        "TIDEWATER_HOME": str(tw_home),
    }
    migrate = subprocess.run(["airflow", "db", "migrate"], env=env, capture_output=True, text=True, timeout=600)
    assert migrate.returncode == 0, migrate.stdout[-2000:] + migrate.stderr[-2000:]
    produce(broker.bootstrap, topic, pizza_events(150, seed=180), partitions=3)
    with standalone(env, tmp_path) as env:
        for cmd in (["dags", "unpause", "ingest_orders"], ["dags", "trigger", "ingest_orders"]):
            subprocess.run(["airflow", *cmd], env=env, check=True, capture_output=True, timeout=120)
        runs = wait_for_runs(env, "ingest_orders", 420)
    assert [r["state"] for r in runs] == ["success"], runs
    table = d.table(orders)
    ids = table.scan().to_arrow().column("order_id").to_pylist()
    assert len(ids) == len(set(ids)) == 150
    assert committed_state(table).offsets == {topic: {0: 50, 1: 50, 2: 50}}
    conn = psycopg2.connect(metadata.replace("postgresql+psycopg2", "postgresql"))
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT task_id, state, pid FROM task_instance WHERE dag_id = 'ingest_orders'")
            tasks = {t: (state, pid) for t, state, pid in cur.fetchall()}
            cur.execute("SELECT task_id, value::text FROM xcom WHERE dag_id = 'ingest_orders'")
            xcoms = cur.fetchall()
    finally:
        conn.close()
    assert any(t == "plan" and "s3://airflow-shape/staging/" in v for t, v in xcoms), xcoms
    assert not any(SECRET in v or KEY in v for _, v in xcoms), "a credential in XCom"
    logs = [p for p in (af / "logs").rglob("*") if p.is_file()]
    assert logs and not any(SECRET in p.read_text(errors="replace") for p in logs), "a credential in a task log"
    steps = ("plan", "write", "validate", "commit")
    assert all(tasks[t][0] == "success" for t in steps), tasks
    assert len({tasks[t][1] for t in steps}) == len(steps), f"each task in its own process: {tasks}"
    assert not (tw_home / "staging").exists()
    staged = d.staged()
    assert any(k.endswith("/plan.json") for k in staged) and any(k.endswith("/manifest.json") for k in staged)
