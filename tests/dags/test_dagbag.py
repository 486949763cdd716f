"""DAG integrity: every pipeline file becomes a DAG that imports cleanly, with tags, retries,
max_active_runs=1 and the plan -> write -> validate -> commit chain; a broken file is shown, not hidden;
parsing contacts nothing (no broker runs during these tests)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def dagbag(pipelines_dir: Path, monkeypatch: pytest.MonkeyPatch):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("TIDEWATER_PIPELINES_DIR", str(pipelines_dir))
    return DagBag(dag_folder=str(REPO / "dags"))


def test_shipped_pipelines_import_without_errors(monkeypatch):
    bag = dagbag(REPO / "include" / "pipelines", monkeypatch)
    assert bag.import_errors == {}
    assert {"ingest_pizzas", "maintain_pizzas", "replay_pizzas", "skip_pizzas", "audit_pizzas", "retry_dead_letters_pizzas"} <= set(
        bag.dags
    )
    for dag_id, dag in bag.dags.items():
        kind = {
            "ingest": "ingest",
            "replay": "replay",
            "maintain": "maintenance",
            "skip": "skip",
            "audit": "audit",
            "retry": "retry_dead_letters",
        }[dag_id.split("_")[0]]
        assert {"tidewater", kind} <= set(dag.tags), dag_id
        assert dag.max_active_runs == 1
        assert dag.doc_md
        assert all(t.retries >= 1 for t in dag.tasks), f"{dag_id}: every task has retries"
        # Airflow 3.3: every task asks the pipeline's retry policy (terminal errors fail at once, runtime/retries.py)
        assert all(type(t.retry_policy).__name__ == "ErrorClassRetryPolicy" for t in dag.tasks), dag_id


def test_the_dag_file_is_two_lines_and_every_dag_names_it_as_its_file(monkeypatch):
    """The DAGs are built by the package (``tidewater.runtime.airflow_dags``): the DAG file a deployment keeps is two
    lines of code, and every DAG records that file as its own, so that Airflow's workers parse the file they were
    given rather than the package's module."""
    dag_file = REPO / "dags" / "tidewater_dags.py"
    code = [ln for ln in dag_file.read_text().splitlines() if ln.strip() and not ln.startswith(('"""', "#"))]
    assert code == ["from tidewater.runtime.airflow_dags import pipeline_dags", "globals().update(pipeline_dags())"]
    assert sorted(p.name for p in (REPO / "dags").glob("*.py")) == ["tidewater_dags.py"]
    bag = dagbag(REPO / "include" / "pipelines", monkeypatch)
    assert bag.dags and {dag.fileloc for dag in bag.dags.values()} == {str(dag_file)}


def test_task_chain(monkeypatch):
    dag = dagbag(REPO / "include" / "pipelines", monkeypatch).dags["ingest_pizzas"]
    assert dag.get_task("plan").downstream_task_ids == {"write", "validate", "commit", "data_docs"}
    assert dag.get_task("write").downstream_task_ids == {"validate"}
    assert dag.get_task("validate").downstream_task_ids == {"commit", "data_docs"}
    assert dag.get_task("commit").downstream_task_ids == set()  # the Data Docs page never delays a commit
    assert type(dag.get_task("write")).__name__ == "IngestSparkSubmitOperator"


def test_maintenance_dag_chain_schedule_and_asset(tmp_path, monkeypatch):
    """maintain_<name>: the enabled actions in order, on the pipeline's maintenance schedule, each bounded by the task
    timeout; a disabled action has no task. Only the last action updates an asset, the maintenance asset of its own:
    never the table's, whose events mean new rows to the DAGs scheduled on it."""
    spec = (REPO / "include" / "pipelines" / "pizzas.yaml").read_text()
    (tmp_path / "pizzas.yaml").write_text(spec + "\nmaintenance:\n  schedule: '0 3 * * *'\n  rewrite_manifests: false\n")
    shutil.copy(REPO / "include" / "pipelines" / "pizzas.expectations.json", tmp_path)
    dag = dagbag(tmp_path, monkeypatch).dags["maintain_pizzas"]
    assert [t.task_id for t in dag.topological_sort()] == ["rewrite_data_files", "expire_snapshots", "remove_orphan_files"]
    assert dag.get_task("rewrite_data_files").downstream_task_ids == {"expire_snapshots"}
    assert dag.get_task("expire_snapshots").downstream_task_ids == {"remove_orphan_files"}
    assert dag.schedule == "0 3 * * *"
    for t in dag.tasks:
        assert t.execution_timeout is not None
    assert {t.task_id: [o.uri for o in t.outlets] for t in dag.tasks} == {
        "rewrite_data_files": [],
        "expire_snapshots": [],
        "remove_orphan_files": ["tidewater://maintenance/pizzas"],
    }


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


