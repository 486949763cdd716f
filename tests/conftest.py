"""Shared fixtures: a real embedded broker, an isolated data directory and catalog, pipeline files."""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = str(Path(sys.executable).parent)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # one temporary directory per pytest-xdist worker (make test runs two): each worker's session services (broker,
    # PostgreSQL, S3 and Connect server logs) and its tests' temporary files stay apart from the other worker's, so a
    # test that checks what a run left in the temporary directory sees only its own worker's (JVMs still use /tmp)
    import tempfile

    _worker_tmp = Path(tempfile.gettempdir()) / f"tidewater-tests-{os.environ['PYTEST_XDIST_WORKER']}-{os.getpid()}"
    _worker_tmp.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(_worker_tmp)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
os.environ["PATH"] = VENV_BIN + os.pathsep + os.environ.get("PATH", "")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
# py4j logs at INFO while the interpreter exits, after pytest has closed the streams it captured.
logging.getLogger("py4j").setLevel(logging.WARNING)

_topic_counter = itertools.count()


@pytest.fixture
def schema_registry():
    """An empty schema-registry stand-in for one test: (registry, its URL). ``LocalSchemaRegistry`` answers Confluent's
    API in-process: the unit tests' registry, and the integration tests' where the test stops it (their
    ``registry_url`` is a real registry, tests/integration/conftest.py). The serializers and clients that talk to it
    are confluent-kafka's."""
    from tidewater_dev.sample_data import LocalSchemaRegistry

    reg = LocalSchemaRegistry({})
    url = reg.start()
    yield reg, url
    reg.stop()


@pytest.fixture
def registry_url(schema_registry):
    """The URL of ``schema_registry`` (the stand-in); tests/integration/conftest.py gives the real registry's."""
    return schema_registry[1]


UNKNOWN_SCHEMA_ID = 2**31 - 1  # an id no registry of a test session has given


def registered_avro(url: str, subject: str, schemas: dict[int, dict]) -> dict[int, int]:
    """Register each Avro schema of ``schemas`` (a test's own numbering) under ``subject`` in the registry at
    ``url`` with confluent-kafka's client: the id the registry gave each, by the test's number."""
    import json

    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client = SchemaRegistryClient({"url": url})
    return {n: client.register_schema(subject, Schema(json.dumps(s), "AVRO")) for n, s in schemas.items()}


