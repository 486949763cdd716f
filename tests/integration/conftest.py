"""Integration fixtures: the session's real schema registry in place of the stand-in."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def registry_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """Apicurio Registry (``tidewater_dev.schema_registry``: `make schema-registry` builds it, make test runs that)
    on a free 127.0.0.1 port for the whole session, in-memory. Subjects are the tests' own (each test has its own
    topic), so tests share it; ids are the registry's, never assumed."""
    from tidewater_dev import schema_registry

    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"tidewater-test-schema-registry-{os.getpid()}.log"
    server = schema_registry.start(tmp_path_factory.mktemp("schema-registry"), log)
    yield server
    server.stop()


@pytest.fixture
def registry_url(registry_server: object) -> str:
    """In the integration tests, the URL of the real registry (``registry_server``), where the unit tests' fixture of
    this name is the stand-in: confluent-kafka's serializers register through it and the pipeline reads from it."""
    return registry_server.url  # type: ignore[attr-defined]
