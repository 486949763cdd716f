"""Shared fixtures: a real embedded broker, an isolated data directory and catalog, pipeline files."""

from __future__ import annotations

import itertools
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = str(Path(sys.executable).parent)
os.environ["PATH"] = VENV_BIN + os.pathsep + os.environ.get("PATH", "")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
# py4j logs at INFO while the interpreter exits, after pytest has closed the streams it captured.
logging.getLogger("py4j").setLevel(logging.WARNING)

_topic_counter = itertools.count()


@pytest.fixture(scope="session")
def broker() -> Iterator[object]:
    """The embedded Kafka-compatible broker (Tansu) on a free 127.0.0.1 port, for the whole session."""
    from tidewater.dev import broker as embedded

    b = embedded.start(log_path=Path(os.environ.get("TMPDIR", "/tmp")) / f"tidewater-test-broker-{os.getpid()}.log")
    yield b
    b.stop()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated TIDEWATER_HOME: its own SQLite catalog, warehouse and staging directory."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("TIDEWATER_HOME", str(h))
    # the repaired Iceberg jar is built once per machine and shared between tests
    shared = REPO / ".data" / "jars"
    if shared.is_dir():
        (h / "jars").symlink_to(shared)
    return h


@pytest.fixture
def topic(broker: object) -> str:
    return f"t{os.getpid()}-{next(_topic_counter)}"


def write_pipeline(directory: Path, **overrides: object) -> Path:
    """A pipeline file with test defaults (small chunks, short timeouts), overridden by ``overrides``."""
    doc: dict[str, object] = {
        "name": "orders",
        "topics": ["orders"],
        "kafka": {"bootstrap_servers": "127.0.0.1:9092", "read_timeout_seconds": 20},
        "table": {"identifier": "rpc.orders"},
        "batch": {"max_records": 100000, "chunk_records": 400},
        "validation": {"not_null": ["order_id"]},
        "spark": {"master": "local[2]"},
        "schedule": None,
    }
    for k, v in overrides.items():
        if isinstance(v, dict) and isinstance(doc.get(k), dict):
            doc[k] = {**doc[k], **v}  # type: ignore[dict-item]
        else:
            doc[k] = v
    path = directory / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def pipeline_file(home: Path, broker: object, topic: str) -> Path:
    """A pipeline reading ``topic`` from the embedded broker into rpc.orders."""
    return write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap})  # type: ignore[attr-defined]


def produce_to_partition(bootstrap: str, topic: str, partition: int, values: list[bytes | None], partitions: int = 1,
                         producer_settings: dict | None = None) -> None:
    """Produce ``values`` to one partition in order (creating the topic), last record in its own request."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    conf = {"bootstrap.servers": bootstrap}
    admin = AdminClient(conf)
    if topic not in admin.list_topics(timeout=10).topics:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(timeout=15)
    p = Producer({**conf, "linger.ms": 5, **(producer_settings or {})})
    for v in values[:-1]:
        p.produce(topic, v, partition=partition)
    p.flush(30)
    p.produce(topic, values[-1], partition=partition)
    p.flush(30)


def table_of(pipeline_path: Path):  # noqa: ANN201
    """The pipeline's table, freshly loaded from the catalog (None if it does not exist)."""
    from tidewater.config.parse import load_pipeline
    from tidewater.table.catalog import load_catalog, load_table

    spec = load_pipeline(pipeline_path)
    return load_table(load_catalog(spec), spec.table.identifier)


def quiet(_: str) -> None:
    """Swallow run_once's progress lines."""


def stage_inline(spec):  # noqa: ANN001, ANN201
    """Plan and write a batch in this process (``write.job.run_inline``: the task code Spark runs)."""
    from tidewater.batch import manifest_path, write_json_atomic
    from tidewater.plan.ingest import plan_batch
    from tidewater.source.kafka import kafka_settings
    from tidewater.write.job import run_inline

    plan, path = plan_batch(spec)
    manifest = run_inline(plan, spec, kafka_settings(spec))
    if path is not None:  # staged like the write step does: the manifest next to the plan
        write_json_atomic(manifest_path(path), manifest.to_json())
    return plan, manifest


def ingest_inline(spec):  # noqa: ANN001, ANN201
    """One whole batch in this process: stage (the Spark task code, inline), validate, commit."""
    from tidewater.runtime.steps import commit_step, validate_step

    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    return commit_step(spec, plan, manifest)
