"""Shared by the end-to-end tests: a fresh Airflow home (SQLite) with this checkout's DAGs and plugin."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.fixture
def airflow_env(tmp_path: Path, home: Path) -> dict[str, str]:
    af = tmp_path / "airflow"
    af.mkdir()
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
    subprocess.run(["airflow", "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    return env


def stop_group(proc: subprocess.Popen) -> None:
    """Stop a server started in its own session (the whole process group), killing it after 30 s."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
