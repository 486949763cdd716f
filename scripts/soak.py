"""`make soak`: production on this machine for SOAK_MINUTES (default 60), with faults, then every table audited.

What runs (all real, on 127.0.0.1): Debian's PostgreSQL (Airflow's metadata and the Iceberg catalog), the embedded
broker, the local S3 endpoint (moto's server, the stand-in for S3/MinIO: batches are staged in its bucket), the schema
registry (Apicurio Registry, `make schema-registry`; the Avro schema registered there), a Spark Connect server,
and Airflow's api-server, scheduler (LocalExecutor) and DAG processor as separate processes. Three pipelines run
on a schedule (SOAK_SCHEDULE, default every minute) while producers feed them continuously:

- ``soak_events``: JSON events, appended, written through the Spark Connect server; the quality gate quarantines
  a batch holding a record without an ``order_id`` (two such records are produced: one batch is published, one
  dropped, each answered in its decision run's Required action through Airflow's REST API, as the UI does, and
  answered again when Airflow fails the decision task after the answer and asks again);
- ``soak_db``: a 10-table Debezium database in one routed pipeline (upserts and deletes by key), spark-submit;
- ``soak_avro``: Avro through the registry, appended, spark-submit.

Faults at random times: SIGKILL of a running task's process, of the scheduler (then restarted) and of the Connect
server (restarted); a catalog lock held for a while; a Spark-side ``expire_snapshots`` with ``retain_last => 1`` and
a ``rewrite_data_files`` from outside. Operations beside them: maintenance DAG runs and replays of random committed
ranges (``soak_avro``: replace or append-missing; ``soak_db``: reapply). The scheduler's and the Connect server's
resident memory is sampled. At the end the producers stop, the pipelines drain, and then: ``tidewater audit --deep``
of every pipeline (no discrepancy), every table equal to the model of what was produced (rows, keys, values), lag 0,
no quarantined batch waiting and every decision run a success.

Writes ``report.json`` in the work folder and prints a Markdown summary (``--markdown FILE`` writes it too). Exit 0
when every check passed. ``tests/e2e/test_soak.py`` runs the 3-minute version in ``make test``.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

from tidewater_dev.broker import free_port

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CATALOG = "lake"
KEY, SECRET = "soak-access-key", "soak-secret-value"  # the local S3 endpoint's (any are accepted)
DB_TABLES, DB_PARTITIONS, EVENT_PARTITIONS, AVRO_PARTITIONS = 10, 2, 3, 2
READING = {
    "type": "record",
    "name": "Reading",
    "namespace": "soak",
    "fields": [{"name": "reading_id", "type": "string"}, {"name": "sensor", "type": "int"}, {"name": "value", "type": "double"}],
}
FAULTS = ("kill_task", "kill_scheduler", "kill_connect", "catalog_lock", "outside_expire", "outside_compaction")
OPERATIONS = ("maintain", "replay_avro", "replay_db")
ONCE = ("kill_scheduler", "kill_connect")  # once per run: the rest of the run measures their memory in one lifetime


def log(msg: str) -> None:
    print(f"[soak {datetime.now(timezone.utc):%H:%M:%S}] {msg}", flush=True)


class Services:
    """The shared services and Airflow's components; restartable where the faults need it."""

    def __init__(self, work: Path) -> None:
        from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

        from tidewater_dev import broker, postgres, schema_registry, spark_connect

        self.work = work
        self.postgres = postgres.start(work / "postgres.log")
        self.broker = broker.start(log_path=work / "broker.log")
        self.s3_url, self.s3 = self._start_s3()
        self.registry = schema_registry.start(work / "schema-registry", work / "schema-registry.log")
        self.registry_url = self.registry.url
        self.reading_id = SchemaRegistryClient({"url": self.registry_url}).register_schema(
            "soak-avro-value", Schema(json.dumps(READING), "AVRO")
        )
        self.connect_log = work / "spark-connect.log"
        self.connect = spark_connect.start(REPO / ".data" / "spark-connect", log_path=self.connect_log)
        self.catalog_url = self.postgres.create_database("soak_catalog")
        self.metadata_url = self.postgres.create_database("soak_airflow")
        self.airflow: dict[str, subprocess.Popen] = {}
        self.api_port = free_port()

    def _start_s3(self) -> tuple[str, subprocess.Popen]:
        import urllib.request

        server = REPO / ".data" / "moto" / "bin" / "moto_server"
        if not server.is_file():
            raise SystemExit(f"{server} is missing: run `make s3-stand-in`")
        port = free_port()
        proc = subprocess.Popen(
            [str(server), "-H", "127.0.0.1", "-p", str(port)],
            stdout=open(self.work / "s3.log", "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/moto-api/", timeout=2).close()
                break
            except OSError:
                time.sleep(0.2)
        from pyarrow import fs

        fs.S3FileSystem(
            endpoint_override=url, scheme="http", access_key=KEY, secret_key=SECRET, region="us-east-1", allow_bucket_creation=True
        ).create_dir("soak")
        return url, proc

    def restart_connect(self) -> None:
        from tidewater_dev import spark_connect

        self.connect = spark_connect.start(REPO / ".data" / "spark-connect", port=self.connect.port, log_path=self.connect_log)

    def env(self) -> dict[str, str]:
        af = self.work / "airflow"
        return {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "AIRFLOW_HOME": str(af),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.metadata_url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.api_port}/execution/",
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__API_AUTH__JWT_SECRET": "soak-jwt-secret-" + "x" * 32,
            "AIRFLOW__API__SECRET_KEY": "soak-api-secret",
            # the tasks a killed scheduler had started are found (their scheduler's heartbeat stopped) and reset within
            # a minute, not Airflow's five; a task that stops heartbeating is failed after a minute
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "30",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
            "AIRFLOW_CONN_TIDEWATER_SPARK": '{"conn_type": "spark", "host": "local[2]"}',
            "TIDEWATER_PIPELINES_DIR": str(self.work / "pipelines"),
            "TIDEWATER_HOME": str(self.work / "home"),
            "SOAK_S3_KEY": KEY,
            "SOAK_S3_SECRET": SECRET,
            "GX_ANALYTICS_ENABLED": "false",
        }

    def start_airflow(self) -> None:
        env = self.env()
        (self.work / "airflow").mkdir(exist_ok=True)
        run(["airflow", "db", "migrate"], env, timeout=900)
        run(["airflow", "dags", "reserialize"], env, timeout=600)
        for name in ("api-server", "dag-processor", "scheduler"):
            self.start_component(name)
        wait_http(f"http://127.0.0.1:{self.api_port}/api/v2/monitor/health", 240)

    def start_component(self, name: str) -> None:
        out = open(self.work / f"airflow-{name}.log", "ab")
        self.airflow[name] = subprocess.Popen(
            ["airflow", name], env=self.env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def kill_component(self, name: str) -> None:
        proc = self.airflow[name]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait(timeout=60)

    def stop_airflow(self) -> None:
        for name, proc in list(self.airflow.items()):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
            del self.airflow[name]

    def stop(self) -> None:
        self.stop_airflow()
        self.connect.stop()
        self.registry.stop()
        self.s3.terminate()
        self.broker.stop()
        self.postgres.stop()


def wait_http(url: str, seconds: float) -> None:
    from tidewater_dev.process import answers_http

    if not answers_http(url, seconds):
        raise SystemExit(f"{url} did not answer within {seconds:.0f} s")


def run(cmd: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} exited {proc.returncode}: {(proc.stderr or proc.stdout)[-2000:]}")
    return proc


def pipelines(svc: Services, schedule: str) -> dict[str, Path]:
    """The three pipeline files in the pipelines folder the DAGs read."""
    folder = svc.work / "pipelines"
    folder.mkdir(exist_ok=True)
    s3 = {
        "s3.endpoint": svc.s3_url,
        "s3.access-key-id": "${SOAK_S3_KEY}",
        "s3.secret-access-key": "${SOAK_S3_SECRET}",
        "s3.region": "us-east-1",
    }
    common = {
        "kafka": {"bootstrap_servers": svc.broker.bootstrap, "read_timeout_seconds": 30},
        "catalog": {
            "name": CATALOG,
            "properties": {"type": "sql", "uri": svc.catalog_url, "warehouse": f"file://{svc.work / 'warehouse'}"},
        },
        "batch": {"staging_dir": "s3://soak/staging", "staging_properties": s3, "max_records": 200000},
        "schedule": schedule,
        "airflow": {"retries": 4, "retry_delay_seconds": 10, "task_timeout_minutes": 20},
        "maintenance": {"schedule": None},
        "audit": {"schedule": None},
        "spark": {"master": "local[2]"},
    }
    db_topics = [f"soak-db-{i}" for i in range(DB_TABLES)]
    docs = {
        "soak_events": {
            "topics": ["soak-events"],
            "table": {"identifier": "rpc.soak_events"},
            "validation": {"not_null": ["order_id"], "on_failure": "quarantine"},
            "spark": {"master": "local[2]", "connect_url": svc.connect.url},
        },
        "soak_db": {
            "topics": db_topics,
            "table": {"identifier": ""},
            "routing": {"namespace": "rpc"},
            "tables": [
                {"identifier": f"rpc.soak_db_{i}", "topics": [t], "id_columns": ["id"], "upsert": True} for i, t in enumerate(db_topics)
            ],
            "format": {"value": "debezium"},
            "validation": {"not_null": ["id"]},
        },
        "soak_avro": {
            "topics": ["soak-avro"],
            "table": {"identifier": "rpc.soak_avro"},
            "format": {"value": "avro", "registry_url": svc.registry_url},
            "validation": {"not_null": ["reading_id"]},
        },
    }
    out = {}
    for name, doc in docs.items():
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"name": name, **common, **doc}))
        out[name] = path
    return out


