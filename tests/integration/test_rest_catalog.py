"""Batches through an Iceberg REST catalog server (the session's ``rest_catalog``: Iceberg 1.12's request handlers
over a JdbcCatalog, OAuth2 client credentials; see tidewater_dev.rest_catalog): a commit conflict retried and
counted, an expired token refreshed, credentials from an Airflow connection, refused credentials terminal with
nothing committed, and the deep audit clean. The golden commit files and the exactly-once tests run on it too
(their ``catalog`` fixture).

Two tests keep a local HTTP stand-in: a catalog answering 401 or 503 to everything, which the real server does
not do on demand; it checks that an unreachable or failing catalog is transient and refused credentials are
terminal."""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from tests.conftest import REST_CLIENT, produce_to_partition, rest_catalog_properties, stage_inline, write_pipeline
from tidewater.audit.pipeline import audit
from tidewater.config.parse import load_pipeline
from tidewater.errors import ConfigError, TerminalError, TransientError
from tidewater.steps.lifecycle import commit_step, validate_step
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import committed_state
from tidewater_dev.sample_data import pizza_events

pytestmark = [pytest.mark.integration]


def _server(status: int) -> tuple[HTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = b'{"error": {"message": "stand-in", "type": "NotAuthorizedException", "code": %d}}' % status
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *_args: object) -> None:
            pass

    srv = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


REST_RUNTIME = "org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.12.0"


def _spec(home, uri: str, spark: dict | None = None):
    return load_pipeline(
        write_pipeline(
            home,
            catalog={
                "name": "lake",
                "properties": {"type": "rest", "uri": uri, "credential": "client:${TEST_REST_SECRET}", "warehouse": "analytics"},
            },
            spark=spark or {},
        )
    )


def test_rest_catalog_unreachable_is_transient_and_refused_credentials_are_terminal(home, monkeypatch):
    monkeypatch.setenv("TEST_REST_SECRET", "s3cr3t-value")
    with pytest.raises(TransientError, match="catalog 'lake' is unreachable or busy"):
        load_catalog(_spec(home, "http://127.0.0.1:9"))
    srv, url = _server(401)
    try:
        with pytest.raises(TerminalError) as e:
            load_catalog(_spec(home, url))
        assert not e.value.transient and "s3cr3t-value" not in str(e.value)
    finally:
        srv.shutdown()
    srv, url = _server(503)
    try:
        with pytest.raises(TransientError):
            load_catalog(_spec(home, url))
    finally:
        srv.shutdown()


def test_spark_gets_the_rest_catalog_with_its_secret_off_the_command_line(home, monkeypatch):
    from tidewater.spark import conf as spark_conf_module

    monkeypatch.setenv("TEST_REST_SECRET", "s3cr3t-value")
    with pytest.raises(ConfigError, match="spark.iceberg_packages: unset, and the offline bundled Iceberg runtime has no REST client"):
        spark_conf_module.spark_conf(_spec(home, "https://catalog.example"))
    conf = spark_conf_module.spark_conf(_spec(home, "https://catalog.example", {"iceberg_packages": REST_RUNTIME}))
    assert conf["spark.sql.catalog.lake.type"] == "rest" and conf["spark.sql.catalog.lake.uri"] == "https://catalog.example"
    assert conf["spark.sql.catalog.lake.warehouse"] == "analytics"
    from tidewater.config.secrets import split_secrets

    public, secret = split_secrets(conf)  # what a spark-submit of these settings would put apart
    assert secret["spark.sql.catalog.lake.credential"] == "client:s3cr3t-value" and "s3cr3t-value" not in repr(public)
    # the write step's spark-submit never opens the catalog in Spark: it carries no catalog credential at all
    settings = spark_conf_module.write_submit_settings(_spec(home, "https://catalog.example"))
    assert "s3cr3t-value" not in repr(settings)


def _on_rest(home, broker, topic, props: dict | None = None, conn_id: str | None = None):
    catalog: dict = {"name": "lake", "properties": props or {}}
    if conn_id:
        catalog["conn_id"] = conn_id
    return load_pipeline(write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, catalog=catalog))


def _rows_and_offsets(spec) -> tuple[int, dict]:
    table = load_table(load_catalog(spec), spec.table.identifier)
    return table.scan().to_arrow().num_rows, committed_state(table).offsets


def _deep_audit_clean(spec):
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]
    return report


def test_a_rest_commit_conflict_is_retried_and_counted(broker, rest_catalog, home, topic):
    """The server refuses the batch's commit twice with 409 CommitFailedException (as when another writer committed
    first). Expected: the commit step refreshes and commits once on its third attempt; the result counts 2 retries;
    40 rows, the offsets at the end, and a clean deep audit (ranges against the broker, rows against offsets)."""
    spec = _on_rest(home, broker, topic, rest_catalog_properties(rest_catalog, home))
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(40, seed=571))
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    refused = rest_catalog.stats().get("refused commits", 0)
    rest_catalog.fail_commits(2)
    result = commit_step(spec, plan, manifest)
    assert (result.status, result.rows, result.commit_retries) == ("committed", 40, 2)
    assert result.summary()["commit_retries"] == 2
    assert rest_catalog.stats()["refused commits"] == refused + 2
    assert _rows_and_offsets(spec) == (40, {topic: {0: 40}})
    again = commit_step(spec, plan, manifest)  # the retried step after a success: nothing twice
    assert again.status == "already-committed" and _rows_and_offsets(spec) == (40, {topic: {0: 40}})
    _deep_audit_clean(spec)


