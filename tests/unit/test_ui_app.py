"""The Tidewater view's FastAPI app (runtime/ui.py) in FastAPI's own terms: a pipeline's routes take it through one
dependency (404 unknown, 403 not readable), Tidewater's errors answer through one exception handler (400 a bad
setting, 503 transient, 500 terminal), the React bundle is static files revalidated on every load.

Airflow's sign-in and its auth manager are overridden here (the UI end-to-end tests run them in a real api-server);
the overview raising each kind of error is a stand-in for a broker or catalog in that state."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from airflow.api_fastapi.core_api.security import get_user
from fastapi.testclient import TestClient

from tidewater.errors import ConfigError, TerminalError, TransientError
from tidewater.runtime import ui

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def view(tmp_path, monkeypatch):
    for name in ("pizzas.yaml", "pizzas.expectations.json"):
        shutil.copy(REPO / "include" / "pipelines" / name, tmp_path)
    monkeypatch.setenv("TIDEWATER_PIPELINES_DIR", str(tmp_path))
    monkeypatch.setattr(ui, "_LOADED", {})
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "tidewater-ui.js").write_text("globalThis.AirflowPlugin = () => null;")
    monkeypatch.setattr(ui, "STATIC", bundle)
    readable: set[str] = {"ingest_pizzas"}
    monkeypatch.setattr(ui, "_readable", lambda user, dag_ids: set(dag_ids) & readable)
    app = ui.create_app()
    for dep in app.router.dependencies:
        app.dependency_overrides[dep.dependency] = lambda: None
    app.dependency_overrides[get_user] = lambda: None
    return TestClient(app), readable  # readable: the DAG ids the signed-in user may read, for a test to change


def test_a_pipelines_routes_answer_404_for_no_such_pipeline_and_403_without_its_dag(view):
    client, readable = view
    assert [p["name"] for p in client.get("/api/pipelines").json()] == ["pizzas"]
    missing = client.get("/api/pipelines/nope/lag-history")
    assert missing.status_code == 404 and missing.json() == {"detail": "no pipeline named 'nope'"}
    readable.clear()
    assert client.get("/api/pipelines").json() == []
    for path in (
        "/api/pipelines/pizzas",
        "/api/pipelines/pizzas/dead-letters",
        "/api/pipelines/pizzas/runs/x",
        "/data-docs/pizzas/index.html",
    ):
        refused = client.get(path)
        assert refused.status_code == 403 and "no access to its DAG ingest_pizzas" in refused.json()["detail"], path


@pytest.mark.parametrize(
    ("error", "status"),
    [(ConfigError("kafka.bootstrap_servers: missing"), 400), (TransientError("broker unreachable"), 503), (TerminalError("broken"), 500)],
)
def test_tidewaters_errors_answer_by_whether_they_are_worth_retrying(view, monkeypatch, error, status):
    client, _ = view
    from tidewater.ops import overview

    def failing(spec, batches):
        raise error

    monkeypatch.setattr(overview, "overview", failing)
    answer = client.get("/api/pipelines/pizzas")
    assert answer.status_code == status and answer.json() == {"detail": str(error)}


def test_the_bundle_is_served_revalidated_and_nothing_outside_it(view):
    client, _ = view
    js = client.get("/static/tidewater-ui.js")
    assert js.status_code == 200 and js.headers["cache-control"] == "no-cache"
    assert js.headers["content-type"].startswith("text/javascript") and "AirflowPlugin" in js.text
    assert client.get("/static/missing.js").status_code == 404
    assert client.get("/static/../../pizzas.yaml").status_code == 404
