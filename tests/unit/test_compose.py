"""docker-compose.yml, the production-shaped stack: valid for the compose client (`docker-compose config`, from
Debian's package, installed by `make system-deps`), and consistent: every service has an image, every address
one service gives another (host:port in its environment, the Spark master URL) names a service of the file
that exposes that port, every named volume is declared, every bind mount exists in the checkout, every
`${VAR}` has a default, and the pipeline files the stack mounts are valid against that environment. Nothing
is started here (no container runtime runs in CI)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from tests.conftest import REPO

COMPOSE = REPO / "docker-compose.yml"
LOCAL = {"localhost", "127.0.0.1", "0.0.0.0"}


def _services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def test_the_compose_client_accepts_the_file():
    """Valid with a Fernet key in the environment (.env), refused naming the variable without one."""
    import os

    client = shutil.which("docker-compose")
    assert client, "docker-compose is missing: `make system-deps` installs it (apt-get)"
    env = {k: v for k, v in os.environ.items() if k != "AIRFLOW_FERNET_KEY"}
    done = subprocess.run(
        [client, "-f", str(COMPOSE), "config", "-q"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "AIRFLOW_FERNET_KEY": "x" * 43 + "="},
    )
    assert done.returncode == 0, done.stderr
    refused = subprocess.run([client, "-f", str(COMPOSE), "config", "-q"], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode != 0 and "AIRFLOW_FERNET_KEY" in refused.stderr, refused.stderr


def test_every_long_running_service_has_a_healthcheck_and_dependents_wait_for_it():
    doc = yaml.safe_load(COMPOSE.read_text())
    services = doc["services"]
    one_shot = {n for n, s in services.items() if s.get("restart") == "no"}
    assert one_shot == {"minio-bucket", "airflow-init"}
    for name, s in services.items():
        if name not in one_shot:
            assert (s.get("healthcheck") or {}).get("test"), f"{name}: no healthcheck"
        for dep, how in (s.get("depends_on") or {}).items():
            want = "service_completed_successfully" if dep in one_shot else "service_healthy"
            assert how["condition"] == want, f"{name} waits for {dep} with {how['condition']}, not {want}"
    assert services["airflow-scheduler"]["environment"]["AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK"] == "true"
    assert "AIRFLOW__CORE__FERNET_KEY" in services["airflow-scheduler"]["environment"]


def test_the_stack_has_what_users_run_and_its_addresses_name_services_of_the_file():
    services = _services()
    assert {
        "kafka",
        "minio",
        "minio-bucket",
        "iceberg-rest",
        "spark-master",
        "spark-worker",
        "postgres",
        "airflow-apiserver",
        "airflow-scheduler",
        "airflow-dag-processor",
    } <= set(services)
    exposed = {
        name: {str(p).split(":")[-1].split("/")[0] for p in [*s.get("expose", []), *s.get("ports", [])]} for name, s in services.items()
    }
    for name, s in services.items():
        assert s.get("image"), f"{name}: no image"
        env = s.get("environment") or {}
        texts = [str(v) for v in env.values()] + [
            " ".join(map(str, s.get("command") or [])) if isinstance(s.get("command"), list) else str(s.get("command") or "")
        ]
        for text in texts:
            for host, port in re.findall(r"(?:[a-z+]+://|@|\s|^)([a-z][a-z0-9-]*):(\d{2,5})\b", text):
                if host in LOCAL or host in ("jdbc", "sqlite", "file"):
                    continue
                assert host in services, f"{name}: {text!r} names {host!r}, which is not a service"
                assert port in exposed[host], f"{name}: {text!r} uses port {port} of {host}, which it does not expose"
        for dep in s.get("depends_on") or {}:
            assert dep in services, f"{name} depends on {dep!r}"
    conn = yaml.safe_load(COMPOSE.read_text())["services"]["airflow-scheduler"]["environment"]["AIRFLOW_CONN_TIDEWATER_SPARK"]
    assert '"host": "spark://spark-master"' in conn and "7077" in exposed["spark-master"]


def test_volumes_and_variables_are_declared():
    doc = yaml.safe_load(COMPOSE.read_text())
    named = set(doc.get("volumes") or {})
    for name, s in doc["services"].items():
        for v in s.get("volumes") or []:
            source = str(v).split(":")[0]
            if source.startswith((".", "/")):
                assert (REPO / source).exists(), f"{name}: bind mount {source} is not in the checkout"
            else:
                assert source in named, f"{name}: volume {source!r} is not declared"
    for var in re.findall(r"\$\{([^}]*)\}", COMPOSE.read_text()):
        if var.startswith("HOSTNAME"):  # the container's own, in a healthcheck
            continue
        # a default, or required with a message (secrets with no safe default: the Fernet key)
        assert ":-" in var or ":?" in var, f"${{{var}}} has no default: `docker compose up` would start with it empty"


def test_the_stacks_pipeline_files_are_valid_in_its_environment(monkeypatch: pytest.MonkeyPatch):
    """The files under docker/pipelines, with the scheduler's environment of the compose file."""
    from tidewater.config.parse import load_pipeline

    env = _services()["airflow-scheduler"]["environment"]
    for k, v in env.items():
        monkeypatch.setenv(k, re.sub(r"\$\{[^:}]*:[-?]([^}]*)\}", r"\1", str(v)))
    files = sorted((REPO / "docker" / "pipelines").glob("*.yaml"))
    assert files
    for path in files:
        spec = load_pipeline(path)
        props = spec.catalog_properties()
        assert props["uri"] == "http://iceberg-rest:8181" and props["warehouse"].startswith("s3://lake/")
        assert "iceberg-aws-bundle" in (spec.spark.iceberg_packages or "")
        assert str(spec.staging_dir()).startswith("s3://lake/"), f"{path.name}: batches must be staged in the bucket"
        assert (spec.validation.data_docs_dir or "").startswith("s3://lake/"), f"{path.name}: Data Docs in the bucket"


def test_airflow_and_spark_services_share_no_volume():
    """Batches and Data Docs go through the bucket: no named volume is mounted by two of Tidewater's services
    (Airflow's and Spark's; the databases and MinIO keep their own)."""
    mounts: dict[str, set[str]] = {}
    for name, service in _services().items():
        if name.startswith(("airflow", "spark")):
            for v in service.get("volumes") or []:
                if not str(v).startswith((".", "/")):
                    mounts.setdefault(str(v).split(":")[0], set()).add(name)
    assert not {v: s for v, s in mounts.items() if len(s) > 1}


def test_what_each_documented_deployment_needs_is_installed(monkeypatch: pytest.MonkeyPatch):
    """Airflow on PostgreSQL (the compose stack) opens its async engine with asyncpg (`airflow db migrate` failed
    with "No module named 'asyncpg'"); the ingest DAG's Spark hook accepts a `k8s://` master (it failed with
    NameError: kube_client without Airflow's Kubernetes provider). Neither connects anywhere here."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine("postgresql+asyncpg://airflow:airflow@127.0.0.1:1/airflow")
    assert engine.dialect.driver == "asyncpg"
    monkeypatch.setenv("AIRFLOW_CONN_TIDEWATER_K8S", '{"conn_type": "spark", "host": "k8s://https://127.0.0.1:6443"}')
    hook = SparkSubmitHook(conn_id="tidewater_k8s", conf={"spark.kubernetes.container.image": "tidewater-airflow:latest"})
    command = hook._build_spark_submit_command("ingest_batch.py")
    assert command[command.index("--master") + 1] == "k8s://https://127.0.0.1:6443"
