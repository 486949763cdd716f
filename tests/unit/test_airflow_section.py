"""``[tidewater]`` of Airflow's configuration: the pipelines folder and the data folder from airflow.cfg or
``AIRFLOW__TIDEWATER__*``, a ``TIDEWATER_*`` variable winning, the command line reading airflow.cfg without loading
Airflow, and the provider declaring the section so that Airflow's own configuration knows it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidewater.config.locations import home_dir, pipelines_dir


@pytest.fixture
def airflow_cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in (
        "TIDEWATER_PIPELINES_DIR",
        "TIDEWATER_HOME",
        "AIRFLOW__TIDEWATER__PIPELINES_DIR",
        "AIRFLOW__TIDEWATER__HOME",
        "AIRFLOW_CONFIG",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    cfg = tmp_path / "airflow.cfg"
    cfg.write_text(
        f"[core]\nload_examples = False\n\n[tidewater]\npipelines_dir = {tmp_path / 'from-cfg'}\nhome = {tmp_path / 'home-from-cfg'}\n"
    )
    return cfg


def test_the_section_of_airflow_cfg_then_airflows_variable_then_ours_win_in_turn(airflow_cfg, monkeypatch):
    """As in a process that has not loaded Airflow (the command line): airflow.cfg is read as a file."""
    monkeypatch.delitem(sys.modules, "airflow.configuration", raising=False)  # restored after the test
    base = airflow_cfg.parent
    assert (pipelines_dir(), home_dir()) == (base / "from-cfg", base / "home-from-cfg")
    monkeypatch.setenv("AIRFLOW__TIDEWATER__PIPELINES_DIR", str(base / "from-airflow-variable"))
    assert pipelines_dir() == base / "from-airflow-variable"
    monkeypatch.setenv("TIDEWATER_PIPELINES_DIR", str(base / "ours"))
    assert pipelines_dir() == base / "ours"
    from tidewater.config.airflow_section import _from_file

    assert _from_file("tidewater", "pipelines_dir") == str(base / "from-cfg")  # $AIRFLOW_HOME/airflow.cfg
    monkeypatch.setenv("AIRFLOW_CONFIG", str(base / "missing.cfg"))
    assert _from_file("tidewater", "pipelines_dir") is None


def test_the_command_line_finds_a_pipeline_through_airflow_cfg_and_airflow_knows_the_section(airflow_cfg):
    folder = airflow_cfg.parent / "from-cfg"
    folder.mkdir()
    (folder / "orders.yaml").write_text(
        "name: orders\ntopics: [a]\nkafka: {bootstrap_servers: 'h:9092'}\ntable: ns.orders\nschedule: null\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEWATER_")}
    proc = subprocess.run(
        [sys.executable, "-m", "tidewater.runtime.cli", "validate", "orders"], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and f"{folder / 'orders.yaml'}: ok" in proc.stdout, proc.stderr
    listed = subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "config", "get-value", "tidewater", "pipelines_dir"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.stdout.strip().endswith(str(folder)), listed.stdout + listed.stderr[-2000:]
    from tidewater.runtime.provider import get_provider_info

    options = get_provider_info()["config"]["tidewater"]["options"]
    assert set(options) == {"pipelines_dir", "home"} and "TIDEWATER_PIPELINES_DIR" in options["pipelines_dir"]["description"]