@pytest.fixture(scope="session")
def broker() -> Iterator[object]:
    """The embedded Apache Kafka broker (KRaft, one node; `make kafka` installs it, make test runs that) on a free
    127.0.0.1 port, for the whole session."""
    from tidewater_dev import broker as embedded

    b = embedded.start(log_path=Path(os.environ.get("TMPDIR", "/tmp")) / f"tidewater-test-broker-{os.getpid()}.log")
    yield b
    b.stop()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A local S3 endpoint (moto's server from `make s3-stand-in`, its own virtualenv) on a free 127.0.0.1
    port, for the whole session: the stand-in for MinIO/S3, which cannot run here. Credentials: any."""
    import socket
    import subprocess
    import time
    import urllib.request

    server = REPO / ".data" / "moto" / "bin" / "moto_server"
    if not server.is_file():
        pytest.fail(f"{server} is missing: run `make s3-stand-in` (make test does)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"tidewater-test-s3-{os.getpid()}.log", "wb")
    proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=2).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"the local S3 endpoint did not start (see {log.name})")
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


@pytest.fixture(scope="session")
def postgres() -> Iterator[object]:
    """Debian's PostgreSQL server on a free 127.0.0.1 port for the whole session (``tidewater_dev.postgres``): the
    production-shaped tests' catalog and Airflow metadata database; each test makes its own databases."""
    from tidewater_dev import postgres as pg

    server = pg.start(Path(os.environ.get("TMPDIR", "/tmp")) / f"tidewater-test-postgres-{os.getpid()}.log")
    yield server
    server.stop()


def spark4_dist() -> Path:
    """pyspark 4.0.x's unpacked distribution (Spark 4, with the Connect server), which `make spark-connect-install`
    installs and make test runs; a test that needs it fails, saying so, where it is missing."""
    dist = REPO / ".data" / "spark-connect"
    if not (dist / ".installed").is_file():
        pytest.fail(f"{dist} is missing: run `make spark-connect-install` (make test does)")
    return dist


@pytest.fixture(scope="session")
def spark_connect() -> Iterator[object]:
    """A real Spark Connect server (pyspark 4.0.x's distribution, installed by `make spark-connect-install`,
    which make test runs), on a free 127.0.0.1 port with local[2], for the whole session. Its Python workers
    run this interpreter, so they have the project's packages."""
    from tidewater_dev import spark_connect as connect

    dist = spark4_dist()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"tidewater-test-spark-connect-{os.getpid()}.log"
    server = connect.start(dist, log_path=log)
    yield server
    server.stop()


REST_CLIENT = ("tidewater-tests", "rest-client-secret")


REST_S3_KEYS = ("rest-s3-key", "rest-s3-secret-value")  # moto's server takes any keys


@pytest.fixture(scope="session")
def rest_catalog(tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str) -> Iterator[object]:
    """The Iceberg REST catalog server (``tidewater_dev.rest_catalog``: Iceberg 1.12's request handlers over a
    JdbcCatalog, `make rest-catalog` installs it, make test runs that) on a free 127.0.0.1 port for the whole
    session, requiring OAuth2 client credentials (``REST_CLIENT``). Each test's own catalog is the server's
    warehouse of that name (``rest_catalog_properties``); a warehouse named by an ``s3://`` location is in the
    session's S3 endpoint (``REST_S3_KEYS``)."""
    from tidewater_dev import rest_catalog as rest

    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"tidewater-test-rest-catalog-{os.getpid()}.log"
    server = rest.start(tmp_path_factory.mktemp("rest-catalog"), log, client=REST_CLIENT, s3=(s3_endpoint, *REST_S3_KEYS))
    yield server
    server.stop()


def rest_catalog_properties(server: object, home: Path) -> dict[str, str]:
    """pyiceberg properties of a test's own catalog on the REST server: its warehouse named after ``home``'s
    test directory, the client secret from the environment (``${TIDEWATER_TEST_REST_SECRET}``, set here)."""
    os.environ["TIDEWATER_TEST_REST_SECRET"] = REST_CLIENT[1]
    return {
        "type": "rest",
        "uri": server.url,
        "warehouse": home.parent.name,  # type: ignore[attr-defined]
        "credential": f"{REST_CLIENT[0]}:${{TIDEWATER_TEST_REST_SECRET}}",
    }


# the catalog of write_pipeline's files when a test does not name one (None: the pipeline's default SQLite
# catalog in its home); the ``catalog`` fixture sets it per test
DEFAULT_CATALOG: dict[str, object] | None = None


@pytest.fixture(params=["sql", pytest.param("rest", marks=pytest.mark.rest)])
def catalog(request: pytest.FixtureRequest, home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run a test on each catalog kind: the default SQL catalog (SQLite in the test's home) and the session's REST
    catalog server. The pipelines ``write_pipeline`` writes use it; the value is the kind's name. On REST, the
    server must have taken the test's table commits (a test that fell back to another catalog fails here)."""
    if request.param != "rest":
        yield request.param
        return
    server = request.getfixturevalue("rest_catalog")
    props = rest_catalog_properties(server, home)
    monkeypatch.setattr(sys.modules[__name__], "DEFAULT_CATALOG", {"name": "lake", "properties": props})
    commits = "POST /v1/{prefix}/namespaces/{ns}/tables/{t}"
    before = server.stats().get(commits, 0)
    yield request.param
    assert server.stats().get(commits, 0) > before, "the test committed nothing through the REST catalog server"


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
    if DEFAULT_CATALOG is not None:
        doc["catalog"] = DEFAULT_CATALOG
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


def produce_to_partition(
    bootstrap: str,
    topic: str,
    partition: int,
    values: list[bytes | None],
    partitions: int = 1,
    producer_settings: dict | None = None,
    keys: list[bytes | None] | None = None,
) -> None:
    """Produce ``values`` (with ``keys``, one per value) to one partition in order (creating the topic), last
    record in its own request."""
    from confluent_kafka import Producer

    from tidewater_dev.sample_data import Deliveries, ensure_topic

    conf = {"bootstrap.servers": bootstrap}
    ensure_topic(conf, topic, partitions)
    deliveries = Deliveries()  # a record the broker refuses fails the test here, not as a shifted offset later
    p = Producer({**conf, "linger.ms": 5, "on_delivery": deliveries, **(producer_settings or {})})
    keyed = keys or [None] * len(values)
    for k, v in zip(keyed[:-1], values[:-1]):
        p.produce(topic, v, key=k, partition=partition)
    p.flush(30)
    p.produce(topic, values[-1], key=keyed[-1], partition=partition)
    p.flush(30)
    deliveries.check()


def table_of(pipeline_path: Path):
    """The pipeline's table, freshly loaded from the catalog (None if it does not exist)."""
    from tidewater.config.parse import load_pipeline
    from tidewater.table.catalog import load_catalog, load_table

    spec = load_pipeline(pipeline_path)
    return load_table(load_catalog(spec), spec.table.identifier)


def stage_inline(spec):
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


def null_order_ids(n: int, seed: int) -> list[bytes]:
    """``n`` pizza events without an order_id (dead letters under ``validation.not_null_policy: dead_letter``)."""
    import json

    from tidewater_dev.sample_data import pizza_events

    out = []
    for raw in pizza_events(n, seed=seed):
        doc = json.loads(raw)
        doc["order_id"] = None
        out.append(json.dumps(doc).encode())
    return out


def ingest_inline(spec):
    """One whole batch in this process: stage (the Spark task code, inline), validate, commit."""
    from tidewater.steps.lifecycle import commit_step, validate_step

    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    return commit_step(spec, plan, manifest)


def commit_as_airflow_would(spec, plan, manifest):
    """The commit step, retried on a transient error up to the DAG's ``airflow.retries`` (what Airflow does with
    a commit that lost every attempt to concurrent writers); the last error is raised."""
    from tidewater.errors import TransientError
    from tidewater.steps.lifecycle import commit_step

    for attempt in range(spec.airflow.retries + 1):
        try:
            return commit_step(spec, plan, manifest)
        except TransientError:
            if attempt == spec.airflow.retries:
                raise
    return None


def ingest_changes(broker: object, topic: str, spec, batches: int, changes: int, keys: int, seed: int) -> dict:
    """``batches`` Debezium change batches to partition 0 of ``topic``, each ingested in this process
    (:func:`ingest_inline`); returns the reference model of the source after them."""
    from tidewater_dev.changes import apply, change_stream, encode

    model: dict[int, dict] = {}
    for b in range(batches):
        stream = change_stream(model, changes, keys=keys, seed=seed + b)
        produce_to_partition(broker.bootstrap, topic, 0, [v for _, v in encode(stream, model, "debezium")])
        ingest_inline(spec)
        model = apply(model, stream)
    return model


def race(*calls):
    """Run the calls in threads released together; return each call's result or exception."""
    barrier = threading.Barrier(len(calls))
    out: list[object] = [None] * len(calls)

    def runner(i, fn):
        barrier.wait()
        try:
            out[i] = fn()
        except Exception as e:  # noqa: BLE001 - collected for the assertions
            out[i] = e

    threads = [threading.Thread(target=runner, args=(i, fn)) for i, fn in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def unreferenced_metadata(spec: Any, idents: list[str]) -> dict[str, set[str]]:
    """Per table, the Avro files (manifests, manifest lists) in its metadata folder, on this machine's disk, that no
    snapshot references."""
    from urllib.parse import urlparse

    from tidewater.table.catalog import load_catalog, load_table

    catalog, out = load_catalog(spec), {}
    for ident in idents:
        table = load_table(catalog, ident)
        referenced = set()
        for s in table.snapshots():
            referenced |= {
                Path(urlparse(s.manifest_list).path).name,
                *(Path(urlparse(m.manifest_path).path).name for m in s.manifests(table.io)),
            }
        folder = Path(urlparse(table.metadata.location).path) / "metadata"
        assert folder.is_dir(), f"{ident}'s metadata folder is not on this machine's disk: {folder}"
        out[ident] = {f.name for f in folder.glob("*.avro")} - referenced
    return out
