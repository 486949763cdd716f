"""Airflow task bodies and the write step's operator. Imported by dags/ at run time only.

XCom carries a small document (batch id, plan path, counts), never data or secrets.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from airflow.sdk import BaseOperator

from tidewater.config.connections import CATALOG_CONFIG_ENV, REGISTRY_CONFIG_ENV, STORAGE_CONFIG_ENV
from tidewater.config.locations import KAFKA_CONFIG_ENV
from tidewater.config.parse import load_pipeline
from tidewater.config.spec import PipelineSpec
from tidewater.errors import ConfigError, TerminalError, TidewaterError
from tidewater.runtime.links import data_docs_url

log = logging.getLogger(__name__)


F = TypeVar("F", bound=Callable[..., Any])


def ids_as_strings(value: Any) -> Any:
    """A task result with every snapshot id as a string: XCom goes through JSON, and the UI's JavaScript
    rounds integers above 2^53 (a wrong id for time travel). Keys ending in ``snapshot_id`` are ids."""
    if isinstance(value, dict):
        return {
            k: (str(v) if isinstance(k, str) and k.endswith("snapshot_id") and isinstance(v, int) else ids_as_strings(v))
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [ids_as_strings(v) for v in value]
    return value


def fail_task(e: TidewaterError, prefix: str = "") -> NoReturn:
    """Fail the task with one of our errors. Where Airflow has retry policies (3.3) the error itself is raised: the
    pipeline's policy (runtime/retries.py) fails a terminal one at once and retries a transient one with a growing
    delay. On older Airflow a terminal error becomes ``AirflowFailException`` (no retry); a transient one stays."""
    from tidewater.runtime import retries

    if e.transient or retries.supported():
        raise e
    raise _fail_exception()(f"{prefix}{type(e).__name__}: {e}") from e


def _fail_exception() -> type[Exception]:
    """Airflow's exception that fails a task without a retry, where this Airflow keeps it."""
    try:
        from airflow.sdk.exceptions import AirflowFailException

        return AirflowFailException
    except ImportError:  # pragma: no cover - older Airflow
        from airflow.exceptions import AirflowFailException as older

        return older