def test_an_expired_token_is_refreshed_and_the_batch_commits(broker, home, topic, tmp_path):
    """A server whose tokens live 2 seconds (its own, beside the session's). The catalog is opened, the token
    expires, then a batch runs with that catalog's client: the server refuses the expired token (401), the client
    asks for a new one with its client credentials and the batch commits 30 rows once, offsets at the end."""
    from tidewater_dev import rest_catalog as rest

    server = rest.start(tmp_path / "short-tokens", tmp_path / "short-tokens.log", client=REST_CLIENT, token_ttl=2)
    try:
        spec = _on_rest(home, broker, topic, rest_catalog_properties(server, home))
        catalog = load_catalog(spec)
        catalog.create_namespace_if_not_exists("rpc")
        issued = server.stats()["tokens issued"]
        time.sleep(2.5)
        assert ("rpc",) in catalog.list_namespaces()  # with the expired token: refused, refreshed, answered
        stats = server.stats()
        assert stats["expired tokens refused"] >= 1 and stats["tokens issued"] > issued
        produce_to_partition(broker.bootstrap, topic, 0, pizza_events(30, seed=572))
        plan, manifest = stage_inline(spec)
        validate_step(spec, plan, manifest)
        assert commit_step(spec, plan, manifest).rows == 30
        assert _rows_and_offsets(spec) == (30, {topic: {0: 30}})
    finally:
        server.stop()


def test_rest_credentials_from_an_airflow_connection_commit_and_a_wrong_secret_commits_nothing(
    broker, rest_catalog, home, topic, monkeypatch, capsys
):
    """The catalog comes from an Airflow ``http`` connection: host and port the server, login and password the
    OAuth2 client id and secret, the token endpoint and warehouse in its extra. A batch commits 25 rows and the
    secret appears in no result or log line. The same connection with a wrong password: a terminal error naming
    the catalog, no table and no offsets."""
    url = rest_catalog.url
    conn = {
        "conn_type": "http",
        "host": "127.0.0.1",
        "port": rest_catalog.port,
        "login": REST_CLIENT[0],
        "password": REST_CLIENT[1],
        "extra": {"warehouse": home.parent.name, "oauth2-server-uri": f"{url}/v1/oauth/tokens"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_REST", json.dumps(conn))
    spec = _on_rest(home, broker, topic, conn_id="lake_rest")
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(25, seed=573))
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    result = commit_step(spec, plan, manifest)
    assert result.rows == 25 and _rows_and_offsets(spec) == (25, {topic: {0: 25}})
    assert REST_CLIENT[1] not in repr(result.summary()) + capsys.readouterr().out

    other = home / "other"
    other.mkdir()
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAKE_WRONG",
        json.dumps({**conn, "password": "not-the-secret", "extra": {**conn["extra"], "warehouse": "wrong-secret"}}),
    )
    wrong = load_pipeline(
        write_pipeline(
            other, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, catalog={"name": "lake", "conn_id": "lake_wrong"}
        )
    )
    with pytest.raises(TerminalError) as e:
        load_catalog(wrong)
    assert not e.value.transient and "not-the-secret" not in str(e.value)
    right = load_pipeline(
        write_pipeline(
            other,
            topics=[topic],
            kafka={"bootstrap_servers": broker.bootstrap},
            catalog={"name": "lake", "properties": {**rest_catalog_properties(rest_catalog, home), "warehouse": "wrong-secret"}},
        )
    )
    assert load_table(load_catalog(right), right.table.identifier) is None, "nothing was made with the wrong secret"


def test_a_catalog_that_expires_snapshots_itself_leaves_the_pipeline_moving_from_its_tag_and_ledger(broker, rest_catalog, home, topic):
    """The catalog maintains the table on its own, as S3 Tables does: three batches, then the server expires every
    snapshot older than now with Iceberg's ExpireSnapshots (Java, on the server's side; the schedule is the test's
    call). Expected: only the newest batch's snapshot is left (the ``tidewater-offsets`` tag's); the next batch
    plans from it and lands the 7 new records once; the ledger still lists every batch and the deep audit is clean.
    (A user's own delete after the batches would be flagged by the audit as an outside write, rightly: see
    test_other_tools.py for the tag keeping an older snapshot alive.)"""
    from tests.conftest import ingest_inline

    spec = _on_rest(home, broker, topic, rest_catalog_properties(rest_catalog, home))
    for b in range(3):
        produce_to_partition(broker.bootstrap, topic, 0, pizza_events(10, seed=580 + b))
        assert ingest_inline(spec).records == 10
    assert rest_catalog.expire_snapshots(max_age_ms=0) >= 2
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert len(table.snapshots()) == 1 and committed_state(table).offsets == {topic: {0: 30}}
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(7, seed=583))
    assert ingest_inline(spec).records == 7
    assert _rows_and_offsets(spec) == (37, {topic: {0: 37}})
    assert _deep_audit_clean(spec).batches == 4  # the ledger's four batches, three of them past their snapshots


