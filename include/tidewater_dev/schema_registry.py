"""A real schema registry for the tests: Apicurio Registry (2.4.2.Final, in-memory storage), which `make
schema-registry` builds from Maven Central into .data/schema-registry (jvm/schema-registry/pom.xml says why that
version). It answers Confluent's API under ``/apis/ccompat/v7``: what confluent-kafka's registry client and
serializers ask, schema references included.

What it cannot do here: authenticate. Apicurio Registry's authentication is OIDC against an identity server
(Keycloak), which cannot run here; basic auth from a connection is tested against the stand-in
(``tidewater_dev.sample_data.LocalSchemaRegistry``), as are faults no real registry makes on demand.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tidewater.errors import ConfigError
from tidewater_dev.broker import free_port, java
from tidewater_dev.process import LocalServer, spawn

CHECKOUT = Path(__file__).resolve().parents[2]
CCOMPAT = "/apis/ccompat/v7"  # Apicurio Registry's Confluent-compatible API


def default_build() -> Path:
    return CHECKOUT / ".data" / "schema-registry"


@dataclass
class SchemaRegistryServer(LocalServer):
    grace: ClassVar[float] = 10.0

    @property
    def url(self) -> str:
        """The URL a Confluent client takes (``format.registry_url``)."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT}"


def start(root: Path, log_path: Path, build: Path | None = None, timeout: float = 120) -> SchemaRegistryServer:
    """Start a registry on a free 127.0.0.1 port (its working folder ``root``) and return once it answers."""
    build = build or default_build()
    runner = next(iter(sorted(build.glob("*-runner.jar"))), None)
    if not (build / ".installed").is_file() or runner is None:
        raise ConfigError(f"{build} is missing: run `make schema-registry` (make test does)")
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    # settings through the environment, which Quarkus reads (QUARKUS_HTTP_PORT for quarkus.http.port)
    env = {**os.environ, "QUARKUS_HTTP_PORT": str(port), "QUARKUS_HTTP_HOST": "127.0.0.1"}
    cmd = [java(), "-Xmx256m", "-XX:+UseSerialGC", "-jar", str(runner)]
    proc = spawn(cmd, log_path, env, cwd=root)
    return SchemaRegistryServer(proc.pid, port, str(log_path)).listening(proc, "the schema registry", timeout)
