"""Airflow with the CeleryExecutor across test hosts (``tidewater_dev.hosts``): the scheduler, DAG processor and
api-server on this machine; Celery workers each on a host of their own (network namespace, hostname and disk), with
no shared /tmp, home or ``.data/``. What they share is what a deployment shares, on the hosts' bridge: Redis (Debian's)
as the Celery broker, PostgreSQL as Airflow's metadata database and result backend and as the Iceberg catalog, the
Kafka broker, and the bucket (moto's S3 server, the stand-in for S3). Each worker has its own copy of the pipeline
files (its DAG bundle) and its own ``TIDEWATER_HOME`` and Airflow home.

Used by tests/e2e/test_celery_hosts.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tidewater_dev import broker as kafka
from tidewater_dev import hosts, postgres
from tidewater_dev.process import LocalServer, answers_http

REPO = hosts.REPO
S3_KEY, S3_SECRET = "tidewater-celery-key", "tidewater-celery-secret-value"


def wait_http(url: str, seconds: float, what: str, log: Path) -> None:
    if not answers_http(url, seconds):
        raise RuntimeError(f"{what} did not answer at {url} within {seconds:.0f} s; see {log}")


@dataclass
class _ProcessGroup(LocalServer):
    """A process this deployment started in its own session, stopped with its children (SIGTERM, SIGKILL after 20 s)."""

    process_group: ClassVar[bool] = True
    grace: ClassVar[float] = 20.0


def _stop(proc: subprocess.Popen) -> None:
    _ProcessGroup(proc.pid, 0, "").stop()
    proc.poll()


class CeleryDeployment:
    """The services, Airflow's components on this machine and ``workers`` Celery worker hosts (module docstring).
    ``work``: this deployment's folder on this machine (logs, the hosts' disks)."""

    def __init__(self, work: Path, workers: int = 2, concurrency: int = 1, settings: dict[str, str] | None = None) -> None:
        self.work = work
        self.concurrency = concurrency  # task slots per worker
        self.settings = settings or {}  # more Airflow settings (AIRFLOW__...) for every component
        self.procs: dict[str, subprocess.Popen] = {}
        self.workers: dict[str, hosts.Host] = {}
        self.network = hosts.Network(hosts.free_index()).create()
        gw = self.network.gateway
        try:
            self.postgres = postgres.start(work / "postgres.log", host=gw, clients=self.network.cidr)
            self.broker = kafka.start(log_path=work / "kafka.log", host=gw)
            self.s3_url = self._start_s3()
            self.redis_url = self._start_redis()
            self.metadata_url = self.postgres.create_database("airflow")
            self.catalog_url = self.postgres.create_database("catalog")
            self.api_port = kafka.free_port(gw)
            (work / "pipelines").mkdir(exist_ok=True)
            self._start_airflow()
            for number in range(1, workers + 1):
                host = self.network.host(number, work / f"host{number}")
                self.workers[host.name] = host
                self.start_worker(host)
        except BaseException:
            self.stop()
            raise

    # --- the shared services, on the bridge -------------------------------------------------------------------------

    def _start_s3(self) -> str:
        server = REPO / ".data" / "moto" / "bin" / "moto_server"
        if not server.is_file():
            raise RuntimeError(f"{server} is missing: run `make s3-stand-in`")
        port = kafka.free_port(self.network.gateway)
        self.procs["s3"] = subprocess.Popen(
            [str(server), "-H", self.network.gateway, "-p", str(port)],
            stdout=open(self.work / "s3.log", "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://{self.network.gateway}:{port}"
        wait_http(url + "/moto-api/", 60, "the S3 endpoint", self.work / "s3.log")
        from pyarrow import fs

        fs.S3FileSystem(
            endpoint_override=url, scheme="http", access_key=S3_KEY, secret_key=S3_SECRET, region="us-east-1", allow_bucket_creation=True
        ).create_dir("lake")
        return url

    def _start_redis(self) -> str:
        server = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not Path(server).is_file():
            raise RuntimeError("redis-server is missing: make test-system-deps installs it (apt-get)")
        port = kafka.free_port(self.network.gateway)
        self.procs["redis"] = subprocess.Popen(
            [
                server,
                "--bind",
                self.network.gateway,
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
                "--dir",
                str(self.work),
            ],
            stdout=open(self.work / "redis.log", "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if not kafka.wait_listening(port, 30, self.network.gateway):
            raise RuntimeError(f"redis-server did not start; see {self.work / 'redis.log'}")
        return f"redis://{self.network.gateway}:{port}/0"

    # --- Airflow ------------------------------------------------------------------------------------------------------

    def airflow_env(self) -> dict[str, str]:
        """What every Airflow process of the deployment is given (the machine's and the workers')."""
        gw = self.network.gateway
        bin_dir = str(Path(sys.executable).parent)
        return {
            "PATH": f"{bin_dir}{os.pathsep}/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "LANG": "C.UTF-8",
            "JAVA_HOME": os.environ.get("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64"),
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CELERY__BROKER_URL": self.redis_url,
            "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + self.metadata_url,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.metadata_url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://{gw}:{self.api_port}/execution/",
            "AIRFLOW__API__HOST": gw,
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__API_AUTH__JWT_SECRET": "celery-hosts-jwt-secret-" + "x" * 32,
            "AIRFLOW__API__SECRET_KEY": "celery-hosts-api-secret",
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "socket.gethostname",  # each try records its host's name
            # a lost worker's task is failed (then retried elsewhere) 40 s after its last heartbeat, not Airflow's 5
            # minutes; long enough that a live task on a busy machine (the suite beside it) is not taken for lost
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "40",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
            "AIRFLOW_CONN_TIDEWATER_SPARK": '{"conn_type": "spark", "host": "local[2]"}',
            "GX_ANALYTICS_ENABLED": "false",
            "TEST_S3_KEY": S3_KEY,
            "TEST_S3_SECRET": S3_SECRET,
            **self.settings,
        }

    def machine_env(self) -> dict[str, str]:
        """The scheduler's host (this machine): its Airflow home and pipelines under ``work``."""
        return {
            **os.environ,
            **self.airflow_env(),
            "AIRFLOW_HOME": str(self.work / "airflow"),
            "TIDEWATER_PIPELINES_DIR": str(self.work / "pipelines"),
            "TIDEWATER_HOME": str(self.work / "home"),
        }

    def _run(self, command: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
        proc = subprocess.run(command, env=self.machine_env(), capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command[:4])} exited {proc.returncode}: {(proc.stderr or proc.stdout)[-3000:]}")
        return proc

    def _start_airflow(self) -> None:
        (self.work / "airflow").mkdir(exist_ok=True)
        self._run(["airflow", "db", "migrate"], timeout=900)
        for name in ("api-server", "dag-processor", "scheduler"):
            log = self.work / f"airflow-{name}.log"
            self.procs[name] = subprocess.Popen(
                ["airflow", name], env=self.machine_env(), stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True
            )
        wait_http(
            f"http://{self.network.gateway}:{self.api_port}/api/v2/monitor/health",
            240,
            "Airflow's api-server",
            self.work / "airflow-api-server.log",
        )

    def worker_env(self, host: hosts.Host) -> dict[str, str]:
        """A worker host's environment: its own home, Airflow home, Tidewater home and pipeline files."""
        home = Path(os.path.expanduser("~")).resolve()
        return {
            **self.airflow_env(),
            "HOME": str(home),
            "TMPDIR": "/tmp",
            "SPARK_LOCAL_IP": "127.0.0.1",
            "AIRFLOW_HOME": str(home / "airflow"),
            "TIDEWATER_HOME": str(home / "tidewater"),
            "TIDEWATER_PIPELINES_DIR": str(home / "pipelines"),
        }

    def start_worker(self, host: hosts.Host) -> subprocess.Popen:
        """A Celery worker on ``host`` (``concurrency`` tasks at a time), given a copy of the pipeline files first."""
        copy = host.home / "pipelines"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(self.work / "pipelines", copy)
        proc = host.popen(
            [
                "airflow",
                "celery",
                "worker",
                "--concurrency",
                str(self.concurrency),
                "--celery-hostname",
                f"{host.name}@{host.name}",
                "--without-gossip",
                "--without-mingle",
            ],
            self.worker_env(host),
            self.work / f"worker-{host.name}.log",
        )
        self.procs[f"worker-{host.name}"] = proc
        return proc

    def add_pipeline(self, name: str, doc: dict) -> Path:
        """Write a pipeline file to the machine's pipelines folder (the workers get copies when they start) and
        have the DAGs serialized."""
        path = self.work / "pipelines" / f"{name}.yaml"
        path.write_text(json.dumps(doc))  # JSON is YAML
        for host in self.workers.values():
            (host.home / "pipelines").mkdir(parents=True, exist_ok=True)
            shutil.copy(path, host.home / "pipelines" / path.name)
        self._run(["airflow", "dags", "reserialize"])
        return path

    def pipeline(self, name: str, topics: list[str], **sections: object) -> dict:
        """A pipeline every host can run: catalog in PostgreSQL, warehouse, staging and Data Docs in the bucket
        (addresses on the bridge), secrets by reference."""
        s3 = {
            "s3.endpoint": self.s3_url,
            "s3.access-key-id": "${TEST_S3_KEY}",
            "s3.secret-access-key": "${TEST_S3_SECRET}",
            "s3.region": "us-east-1",
        }
        return {
            "name": name,
            "topics": topics,
            "kafka": {"bootstrap_servers": self.broker.bootstrap},
            "catalog": {"name": "lake", "properties": {"type": "sql", "uri": self.catalog_url, "warehouse": "s3://lake/warehouse", **s3}},
            "batch": {"staging_dir": "s3://lake/staging"},
            "validation": {"data_docs_dir": "s3://lake/data-docs"},
            "spark": {"master": "local[2]"},
            "schedule": None,
            **sections,
        }

    # --- the run's state, from Airflow's database ----------------------------------------------------------------------

    def query(self, sql: str, *args: object, database: str = "airflow") -> list[tuple]:
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.postgres.port, user=postgres.USER, dbname=database)
        try:
            with conn, conn.cursor() as cur:  # committed on leaving the block (an UPDATE ... RETURNING too)
                cur.execute(sql, args)
                return cur.fetchall()
        finally:
            conn.close()

    def query_catalog(self, sql: str, *args: object) -> list[tuple]:
        return self.query(sql, *args, database="catalog")

    def table_state(self, pipeline: str):
        """(the pipeline's table as Arrow, its committed offsets), read from the catalog as a reader would."""
        from tidewater.config.parse import load_pipeline
        from tidewater.table.catalog import load_catalog, load_table
        from tidewater.table.summary import committed_state

        os.environ.update({"TEST_S3_KEY": S3_KEY, "TEST_S3_SECRET": S3_SECRET})  # the files' ${TEST_S3_*}
        spec = load_pipeline(self.work / "pipelines" / f"{pipeline}.yaml")
        table = load_table(load_catalog(spec), spec.table.identifier)
        return table.scan().to_arrow(), committed_state(table).offsets

    def tries(self, dag_id: str, run_id: str) -> list[tuple[str, int, str, str]]:
        """(task, try number, state, hostname) of every try of the run's tasks, earlier tries included."""
        rows = self.query(
            "SELECT task_id, try_number, state, hostname FROM task_instance_history WHERE dag_id = %s "
            "AND run_id = %s UNION ALL SELECT task_id, try_number, state, hostname FROM task_instance "
            "WHERE dag_id = %s AND run_id = %s",
            dag_id,
            run_id,
            dag_id,
            run_id,
        )
        return sorted((t, n, s or "", h or "") for t, n, s, h in rows)

    def trigger(self, dag_id: str, run_id: str) -> None:
        self._run(["airflow", "dags", "unpause", dag_id])
        self._run(["airflow", "dags", "trigger", dag_id, "--run-id", run_id])

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        rows = self.query("SELECT state FROM dag_run WHERE dag_id = %s AND run_id = %s", dag_id, run_id)
        return rows[0][0] if rows else None

    def wait_run(self, dag_id: str, run_id: str, seconds: float) -> str | None:
        deadline = time.monotonic() + seconds
        state = None
        while time.monotonic() < deadline:
            state = self.run_state(dag_id, run_id)
            if state in ("success", "failed"):
                return state
            time.sleep(2)
        return state

    def running_on(self, dag_id: str, run_id: str, task_id: str) -> hosts.Host | None:
        """The worker host where the task's current try is running, or None."""
        rows = self.query(
            "SELECT state, hostname FROM task_instance WHERE dag_id = %s AND run_id = %s AND task_id = %s", dag_id, run_id, task_id
        )
        if rows and rows[0][0] == "running" and rows[0][1] in self.workers:
            return self.workers[rows[0][1]]
        return None

    def logs(self) -> str:
        """The tail of every log of the deployment, for a failure's message."""
        out = []
        for log in sorted(self.work.glob("*.log")) + sorted(self.work.glob("host*/home/airflow/logs/**/*.log")):
            out.append(f"--- {log}\n{log.read_text(errors='replace')[-2500:]}")
        return "\n".join(out)

    def stop(self) -> None:
        for host in self.workers.values():
            host.remove()
        for name in ("scheduler", "dag-processor", "api-server", "redis", "s3"):
            if name in self.procs:
                _stop(self.procs[name])
        for server in ("broker", "postgres"):
            found = getattr(self, server, None)
            if isinstance(found, LocalServer):
                found.stop()
        self.network.remove()