def test_batches_through_the_rest_catalog_land_in_a_bucket_warehouse(broker, rest_catalog, s3_endpoint, home, topic, monkeypatch):
    """The REST catalog's warehouse is a bucket (moto's S3 server: the stand-in for S3, which cannot run here): the
    server writes the table metadata through Iceberg's S3FileIO, Tidewater's writer the data files through pyiceberg's.
    Two batches: every record once, offsets at the end, every data file and the metadata in the bucket, the bucket's
    secret key in no snapshot summary, and the deep audit clean."""
    from pyarrow import fs

    from tests.conftest import REST_S3_KEYS, ingest_inline

    fs.S3FileSystem(
        endpoint_override=s3_endpoint,
        scheme="http",
        access_key=REST_S3_KEYS[0],
        secret_key=REST_S3_KEYS[1],
        region="us-east-1",
        allow_bucket_creation=True,
    ).create_dir("rest-lake")
    monkeypatch.setenv("TEST_S3_SECRET", REST_S3_KEYS[1])
    props = {
        **rest_catalog_properties(rest_catalog, home),
        "warehouse": f"s3://rest-lake/{home.parent.name}",
        "s3.endpoint": s3_endpoint,
        "s3.access-key-id": REST_S3_KEYS[0],
        "s3.secret-access-key": "${TEST_S3_SECRET}",
        "s3.region": "us-east-1",
    }
    spec = _on_rest(home, broker, topic, props)
    for b, n in enumerate((40, 15)):
        produce_to_partition(broker.bootstrap, topic, 0, pizza_events(n, seed=590 + b))
        assert ingest_inline(spec).records == n
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert table.metadata_location.startswith(f"s3://rest-lake/{home.parent.name}/")
    files = [f["file_path"] for f in table.inspect.files().to_pylist()]
    assert len(files) >= 2 and all(p.startswith(f"s3://rest-lake/{home.parent.name}/") for p in files)
    assert _rows_and_offsets(spec) == (55, {topic: {0: 55}})
    assert not any(REST_S3_KEYS[1] in json.dumps(dict(s.summary.additional_properties)) for s in table.snapshots())
    _deep_audit_clean(spec)


def test_the_maintenance_command_compacts_and_expires_a_rest_table_through_spark_s_rest_client(broker, rest_catalog, home, topic):
    """`tidewater maintain` (its own process, so its JVM is fresh: Spark's classpath cannot change inside one) on a
    REST pipeline: Spark's Iceberg REST client against the server, with Iceberg's runtime from Maven Central
    (``spark.iceberg_packages``; with the offline bundled runtime, which lacks the REST client's HTTP library,
    Spark's settings are refused before the JVM starts: the test above). Four batches over 2 partitions make 8 files; compaction
    leaves fewer with the same rows and offsets, expiry keeps the tagged snapshot, the next batch commits once on top,
    and the deep audit is clean."""
    import subprocess
    import sys

    from tests.conftest import ingest_inline
    from tidewater_dev.sample_data import produce

    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        catalog={"name": "lake", "properties": rest_catalog_properties(rest_catalog, home)},
        maintenance={"rewrite_data_files": {"min_input_files": 2}},
        spark={"iceberg_packages": REST_RUNTIME},
    )
    spec = load_pipeline(path)
    for b in range(4):
        produce(broker.bootstrap, topic, pizza_events(20, seed=610 + b), partitions=2)
        assert ingest_inline(spec).records == 20
    before = load_table(load_catalog(spec), spec.table.identifier)
    files_before = len(before.inspect.files())
    assert files_before >= 8 and _rows_and_offsets(spec) == (80, {topic: {0: 40, 1: 40}})
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tidewater.runtime.cli",
            "maintain",
            "--pipeline",
            str(path),
            "--actions",
            "rewrite_data_files,expire_snapshots",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TIDEWATER_HOME": str(home)},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    after = load_table(load_catalog(spec), spec.table.identifier)
    assert len(after.inspect.files()) < files_before and after.current_snapshot().summary.operation.value == "replace"
    assert _rows_and_offsets(spec) == (80, {topic: {0: 40, 1: 40}})
    produce(broker.bootstrap, topic, pizza_events(10, seed=615), partitions=2)
    assert ingest_inline(spec).records == 10
    assert _rows_and_offsets(spec) == (90, {topic: {0: 45, 1: 45}})
    _deep_audit_clean(spec)
