"""An Iceberg REST catalog server for the tests: ``jvm/rest-catalog/RestCatalogServer.java`` run from source with
the classpath `make rest-catalog` copies from Maven Central (Iceberg 1.12.0's core, SQLite's JDBC driver, Hadoop's
client for the warehouse files). Iceberg's own request handlers (``CatalogHandlers``) over a JdbcCatalog on its own
SQLite store answer the REST spec's routes; the Java file is the HTTP front (routing, JSON, OAuth2 client
credentials). Why not Iceberg's REST fixture, Nessie or Polaris: none of their servers is served from Maven
Central here (see jvm/rest-catalog/pom.xml).

The server offers the multi-table commit (``POST /v1/{prefix}/transactions/commit``): every table's requirements
checked, then every table's updates applied, under the lock all its commits take (the Java file says what is not
atomic there: a crash of the server itself between two tables).

Settings reach the server through its environment (the client secret never on a command line). Routes of its own
serve the tests: ``GET /test/stats`` counts requests by route, tokens issued, expired tokens refused and
transactions committed; ``POST /test/fail-commits?n=N`` refuses the next N commits with 409 CommitFailedException,
as a concurrent committer would; ``POST /test/hold-transactions?ms=N`` makes the next multi-table commit wait before
it applies, for a kill test; ``POST /test/expire?max-age-ms=N`` is the catalog maintaining its tables itself (S3
Tables expires snapshots older than 120 hours on its own schedule): Iceberg's ExpireSnapshots on every table, at the
test's call.
"""

from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tidewater.errors import ConfigError
from tidewater_dev.broker import free_port, java
from tidewater_dev.process import LocalServer, spawn

CHECKOUT = Path(__file__).resolve().parents[2]
SOURCE = CHECKOUT / "jvm" / "rest-catalog" / "RestCatalogServer.java"


def default_libs() -> Path:
    return CHECKOUT / ".data" / "rest-catalog" / "libs"


@dataclass
class RestCatalogServer(LocalServer):
    root: str = ""  # the server's warehouse and store

    grace: ClassVar[float] = 10.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def warehouse(self) -> str:
        return str(Path(self.root) / "warehouse")

    def stats(self) -> dict[str, int]:
        """Requests by method and route, ``tokens issued``, ``expired tokens refused``, ``refused commits``."""
        with urllib.request.urlopen(self.url + "/test/stats", timeout=10) as r:
            return json.loads(r.read())

    def expire_snapshots(self, max_age_ms: int = 0) -> int:
        """Expire every table's snapshots older than ``max_age_ms`` on the server's side; returns how many went."""
        req = urllib.request.Request(f"{self.url}/test/expire?max-age-ms={max_age_ms}", method="POST", data=b"")
        with urllib.request.urlopen(req, timeout=60) as r:
            return int(json.loads(r.read())["expired"])

    def fail_commits(self, n: int) -> None:
        """Refuse the next ``n`` table commits (a multi-table commit counts once) with 409 CommitFailedException."""
        self._post(f"/test/fail-commits?n={n}")

    def hold_transactions(self, ms: int) -> None:
        """Make the next multi-table commit wait ``ms`` after its requirements are checked, before it applies."""
        self._post(f"/test/hold-transactions?ms={ms}")

    def _post(self, route: str) -> None:
        req = urllib.request.Request(self.url + route, method="POST", data=b"")
        urllib.request.urlopen(req, timeout=10).close()


def start(
    root: Path,
    log_path: Path,
    client: tuple[str, str] | None = None,
    token_ttl: int = 3600,
    libs: Path | None = None,
    timeout: float = 120,
    s3: tuple[str, str, str] | None = None,
) -> RestCatalogServer:
    """Start a server on a free 127.0.0.1 port, its store and warehouse under ``root``, and return once it listens.
    ``client``: the OAuth2 client id and secret it requires (None: no authentication); ``token_ttl``: seconds a
    token lives; ``s3``: the endpoint, access key and secret key of the bucket warehouses (``s3://`` ones)."""
    libs = libs or default_libs()
    if not (libs / ".installed").is_file():
        raise ConfigError(f"{libs} is missing: run `make rest-catalog` (make test does)")
    for sub in ("warehouse", "store"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {
        **os.environ,
        "REST_PORT": str(port),
        "REST_STORE": str(root / "store"),
        "REST_WAREHOUSE": str(root / "warehouse"),
        "REST_TOKEN_TTL": str(token_ttl),
    }
    if client:
        env["REST_CLIENT_ID"], env["REST_CLIENT_SECRET"] = client
    if s3:
        env["REST_S3_ENDPOINT"], env["REST_S3_ACCESS_KEY"], env["REST_S3_SECRET_KEY"] = s3
    cmd = [java(), "-Xmx384m", "-XX:+UseSerialGC", "-cp", f"{libs}/*", str(SOURCE)]
    proc = spawn(cmd, log_path, env)
    return RestCatalogServer(proc.pid, port, str(log_path), str(root)).listening(proc, "the REST catalog server", timeout)