class Producers(threading.Thread):
    """Continuous producers for the three pipelines, and the models of what they produced: the events and readings
    by id (the events by partition and offset too, for the dropped quarantined batch), each source table by key."""

    def __init__(self, bootstrap: str, seed: int, first_null: float, reading_id: int) -> None:
        super().__init__(name="producers", daemon=True)
        from confluent_kafka import Producer

        self.reading_frame = b"\x00" + reading_id.to_bytes(4, "big")  # Confluent's framing: magic byte, schema id

        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
        self.rng = random.Random(seed)
        self.stopping = threading.Event()
        self.events: dict[tuple[int, int], str | None] = {}  # (partition, offset) -> order_id
        self.readings: collections.Counter = collections.Counter()
        self.models: list[dict[int, dict]] = [{} for _ in range(DB_TABLES)]
        self.sent: collections.Counter = collections.Counter()
        # a record without order_id at ``first_null`` (monotonic time), another once ``more_nulls`` is set (after the
        # first quarantined batch was decided: the two are then in different batches)
        self.null_times = [first_null]
        self.more_nulls = threading.Event()
        self.nulls: list[tuple[int, int]] = []
        self.seq = 0
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.tick()
            except Exception as e:  # noqa: BLE001 - reported, and the run then fails its checks
                self.errors.append(repr(e))
                log(f"producer error: {e!r}")
            self.stopping.wait(1.0)

    def tick(self) -> None:
        import fastavro

        records: list[tuple[str, int, bytes | None, bytes | None, object]] = []
        for _ in range(self.rng.randint(10, 30)):
            self.seq += 1
            oid: str | None = f"e{self.seq}"
            due = bool(self.null_times) and time.monotonic() >= self.null_times[0]
            if due or self.more_nulls.is_set():
                if due:
                    self.null_times.pop(0)
                else:
                    self.more_nulls.clear()
                oid = None  # the quality gate quarantines its batch
            doc = {"order_id": oid, "store": self.seq % 17, "amount": round(self.rng.uniform(1, 90), 2)}
            records.append(("soak-events", self.seq % EVENT_PARTITIONS, None, json.dumps(doc).encode(), ("event", oid)))
        parsed = fastavro.parse_schema(READING)
        for _ in range(self.rng.randint(5, 15)):
            self.seq += 1
            buf = io.BytesIO()
            rid = f"r{self.seq}"
            fastavro.schemaless_writer(buf, parsed, {"reading_id": rid, "sensor": self.seq % 11, "value": self.seq / 7})
            records.append(("soak-avro", self.seq % AVRO_PARTITIONS, None, self.reading_frame + buf.getvalue(), ("reading", rid)))
        changed = self._changes(records)
        self.send(records)
        for i, model in changed.items():
            self.models[i] = model

    def _changes(self, records: list) -> dict[int, dict]:
        """Debezium changes of two random source tables (each key in one partition, in order)."""
        from tidewater_dev.changes import apply, change_stream, encode

        out = {}
        for i in self.rng.sample(range(DB_TABLES), 2):
            stream = change_stream(self.models[i], self.rng.randint(4, 12), keys=40, seed=self.rng.randrange(10**9))
            for key, value in encode(stream, self.models[i], "debezium"):
                records.append((f"soak-db-{i}", key % DB_PARTITIONS, json.dumps({"id": key}).encode(), value, None))
            out[i] = apply(self.models[i], stream)
        return out

    def send(self, records: list) -> None:
        """Every record, the last of each partition in its own request (the embedded broker's high watermark is the
        base offset of the last batch + 1, see STACK.md); raises when one was not delivered."""
        lasts: dict[tuple[str, int], tuple] = {}
        for rec in records:
            lasts[(rec[0], rec[1])] = rec
        failed: list[str] = []

        def delivered(tag: object):
            def on_delivery(err, msg) -> None:
                if err is not None:
                    failed.append(str(err))
                elif tag is not None and tag[0] == "event":  # type: ignore[index]
                    self.events[(msg.partition(), msg.offset())] = tag[1]  # type: ignore[index]
                    if tag[1] is None:  # type: ignore[index]
                        self.nulls.append((msg.partition(), msg.offset()))
                elif tag is not None:
                    self.readings[tag[1]] += 1  # type: ignore[index]

            return on_delivery

        last_ids = {id(r) for r in lasts.values()}
        for group in ([r for r in records if id(r) not in last_ids], list(lasts.values())):
            for topic, part, key, value, tag in group:
                self.producer.produce(topic, value, key=key, partition=part, on_delivery=delivered(tag))
                self.sent[topic.rsplit("-", 1)[0] if topic.startswith("soak-db") else topic] += 1
            if self.producer.flush(60):
                raise RuntimeError("records not delivered within 60 s")
        if failed:
            raise RuntimeError(f"{len(failed)} records not delivered: {failed[0]}")