def test_routed_pipeline_dags(tmp_path, monkeypatch):
    """A routed pipeline (docs/examples/payments_by_type.yaml) makes its ingest, replay (with a tables
    field), skip, maintenance and audit DAGs; the maintenance DAG's asset is its own (not a table's) and
    the documentation names the target tables."""
    shutil.copy(REPO / "docs" / "examples" / "payments_by_type.yaml", tmp_path)
    bag = dagbag(tmp_path, monkeypatch)
    assert bag.import_errors == {}
    assert "payments.debit, payments.credit, payments.bank_slip" in bag.dags["ingest_payments"].doc_md
    replay = bag.dags["replay_payments"]
    assert "payments.debit, payments.credit, payments.bank_slip" in replay.doc_md
    assert replay.params["tables"] == [] and "reapply" in replay.params.get_param("mode").schema["enum"]
    assert "the tables of `payments`" in bag.dags["skip_payments"].doc_md
    import yaml

    doc = yaml.safe_load((tmp_path / "payments_by_type.yaml").read_text())
    doc["validation"] = {**doc.get("validation", {}), "on_failure": "quarantine"}
    (tmp_path / "payments_by_type.yaml").write_text(yaml.safe_dump(doc))
    held = dagbag(tmp_path, monkeypatch).dags["quarantine_payments"]
    assert held.params["table"] == "" and "the tables of `payments`" in held.doc_md
    assert "payments.debit, payments.credit, payments.bank_slip" in bag.dags["audit_payments"].doc_md
    maintain = bag.dags["maintain_payments"]
    assert {o.uri for t in maintain.tasks for o in t.outlets} == {"tidewater://maintenance/payments"}


def test_replay_dag_form_and_chain(monkeypatch):
    """replay_<name>: triggered only, a typed parameter form, the same plan -> write -> validate -> commit
    chain; the ingest DAG offers `reprocess` for backfills."""
    bag = dagbag(REPO / "include" / "pipelines", monkeypatch)
    dag = bag.dags["replay_pizzas"]
    assert dag.schedule is None
    params = dag.params.dump()
    assert params == {
        "topic": "completed-pizzas",
        "partitions": [],
        "start_offset": None,
        "end_offset": None,
        "start_time": None,
        "end_time": None,
        "mode": "replace",
        "dry_run": True,
    }  # dry run by default
    assert dag.params.get_param("mode").schema["enum"] == ["replace", "append-missing"]
    for name in ("start_offset", "end_offset", "start_time", "end_time", "mode", "dry_run"):
        assert dag.params.get_param(name).description, name  # every field of the form explains itself
    assert "append-missing: add only the offsets the table does not hold" in dag.params.get_param("mode").description
    # what the form can check is checked before a run starts
    from airflow.sdk.exceptions import ParamValidationError

    for good in ("2024-01-04T12:00:00Z", "2024-01-04 12:00", "2024-01-04T12:00:00.5+02:00", "2024-01-04", None):
        dag.params.get_param("start_time").resolve(good)
    for bad in ("yesterday", "04/01/2024", "2024-01-04T12"):
        with pytest.raises(ParamValidationError):
            dag.params.get_param("end_time").resolve(bad)
    with pytest.raises(ParamValidationError):
        dag.params.get_param("start_offset").resolve(-1)
    assert dag.params.get_param("topic").schema["enum"] == ["completed-pizzas"]
    assert dag.get_task("plan").downstream_task_ids == {"write", "validate", "commit", "data_docs"}
    assert dag.get_task("validate").downstream_task_ids == {"commit", "data_docs"}
    assert dag.get_task("commit").downstream_task_ids == set()  # the Data Docs page never delays a commit
    assert bag.dags["ingest_pizzas"].params.dump() == {"reprocess": False}


