"""The REST catalog's configuration path. No Iceberg REST catalog server can be installed here (the reference
ones are Java or Rust distributions and container images, not in the package registries), so these tests
use a local HTTP stand-in that answers like a REST catalog refusing or failing, and check what Tidewater makes
of it: an unreachable or failing catalog is transient, refused credentials are terminal; Spark gets the same
catalog with its secret kept off the command line."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from tests.conftest import write_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.errors import TerminalError, TransientError
from tidewater.table.catalog import load_catalog

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


def _spec(home, uri: str):
    return load_pipeline(write_pipeline(home, catalog={"name": "lake", "properties": {
        "type": "rest", "uri": uri, "credential": "client:${TEST_REST_SECRET}", "warehouse": "analytics"}}))


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
    conf = spark_conf_module.spark_conf(_spec(home, "https://catalog.example"))
    assert conf["spark.sql.catalog.lake.type"] == "rest" and conf["spark.sql.catalog.lake.uri"] == "https://catalog.example"
    assert conf["spark.sql.catalog.lake.warehouse"] == "analytics"
    from tidewater.config.secrets import split_secrets

    public, secret = split_secrets(conf)  # what a spark-submit of these settings would put apart
    assert secret["spark.sql.catalog.lake.credential"] == "client:s3cr3t-value" and "s3cr3t-value" not in repr(public)
    # the write step's spark-submit never opens the catalog in Spark: it carries no catalog credential at all
    settings = spark_conf_module.write_submit_settings(_spec(home, "https://catalog.example"))
    assert "s3cr3t-value" not in repr(settings)