def create_topics(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    wanted = [NewTopic("soak-events", EVENT_PARTITIONS, 1), NewTopic("soak-avro", AVRO_PARTITIONS, 1)]
    wanted += [NewTopic(f"soak-db-{i}", DB_PARTITIONS, 1) for i in range(DB_TABLES)]
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the results are in
    for fut in admin.create_topics(wanted).values():
        fut.result(timeout=30)


def _is_task_process(pid: int) -> bool:
    import psutil

    try:
        return "airflow" in " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def metadata_query(svc: Services, sql: str) -> list[tuple]:
    import psycopg2

    conn = psycopg2.connect(svc.metadata_url.replace("postgresql+psycopg2", "postgresql"))
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetchall()
    finally:
        conn.close()


def trigger(svc: Services, dag_id: str, conf: dict | None = None, run_id: str | None = None) -> None:
    run(
        ["airflow", "dags", "trigger", dag_id, *(["--conf", json.dumps(conf)] if conf else []), *(["--run-id", run_id] if run_id else [])],
        svc.env(),
        timeout=180,
    )


# How long the soak's "person" reads a decision before answering it. An answer within a second or two of the question
# meets Airflow 3.3's race (apache/airflow#72716: the scheduler fails the resumed task), which the decide task's
# retries absorb; a person takes longer than that, and the soak decides as one would. Answers given again are counted.
READING_SECONDS = 20
# a decide task waiting for its answer: awaiting_input on Airflow 3.3, deferred before
WAITING_STATES = ("awaiting_input", "deferred")


def respond(svc: Services, dag_id: str, batch_id: str, action: str) -> bool:
    """Answer the decision run of a quarantined batch as the admin user would in Airflow's Required actions (the
    REST call the UI's Publish and Drop buttons make), once it has waited READING_SECONDS. False while its ``decide``
    task is not waiting for an answer (not yet, or answered already: a retry of a task Airflow failed after the
    answer asks again, and is answered then) or was asked less than READING_SECONDS ago."""
    import urllib.error
    import urllib.request

    from tidewater.ops.quarantine import decision_run_id

    base = f"http://127.0.0.1:{svc.api_port}"
    home = Path(svc.env()["AIRFLOW_HOME"])
    password = json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
    detail = f"{base}/api/v2/dags/{dag_id}/dagRuns/{decision_run_id(batch_id)}/taskInstances/decide/-1/hitlDetails"

    def call(method: str, url: str, body: dict | None, token: str | None = None) -> dict:
        req = urllib.request.Request(
            url,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    try:
        token = call("POST", f"{base}/auth/token", {"username": "admin", "password": password})["access_token"]
        asked = call("GET", detail, None, token)
        if asked.get("response_received") or (asked.get("task_instance") or {}).get("state") not in WAITING_STATES:
            return False
        if (datetime.now(timezone.utc) - datetime.fromisoformat(asked["created_at"])).total_seconds() < READING_SECONDS:
            return False  # a person reads the question first
        call("PATCH", detail, {"chosen_options": [action.capitalize()], "params_input": {"reason": f"soak: {action}"}}, token)
    except (urllib.error.URLError, OSError) as e:  # not waiting yet (404), or the API server restarting
        log(f"quarantine decision on {batch_id} not answered yet: {e}")
        return False
    return True


class Chaos(threading.Thread):
    """The faults and operations, one at a time at their planned times, and the quarantine's decisions."""

    def __init__(self, svc: Services, files: dict[str, Path], plan: list[tuple[float, str]], seed: int, producers: Producers) -> None:
        super().__init__(name="chaos", daemon=True)
        self.svc, self.files, self.plan, self.rng = svc, files, plan, random.Random(seed)
        self.producers = producers
        self.t0 = time.monotonic()
        self.stopping = threading.Event()
        self.done: list[dict] = []
        self.decisions: dict[str, str] = {}  # quarantined batch id -> publish | drop
        self.answers: collections.Counter = collections.Counter()  # quarantined batch id -> times answered
        self.dropped_ranges: list[tuple[str, int, int, int]] = []

    def run(self) -> None:
        for due, name in self.plan:
            while time.monotonic() < due and not self.stopping.is_set():
                self.watch_quarantine()
                self.stopping.wait(min(10.0, max(0.0, due - time.monotonic())))
            if self.stopping.is_set():
                return
            started = time.monotonic()
            try:
                outcome, detail = "done", getattr(self, name)()
            except Exception as e:  # noqa: BLE001 - an operation that failed is reported, and fails the run
                outcome, detail = "error", repr(e)[:500]
            self.done.append(
                {
                    "name": name,
                    "at": round(started - self.t0),
                    "outcome": outcome,
                    "detail": detail,
                    "seconds": round(time.monotonic() - started, 1),
                }
            )
            log(f"{name}: {outcome} {detail}")

    # --- faults -----------------------------------------------------------------------------------------------
    def kill_task(self) -> str:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            rows = metadata_query(
                self.svc,
                "SELECT dag_id, task_id, pid FROM task_instance WHERE state = 'running' "
                "AND pid IS NOT NULL AND dag_id LIKE 'ingest_soak_%'",
            )
            rows.sort(key=lambda r: {"commit": 0, "write": 1, "validate": 2}.get(r[1], 3))
            for dag_id, task_id, pid in rows:
                if not _is_task_process(pid):  # a stale pid (its task died with a scheduler) may be reused
                    continue
                try:
                    os.kill(pid, signal.SIGKILL)
                    return f"{dag_id}.{task_id} (pid {pid})"
                except OSError:
                    continue
            time.sleep(2)
        raise RuntimeError("no running task to kill within 180 s")

    def kill_scheduler(self) -> str:
        pid = self.svc.airflow["scheduler"].pid
        self.svc.kill_component("scheduler")
        time.sleep(5)
        self.svc.start_component("scheduler")
        return f"pid {pid} and its executor's workers killed; restarted as pid {self.svc.airflow['scheduler'].pid}"

    def kill_connect(self) -> str:
        pid = self.svc.connect.pid
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        deadline = time.monotonic() + 120
        while True:
            time.sleep(5)
            try:
                self.svc.restart_connect()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
        return f"pid {pid} killed; restarted as pid {self.svc.connect.pid}"

    def catalog_lock(self) -> str:
        import psycopg2

        conn = psycopg2.connect(self.svc.catalog_url.replace("postgresql+psycopg2", "postgresql"))
        try:
            with conn.cursor() as cur:
                cur.execute("LOCK TABLE iceberg_tables IN ACCESS EXCLUSIVE MODE")
                time.sleep(20)
            conn.commit()
        finally:
            conn.close()
        return "iceberg_tables locked for 20 s"

    def _outside(self, call: str) -> str:
        from tidewater.config.parse import load_pipeline
        from tidewater.table.catalog import load_catalog, load_table

        catalog = load_catalog(load_pipeline(self.files["soak_events"]))
        names = ["rpc.soak_events", "rpc.soak_avro", *(f"rpc.soak_db_{i}" for i in range(DB_TABLES))]
        written = [n for n in names if (t := load_table(catalog, n)) is not None and t.current_snapshot() is not None]
        if not written:
            raise RuntimeError("no table has a snapshot yet")
        table = self.rng.choice(written)
        sql = call.format(catalog=CATALOG, table=table)
        failures = []
        for _ in range(3):  # another tool's commit may lose a race with a batch (Iceberg's validation): it tries again
            proc = subprocess.run(
                ["tidewater", "sql", "--pipeline", str(self.files["soak_events"]), sql],
                env=self.svc.env(),
                capture_output=True,
                text=True,
                timeout=900,
            )
            if proc.returncode == 0:
                return f"{table}" + (f" (after {len(failures)} failed attempts: {failures[-1]})" if failures else "")
            failures.append(proc.stderr.strip().splitlines()[-1][-300:] if proc.stderr.strip() else f"exit {proc.returncode}")
        raise RuntimeError(f"{table}: {failures}")

    def outside_expire(self) -> str:
        return self._outside(
            "CALL {catalog}.system.expire_snapshots(table => '{table}', older_than => TIMESTAMP '2100-01-01 00:00:00', retain_last => 1)"
        )

    def outside_compaction(self) -> str:
        return self._outside("CALL {catalog}.system.rewrite_data_files(table => '{table}', options => map('min-input-files','2'))")

    # --- operations ---------------------------------------------------------------------------------------------
    def maintain(self) -> str:
        name = self.rng.choice(sorted(self.files))
        trigger(self.svc, f"maintain_{name}")
        return f"maintain_{name} triggered"

    def _replay(self, name: str, topics: list[str], mode: str) -> str:
        from tidewater.config.parse import load_pipeline
        from tidewater.ops.status import status

        deadline = time.monotonic() + 300
        while True:  # early in a run: wait for the pipeline's first commits
            parts = [
                p for p in status(load_pipeline(self.files[name]))["partitions"] if p["topic"] in topics and (p["committed"] or 0) >= 2
            ]
            if parts or time.monotonic() > deadline:
                break
            time.sleep(10)
        if not parts:
            raise RuntimeError(f"nothing of {topics} committed within 300 s: no range to replay")
        p = self.rng.choice(parts)
        start = self.rng.randrange(0, p["committed"] - 1)
        end = min(p["committed"], start + self.rng.randint(1, 300))
        conf = {"topic": p["topic"], "partitions": [p["partition"]], "start_offset": start, "end_offset": end, "mode": mode}
        trigger(self.svc, f"replay_{name}", conf)
        return f"replay_{name} triggered with {conf}"

    def replay_avro(self) -> str:
        return self._replay("soak_avro", ["soak-avro"], self.rng.choice(["replace", "append-missing"]))

    def replay_db(self) -> str:
        return self._replay("soak_db", [f"soak-db-{self.rng.randrange(DB_TABLES)}"], "reapply")

    # --- the quality gate's quarantine ----------------------------------------------------------------------------
    def watch_quarantine(self) -> None:
        """The first quarantined batch is published, the second dropped, any later one published: each as a person
        decides it, in its decision run's Required action (runtime/decisions.py), through Airflow's REST API. A batch
        whose decision is not waiting yet is looked at again on the next call."""
        from tidewater.config.parse import load_pipeline
        from tidewater.ops import quarantine
        from tidewater.table.catalog import load_catalog, load_table
        from tidewater.table.summary import RANGES, summary_dict

        spec = load_pipeline(self.files["soak_events"])
        for q in quarantine.list_all(spec):
            batch = q["batch_id"]
            if batch in self.decisions:  # decided, and still waiting: answered again once Airflow asks again
                if respond(self.svc, "quarantine_soak_events", batch, self.decisions[batch]):
                    self.answers[batch] += 1
                    log(f"quarantine_{self.decisions[batch]}: {batch} asked again (answer {self.answers[batch]})")
                continue
            action = "drop" if list(self.decisions.values()) == ["publish"] else "publish"
            if action == "drop":  # what the model leaves out: the records of the batch's ranges
                table = load_table(load_catalog(spec), spec.table.identifier)
                ranges = [tuple(r) for r in json.loads(summary_dict(table.snapshot_by_name(q["branch"]))[RANGES])]
            if not respond(self.svc, "quarantine_soak_events", batch, action):
                continue
            self.decisions[batch], self.answers[batch] = action, 1
            if action == "drop":
                self.dropped_ranges += ranges
            if len(self.decisions) == 1:
                self.producers.more_nulls.set()  # the second, for a batch of its own
            self.done.append(
                {
                    "name": f"quarantine_{action}",
                    "at": round(time.monotonic() - self.t0),
                    "outcome": "done",
                    "detail": batch,
                    "seconds": 0,
                }
            )
            log(f"quarantine_{action}: {batch} ({q['rows']} rows)")


def chaos_plan(start: float, seconds: float, seed: int) -> list[tuple[float, str]]:
    """Every fault and operation once per round of 15 minutes (the scheduler's and Connect server's kills once per
    run), at random times within the round, between 10% and 85% of the run."""
    rng = random.Random(seed)
    rounds = max(1, round(seconds / 900))
    lo, hi = 0.10 * seconds, 0.85 * seconds
    width = (hi - lo) / rounds
    plan = []
    for r in range(rounds):
        for name in (*FAULTS, *OPERATIONS):
            if name in ONCE and r > 0:
                continue
            plan.append((start + lo + r * width + rng.uniform(0, width), name))
    return sorted(plan)


class Monitor(threading.Thread):
    """The resident memory of the scheduler's process and of the Connect server's JVM, every 15 s."""

    def __init__(self, svc: Services) -> None:
        super().__init__(name="monitor", daemon=True)
        self.svc, self.samples, self.stopping = svc, [], threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        import psutil

        while not self.stopping.wait(15):
            for name, pid in (("scheduler", self.svc.airflow["scheduler"].pid), ("spark-connect", self.svc.connect.pid)):
                try:
                    rss = psutil.Process(pid).memory_info().rss
                except psutil.Error:
                    continue
                self.samples.append({"process": name, "pid": pid, "t": round(time.monotonic() - self.t0), "rss_mb": rss >> 20})


def lags(files: dict[str, Path]) -> dict[str, int]:
    from tidewater.config.parse import load_pipeline
    from tidewater.ops.status import status

    return {name: status(load_pipeline(path))["total_lag"] for name, path in files.items()}


def drain(svc: Services, files: dict[str, Path], chaos: Chaos, seconds: float) -> dict[str, int]:
    """Wait until every pipeline's lag is 0 and no quarantined batch waits, then pause the ingest DAGs and wait until
    nothing is in flight (``IN_FLIGHT``); returns the lags then."""
    from tidewater.config.parse import load_pipeline
    from tidewater.ops import quarantine

    deadline = time.monotonic() + seconds
    current: dict[str, int] = {}
    while time.monotonic() < deadline:
        chaos.watch_quarantine()
        if chaos.producers.more_nulls.is_set():  # asked for after the producers stopped: produced here
            chaos.producers.tick()
        current = lags(files)
        waiting = quarantine.list_all(load_pipeline(files["soak_events"]))
        log(f"draining: lag {current}, quarantined waiting {len(waiting)}, decided {len(chaos.decisions)}")
        if not any(current.values()) and not waiting and len(chaos.decisions) >= 2:
            break
        time.sleep(15)
    for name in files:
        run(["airflow", "dags", "pause", f"ingest_{name}"], svc.env())
    while time.monotonic() < deadline:
        if not metadata_query(svc, IN_FLIGHT):
            break
        time.sleep(10)
    return lags(files)


# What may still change a table: a run of a DAG that is not paused, or a task already queued or running (of any DAG).
# A run of a paused DAG whose tasks were not queued yet never goes on (the scheduler leaves paused DAGs' runs alone):
# waiting for it waited out the whole drain deadline, about ten minutes of every soak test.
IN_FLIGHT = (
    "SELECT r.dag_id FROM dag_run r JOIN dag d ON d.dag_id = r.dag_id "
    "WHERE r.state IN ('queued', 'running') AND NOT d.is_paused "
    "UNION SELECT dag_id FROM task_instance WHERE state IN ('queued', 'running', 'restarting', 'deferred')"
)


def table_checks(files: dict[str, Path], producers: Producers, dropped: list[tuple]) -> dict[str, dict]:
    """Every table against the model of what was produced: the events (less the dropped batch's) and the readings
    by id, each once; each source table row by row."""
    from tidewater.config.parse import load_pipeline
    from tidewater.table.catalog import load_catalog, load_table

    catalog = load_catalog(load_pipeline(files["soak_events"]))

    def column(ident: str, name: str) -> collections.Counter:
        return collections.Counter(load_table(catalog, ident).scan(selected_fields=(name,)).to_arrow().column(name).to_pylist())

    gone = {(p, o) for _, p, s, e in dropped for o in range(s, e)}
    events = collections.Counter(v for k, v in producers.events.items() if k not in gone)
    out = {
        "rpc.soak_events": _compare(column("rpc.soak_events", "order_id"), events),
        "rpc.soak_avro": _compare(column("rpc.soak_avro", "reading_id"), producers.readings),
    }
    for i, model in enumerate(producers.models):
        rows = load_table(catalog, f"rpc.soak_db_{i}").scan(selected_fields=("id", "item", "price")).to_arrow().to_pylist()
        got = {r["id"]: r for r in rows}
        out[f"rpc.soak_db_{i}"] = {
            "rows": len(rows),
            "expected": len(model),
            "equal": len(got) == len(rows) and got == {k: {"id": k, **{c: v[c] for c in ("item", "price")}} for k, v in model.items()},
        }
    return out


def _compare(got: collections.Counter, expected: collections.Counter) -> dict:
    return {
        "rows": sum(got.values()),
        "expected": sum(expected.values()),
        "equal": got == expected,
        "missing": sum((expected - got).values()),
        "extra": sum((got - expected).values()),
    }


def audits(files: dict[str, Path], env: dict[str, str]) -> dict[str, dict]:
    out = {}
    for name, path in files.items():
        proc = subprocess.run(
            ["tidewater", "audit", "--pipeline", str(path), "--deep", "--json"], env=env, capture_output=True, text=True, timeout=1800
        )
        try:
            report = json.loads(proc.stdout)
        except json.JSONDecodeError:
            report = {"error": (proc.stderr or proc.stdout)[-2000:]}
        errors = [f for f in report.get("findings", []) if f.get("severity") == "error"]
        out[name] = {
            "exit": proc.returncode,
            "discrepancies": len(errors),
            "first": errors[:5],
            "explained": sum(f.get("severity") == "explained" for f in report.get("findings", [])),
            "batches": report.get("batches"),
            "error": report.get("error"),
        }
    return out


def memory(samples: list[dict], judge_after: float = 1200) -> dict[str, dict]:
    """Per process, its longest lifetime: resident memory in the second quarter of it against the last quarter
    (the first quarter is warm-up: the JVM's heap and Airflow's imports). Judged only on a lifetime of at least
    ``judge_after`` seconds; flat means the last quarter's mean is within 20% of the second quarter's."""
    out = {}
    for name in sorted({s["process"] for s in samples}):
        by_pid = collections.defaultdict(list)
        for s in samples:
            if s["process"] == name:
                by_pid[s["pid"]].append(s)
        life = max(by_pid.values(), key=lambda v: v[-1]["t"] - v[0]["t"])
        span = life[-1]["t"] - life[0]["t"]
        q = len(life) // 4
        second = [s["rss_mb"] for s in life[q : 2 * q]] or [life[0]["rss_mb"]]
        last = [s["rss_mb"] for s in life[-q:]] if q else [life[-1]["rss_mb"]]
        growth = (sum(last) / len(last)) / (sum(second) / len(second)) - 1
        out[name] = {
            "lifetime_s": span,
            "samples": len(life),
            "rss_mb_second_quarter": round(sum(second) / len(second)),
            "rss_mb_last_quarter": round(sum(last) / len(last)),
            "growth": round(growth, 3),
            "max_rss_mb": max(s["rss_mb"] for s in life),
            "verdict": ("flat" if growth <= 0.20 else "grows") if span >= judge_after else "not judged (lifetime too short)",
        }
    return out


# Each decision run of the quarantine and how often its ``decide`` task was tried: a try beyond the first is Airflow
# failing the task after the answer (apache/airflow#72716), asked again.
DECISION_RUNS = (
    "SELECT r.run_id, r.state, t.try_number FROM dag_run r JOIN task_instance t ON t.dag_id = r.dag_id AND "
    "t.run_id = r.run_id AND t.task_id = 'decide' WHERE r.dag_id = 'quarantine_soak_events' AND r.run_id LIKE 'decide%'"
)


def decisions(svc: Services, files: dict[str, Path], chaos: Chaos) -> dict:
    """The quarantine after the drain: the batches still waiting (none when every decision was applied), each
    decision run's state and tries, and how often the soak answered each batch."""
    from tidewater.config.parse import load_pipeline
    from tidewater.ops import quarantine

    return {
        "decided": chaos.decisions,
        "answers": dict(chaos.answers),
        "waiting": sorted(q["batch_id"] for q in quarantine.list_all(load_pipeline(files["soak_events"]))),
        "runs": {run_id: {"state": state, "tries": tries} for run_id, state, tries in metadata_query(svc, DECISION_RUNS)},
    }


def run_states(svc: Services) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = collections.defaultdict(dict)
    for dag_id, state, n in metadata_query(svc, "SELECT dag_id, state, count(*) FROM dag_run GROUP BY dag_id, state"):
        out[dag_id][state] = n
    return dict(out)


def verdict(report: dict) -> list[str]:
    """What failed, in words (empty: the soak passed)."""
    bad = [
        f"audit of {n}: {a['discrepancies']} discrepancies, exit {a['exit']} {a['error'] or ''}".strip()
        for n, a in report["audits"].items()
        if a["exit"] != 0 or a["discrepancies"]
    ]
    bad += [f"{t} differs from its model: {c}" for t, c in report["tables"].items() if not c["equal"]]
    bad += [f"lag of {n} is {lag}" for n, lag in report["lag"].items() if lag]
    bad += [f"quarantined batch {b} still waits after the drain" for b in report["decisions"]["waiting"]]
    bad += [f"decision run {r} ended {d['state']}" for r, d in report["decisions"]["runs"].items() if d["state"] != "success"]
    happened = {d["name"] for d in report["events"] if d["outcome"] == "done"}
    bad += [f"{name} never happened" for name in (*FAULTS, *OPERATIONS, "quarantine_publish", "quarantine_drop") if name not in happened]
    bad += [f"{d['name']} failed: {d['detail']}" for d in report["events"] if d["outcome"] != "done"]
    bad += [f"producer error: {e}" for e in report["producer_errors"]]
    bad += [f"{n}'s resident memory grows: {m}" for n, m in report["memory"].items() if m["verdict"] == "grows"]
    return bad


def markdown(report: dict) -> str:
    lines = [
        "# Soak",
        "",
        f"Produced by `make soak SOAK_MINUTES={report['minutes']:g}` (scripts/soak.py: its docstring says what "
        "runs and what is checked) on this machine (2 cores), while nothing else ran.",
        "",
        f"Soak of {report['minutes']} minutes ({report['started']}, seed {report['seed']}, schedule "
        f"`{report['schedule']}`): **{'passed' if not report['failures'] else 'FAILED'}**",
        "",
        f"Produced: {report['produced']}. Drained in {report['drain_seconds']} s.",
        "",
        "| table | rows | model | equal |",
        "| --- | ---: | ---: | --- |",
    ]
    lines += [f"| {t} | {c['rows']} | {c['expected']} | {'yes' if c['equal'] else 'NO'} |" for t, c in report["tables"].items()]
    lines += ["", "| pipeline | batches in the ledger | explained | discrepancies | lag |", "| --- | ---: | ---: | ---: | ---: |"]
    lines += [
        f"| {n} | {a['batches']} | {a['explained']} | {a['discrepancies']} | {report['lag'][n]} |" for n, a in report["audits"].items()
    ]
    lines += ["", "| fault or operation | when (s) | outcome |", "| --- | ---: | --- |"]
    lines += [f"| {d['name']} | {d.get('at', '')} | {d['outcome']}: {str(d['detail'])[:160]} |" for d in report["events"]]
    lines += ["", "| decision run | decision | state | tries of decide | answers |", "| --- | --- | --- | ---: | ---: |"]
    lines += [
        f"| {r} | {report['decisions']['decided'].get(r.removeprefix('decide__'), '')} | {d['state']} | {d['tries']} | "
        f"{report['decisions']['answers'].get(r.removeprefix('decide__'), 0)} |"
        for r, d in sorted(report["decisions"]["runs"].items())
    ]
    lines += ["", "| DAG | runs by state |", "| --- | --- |"]
    lines += [f"| {dag} | {', '.join(f'{s} {n}' for s, n in sorted(states.items()))} |" for dag, states in sorted(report["runs"].items())]
    lines += [
        "",
        "| process | longest lifetime (s) | RSS 2nd quarter (MB) | RSS last quarter (MB) | growth | max (MB) | verdict |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    lines += [
        f"| {n} | {m['lifetime_s']} | {m['rss_mb_second_quarter']} | {m['rss_mb_last_quarter']} | {m['growth']:+.1%} | "
        f"{m['max_rss_mb']} | {m['verdict']} |"
        for n, m in report["memory"].items()
    ]
    if report["failures"]:
        lines += ["", "Failures:", *(f"- {f}" for f in report["failures"])]
    return "\n".join(lines) + "\n"


def soak(work: Path, minutes: float, seed: int, schedule: str, drain_minutes: float) -> dict:
    for k, v in (("SOAK_S3_KEY", KEY), ("SOAK_S3_SECRET", SECRET), ("TIDEWATER_HOME", str(work / "home"))):
        os.environ[k] = v  # this process reads the pipelines too (status, the models' tables)
    (work / "home").mkdir(parents=True, exist_ok=True)
    if (REPO / ".data" / "jars").is_dir() and not (work / "home" / "jars").exists():
        (work / "home" / "jars").symlink_to(REPO / ".data" / "jars")  # the repaired Iceberg jar, built once per machine
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    svc = Services(work)
    try:
        create_topics(svc.broker.bootstrap)
        files = pipelines(svc, schedule)
        svc.start_airflow()
        log(f"Airflow up (api-server :{svc.api_port}); producing for {minutes} minutes")
        seconds = minutes * 60
        t0 = time.monotonic()
        producers = Producers(svc.broker.bootstrap, seed, t0 + 0.25 * seconds, svc.reading_id)
        chaos = Chaos(svc, files, chaos_plan(t0, seconds, seed), seed, producers)
        monitor = Monitor(svc)
        for thread in (producers, chaos, monitor):
            thread.start()
        time.sleep(seconds)
        producers.stopping.set()
        producers.join(timeout=120)
        log(f"producers stopped: {dict(producers.sent)}")
        chaos.join(timeout=1800)  # the faults and operations planned for the run all happen
        drained = time.monotonic()
        final_lag = drain(svc, files, chaos, drain_minutes * 60)
        drain_seconds = round(time.monotonic() - drained)
        monitor.stopping.set()
        runs, decided = run_states(svc), decisions(svc, files, chaos)
        producers.producer.flush(30)
        producers.producer = None  # its connections go before the broker does
        svc.stop_airflow()
        log("auditing every pipeline (tidewater audit --deep) and comparing every table with its model")
        report = {
            "minutes": minutes,
            "seed": seed,
            "schedule": schedule,
            "started": started,
            "produced": dict(producers.sent),
            "drain_seconds": drain_seconds,
            "lag": final_lag,
            "events": chaos.done,
            "runs": runs,
            "producer_errors": producers.errors,
            "memory": memory(monitor.samples),
            "quarantine": chaos.decisions,
            "decisions": decided,
            "dropped_ranges": chaos.dropped_ranges,
            "audits": audits(files, svc.env()),
            "tables": table_checks(files, producers, chaos.dropped_ranges),
            "rss_samples": monitor.samples,
        }
    finally:
        svc.stop()
    report["failures"] = verdict(report)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", "60")))
    ap.add_argument("--seed", type=int, default=int(os.environ.get("SOAK_SEED", "7")))
    ap.add_argument("--schedule", default=os.environ.get("SOAK_SCHEDULE", "* * * * *"))
    ap.add_argument("--drain-minutes", type=float, default=15)
    ap.add_argument("--work", type=Path, default=None, help="work folder (default .data/soak-<time>; removed unless --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs, warehouse) afterwards")
    ap.add_argument("--markdown", type=Path, default=None, help="also write the summary to this file")
    args = ap.parse_args(argv)
    work = (args.work or REPO / ".data" / f"soak-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}").resolve()
    work.mkdir(parents=True, exist_ok=True)
    report = soak(work, args.minutes, args.seed, args.schedule, args.drain_minutes)
    (work / "report.json").write_text(json.dumps(report, indent=1, default=str))
    text = markdown(report)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    if not args.keep and not report["failures"]:
        shutil.rmtree(work / "warehouse", ignore_errors=True)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