def test_quarantine_dag_only_for_the_quarantine_policy(tmp_path, monkeypatch):
    spec = (REPO / "include" / "pipelines" / "pizzas.yaml").read_text()
    shutil.copy(REPO / "include" / "pipelines" / "pizzas.expectations.json", tmp_path)
    (tmp_path / "pizzas.yaml").write_text(spec.replace("validation:\n", "validation:\n  on_failure: quarantine\n", 1))
    bag = dagbag(tmp_path, monkeypatch)
    assert bag.import_errors == {}
    dag = bag.dags["quarantine_pizzas"]
    assert dag.schedule is None and dag.params.dump() == {"action": "list", "batch_id": "", "reason": None}
    # the form's run takes the form's task; a decision run (conf `decision`, started by an ingest run) waits in
    # `decide` for a person, then `apply` publishes or drops (runtime/decisions.py)
    assert dag.get_task("route").downstream_task_ids == {"quarantine", "decide"}
    assert dag.get_task("decide").downstream_task_ids == {"apply"}
    assert dag.get_task("decide").options == ["Publish", "Drop"] and dag.get_task("decide").execution_timeout is None
    # a decision Airflow 3.3 fails after the answer (apache/airflow#72716) is asked again, twice, 10 s apart
    assert (dag.get_task("decide").retries, dag.get_task("decide").retry_delay.total_seconds()) == (2, 10)
    assert dag.max_active_runs > 1  # an undecided batch does not hold up the next decision or a form run
    assert "quarantine_pizzas" not in dagbag(REPO / "include" / "pipelines", monkeypatch).dags


def test_an_invalid_schedule_is_a_configuration_error_and_hides_no_other_dag(tmp_path, monkeypatch):
    """`schedule: "every 3 minutes"` fails validation naming the key (cron or preset expected); in the DAG
    folder that file shows as its failing DAG while every other pipeline keeps its DAGs."""
    import yaml

    from tidewater.config.parse import load_pipeline
    from tidewater.errors import ConfigError

    shutil.copy(REPO / "include" / "pipelines" / "pizzas.yaml", tmp_path / "pizzas.yaml")
    shutil.copy(REPO / "include" / "pipelines" / "pizzas.expectations.json", tmp_path)
    doc = yaml.safe_load((tmp_path / "pizzas.yaml").read_text())
    (tmp_path / "clicks.yaml").write_text(
        yaml.safe_dump({**doc, "name": "clicks", "schedule": "every 3 minutes", "table": {"identifier": "web.clicks"}})
    )
    with pytest.raises(ConfigError, match=r"schedule: 'every 3 minutes' is neither a cron expression"):
        load_pipeline(tmp_path / "clicks.yaml")
    for ok in ("*/3 * * * *", "@hourly", None):
        (tmp_path / "ok.yaml").write_text(yaml.safe_dump({**doc, "name": "ok", "schedule": ok, "table": {"identifier": "web.ok"}}))
        assert load_pipeline(tmp_path / "ok.yaml").schedule == ok
    (tmp_path / "ok.yaml").unlink()
    bag = dagbag(tmp_path, monkeypatch)
    assert bag.import_errors == {}
    assert {"ingest_pizzas", "replay_pizzas", "maintain_pizzas"} <= set(bag.dags)
    assert "schedule: 'every 3 minutes'" in bag.dags["ingest_invalid_clicks"].doc_md
    assert "ingest_clicks" not in bag.dags and "maintain_clicks" not in bag.dags


def test_task_results_carry_snapshot_ids_as_strings():
    """XCom goes through JSON and the UI rounds integers above 2^53: every key ending in snapshot_id, at any
    depth, becomes a string; other numbers stay numbers."""
    from tidewater.runtime.airflow import ids_as_strings

    big = 2**62 + 1
    result = ids_as_strings(
        {"snapshot_id": big, "rows": big, "tables": [{"last_snapshot_id": 7, "files": 2}], "none": {"snapshot_id": None}}
    )
    assert result == {
        "snapshot_id": str(big),
        "rows": big,
        "tables": [{"last_snapshot_id": "7", "files": 2}],
        "none": {"snapshot_id": None},
    }


