"""The ingest DAG run through Airflow (`airflow dags test`) against the real broker, Spark and catalog."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, table_of, write_pipeline
from tidewater.offsets import DAG_RUN_ID, OFFSETS, committed_state
from tidewater.sample_data import pizza_events, produce

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


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


def dags_test(env: dict[str, str], dag_id: str, conf: dict | None = None, expect: str = "success") -> str:
    cmd = ["airflow", "dags", "test", dag_id] + (["--conf", json.dumps(conf)] if conf else [])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    if expect == "success":
        assert proc.returncode == 0, out[-4000:]
    assert f"state={expect}" in out, out[-4000:]
    return out


def test_dag_runs_twice_with_new_events_between_then_short_circuits(broker, topic, airflow_env):
    """Two DAG runs with 240 new events before each: 480 rows, two snapshots stamped with the DAG run id
    and exact offsets; a third run with nothing new skips write/validate/commit and adds no snapshot.
    Then the maintenance DAG compacts the 4 files into 1: same rows, same offsets."""
    pipeline = write_pipeline(
        Path(airflow_env["TIDEWATER_PIPELINES_DIR"]), topics=[topic], kafka={"bootstrap_servers": broker.bootstrap},
        maintenance={"rewrite_data_files": {"min_input_files": 2}},
    )
    for i in range(2):
        produce(broker.bootstrap, topic, pizza_events(240, seed=50 + i), partitions=2)
        dags_test(airflow_env, "ingest_orders")
    table = table_of(pipeline)
    assert table.scan().to_arrow().num_rows == 480
    snaps = sorted(table.snapshots(), key=lambda s: s.sequence_number)
    assert len(snaps) == 2
    for n, s in enumerate(snaps, start=1):
        props = s.summary.additional_properties
        assert props[DAG_RUN_ID].startswith("manual__")
        assert json.loads(props[OFFSETS]) == {topic: {"0": 120 * n, "1": 120 * n}}
    out = dags_test(airflow_env, "ingest_orders")
    assert "Skipping downstream tasks" in out
    assert len(table_of(pipeline).snapshots()) == 2

    out = dags_test(airflow_env, "maintain_orders")
    assert "rewrite_data_files on rpc.orders: data files 4 -> 1" in out
    table = table_of(pipeline)
    assert len(table.inspect.files()) == 1
    assert table.scan().to_arrow().num_rows == 480
    assert committed_state(table).offsets == {topic: {0: 240, 1: 240}}


def test_replay_dag_from_its_form(broker, topic, airflow_env):
    """replay_<name> run through Airflow with the form's parameters (`--conf`): a dry run changes nothing,
    a replace replay leaves the table identical with unchanged offsets, and a range past the committed
    offset fails the run with a message naming the parameter."""
    pipeline = write_pipeline(
        Path(airflow_env["TIDEWATER_PIPELINES_DIR"]), topics=[topic], kafka={"bootstrap_servers": broker.bootstrap},
        format={"metadata": "prefixed"},
    )
    produce(broker.bootstrap, topic, pizza_events(200, seed=70), partitions=2)
    dags_test(airflow_env, "ingest_orders")

    def rows():  # noqa: ANN202
        t = table_of(pipeline).scan().to_arrow()
        return sorted(zip(t.column("_kafka_partition").to_pylist(), t.column("_kafka_offset").to_pylist(), t.column("order_id").to_pylist()))

    before, snaps = rows(), len(table_of(pipeline).snapshots())
    form = {"topic": topic, "partitions": [1], "start_offset": 20, "end_offset": 60}
    out = dags_test(airflow_env, "replay_orders", {**form, "dry_run": True})
    assert f"{topic}[1] [20, 60): 40 offsets; rows now 40, to delete 40, to add at most 40" in out
    assert len(table_of(pipeline).snapshots()) == snaps
    dags_test(airflow_env, "replay_orders", form)
    table = table_of(pipeline)
    assert rows() == before and len(table.snapshots()) == snaps + 2
    assert json.loads(table.current_snapshot().summary.additional_properties["tidewater.replay"])["ranges"] == [[topic, 1, 20, 60]]
    assert committed_state(table).offsets == {topic: {0: 100, 1: 100}}
    out = dags_test(airflow_env, "replay_orders", {**form, "end_offset": 150}, expect="failed")
    assert "end_offset: 150 is beyond the committed offset 100" in out
