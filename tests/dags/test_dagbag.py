"""DAG integrity: every pipeline file becomes a DAG that imports cleanly, with tags, retries,
max_active_runs=1 and the plan -> write -> validate -> commit chain; a broken file is shown, not hidden;
parsing contacts nothing (no broker runs during these tests)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def dagbag(pipelines_dir: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("TIDEWATER_PIPELINES_DIR", str(pipelines_dir))
    return DagBag(dag_folder=str(REPO / "dags"))


def test_shipped_pipelines_import_without_errors(monkeypatch):
    bag = dagbag(REPO / "include" / "pipelines", monkeypatch)
    assert bag.import_errors == {}
    assert "ingest_pizzas" in bag.dags
    for dag_id, dag in bag.dags.items():
        assert {"tidewater", "ingest"} <= set(dag.tags), dag_id
        assert dag.max_active_runs == 1
        assert dag.doc_md
        assert all(t.retries >= 1 for t in dag.tasks), f"{dag_id}: every task has retries"


def test_task_chain(monkeypatch):
    dag = dagbag(REPO / "include" / "pipelines", monkeypatch).dags["ingest_pizzas"]
    assert dag.get_task("plan").downstream_task_ids == {"write", "validate", "commit"}
    assert dag.get_task("write").downstream_task_ids == {"validate"}
    assert dag.get_task("validate").downstream_task_ids == {"commit"}
    assert type(dag.get_task("write")).__name__ == "IngestSparkSubmitOperator"


def test_broken_pipeline_file_shows_as_a_failing_dag(tmp_path, monkeypatch):
    shutil.copy(REPO / "include" / "pipelines" / "pizzas.yaml", tmp_path / "pizzas.yaml")
    shutil.copy(REPO / "include" / "pipelines" / "pizzas.expectations.json", tmp_path)
    (tmp_path / "clicks.yaml").write_text("name: clicks\ntopics: [clicks]\ntable: web.clicks\nkafka: {bootstrp_servers: x}\n")
    bag = dagbag(tmp_path, monkeypatch)
    assert bag.import_errors == {}
    assert "ingest_pizzas" in bag.dags, "a broken file does not take the good pipelines down"
    broken = bag.dags["ingest_invalid_clicks"]
    assert "invalid-config" in broken.tags
    assert "bootstrp_servers: unknown key (did you mean 'bootstrap_servers'?)" in broken.doc_md