def fail_fast(fn: F) -> F:
    """Terminal errors fail the task at once (retrying cannot help); transient ones keep Airflow's retries
    (see ``fail_task``). The task's result goes to XCom with snapshot ids as strings (``ids_as_strings``)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return ids_as_strings(fn(*args, **kwargs))
        except TidewaterError as e:
            fail_task(e)

    return wrapper  # type: ignore[return-value]  # fn's own signature (functools.wraps), which F names


@fail_fast
def plan_task(
    pipeline_path: str, run_type: str | None = None, data_interval: tuple[str, str] | None = None, reprocess: bool = False, cleared: int = 0
) -> dict[str, Any] | None:
    """Plan the next batch (a backfill run: its interval, see replay.plan_backfill). Returns None
    (skipping write/validate/commit) when there is nothing to do.

    A backfill run re-ingests its interval (``reprocess``) when asked by the run parameter or when it re-runs
    an earlier run (``cleared``: the run's clear number). Airflow's backfill form has its own "Reprocess
    Behavior": "All Runs" clears and re-runs the runs that ran before, which is the user asking for their
    intervals again; the form sends our run parameter only with "Override parameters on existing runs" on,
    and a task cannot see the backfill's settings, so the clear number is what tells them apart."""
    from tidewater.steps.lifecycle import plan_step

    spec = load_pipeline(pipeline_path)
    if run_type == "backfill" and data_interval is not None:
        from tidewater.plan.backfill import plan_backfill

        if cleared and not reprocess:
            log.info(
                "this backfill run re-runs an earlier run of its interval (cleared %d time(s): Reprocess Behavior "
                "or a Clear): its committed ranges are re-ingested with replace",
                cleared,
            )
            reprocess = True

        plan, path = plan_backfill(spec, data_interval, reprocess)
    else:
        plan, path = plan_step(spec, data_interval=data_interval)
        from tidewater.runtime import metrics

        metrics.lag(spec)  # before the batch: what this run is about to take in
    return _planned(plan, path)


@fail_fast
def replay_plan_task(pipeline_path: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """The replay DAG's plan: parameters checked first (errors name them); a dry run logs the preview."""
    from tidewater.plan.replay import ReplayRequest, plan_replay

    spec = load_pipeline(pipeline_path)
    req = ReplayRequest.from_params(params)
    plan, path, _ = plan_replay(spec, req)  # logs what would change per partition
    if req.dry_run:
        log.info("dry run: nothing changed")
    return _planned(plan, path)


@fail_fast
def quarantine_task(pipeline_path: str, params: dict[str, Any], outlet_events: Any = None, by: str | None = None) -> dict[str, Any]:
    """The quarantine DAG's form: list, publish or drop (errors name the parameter); ``by``: who triggered it."""
    from tidewater.ops import quarantine

    spec = load_pipeline(pipeline_path)
    action, batch_id = params.get("action") or "list", (params.get("batch_id") or "").strip()
    table = (params.get("table") or "").strip() or None
    if action == "list":
        rows = quarantine.list_all(spec, table)
        for q in rows:
            log.info(
                "quarantined batch %s of %s: %d rows on branch %s, validation %s",
                q["batch_id"],
                q["table"],
                q["rows"],
                q["branch"],
                q["validation"],
            )
        if not rows:
            log.info("no quarantined batches")
        return {"quarantined": rows}
    if not batch_id:
        raise ConfigError(f"batch_id: required for {action}")
    view = quarantine.view_for(spec, table)
    result = (
        quarantine.publish(view, batch_id, by=by)
        if action == "publish"
        else quarantine.drop(view, batch_id, reason=str(params.get("reason") or ""), by=by)
    )
    log.info("%s batch %s of %s: %d rows", result["status"], batch_id, view.table.identifier, result["rows"])
    if action == "publish" and result["rows"]:
        emit_table_events(
            outlet_events, spec, [(view.table.identifier, {"batch_id": batch_id, "mode": "quarantine-publish", "rows": result["rows"]})]
        )
    return result


@fail_fast
def skip_task(pipeline_path: str, params: dict[str, Any], by: str) -> dict[str, Any]:
    """The skip DAG: dead-letter the range that blocks a partition (errors name the parameter)."""
    from tidewater.ops.skip import SkipRequest, skip

    def number(name: str) -> int:
        value = params.get(name)
        if value is None or isinstance(value, bool):
            raise ConfigError(f"{name}: required (a whole number)")
        return int(value)

    req = SkipRequest(
        str(params.get("topic") or ""),
        number("partition"),
        number("start_offset"),
        number("end_offset"),
        str(params.get("reason") or ""),
        by,
        bool(params.get("dry_run", True)),
    )
    return skip(load_pipeline(pipeline_path), req)


@fail_fast
def retry_dead_letters_task(pipeline_path: str, params: dict[str, Any], by: str, outlet_events: Any = None) -> dict[str, Any]:
    """The dead-letter retry DAG: retry the open letters (of a class, of a batch), or only say what it would do."""
    from tidewater.ops.dead_letters import retry

    spec = load_pipeline(pipeline_path)
    result = retry(
        spec,
        error_class=(params.get("error_class") or "").strip() or None,
        batch=(params.get("batch_id") or "").strip() or None,
        dry_run=bool(params.get("dry_run", True)),
        by=by,
        out=log.info,
    )
    if result.get("rows"):
        emit_table_events(
            outlet_events, spec, [(t, {"batch_id": result["batch_id"], "mode": "dead-letter-retry"}) for t in result.get("snapshots", {})]
        )
    return result


def _planned(plan: Any, path: Any) -> dict[str, Any] | None:
    if plan is None or path is None:
        return None
    return {
        "batch_id": plan.batch_id,
        "plan_path": str(path),
        "table": plan.table,
        "offsets": plan.record_span,
        "partitions": len(plan.ranges),
        "mode": plan.mode,
    }


def _staged(pipeline_path: str, planned: dict[str, Any]) -> tuple[Any, Any, Any]:
    """The pipeline, and the plan and manifest the plan and write tasks staged."""
    from tidewater.steps.write import load_manifest, load_plan

    spec = load_pipeline(pipeline_path)
    return spec, load_plan(planned["plan_path"], spec), load_manifest(planned["plan_path"], spec)


@fail_fast
def validate_task(pipeline_path: str, planned: dict[str, Any]) -> dict[str, Any]:
    from tidewater.errors import ValidationFailedError
    from tidewater.runtime import lineage
    from tidewater.steps.lifecycle import validate_step

    spec, plan, manifest = _staged(pipeline_path, planned)
    try:
        return {"batch_id": plan.batch_id, **validate_step(spec, plan, manifest).summary()}
    except ValidationFailedError:  # the FAIL event shows the failed checks and the batch's counts
        lineage.guarded(lambda: lineage.attach(failure=lineage.batch_lineage(spec, plan, manifest, gate="failed")))
        raise
    finally:
        log.info("Data Docs of batch %s in the Tidewater view: %s", plan.batch_id, data_docs_url(spec, plan.batch_id))


@fail_fast
def connect_write_task(pipeline_path: str, planned: dict[str, Any], url: str | None = None, tries: Any = None) -> None:
    """The write step on a Spark Connect server (``url``: an Airflow Spark Connect connection's; default
    ``spark.connect_url``), from this task. ``tries``: the task's state store (Airflow 3.3's ``task_state_store``),
    where each try keeps the tag of its operations so that a retry interrupts what a dead try left running."""
    from tidewater.steps.write import run_connect_write

    spec = load_pipeline(pipeline_path)
    manifest = run_connect_write(spec, spec.stage(planned["plan_path"]), url=url, tries=tries)
    log.info(
        "batch %s: %d records written in %d files through Spark Connect", planned["batch_id"], manifest.records, len(manifest.data_files)
    )


@fail_fast
def data_docs_task(pipeline_path: str, planned: dict[str, Any]) -> list[str]:
    """Render the batch's Data Docs page if the validate task left it for later."""
    from tidewater.quality.data_docs import render_pending

    spec = load_pipeline(pipeline_path)
    pages = render_pending(spec, planned["batch_id"])
    for page in pages:
        log.info("Data Docs %s, in the Tidewater view: %s", page.as_uri(), data_docs_url(spec, planned["batch_id"]))
    return [str(p) for p in pages]


def table_asset(catalog_name: str, ident: str) -> Any:
    """The Airflow asset of an Iceberg table (``iceberg://<catalog>/<namespace>/<table>``): ingest,
    replay and quarantine-publish commits and maintenance emit events on it."""
    from airflow.sdk import Asset

    return Asset(name=f"{catalog_name}.{ident}", uri=f"iceberg://{catalog_name}/{ident.replace('.', '/')}")


def commits_alias(spec: PipelineSpec) -> Any:
    """The alias the commit tasks of a pipeline declare as outlet: the tables a batch commits to are only
    known when it commits (routing), so each event is added through the alias to the table's asset."""
    from airflow.sdk import AssetAlias

    return AssetAlias(name=f"tidewater-{spec.name}-commits")


def emit_table_events(outlet_events: Any, spec: PipelineSpec, events: list[tuple[str, dict[str, Any]]]) -> None:
    if outlet_events is None:
        return
    alias = commits_alias(spec)
    for ident, extra in events:
        asset = table_asset(spec.catalog.name, ident)
        outlet_events[alias].add(asset, extra=extra)
        log.info("asset event on %s: %s", asset.uri, json.dumps(extra))


def commit_events(plan: Any, manifest: Any, result: Any, dag_run_id: str | None) -> list[tuple[str, dict[str, Any]]]:
    """One asset event per table the batch added rows to, with what downstream DAGs want to know."""
    from datetime import datetime, timezone

    vt = manifest.valid_through_ms()
    base = {
        "batch_id": plan.batch_id,
        "mode": plan.mode,
        "dead_letters": manifest.dead_letters,
        "offsets": {t: {str(p): o for p, o in ps.items()} for t, ps in manifest.next_offsets().items()},
        "valid_through": datetime.fromtimestamp(vt / 1000, timezone.utc).isoformat() if vt is not None else None,
        "dag_run_id": dag_run_id,
    }
    if result.status == "nothing-to-commit":
        return []
    return [
        (t.table, {**base, "rows": t.rows, **({"snapshot_id": str(t.snapshot_id)} if t.snapshot_id is not None else {})})
        for t in result.tables
        if t.holds_rows and t.rows
    ]


@fail_fast
def commit_task(pipeline_path: str, planned: dict[str, Any], dag_run_id: str | None, outlet_events: Any = None) -> dict[str, Any]:
    import time

    from tidewater.commit.quarantine import QuarantinedError
    from tidewater.runtime import lineage, metrics
    from tidewater.steps.lifecycle import commit_step

    spec, plan, manifest = _staged(pipeline_path, planned)
    started = time.monotonic()
    try:
        result = commit_step(spec, plan, manifest, dag_run_id=dag_run_id)
    except Exception as e:  # a quarantined batch, a refused commit: the FAIL event still says what the batch read
        lineage.guarded(lambda: lineage.attach(failure=lineage.batch_lineage(spec, plan, manifest)))
        if isinstance(e, QuarantinedError):  # a person decides in Airflow's Required actions (runtime/decisions.py)
            from tidewater.runtime import decisions

            try:
                decisions.open_decision(spec, plan.batch_id, e.tables, decisions.body_for(spec, plan, e.tables))
            except Exception as opening:  # noqa: BLE001 - the run must still fail with the quarantine's own error
                log.warning("could not open the decision on batch %s (%s); decide with the quarantine DAG's form", plan.batch_id, opening)
        raise
    lineage.guarded(lambda: lineage.attach(complete=lineage.batch_lineage(spec, plan, manifest, result)))
    metrics.committed(spec, plan, manifest, result, time.monotonic() - started, metrics.letter_classes(spec, manifest))
    emit_table_events(outlet_events, spec, commit_events(plan, manifest, result, dag_run_id))
    return result.summary()


# Cluster managers whose Spark settings the provider's hook turns environment variables into (--conf arguments)
_ENV_AS_CONF = ("yarn", "k8s")


class IngestSparkSubmitOperator(BaseOperator):
    """spark-submit of the package's ``runtime/spark_app/ingest_batch.py`` for the batch the ``plan`` task staged,
    through the Spark provider's ``SparkSubmitHook`` (its connection, its process handling and ``on_kill``); or, for
    a pipeline with ``spark.connect_url`` or a ``spark_connect`` connection, the write through that server.

    Not a subclass of the provider's ``SparkSubmitOperator``: Airflow parses the DAG file at every task's start, and
    importing that operator's module (which loads the Kubernetes client and OpenLineage's Spark helpers) took 0.9 s
    of each parse; the hook is imported when a spark-submit write runs (BENCHMARKS.md, DAG latency).

    Spark settings are computed when the task runs, not when the DAG file is parsed. Secrets never reach
    the command line: secret Spark settings go through a private properties file (0600, deleted after the
    run), and settings from Airflow connections through spark-submit's environment (in cluster mode on Kubernetes,
    a Kubernetes secret the settings refer to: ``_pass_settings``), never XCom, logs or rendered templates.
    """

    ui_color = "#d8f3ff"

    def __init__(
        self, *, pipeline_path: str, conn_id: str = "spark_default", verbose: bool = False, plan_task_id: str = "plan", **kwargs: Any
    ) -> None:
        from tidewater.config.locations import spark_app_path

        super().__init__(**kwargs)
        self.application = str(spark_app_path())
        self.pipeline_path = pipeline_path
        self.plan_task_id = plan_task_id
        self._conn_id, self._verbose = conn_id, verbose
        self.conf: dict[str, Any] | None = None
        self.jars: str | None = None
        self.packages: str | None = None
        self.application_args: list[str] | None = None
        self.name = "tidewater-write"
        self.env_vars: dict[str, str] | None = None
        self.properties_file: str | None = None
        self._hook: Any = None

    def _get_hook(self) -> Any:
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        return SparkSubmitHook(
            conf=self.conf or {},
            conn_id=self._conn_id,
            jars=self.jars,
            packages=self.packages,
            name=self.name,
            application_args=self.application_args,
            env_vars=self.env_vars,
            verbose=self._verbose,
            properties_file=self.properties_file,
        )

    def on_kill(self) -> None:
        if self._hook is not None:  # the spark-submit process (and, on a cluster, the driver it started)
            self._hook.on_kill()

    def execute(self, context: Any) -> None:
        from airflow.sdk import BaseHook

        from tidewater.spark.conf import process_env, remove_properties_file, write_submit_settings
        from tidewater.spark.submit import write_job_args

        planned = context["ti"].xcom_pull(task_ids=self.plan_task_id)
        if not planned:
            raise ConfigError("write: the plan task returned no batch")
        spec = load_pipeline(self.pipeline_path)
        if spec.spark.connect_url:  # a long-running Spark Connect server: no spark-submit
            connect_write_task(self.pipeline_path, planned, tries=context.get("task_state_store"))
            return
        try:
            conn = BaseHook.get_connection(self._conn_id)
        except Exception:  # noqa: BLE001 - not found, or a secrets backend's own error: unusable
            raise ConfigError(
                f"spark.conn_id: Airflow connection {self._conn_id!r} is not defined; e.g. "
                f'AIRFLOW_CONN_{self._conn_id.upper()}=\'{{"conn_type": "spark", "host": "local[*]"}}\''
            ) from None
        if conn.conn_type == "spark_connect":  # the provider's Spark Connect connection: the server's URL
            from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

            connect_write_task(
                self.pipeline_path, planned, SparkConnectHook(self._conn_id).get_connection_url(), tries=context.get("task_state_store")
            )
            return
        master = spark_master(self._conn_id, spec.spark.master)
        if master.startswith("spark://") and _deploy_mode(self._conn_id) == "cluster":
            from tidewater.config.validate import cluster_mode_refused

            fail_task(cluster_mode_refused(f"Airflow connection {self._conn_id!r}: deploy-mode"))
        settings = write_submit_settings(spec, master)
        self.conf = {**settings["conf"], **(self.conf or {})}
        self.jars = settings["jars"] or None
        self.packages = settings["packages"]
        self.application_args = write_job_args(spec, planned["plan_path"])
        self.name = f"tidewater-{spec.name}-{planned['batch_id']}"
        secrets_file, driver_env = self._pass_settings(spec, master, dict(settings["secret_conf"]))
        log.info("batch %s: submitting the write job for %s", planned["batch_id"], spec.describe_targets())
        try:
            self._hook = self._get_hook()
            with process_env(driver_env):
                self._hook.submit(self.application)
        except Exception:
            self._raise_batch_error(spec, planned["plan_path"])
            raise
        finally:
            remove_properties_file(secrets_file)

    def _pass_settings(self, spec: PipelineSpec, master: str, secret: dict[str, str]) -> tuple[Any, dict[str, str]]:
        """How settings other than ``--conf`` reach the driver, by where it runs. Returns (the private properties
        file holding the secret Spark settings, with the cluster's defaults copied in, or None: the caller removes
        it; the variables to add to spark-submit's own environment while it runs).

        The settings resolved from Airflow connections (Kafka's, the catalog's, the registry's, object storage's:
        a driver elsewhere cannot ask Airflow) are never written into the Spark configuration:

        - client mode (any master): the driver is spark-submit's child on this host, so they go in spark-submit's
          environment: through the hook's ``env_vars`` on local and standalone masters, and on YARN and Kubernetes
          (where the hook would turn ``env_vars`` into ``--conf`` arguments, visible in the process list and the
          application's settings) by this task's own environment while spark-submit runs (:func:`process_env`);
        - cluster mode on Kubernetes: the driver pod takes them from the Kubernetes secret ``spark.kubernetes_secret``
          (``spark.kubernetes.driver.secretKeyRef.<VARIABLE>=<secret>:<VARIABLE>``: references, not values);
        - cluster mode on YARN: refused, naming the settings (:func:`yarn_cluster_refused`)."""
        from tidewater.spark.conf import launcher_env, properties_file, spark_defaults_file

        manager = master.split(":", 1)[0]
        cluster = _deploy_mode(self._conn_id) == "cluster"
        resolved = resolved_connections(spec)
        # (the Spark hook refuses environment variables in standalone cluster mode, which is refused before this)
        self.env_vars = launcher_env() if manager not in _ENV_AS_CONF and not cluster else None
        driver_env: dict[str, str] = {}
        if cluster and manager == "k8s" and resolved:
            if not spec.spark.kubernetes_secret:
                raise ConfigError(kubernetes_secret_missing(resolved))
            for name in resolved:
                secret[f"spark.kubernetes.driver.secretKeyRef.{name}"] = f"{spec.spark.kubernetes_secret}:{name}"
        elif cluster and manager == "yarn" and resolved:
            raise ConfigError(yarn_cluster_refused(resolved))
        elif manager in _ENV_AS_CONF:
            driver_env = resolved
        else:
            self.env_vars = {**(self.env_vars or {}), **resolved}
        if not secret:
            self.properties_file = None
            return None, driver_env
        path = properties_file(secret, spark_defaults_file({**os.environ, **(self.env_vars or {})}))
        self.properties_file = str(path)
        return path, driver_env

    @staticmethod
    def _raise_batch_error(spec: PipelineSpec, plan_path: str) -> None:
        """Turn the job's error.json (a record or Kafka error) into a readable task failure."""
        from tidewater.write.job import read_error

        e = read_error(spec.stage(plan_path).parent)
        if e is not None:
            fail_task(e, prefix="write failed: ")


def resolved_connections(spec: PipelineSpec) -> dict[str, str]:
    """The settings resolved from the pipeline's Airflow connections, as the driver's variables (name: JSON), each value
    registered with Airflow's secrets masker."""
    from tidewater.config.connections import catalog_connection, mask, registry_connection, storage_connection
    from tidewater.source.kafka import kafka_settings

    resolved = {
        KAFKA_CONFIG_ENV: kafka_settings(spec) if spec.kafka.conn_id else None,
        CATALOG_CONFIG_ENV: catalog_connection(spec.catalog.conn_id) if spec.catalog.conn_id else None,
        REGISTRY_CONFIG_ENV: registry_connection(rc) if (rc := spec.format.registry_conn_id) else None,
        STORAGE_CONFIG_ENV: storage_connection(sc) if (sc := spec.batch.staging_conn_id) else None,
    }
    out = {}
    for name, values in resolved.items():
        if values is not None:
            mask(values)
            out[name] = json.dumps(values)
    return out


# the setting that names each connection resolved for the driver (resolved_connections)
_SETTING_OF = {
    KAFKA_CONFIG_ENV: "kafka.conn_id",
    CATALOG_CONFIG_ENV: "catalog.conn_id",
    REGISTRY_CONFIG_ENV: "format.registry_conn_id",
    STORAGE_CONFIG_ENV: "batch.staging_conn_id",
}


def kubernetes_secret_missing(resolved: dict[str, str]) -> str:
    settings = ", ".join(_SETTING_OF[n] for n in resolved)
    return (
        f"spark.kubernetes_secret: cluster deploy mode on Kubernetes runs the driver in a pod, which cannot ask "
        f"Airflow for the connections of {settings}, and writing them into its settings would put them in plain "
        f"text in the pod's spec. Name a Kubernetes secret holding the keys {', '.join(resolved)} (`tidewater "
        "connections --pipeline FILE --output DIR` writes them; `kubectl create secret generic NAME "
        "--from-file=DIR`), or use client deploy mode"
    )


def yarn_cluster_refused(resolved: dict[str, str]) -> str:
    settings = ", ".join(_SETTING_OF[n] for n in resolved)
    return (
        f"{settings}: cluster deploy mode on YARN would carry the settings of these Airflow connections to the "
        "driver only as the application's environment (spark.yarn.appMasterEnv.*), in plain text wherever YARN "
        "shows an application's settings. Use client deploy mode: the driver then gets them in spark-submit's "
        "environment"
    )


def spark_master(conn_id: str, default: str) -> str:
    """The master of the Airflow Spark connection the ingest DAG submits to, else the pipeline's. A connection of the
    provider's ``spark_connect`` type names a Spark Connect server, not a master: the write step runs there, and the
    Spark sessions of maintenance and ``tidewater sql`` (which need the Iceberg runtime and SQL extensions in their
    own JVM) use the pipeline's ``spark.master``."""
    try:
        from airflow.sdk import BaseHook

        conn = BaseHook.get_connection(conn_id)
    except Exception:  # noqa: BLE001 - no such connection (or no backend answers): the pipeline's spark.master
        return default
    if conn.conn_type == "spark_connect":
        log.info("Airflow connection %r is a Spark Connect server: Spark sessions of this task use spark.master %s", conn_id, default)
        return default
    host = conn.host or ""
    if host and conn.port and "://" in host:
        host = f"{host}:{conn.port}"
    return host or default


def _deploy_mode(conn_id: str) -> str | None:
    try:
        from airflow.sdk import BaseHook

        return BaseHook.get_connection(conn_id).extra_dejson.get("deploy-mode")
    except Exception:  # noqa: BLE001 - no such connection (or no backend answers): client mode
        return None


@fail_fast
def audit_task(pipeline_path: str) -> dict[str, Any]:
    """The audit DAG's task: every finding logged; a discrepancy fails the task (terminal: retrying the same audit
    finds it again); the verdict is kept for the Tidewater view."""
    from tidewater.audit.pipeline import audit
    from tidewater.runtime import lineage

    spec = load_pipeline(pipeline_path)
    report = audit(spec, deep=spec.audit.deep, full=spec.audit.full)

    def attach_lineage() -> None:  # the same lineage whether the audit passes or fails the task
        built = lineage.audit_lineage(spec, report, spec.audit.deep)
        lineage.attach(complete=built, failure=built)

    lineage.guarded(attach_lineage)
    for f in report.findings:
        {"error": log.error, "warning": log.warning}.get(f.severity, log.info)("%s", f.text())
    errors = [f.text() for f in report.findings if f.severity == "error"]
    if errors:
        raise TerminalError(
            f"audit of {report.table}: {len(errors)} discrepanc{'y' if len(errors) == 1 else 'ies'}: "
            + "; ".join(errors[:5])
            + (" ..." if len(errors) > 5 else ""),
            table=report.table,
        )
    log.info("audit of %s: clean (%d batches)", report.table, report.batches)
    return {"table": report.table, "clean": True, "batches": report.batches}


@fail_fast
def maintenance_task(
    pipeline_path: str, action: str, outlet_events: Any = None, asset: Any = None, earlier: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One maintenance action on the pipeline's table; its report goes to the log and XCom. The run's last action also
    sets the event on the maintenance asset (``outlet_events``, ``asset``): ``{"actions": {action: report}}`` with the
    reports of the ``earlier`` actions of the run."""
    from tidewater.ops.maintenance import maintain
    from tidewater.runtime import lineage

    spec = load_pipeline(pipeline_path)
    reports = maintain(spec, actions=[action], master=spark_master(spec.spark.conn_id, spec.spark.master))
    for r in reports:
        log.info("%s", r.text())
    lineage.guarded(lambda: lineage.attach(complete=lineage.maintenance_lineage(spec, reports)))
    metas = [json.loads(json.dumps(r.metadata(), default=str)) for r in reports]
    meta = metas[0] if len(metas) == 1 else {"tables": metas}
    if outlet_events is not None and asset is not None:
        outlet_events[asset].extra = {"actions": {**(earlier or {}), action: meta}}
    return meta
