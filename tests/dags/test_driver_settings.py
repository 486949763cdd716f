"""How the settings resolved from Airflow connections reach the write step's Spark driver, per master and deploy mode
(runtime/airflow.IngestSparkSubmitOperator._pass_settings), read off what the Spark provider's hook would run: its
spark-submit command line, the private properties file, and the environment spark-submit gets. The cluster managers
(Kubernetes, YARN) cannot run here: these are tests of the generated configuration; the local run is in
tests/integration/test_kafka_security.py and the standalone runs in tests/integration/test_cluster.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidewater.config.parse import load_pipeline
from tidewater.errors import ConfigError

PASSWORD = "Kafka-Secret-9431"
CATALOG_SECRET = "Catalog-Secret-5521"


@pytest.fixture
def pipeline(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(
        "AIRFLOW_CONN_KAFKA_SECURED",
        json.dumps(
            {
                "conn_type": "generic",
                "host": "broker:9093",
                "login": "ingest",
                "password": PASSWORD,
                "extra": {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"},
            }
        ),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAKE",
        json.dumps(
            {
                "conn_type": "postgres",
                "host": "db",
                "port": 5432,
                "login": "lake",
                "password": CATALOG_SECRET,
                "schema": "catalog",
                "extra": {"warehouse": "s3://lake/w"},
            }
        ),
    )
    path = tmp_path / "p.yaml"
    path.write_text(
        json.dumps(
            {
                "name": "p",
                "topics": ["a"],
                "table": "ns.t",
                "kafka": {"conn_id": "kafka_secured", "bootstrap_servers": None},
                "catalog": {"name": "lake", "conn_id": "lake"},
                "spark": {"conn_id": "spark_here", "kubernetes_secret": "orders-driver"},
            }
        )
    )
    return path


def submit(pipeline: Path, monkeypatch, master: str, deploy_mode: str | None, **spark: object):
    """(command line, properties file text, env_vars given to the hook, variables added to spark-submit's process
    environment) for the write step on ``master``."""
    from tidewater.runtime.airflow import IngestSparkSubmitOperator

    host, _, port = master.rpartition(":") if master.startswith(("spark://", "k8s://")) else (master, "", "")
    conn = {
        "conn_type": "spark",
        "host": host,
        **({"port": int(port)} if port.isdigit() else {}),
        "extra": {"deploy-mode": deploy_mode} if deploy_mode else {},
    }
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_HERE", json.dumps(conn))
    if spark:
        doc = json.loads(pipeline.read_text())
        doc["spark"] = {**doc["spark"], **spark}
        pipeline.write_text(json.dumps(doc))
    spec = load_pipeline(pipeline)
    op = IngestSparkSubmitOperator(task_id="write", pipeline_path=str(pipeline), conn_id="spark_here")
    op.conf = {"spark.app.name": "t"}
    path, driver_env = op._pass_settings(spec, master, {})
    try:
        command = op._get_hook()._build_spark_submit_command("app.py")
        text = Path(path).read_text() if path else ""
    finally:
        if path:
            os.unlink(path)
    return " ".join(command), text, op.env_vars or {}, driver_env


@pytest.mark.parametrize("master", ["local[2]", "spark://10.0.0.5:7077"])
def test_client_mode_on_local_and_standalone_masters_passes_them_in_spark_submits_environment(pipeline, monkeypatch, master):
    command, props, env_vars, driver_env = submit(pipeline, monkeypatch, master, None)
    assert json.loads(env_vars["TIDEWATER_KAFKA_CONFIG"])["sasl.password"] == PASSWORD
    assert "TIDEWATER_CATALOG_CONFIG" in env_vars and driver_env == {}
    assert PASSWORD not in command + props and CATALOG_SECRET not in command + props


@pytest.mark.parametrize("master", ["k8s://https://10.0.0.1:6443", "yarn"])
def test_client_mode_on_kubernetes_and_yarn_passes_them_in_the_environment_never_as_settings(pipeline, monkeypatch, master):
    """The hook would turn `env_vars` into `spark.kubernetes.driverEnv.*` / `spark.yarn.appMasterEnv.*` arguments
    there; in client mode the driver is spark-submit's child here, so they go in spark-submit's own environment."""
    command, props, env_vars, driver_env = submit(pipeline, monkeypatch, master, "client")
    assert set(driver_env) == {"TIDEWATER_KAFKA_CONFIG", "TIDEWATER_CATALOG_CONFIG"}
    assert json.loads(driver_env["TIDEWATER_KAFKA_CONFIG"])["sasl.password"] == PASSWORD
    assert env_vars == {}
    assert "driverEnv" not in command + props and "appMasterEnv" not in command + props
    assert PASSWORD not in command + props and CATALOG_SECRET not in command + props


def test_cluster_mode_on_kubernetes_holds_references_to_a_kubernetes_secret_never_the_values(pipeline, monkeypatch):
    command, props, env_vars, driver_env = submit(pipeline, monkeypatch, "k8s://https://10.0.0.1:6443", "cluster")
    refs = dict(line.split("=", 1) for line in props.splitlines() if "secretKeyRef" in line)
    assert refs == {
        "spark.kubernetes.driver.secretKeyRef.TIDEWATER_KAFKA_CONFIG": "orders-driver:TIDEWATER_KAFKA_CONFIG",
        "spark.kubernetes.driver.secretKeyRef.TIDEWATER_CATALOG_CONFIG": "orders-driver:TIDEWATER_CATALOG_CONFIG",
    }
    assert env_vars == {} and driver_env == {}
    assert PASSWORD not in command + props and CATALOG_SECRET not in command + props and "driverEnv" not in props


def test_cluster_mode_on_kubernetes_without_a_secret_and_on_yarn_is_refused_naming_the_setting(pipeline, monkeypatch):
    with pytest.raises(
        ConfigError,
        match=r"^spark\.kubernetes_secret: cluster deploy mode on Kubernetes .*"
        r"kafka\.conn_id, catalog\.conn_id",
    ):
        submit(pipeline, monkeypatch, "k8s://https://10.0.0.1:6443", "cluster", kubernetes_secret=None)
    with pytest.raises(ConfigError, match=r"^kafka\.conn_id, catalog\.conn_id: cluster deploy mode on YARN"):
        submit(pipeline, monkeypatch, "yarn", "cluster")


def test_process_env_gives_a_child_the_values_and_puts_the_previous_ones_back(monkeypatch):
    from tidewater.spark.conf import process_env

    monkeypatch.setenv("TW_KEPT", "before")
    monkeypatch.delenv("TW_NEW", raising=False)
    with process_env({"TW_KEPT": "during", "TW_NEW": "secret"}):
        seen = subprocess.run(
            [sys.executable, "-c", "import os; print(os.environ['TW_KEPT'], os.environ['TW_NEW'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    assert seen == ["during", "secret"]
    assert os.environ["TW_KEPT"] == "before" and "TW_NEW" not in os.environ


def test_the_connections_command_writes_private_files_for_a_kubernetes_secret_and_prints_no_value(pipeline, tmp_path):
    out = tmp_path / "secret"
    proc = subprocess.run(
        [sys.executable, "-m", "tidewater.runtime.cli", "connections", "--pipeline", str(pipeline), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["TIDEWATER_CATALOG_CONFIG", "TIDEWATER_KAFKA_CONFIG"]
    assert json.loads((out / "TIDEWATER_KAFKA_CONFIG").read_text())["sasl.password"] == PASSWORD
    assert {oct(p.stat().st_mode & 0o777) for p in out.iterdir()} == {"0o600"} and oct(out.stat().st_mode & 0o777) == "0o700"
    assert PASSWORD not in proc.stdout + proc.stderr and CATALOG_SECRET not in proc.stdout + proc.stderr