def test_the_write_task_refuses_cluster_deploy_mode_on_a_standalone_master_before_spark_submit(tmp_path, monkeypatch):
    """The ingest DAG's write task, whose Spark connection asks for cluster deploy mode on a standalone master
    (Spark refuses Python drivers there): it fails at once, without retries (the task's retry policy fails a
    ConfigError), saying what works instead."""
    from datetime import timedelta
    from types import SimpleNamespace

    from airflow.sdk.definitions.retry_policy import RetryAction

    from tidewater.errors import ConfigError
    from tidewater.runtime.airflow import IngestSparkSubmitOperator
    from tidewater.runtime.retries import retry_policy

    pipeline = tmp_path / "p.yaml"
    pipeline.write_text("name: p\ntopics: [a]\nkafka: {bootstrap_servers: 'h:9092'}\ntable: ns.t\nspark: {conn_id: standalone_cluster}\n")
    monkeypatch.setenv(
        "AIRFLOW_CONN_STANDALONE_CLUSTER",
        '{"conn_type": "spark", "host": "spark://127.0.0.1", "port": 7077, "extra": {"deploy-mode": "cluster"}}',
    )
    op = IngestSparkSubmitOperator(task_id="write", pipeline_path=str(pipeline), conn_id="standalone_cluster")
    context = {"ti": SimpleNamespace(xcom_pull=lambda task_ids: {"batch_id": "b", "plan_path": "s3://x/p/b/plan.json"})}
    with pytest.raises(ConfigError, match="deploy-mode: Spark runs a Python driver in cluster deploy mode") as raised:
        op.execute(context)
    assert retry_policy(timedelta(seconds=60)).evaluate(raised.value, 1, 2).action is RetryAction.FAIL


def test_a_spark_connect_connection_is_not_a_master_for_maintenance_sessions(monkeypatch):
    """The DAGs' Spark connection of the provider's `spark_connect` type: the write step runs on that server, and the
    maintenance task's own Spark session uses the pipeline's spark.master (it was given the server's host as a master,
    which spark-submit refused). A `spark` connection's host and port stay the master; no connection: spark.master."""
    from tidewater.runtime.airflow import spark_master

    monkeypatch.setenv("AIRFLOW_CONN_TW_CONNECT", '{"conn_type": "spark_connect", "host": "127.0.0.1", "port": 15002}')
    monkeypatch.setenv("AIRFLOW_CONN_TW_CLUSTER", '{"conn_type": "spark", "host": "spark://10.0.0.5", "port": 7077}')
    assert spark_master("tw_connect", "local[2]") == "local[2]"
    assert spark_master("tw_cluster", "local[2]") == "spark://10.0.0.5:7077"
    assert spark_master("tw_missing", "local[3]") == "local[3]"


def test_the_audit_dag_runs_on_its_schedule_and_exists_for_single_table_pipelines(tmp_path, monkeypatch):
    """audit_<name>: one task on `audit.schedule` (triggered only with null); none for a routed pipeline."""
    (tmp_path / "p.yaml").write_text(
        "name: p\ntopics: [a]\nkafka: {bootstrap_servers: 'h:9092'}\ntable: ns.t\naudit: {schedule: '@hourly'}\n"
    )
    (tmp_path / "q.yaml").write_text("name: q\ntopics: [a]\nkafka: {bootstrap_servers: 'h:9092'}\ntable: ns.u\naudit: {schedule: null}\n")
    bag = dagbag(tmp_path, monkeypatch)
    assert bag.import_errors == {}
    assert [t.task_id for t in bag.dags["audit_p"].tasks] == ["audit"]
    assert bag.dags["audit_p"].schedule == "@hourly" and bag.dags["audit_q"].schedule is None


# the tasks' libraries, and the Spark provider's operator module (it loads the Kubernetes client: 0.9 s per parse,
# which every task's start pays; the write task imports the provider's hook when it runs spark-submit)
HEAVY = (
    "pyarrow",
    "pyspark",
    "pyiceberg",
    "confluent_kafka",
    "great_expectations",
    "airflow.providers.apache.spark.operators.spark_submit",
    "kubernetes",
)


