"""Shared by the end-to-end tests: a fresh Airflow home (SQLite) with this checkout's DAGs and plugin."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="session")
def migrated_airflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An Airflow metadata database (SQLite) migrated once for the session; each test gets a copy of the file.
    `airflow db migrate` took 10-16 s of every end-to-end test's set-up; copying the migrated file takes
    milliseconds and gives each test the same fresh schema."""
    af = tmp_path_factory.mktemp("airflow-template")
    db = af / "airflow.db"
    env = {
        **os.environ,
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        "AIRFLOW_HOME": str(af),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{db}",
    }
    subprocess.run(["airflow", "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    return db


@pytest.fixture
def airflow_env(tmp_path: Path, home: Path, migrated_airflow_db: Path) -> dict[str, str]:
    af = tmp_path / "airflow"
    af.mkdir()
    shutil.copy(migrated_airflow_db, af / "airflow.db")
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    env = {
        **os.environ,
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        "AIRFLOW_HOME": str(af),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{af / 'airflow.db'}",
        "AIRFLOW_CONN_TIDEWATER_SPARK": '{"conn_type": "spark", "host": "local[2]"}',
        "TIDEWATER_PIPELINES_DIR": str(pipelines),
        "TIDEWATER_HOME": str(home),
    }
    return env


def through_spark_connect(env: dict[str, str], server: object) -> dict[str, str]:
    """``env`` with the DAGs' Spark connection (`tidewater_spark`) of the provider's `spark_connect` type, pointing
    at the session's Spark Connect server: the write task then runs on that warm server instead of starting a
    spark-submit JVM (about 30 s less per batch). For tests whose subject is not the spark-submit path, which
    `test_dag_runs_twice_with_new_events_between_then_short_circuits` and test_production_shape.py keep."""
    host, port = server.url.removeprefix("sc://").split(":")  # type: ignore[attr-defined]
    return {**env, "AIRFLOW_CONN_TIDEWATER_SPARK": json.dumps({"conn_type": "spark_connect", "host": host, "port": int(port)})}


def metadata_rows(env: dict[str, str], sql: str, **params: object) -> list[tuple]:
    """The rows of one query of Airflow's metadata database (SQLite or PostgreSQL, from the environment's
    connection string). Read directly, not through Airflow's CLI: each CLI call imports Airflow (about 4
    CPU-seconds), and polled every 5 s it took half a core from the scheduler a test waits for."""
    import sqlalchemy

    url = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    connect_args = {"timeout": 30} if url.startswith("sqlite") else {}  # wait out the scheduler's write lock
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool, connect_args=connect_args)
    try:
        with engine.connect() as c:
            return [tuple(row) for row in c.execute(sqlalchemy.text(sql), params).fetchall()]
    finally:
        engine.dispose()


def task_tries(env: dict[str, str], dag_id: str) -> dict[str, tuple[str, int]]:
    """(state, try number) of each task of the DAG's latest run, from Airflow's database."""
    rows = metadata_rows(
        env,
        "SELECT task_id, state, try_number FROM task_instance WHERE dag_id = :dag AND run_id = "
        "(SELECT run_id FROM dag_run WHERE dag_id = :dag ORDER BY id DESC LIMIT 1)",
        dag=dag_id,
    )
    return {task: (state, tries) for task, state, tries in rows}


def stop_group(proc: subprocess.Popen) -> None:
    """Stop a server started in its own session (the whole process group), killing it after 30 s. The group's other
    members are waited for too and killed if they outlive it: `airflow standalone` can exit before its scheduler,
    which then kept polling (and running DAGs) for the rest of the suite."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    deadline = time.monotonic() + 15
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    if _group_alive(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group is still running (zombies, waiting for their parent to reap them, are not)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # state, ppid, pgrp
            return True
    return False


def call_api(url: str, token: str | None = None, body: dict | None = None) -> tuple[int, object]:
    """(status, JSON or text) of a GET, or a POST of ``body``, with an Airflow token when given."""
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            return r.status, json.loads(raw) if r.headers.get_content_type() == "application/json" else raw.decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def admin_token(base: str, airflow_home: str) -> str:
    """A token for the simple auth manager's generated admin user."""
    import json

    password = json.loads((Path(airflow_home) / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
    status, body = call_api(f"{base}/auth/token", body={"username": "admin", "password": password})
    assert status in (200, 201), body
    return body["access_token"]  # type: ignore[index]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def standalone(env: dict[str, str], tmp_path: Path):
    """`airflow standalone` (API server, scheduler, triggerer, DAG processor) on a free port, with the DAGs
    serialized first; yields its environment and stops it (the whole process group) afterwards."""
    import urllib.request

    port = free_port()
    env = {**env, "AIRFLOW__API__PORT": str(port), "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/"}
    subprocess.run(["airflow", "dags", "reserialize"], env=env, check=True, capture_output=True, timeout=300)
    log = open(tmp_path / "standalone.log", "w")
    proc = subprocess.Popen(["airflow", "standalone"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(2)
        else:
            raise AssertionError("the Airflow API server did not start: " + (tmp_path / "standalone.log").read_text()[-3000:])
        yield env
    finally:
        stop_group(proc)
        log.close()


def list_runs(env: dict[str, str], dag_id: str) -> list[dict]:
    """(run_id, state) of each of the DAG's runs, oldest first, from Airflow's database."""
    rows = metadata_rows(env, "SELECT run_id, state FROM dag_run WHERE dag_id = :dag ORDER BY id", dag=dag_id)
    return [{"run_id": run_id, "state": state} for run_id, state in rows]


def wait_for_runs(env: dict[str, str], dag_id: str, seconds: float) -> list[dict]:
    """The DAG's runs once there is at least one and all have finished (or as they are after ``seconds``)."""
    runs: list[dict] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        runs = list_runs(env, dag_id)
        if runs and all(r["state"] in ("success", "failed") for r in runs):
            break
        time.sleep(5)
    return runs