def test_parsing_the_dag_folder_imports_no_heavy_library(tmp_path):
    """Airflow parses the DAG folder often, and at every task's start: a fresh interpreter parses it (the shipped
    pipelines and a routed one) and none of the heavy libraries the tasks use is imported: they load inside the task
    bodies only."""
    import json
    import os
    import subprocess
    import sys

    pipelines = tmp_path / "pipelines"
    shutil.copytree(REPO / "include" / "pipelines", pipelines)
    shutil.copy(REPO / "docs" / "examples" / "inventory_database.yaml", pipelines)
    code = (
        "import json, sys\nfrom airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(REPO / 'dags')!r})\n"
        f"print(json.dumps({{'dags': sorted(bag.dags), 'errors': list(bag.import_errors), "
        f"'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}))\n"
    )
    env = {**os.environ, "TIDEWATER_PIPELINES_DIR": str(pipelines), "AIRFLOW_HOME": str(tmp_path / "airflow")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    assert doc["errors"] == [] and "ingest_pizzas" in doc["dags"] and "ingest_inventory" in doc["dags"], doc
    assert doc["heavy"] == []


def many_pipelines(folder: Path, n: int, broken: int | None = None) -> list[str]:
    """``n`` pipeline files ``p0000.yaml``... (the example's settings, each its own name, topic and table), the
    ``broken``-th with a misspelled key; returns their names."""
    folder.mkdir(parents=True, exist_ok=True)
    example = (REPO / "include" / "pipelines" / "pizzas.yaml").read_text()
    shutil.copy(REPO / "include" / "pipelines" / "pizzas.expectations.json", folder)
    names = []
    for i in range(n):
        name = f"p{i:04d}"
        text = (
            example.replace("name: pizzas", f"name: {name}")
            .replace("completed-pizzas", f"topic-{name}")
            .replace("rpc.pizzas", f"rpc.{name}")
        )
        if i == broken:
            text = text.replace("bootstrap_servers:", "bootstrp_servers:")
        (folder / f"{name}.yaml").write_text(text)
        names.append(name)
    return names


def parse_in_subprocess(folder: Path, tmp_path: Path, dag_id: str | None) -> dict:
    """The DAG folder parsed by a fresh interpreter as Airflow's task runner does (its parsing context names the
    task's DAG when ``dag_id`` is given): the DAG ids and import errors."""
    import json
    import os
    import subprocess
    import sys

    code = (
        "import json\nfrom airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(REPO / 'dags')!r})\n"
        "print(json.dumps({'dags': sorted(bag.dags), 'errors': list(bag.import_errors)}))\n"
    )
    # 500 files take 22-37 s on this 2-core machine beside other tests, past Airflow's default 30 s import timeout:
    # these tests are about which DAGs a parse builds, not its time (docs/explanation/scale.md says to raise it)
    env = {
        **os.environ,
        "TIDEWATER_PIPELINES_DIR": str(folder),
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "600",
    }
    env.pop("_AIRFLOW_PARSING_CONTEXT_DAG_ID", None)
    if dag_id:
        env["_AIRFLOW_PARSING_CONTEXT_DAG_ID"] = dag_id
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_task_parse_builds_only_its_own_pipelines_dags_and_the_dag_processor_sees_all(tmp_path):
    """Airflow parses a task's DAG file when the task starts, with its parsing context naming the task's DAG: that
    parse builds the DAGs of the one pipeline file named after the DAG's pipeline (any of its kinds), so a task's
    start does not grow with the folder. Without a parsing context (the DAG processor) every DAG is built; a DAG
    whose file is named otherwise than its pipeline is still found (every file is built then)."""
    folder = tmp_path / "pipelines"
    many_pipelines(folder, 20)
    (folder / "p0019.yaml").rename(folder / "renamed.yaml")  # pipeline p0019 in a file named otherwise
    every = parse_in_subprocess(folder, tmp_path, None)
    assert every["errors"] == [] and len(every["dags"]) == 20 * 6, every
    own = {f"{kind}_p0007" for kind in ("ingest", "replay", "skip", "retry_dead_letters", "audit", "maintain")}
    for dag_id in ("ingest_p0007", "retry_dead_letters_p0007", "maintain_p0007"):  # the longest kind, the first, last
        assert set(parse_in_subprocess(folder, tmp_path, dag_id)["dags"]) == own, dag_id
    assert parse_in_subprocess(folder, tmp_path, "ingest_p0019")["dags"] == every["dags"]


@pytest.mark.slow
def test_one_broken_file_among_500_hides_none_of_the_other_499(tmp_path):
    """A platform's folder: 500 pipeline files, one with a misspelled key. The DAG processor's parse builds the 499
    good pipelines' DAGs (6 each) and shows the broken file as its failing DAG; a task of that failing DAG parses
    it alone."""
    folder = tmp_path / "pipelines"
    names = many_pipelines(folder, 500, broken=123)
    every = parse_in_subprocess(folder, tmp_path, None)
    assert every["errors"] == []
    assert len(every["dags"]) == 499 * 6 + 1
    assert "ingest_invalid_p0123" in every["dags"] and "ingest_p0123" not in every["dags"]
    assert {f"ingest_{n}" for n in names if n != "p0123"} <= set(every["dags"])
    assert parse_in_subprocess(folder, tmp_path, "ingest_invalid_p0123")["dags"] == ["ingest_invalid_p0123"]


def test_a_multi_host_executor_refuses_the_per_host_default_catalog_and_staging(tmp_path, monkeypatch):
    """Airflow's executor set to Celery (tasks of one run may land on different hosts): a pipeline without
    `catalog.properties` and `batch.staging_dir` would have each host read and write offsets in its own SQLite catalog
    under $TIDEWATER_HOME. Its file shows as a failing DAG naming both settings, and `tidewater validate` refuses it
    (exit 2, the same message); a pipeline that sets both keeps its DAGs; under the LocalExecutor the defaults stand."""
    import os
    import subprocess
    import sys

    import yaml

    shutil.copy(REPO / "include" / "pipelines" / "pizzas.yaml", tmp_path / "pizzas.yaml")
    shutil.copy(REPO / "include" / "pipelines" / "pizzas.expectations.json", tmp_path)
    doc = yaml.safe_load((tmp_path / "pizzas.yaml").read_text())
    doc.pop("catalog", None)
    doc.get("batch", {}).pop("staging_dir", None)
    (tmp_path / "pizzas.yaml").write_text(yaml.safe_dump(doc))
    shared = {
        **doc,
        "name": "shared",
        "table": {"identifier": "web.shared"},
        "catalog": {"properties": {"type": "sql", "uri": "postgresql+psycopg2://db/catalog", "warehouse": "s3://lake/w"}},
        "batch": {**doc.get("batch", {}), "staging_dir": "s3://lake/staging"},
        "validation": {**doc.get("validation", {}), "data_docs_dir": "s3://lake/docs"},
    }
    (tmp_path / "shared.yaml").write_text(yaml.safe_dump(shared))

    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor")
    bag = dagbag(tmp_path, monkeypatch)
    assert "ingest_pizzas" not in bag.dags and {"ingest_shared", "replay_shared"} <= set(bag.dags)
    doc_md = bag.dags["ingest_invalid_pizzas"].doc_md
    assert "catalog.properties: Airflow's executor (CeleryExecutor) can run a batch's tasks on different hosts" in doc_md
    assert "batch.staging_dir: Airflow's executor (CeleryExecutor)" in doc_md
    cli = [sys.executable, "-m", "tidewater.runtime.cli", "validate", "--pipeline"]
    env = {**os.environ, "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor"}
    refused = subprocess.run([*cli, str(tmp_path / "pizzas.yaml")], env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "catalog.properties: Airflow's executor (CeleryExecutor)" in refused.stderr, refused
    assert subprocess.run([*cli, str(tmp_path / "shared.yaml")], env=env, capture_output=True, timeout=120).returncode == 0

    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
    assert "ingest_pizzas" in dagbag(tmp_path, monkeypatch).dags


def test_pool_queue_and_failure_callback_reach_every_task_and_a_bad_callback_is_named(tmp_path, monkeypatch):
    """`airflow.pool`, `airflow.queue` and `airflow.on_failure` (a notifier class, made once at parse time) are set on
    every task of every DAG of the pipeline; an `on_failure` path that does not import shows the pipeline as its
    failing DAG naming the setting, and the other pipelines keep theirs."""
    import yaml

    shutil.copy(REPO / "include" / "pipelines" / "pizzas.expectations.json", tmp_path)
    doc = yaml.safe_load((REPO / "include" / "pipelines" / "pizzas.yaml").read_text())
    doc["airflow"] = {**doc.get("airflow", {}), "pool": "tidewater", "queue": "spark", "on_failure": "tests.e2e.late_hook.FailureFile"}
    (tmp_path / "pizzas.yaml").write_text(yaml.safe_dump(doc))
    bad = {**doc, "name": "bad", "table": "web.bad", "airflow": {"on_failure": "tests.e2e.late_hook.nothing_here"}}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    monkeypatch.syspath_prepend(str(REPO))
    bag = dagbag(tmp_path, monkeypatch)
    ours = [d for d in bag.dags.values() if d.dag_id.endswith("_pizzas")]
    assert len(ours) >= 6
    for d in ours:
        for t in d.tasks:
            assert (t.pool, t.queue) == ("tidewater", "spark"), (d.dag_id, t.task_id)
            callbacks = t.on_failure_callback if isinstance(t.on_failure_callback, list) else [t.on_failure_callback]
            assert [type(c).__name__ for c in callbacks] == ["FailureFile"], (d.dag_id, t.task_id)
    assert "airflow.on_failure: cannot import 'tests.e2e.late_hook.nothing_here'" in bag.dags["ingest_invalid_bad"].doc_md
    assert not any(d.endswith("_bad") and not d.startswith("ingest_invalid") for d in bag.dags)


def test_a_dag_id_prefix_and_a_choice_of_optional_dags(tmp_path, monkeypatch):
    """`airflow.dag_id_prefix` goes before every DAG id of the pipeline and `airflow.dags` keeps only the optional DAGs
    named: the DAG processor's parse has exactly those, a task's parse of a prefixed DAG still builds only its own
    pipeline's file, the view lists those ids (null for the others), and a bad prefix or an unknown DAG is refused
    naming the setting."""
    import yaml

    from tidewater.config.parse import parse_pipeline
    from tidewater.errors import ConfigError
    from tidewater.runtime.ui import _ref

    folder = tmp_path / "pipelines"
    many_pipelines(folder, 3)
    doc = yaml.safe_load((folder / "p0001.yaml").read_text())
    doc["airflow"] = {**doc.get("airflow", {}), "dag_id_prefix": "team_a.", "dags": ["replay", "audit"]}
    (folder / "p0001.yaml").write_text(yaml.safe_dump(doc))
    every = parse_in_subprocess(folder, tmp_path, None)
    ours = {"team_a.ingest_p0001", "team_a.replay_p0001", "team_a.audit_p0001"}
    assert every["errors"] == [] and ours <= set(every["dags"]) and len(every["dags"]) == 2 * 6 + 3, every
    assert not any(d.endswith("_p0001") and d not in ours for d in every["dags"])
    assert set(parse_in_subprocess(folder, tmp_path, "team_a.replay_p0001")["dags"]) == ours
    spec = parse_pipeline({**doc, "validation": {"not_null": ["order_id"]}})
    ref = _ref(spec)
    assert ref["dag_id"] == "team_a.ingest_p0001" and ref["replay_dag_id"] == "team_a.replay_p0001"
    assert (ref["skip_dag_id"], ref["retry_dag_id"], ref["quarantine_dag_id"]) == (None, None, None)
    for bad, message in (
        ({"dag_id_prefix": "team a "}, "airflow.dag_id_prefix: 'team a ' may hold only"),
        ({"dags": ["replay", "compact"]}, "airflow.dags: 'compact' is not an optional DAG"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_pipeline({**doc, "airflow": bad})


def test_without_human_in_the_loop_tasks_the_quarantine_dag_is_the_form_alone_and_no_decision_opens(tmp_path, monkeypatch, caplog):
    """Airflow 3.0 has no human-in-the-loop operators (the import fails, as it does here with the module hidden):
    the quarantine DAG is its form's one task, as before, and a quarantined batch's commit opens no decision but
    says to use the form. Outside a task (no supervisor), likewise."""
    import logging
    import sys

    from tidewater.config.parse import load_pipeline
    from tidewater.runtime import decisions
    from tidewater.runtime.airflow_dags import build_quarantine_dag

    spec = (REPO / "include" / "pipelines" / "pizzas.yaml").read_text()
    shutil.copy(REPO / "include" / "pipelines" / "pizzas.expectations.json", tmp_path)
    path = tmp_path / "pizzas.yaml"
    path.write_text(spec.replace("validation:\n", "validation:\n  on_failure: quarantine\n", 1))
    pipeline = load_pipeline(path)
    assert not decisions.supported()  # no task supervisor in a test process
    with caplog.at_level(logging.INFO, logger="tidewater.runtime.decisions"):
        assert decisions.open_decision(pipeline, "b-1", ("ns.t",), "body") is None
    assert "decide with the quarantine_pizzas DAG's form" in caplog.text
    monkeypatch.setitem(sys.modules, "airflow.providers.standard.operators.hitl", None)  # import raises ImportError
    dag = build_quarantine_dag(path, pipeline)
    assert [t.task_id for t in dag.tasks] == ["quarantine"]
    assert dag.params.dump()["action"] == "list"


def test_one_list_of_dag_kinds_names_every_dag_a_pipeline_file_makes(tmp_path):
    """config.spec.DAG_KINDS is the one list of DAG kinds: each has a builder (the failing DAG of a file that does not
    load aside), a pipeline with every optional DAG and the quarantine policy makes a DAG of each other kind, and a
    task's parse finds a pipeline's file from a DAG id of any kind."""
    from tests.conftest import write_pipeline
    from tidewater.config.parse import invalid_dag_id, load_pipeline
    from tidewater.config.sections.airflow import DAG_KINDS, INVALID_DAG_KIND, OPTIONAL_DAGS
    from tidewater.runtime import airflow_dags

    assert set(airflow_dags.BUILDERS) == set(DAG_KINDS) - {INVALID_DAG_KIND}
    spec = load_pipeline(
        write_pipeline(tmp_path, name="kinds", topics=["t"], airflow={"dags": list(OPTIONAL_DAGS)}, validation={"on_failure": "quarantine"})
    )
    assert set(spec.dag_ids()) == set(DAG_KINDS) - {INVALID_DAG_KIND}
    assert invalid_dag_id(Path("kinds.yaml")) == f"{INVALID_DAG_KIND}_kinds"
    for dag_id in [*spec.dag_ids().values(), invalid_dag_id(Path("kinds.yaml"))]:
        assert airflow_dags._files_for(dag_id, tmp_path) == [tmp_path / "kinds.yaml"], dag_id


def test_the_development_set_up_registers_the_view_plugin_once_with_no_import_error(tmp_path):
    """Airflow as `make ui` and `make demo` run it (this checkout's plugins folder, the package installed in
    development mode with its entry point): Airflow's own plugins and providers managers report the Tidewater plugin
    once, no plugin import error (the home page's "Plugin Import Error" count) and the provider."""
    import json
    import os
    import subprocess
    import sys

    from scripts.install_range import LOADED

    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins")}
    done = subprocess.run([sys.executable, "-c", LOADED], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded["plugins"].count("tidewater") == 1 and loaded["plugin_errors"] == {} and loaded["provider"], loaded


def test_each_step_of_a_batch_gets_its_own_queue_pool_and_kubernetes_pod(tmp_path, monkeypatch):
    """`airflow.steps`: the write step of the ingest and replay DAGs runs on the `spark` queue in a pod with its own
    image, resources, node selector, service account and environment from a Kubernetes secret; plan has its own queue;
    validate and commit keep the pipeline's `airflow.queue` and no pod override. Checked with the cncf provider's own
    models: the override merged into a pod template (PodGenerator.reconcile_pods) keeps the template's command and
    takes the step's settings, and the DAG's serialization keeps it."""
    import yaml
    from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator
    from airflow.serialization.serialized_objects import DagSerialization
    from kubernetes.client import models as k8s

    doc = yaml.safe_load((REPO / "include" / "pipelines" / "pizzas.yaml").read_text())
    doc["airflow"] = {
        **doc.get("airflow", {}),
        "queue": "tidewater",
        "steps": {
            "plan": {"queue": "light"},
            "write": {
                "queue": "spark",
                "pool": "spark_slots",
                "image": "registry.example/tidewater-spark:0.3",
                "requests": {"cpu": "2", "memory": "4Gi"},
                "limits": {"memory": "6Gi"},
                "env_from_secrets": ["orders-env"],
                "node_selector": {"workload": "spark"},
                "service_account": "tidewater-writer",
            },
        },
    }
    (tmp_path / "pizzas.yaml").write_text(yaml.safe_dump(doc))
    shutil.copy(REPO / "include" / "pipelines" / "pizzas.expectations.json", tmp_path)
    bag = dagbag(tmp_path, monkeypatch)
    template = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="worker"),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="base", image="apache/airflow:3.3.2", args=["airflow", "tasks", "run"])]),
    )
    for dag_id in ("ingest_pizzas", "replay_pizzas"):
        dag = bag.dags[dag_id]
        tasks = {t.task_id: t for t in dag.tasks}
        assert {k: (t.queue, t.pool) for k, t in tasks.items() if k in ("plan", "write", "validate", "commit")} == {
            "plan": ("light", "default_pool"),
            "write": ("spark", "spark_slots"),
            "validate": ("tidewater", "default_pool"),
            "commit": ("tidewater", "default_pool"),
        }, dag_id
        assert [k for k, t in tasks.items() if t.executor_config] == ["write"], dag_id
        pod = tasks["write"].executor_config["pod_override"]
        merged = PodGenerator.reconcile_pods(template, pod)
        base = merged.spec.containers[0]
        assert (base.name, base.image, base.args) == ("base", "registry.example/tidewater-spark:0.3", ["airflow", "tasks", "run"])
        assert base.resources.requests == {"cpu": "2", "memory": "4Gi"} and base.resources.limits == {"memory": "6Gi"}
        assert [e.secret_ref.name for e in base.env_from] == ["orders-env"]
        assert merged.spec.node_selector == {"workload": "spark"}
        assert merged.spec.service_account_name == "tidewater-writer"
        restored = DagSerialization.from_dict(DagSerialization.to_dict(dag)).get_task("write")
        assert restored.executor_config["pod_override"] == pod, dag_id
