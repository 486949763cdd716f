"""Tidewater's DAGs, built for every pipeline file of a folder: what a deployment's DAG file calls, in two lines::

    from tidewater.runtime.airflow_dags import pipeline_dags
    globals().update(pipeline_dags())  # every pipeline file in $TIDEWATER_PIPELINES_DIR: its DAGs

(Airflow parses only files that mention both "airflow" and "dag": this module's name carries both.)

Per pipeline: ``ingest_<name>`` (plan -> write (spark-submit or Spark Connect) -> validate (great-expectations) ->
commit (one Iceberg commit); the plan task short-circuits the rest when every partition is caught up),
``replay_<name>``, ``skip_<name>``, ``retry_dead_letters_<name>``, ``audit_<name>``, ``maintain_<name>`` and, with
``validation.on_failure: quarantine``, ``quarantine_<name>``. A file that does not load shows as a failing
``ingest_invalid_<file>`` DAG and never hides the others. Task bodies live in ``tidewater.runtime.airflow``;
nothing heavy is imported and nothing is contacted at parse time.
"""

from __future__ import annotations

import logging
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from airflow.sdk import Asset, Param, dag, task

from tidewater.config.locations import pipelines_dir
from tidewater.config.parse import discover_pipelines, invalid_dag_id, load_pipeline
from tidewater.config.sections.airflow import DAG_KINDS
from tidewater.config.spec import PipelineSpec
from tidewater.config.validate import check_hosts
from tidewater.errors import ConfigError
from tidewater.runtime.airflow import commits_alias
from tidewater.runtime.deadlines import freshness_alert
from tidewater.runtime.decisions import DROP, PUBLISH
from tidewater.runtime.hosts import airflow_executor
from tidewater.runtime.pods import step_args
from tidewater.runtime.retries import retry_policy

log = logging.getLogger(__name__)
START = datetime(2024, 1, 1, tzinfo=timezone.utc)


def _dag_kwargs(spec: PipelineSpec, kind: str) -> dict[str, Any]:
    """The pipeline's DAG arguments (``AirflowSpec.dag_kwargs``) with, where Airflow has them (3.3), its retry policy on
    every task: terminal errors fail at once, transient ones retry with a growing delay (runtime/retries.py)."""
    kwargs = spec.airflow.dag_kwargs(kind)
    policy = retry_policy(timedelta(seconds=spec.airflow.retry_delay_seconds))
    if policy is not None:
        kwargs["default_args"] = {**kwargs["default_args"], "retry_policy": policy}
    if spec.airflow.on_failure:
        kwargs["default_args"] = {**kwargs["default_args"], "on_failure_callback": _failure_callback(spec.airflow.on_failure)}
    return kwargs


def _failure_callback(path: str) -> Any:
    """``airflow.on_failure``: the callable at ``path``, or an instance of the notifier class there (Airflow calls a
    notifier with the task's context). A path that does not import, or names neither, is a ConfigError naming the
    setting (the pipeline's failing DAG shows it)."""
    from airflow.sdk.module_loading import import_string

    try:
        target = import_string(path)
    except Exception as e:  # noqa: BLE001 - whatever the import raised, the setting is at fault
        raise ConfigError(f"airflow.on_failure: cannot import {path!r}: {e}") from None
    if isinstance(target, type):
        try:
            target = target()
        except Exception as e:  # noqa: BLE001 - a notifier whose constructor fails, however: the setting is at fault
            raise ConfigError(f"airflow.on_failure: {path} cannot be made without arguments: {e}") from None
    if not callable(target):
        raise ConfigError(f"airflow.on_failure: {path} is neither a callable nor a notifier class")
    return target


def _doc(spec: PipelineSpec, path: Path) -> str:
    return (
        f"### {spec.name}\n\n{spec.description}\n\n"
        f"* topics: `{', '.join(spec.topics) or '-'}`"
        + (f" and every topic matching `{spec.topic_pattern}`" if spec.topic_pattern else "")
        + f"\n* table: `{spec.describe_targets()}` (catalog `{spec.catalog.name}`)\n"
        f"* batch cap: {spec.batch.max_records} records\n* pipeline file: `{path}`\n\n"
        "plan reads the committed offsets from the table's latest snapshot; write runs the Spark job; "
        "validate runs the data-quality suite on the staged files; commit makes one Iceberg append. "
        "Retrying any task is safe: commit is idempotent per batch id."
    )


def _batch_tasks(pipeline_path: str, spec: PipelineSpec, plan_fn) -> None:
    """plan -> write (spark-submit) -> validate -> commit, with ``plan_fn`` deciding what the batch is; each step
    with its own queue, pool and pod where ``airflow.steps`` sets them (runtime/pods.py)."""

    @task.short_circuit(task_id="plan", **step_args(spec, "plan"))
    def plan(**context) -> dict | None:
        return plan_fn(context)

    from tidewater.runtime.airflow import IngestSparkSubmitOperator

    write = IngestSparkSubmitOperator(
        task_id="write", pipeline_path=pipeline_path, conn_id=spec.spark.conn_id, verbose=False, **step_args(spec, "write")
    )

    @task(task_id="validate", **step_args(spec, "validate"))
    def validate(planned: dict) -> dict:
        from tidewater.runtime.airflow import validate_task

        return validate_task(pipeline_path, planned)

    @task(task_id="commit", outlets=[commits_alias(spec)], **step_args(spec, "commit"))  # an event per table committed
    def commit(planned: dict, **context) -> dict:
        from tidewater.runtime.airflow import commit_task

        return commit_task(pipeline_path, planned, dag_run_id=context["run_id"], outlet_events=context.get("outlet_events"))

    @task(task_id="data_docs", **step_args(spec, "validate"))
    def data_docs(planned: dict) -> list:
        from tidewater.runtime.airflow import data_docs_task

        return data_docs_task(pipeline_path, planned)

    planned: Any = plan()  # an XComArg: TaskFlow hands the plan's result to each task below
    checked = validate(planned)
    committed = commit(planned)
    planned >> write >> checked >> committed
    checked >> data_docs(planned)  # next to the commit, never before it (see quality/data_docs.py)


def _timetable(schedule: str | None):
    """Cron schedules with data intervals [previous run, this run): a batch then records the interval it
    covers, and a backfill run of an interval maps it to offsets (Airflow's default cron timetable gives
    every run an empty interval)."""
    if schedule is None or schedule in ("@once", "@continuous"):
        return schedule
    from airflow.timetables.interval import CronDataIntervalTimetable

    try:
        return CronDataIntervalTimetable(schedule, timezone="UTC")
    except Exception:  # noqa: BLE001 - not a cron expression (croniter's several kinds): Airflow validates it as given
        return schedule


def _schedule(spec: PipelineSpec, pipeline_path: str):
    """The cron schedule, or (with ``trigger`` settings) the cron schedule *or* the pipeline's pending-data
    asset, which the lag trigger watches in Airflow's triggerer (see runtime/triggers.py)."""
    timetable = _timetable(spec.schedule)
    if not spec.trigger.enabled:
        return timetable
    from airflow.sdk import Asset, AssetOrTimeSchedule, AssetWatcher

    from tidewater.runtime.triggers import PendingDataTrigger

    asset = Asset(
        name=f"tidewater-{spec.name}-pending",
        uri=f"tidewater://pending/{spec.name}",
        watchers=[
            AssetWatcher(name=f"tidewater_{spec.name}_pending", trigger=PendingDataTrigger(pipeline_path, spec.trigger.poll_seconds))
        ],
    )
    if timetable is None or isinstance(timetable, str):  # triggered only (or @once/@continuous): the lag alone
        return [asset]
    return AssetOrTimeSchedule(timetable=timetable, assets=asset)


def build_ingest_dag(path: Path, spec: PipelineSpec):
    pipeline_path = str(path)

    alert = freshness_alert(spec)  # airflow.freshness (Airflow 3.1+): a deadline on each run

    @dag(
        dag_id=spec.dag_id,
        schedule=_schedule(spec, pipeline_path),
        **_dag_kwargs(spec, "ingest"),
        **({"deadline": alert} if alert is not None else {}),
        doc_md=_doc(spec, path),
        params={
            "reprocess": Param(
                False,
                type="boolean",
                title="Re-ingest committed intervals (new backfill runs)",
                description=(
                    "Backfill runs only. A backfill run that re-runs an earlier run (Reprocess Behavior 'All Runs' or "
                    "'Missing and Errored Runs', or a Clear) always re-ingests its interval, replacing the rows it produced. "
                    "For intervals without an earlier run, turn this on (the backfill form sends it only with "
                    "'Override parameters on existing runs' on); otherwise an interval already committed is left as it is"
                ),
            )
        },
    )
    def ingest():
        def plan_fn(context: dict) -> dict | None:
            from tidewater.runtime.airflow import plan_task

            run = context.get("dag_run")
            run_type = getattr(run, "run_type", None)
            start, end = context.get("data_interval_start"), context.get("data_interval_end")
            interval = (start.isoformat(), end.isoformat()) if start is not None and end is not None else None
            return plan_task(
                pipeline_path,
                run_type=str(getattr(run_type, "value", run_type) or ""),
                data_interval=interval,
                reprocess=bool(context["params"].get("reprocess")),
                cleared=getattr(run, "clear_number", 0) or 0,
            )

        _batch_tasks(pipeline_path, spec, plan_fn)

    return ingest()


# An ISO-8601 date or date-time, zone optional (the form rejects anything else before a run starts).
ISO_TIME = r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?(Z|[+-]\d{2}:?\d{2})?$"


def build_replay_dag(path: Path, spec: PipelineSpec):
    """``replay_<name>``: triggered from the UI with a form; re-reads an offset or time range into the table."""
    pipeline_path = str(path)
    choices: dict[str, Any] = {"enum": list(spec.topics)} if spec.topics and not spec.topic_pattern else {}
    topic = Param(
        spec.topics[0] if spec.topics else "",
        type="string",
        title="Topic",
        description="A topic of the pipeline" + (f" (or one matching `{spec.topic_pattern}`)" if spec.topic_pattern else ""),
        **choices,
    )

    @dag(
        dag_id=spec.dag_ids()["replay"],
        schedule=None,
        **_dag_kwargs(spec, "replay"),
        doc_md=(
            f"### replay into {_targets(spec)}\n\nTrigger with the form: a topic, partitions (empty: all), and "
            "either a start and end offset (end exclusive) or a start and end time (ISO-8601, UTC when no zone). "
            "`replace` deletes the rows that came from the range and appends the re-read ones in one commit (replaying "
            "twice leaves the table identical); `append-missing` adds only offsets the table does not hold. "
            "`dry_run` logs what would change per partition. The committed offsets never move; records past them are "
            "the scheduled batches' to ingest. Needs `format.metadata: prefixed` or `struct`."
            + _routed_replay_doc(spec)
            + "\n\n* pipeline file: `"
            + pipeline_path
            + "`"
        ),
        params={
            "topic": topic,
            "partitions": Param(
                [],
                type="array",
                items={"type": "integer", "minimum": 0},
                title="Partitions",
                description="Partition numbers; empty for every partition",
            ),
            "start_offset": Param(
                None,
                type=["null", "integer"],
                minimum=0,
                title="Start offset",
                description="First offset to re-read (with End offset; leave both empty to give times)",
            ),
            "end_offset": Param(
                None,
                type=["null", "integer"],
                minimum=1,
                title="End offset (exclusive)",
                description="One past the last offset to re-read; at most the committed offset (see `tidewater status`)",
            ),
            "start_time": Param(
                None,
                type=["null", "string"],
                pattern=ISO_TIME,
                title="Start time",
                description="Instead of offsets: ISO-8601, e.g. 2024-01-04T12:00:00Z (UTC when no zone), "
                "mapped to an offset by Kafka's timestamp lookup",
            ),
            "end_time": Param(
                None,
                type=["null", "string"],
                pattern=ISO_TIME,
                title="End time (exclusive)",
                description="ISO-8601 like Start time; records at or after it are not re-read",
            ),
            "mode": Param(
                spec.replay_modes[0],
                type="string",
                enum=list(spec.replay_modes),
                title="Mode",
                description="reapply (change tables): apply each re-read change again where it is still its "
                "key's latest change; a healthy table stays unchanged. replace: delete the rows that "
                "came from the range and append the re-read records in one commit (replaying twice "
                "leaves the table identical). append-missing: add only the offsets the table does "
                "not hold (rows already there are not touched)",
            ),
            "dry_run": Param(
                True,
                type="boolean",
                title="Dry run",
                description="On (default): only log the rows to delete and to add per partition; turn off to change the table",
            ),
            **(
                {
                    "tables": Param(
                        [],
                        type="array",
                        items={"type": "string"},
                        title="Tables",
                        description="Target tables to replay (full names); empty: every table the re-read "
                        "records route to. Records routed only to other tables are skipped",
                    )
                }
                if spec.routed
                else {}
            ),
        },
    )
    def replay():
        def plan_fn(context: dict) -> dict | None:
            from tidewater.runtime.airflow import replay_plan_task

            return replay_plan_task(pipeline_path, dict(context["params"]))

        _batch_tasks(pipeline_path, spec, plan_fn)

    return replay()


def _targets(spec: PipelineSpec) -> str:
    return f"`{spec.table.identifier}`" if not spec.routed else f"the tables of `{spec.name}` ({spec.describe_targets()})"


def _routed_replay_doc(spec: PipelineSpec) -> str:
    if not spec.routed:
        return ""
    return (
        " A routed pipeline's replay rewrites each target table the re-read records route to (or the `tables` "
        "named): its change tables are always reapplied (`reapply`: each change again where it is still its key's "
        "latest), its append tables get the mode (`reapply` there means `replace`). The ranges are checked against "
        "the checkpoint table's offsets; every table keeps its own. The dry run logs rows per table and partition."
    )


def _form_dag(spec: PipelineSpec, kind: str, doc_md: str, params: dict, body, outlets: list | None = None):
    """A DAG of one task, triggered from the UI with a typed form: ``body(params, context)`` runs it."""

    @dag(dag_id=spec.dag_ids()[kind], schedule=None, **_dag_kwargs(spec, kind), doc_md=doc_md, params=params)
    def form_dag():
        @task(task_id=kind, outlets=outlets or [])
        def run(**context) -> dict:
            return body(dict(context["params"]), context)

        run()

    return form_dag()


QUARANTINE_RUNS = 16  # decision runs may wait side by side (runtime/decisions.py), beside the form's runs


# How often a decision Airflow failed after the person answered is asked again (see the decide task).
DECIDE_RETRIES = 2


def _hitl_operator() -> Any:
    """Airflow's human-in-the-loop operator (3.1+), or None on Airflow 3.0 (the quarantine DAG's form alone)."""
    try:
        from airflow.providers.standard.operators.hitl import HITLOperator
    except ImportError:
        return None
    return HITLOperator


def build_quarantine_dag(path: Path, spec: PipelineSpec):
    """``quarantine_<name>``: list, publish or drop batches the quality gate quarantined (triggered with a form), and,
    where Airflow has human-in-the-loop tasks (3.1+), the decision a quarantined batch opens: a run whose ``decide``
    task waits in Airflow's Required actions for Publish or Drop, then ``apply`` does it (runtime/decisions.py)."""
    pipeline_path = str(path)
    hitl_operator = _hitl_operator()
    kwargs = {**_dag_kwargs(spec, "quarantine"), "max_active_runs": QUARANTINE_RUNS}

    @dag(
        dag_id=spec.dag_ids()["quarantine"],
        schedule=None,
        **kwargs,
        doc_md=_quarantine_doc(spec, pipeline_path),
        params=_quarantine_params(spec),
    )
    def quarantine():
        @task(task_id="quarantine", outlets=[commits_alias(spec)])
        def form(**context) -> dict:
            from tidewater.runtime.airflow import quarantine_task

            user = getattr(context.get("dag_run"), "triggering_user_name", None)
            return quarantine_task(
                pipeline_path, dict(context["params"]), outlet_events=context.get("outlet_events"), by=str(user) if user else None
            )

        if hitl_operator is None:
            form()
            return

        @task.branch(task_id="route")
        def route(**context) -> str:
            return "decide" if (context["dag_run"].conf or {}).get("decision") else "quarantine"

        decide = hitl_operator(
            task_id="decide",
            options=[PUBLISH, DROP],
            execution_timeout=None,
            # Airflow 3.3's scheduler can fail a deferred task that resumed before it handled the task's deferral
            # (apache/airflow#72716): an answer given within seconds of the question. A retry asks again; the answer
            # that was lost was never applied (apply runs only after decide succeeds).
            retries=DECIDE_RETRIES,
            retry_delay=timedelta(seconds=10),
            subject="Quarantined batch {{ dag_run.conf.get('batch_id', '') }} of " + spec.name + ": publish or drop?",
            body="{{ dag_run.conf.get('body', '') }}",
            params={
                "reason": Param(
                    None,
                    type=["null", "string"],
                    title="Reason (for Drop)",
                    description="Why the batch is given up: kept with the drop on the table's main "
                    "(optional: without one the drop records who dropped it)",
                )
            },
        )

        @task(task_id="apply", outlets=[commits_alias(spec)])
        def apply(answer: dict, **context) -> dict:
            from tidewater.runtime.airflow import emit_table_events
            from tidewater.runtime.decisions import apply_decision

            done = apply_decision(pipeline_path, dict(context["dag_run"].conf or {}), answer)
            if done["decision"] == PUBLISH:
                emit_table_events(
                    context.get("outlet_events"),
                    spec,
                    [
                        (t["table"], {"batch_id": done["batch_id"], "mode": "quarantine-publish", "rows": t["rows"]})
                        for t in done["tables"]
                        if t["rows"]
                    ],
                )
            return done

        route() >> [form(), decide]
        apply(decide.output)

    return quarantine()


def _quarantine_doc(spec: PipelineSpec, pipeline_path: str) -> str:
    return (
        f"### quarantined batches of {_targets(spec)}\n\nA batch that fails its expectations is committed "
        "to a branch `quarantine-<batch id>` (main unchanged, offsets advanced) and its ingest run fails. Where "
        "Airflow has human-in-the-loop tasks (3.1+), the ingest run also starts a run `decide__<batch id>` of this "
        "DAG, whose `decide` task waits in **Required actions** with the failed expectations, the rows, the ranges "
        "and the Data Docs link: Publish appends the batch to main, Drop gives it up (with a reason), and who "
        "decided is kept in the table's history. Trigger this DAG with the form for scripts and older Airflow: "
        "`list` to see the batches, `publish` to append one to main, `drop` to discard it.\n\n"
        "* pipeline file: `" + pipeline_path + "`"
    )


def _quarantine_params(spec: PipelineSpec) -> dict[str, Any]:
    return {
        "action": Param("list", type="string", enum=["list", "publish", "drop"], title="Action"),
        "batch_id": Param("", type="string", title="Batch id", description="For publish and drop (see list)"),
        "reason": Param(None, type=["null", "string"], title="Reason", description="For drop (optional): why the batch is given up"),
        **(
            {
                "table": Param(
                    "",
                    type="string",
                    title="Table",
                    description="The target table (full name) of the batch to publish or drop; for list, empty lists every table",
                )
            }
            if spec.routed
            else {}
        ),
    }


def build_skip_dag(path: Path, spec: PipelineSpec):
    """``skip_<name>``: dead-letter the records that block a partition (triggered with a form, audited)."""
    pipeline_path = str(path)

    def body(params: dict, context: dict) -> dict:
        from tidewater.runtime.airflow import skip_task

        user = getattr(context.get("dag_run"), "triggering_user_name", None) or "airflow"
        return skip_task(pipeline_path, params, by=str(user))

    return _form_dag(
        spec,
        "skip",
        (
            f"### skip blocking records of {_targets(spec)}\n\nWhen a partition is stuck on records that "
            "fail every retry, trigger this DAG with the partition, the range to skip (it starts at or after the "
            "partition's committed offset, see `tidewater status`) and a reason. Records before the range are "
            "ingested first; the range goes to the dead-letter table as `OperatorSkip` with the reason and the "
            "triggering user, and the partition's offset moves past it (recorded as `tidewater.operator-skip` in the "
            "table's history). `dry_run` (on by default) only checks.\n\n* pipeline file: `" + pipeline_path + "`"
        ),
        {
            "topic": Param(spec.topics[0] if spec.topics else "", type="string", title="Topic"),
            "partition": Param(0, type="integer", minimum=0, title="Partition"),
            "start_offset": Param(
                0,
                type="integer",
                minimum=0,
                title="Start offset",
                description="The first record to skip (at or after the committed offset)",
            ),
            "end_offset": Param(
                1, type="integer", minimum=1, title="End offset (exclusive)", description="The first offset that is ingested again"
            ),
            "reason": Param(
                "", type="string", minLength=1, title="Reason", description="Kept with the dead letters and in the table's history"
            ),
            "dry_run": Param(True, type="boolean", title="Dry run", description="Only check and log what would happen"),
        },
        body,
    )


def build_retry_dead_letters_dag(path: Path, spec: PipelineSpec):
    """``retry_dead_letters_<name>``: decode the open dead letters again with the current settings and commit those
    that pass, once (``tidewater dead-letters retry``; triggered with a form, or from the Tidewater view)."""
    pipeline_path = str(path)

    def body(params: dict, context: dict) -> dict:
        from tidewater.runtime.airflow import retry_dead_letters_task

        user = getattr(context.get("dag_run"), "triggering_user_name", None) or "airflow"
        return retry_dead_letters_task(pipeline_path, params, by=str(user), outlet_events=context.get("outlet_events"))

    return _form_dag(
        spec,
        "retry_dead_letters",
        (
            f"### retry the dead letters of {_targets(spec)}\n\nAfter a fix (a schema, a pipeline setting, a quality rule "
            "that was too strict), trigger this DAG to decode the open dead letters again with the current settings: the "
            "records that now pass are committed once, as a batch of their own (offsets do not move), and their letters "
            "are marked resolved with the snapshot; records that fail again stay letters with their new error; change "
            "tables apply them in source order or refuse them when a later change of the key is applied. The stored "
            "records are decoded, so Kafka need not hold them any more. Choose an error class or a batch to retry only "
            "those; `dry_run` (on by default) only counts them. `tidewater dead-letters drop` gives letters up.\n\n"
            "* pipeline file: `" + pipeline_path + "`"
        ),
        {
            "error_class": Param("", type="string", title="Error class", description="Only letters of this class (empty: all)"),
            "batch_id": Param("", type="string", title="Batch id", description="Only letters this batch dead-lettered (empty: all)"),
            "dry_run": Param(
                True, type="boolean", title="Dry run", description="On (default): only count the letters; turn off to retry them"
            ),
        },
        body,
        outlets=[commits_alias(spec)],
    )


def build_audit_dag(path: Path, spec: PipelineSpec):
    """``audit_<name>``: is the table exactly its topic (``tidewater audit``); fails on a discrepancy."""
    pipeline_path = str(path)

    routed = (
        (
            " For a routed pipeline, from its checkpoint table, and per target table: every batch the checkpoint "
            "committed with rows for it is in it with the rows its writer counted."
        )
        if spec.routed
        else ""
    )

    @dag(
        dag_id=spec.dag_ids()["audit"],
        schedule=spec.audit.schedule,
        **_dag_kwargs(spec, "audit"),
        doc_md=(
            f"### audit of {_targets(spec)}\n\nChecks the table against its topic from the ledger: per partition "
            "the committed ranges follow each other with no gap or overlap, every batch's records read = rows + dead "
            "letters + skipped, no snapshot changed rows outside Tidewater, no committed offset below the log start or "
            f"beyond the log end{'; and every row source offset (`audit.deep`)' if spec.audit.deep else ''}. The run fails on "
            "a discrepancy and its log names each one (topic, partition, offsets, batch, snapshot); the Tidewater view "
            f"shows the last verdict. Same as `tidewater audit`.{routed}"
        ),
    )
    def audit():
        @task(task_id="audit", retries=spec.airflow.retries)
        def run() -> dict:
            from tidewater.runtime.airflow import audit_task

            return audit_task(pipeline_path)

        run()

    return audit()


def build_invalid_dag(path: Path, error: ConfigError):
    """A DAG that shows a broken pipeline file in the UI instead of hiding it."""

    @dag(
        dag_id=invalid_dag_id(path),
        schedule=None,
        start_date=START,
        catchup=False,
        tags=["tidewater", "invalid-config"],
        doc_md=f"Pipeline file `{path}` is invalid:\n\n```\n{error}\n```",
        default_args={"retries": 0},
    )
    def invalid():
        @task(task_id="config_error")
        def config_error() -> None:
            raise ConfigError(str(error))

        config_error()

    return invalid()


def build_pipeline_dags(path: Path, spec: PipelineSpec) -> list:
    """Every DAG of one pipeline file (``PipelineSpec.dag_ids``): ingest, the optional DAGs of ``airflow.dags``
    (replay, skip, dead-letter retry, audit, maintenance) and quarantine under the quarantine policy."""
    return [BUILDERS[kind](path, spec) for kind in spec.dag_ids()]


def maintenance_asset(spec: PipelineSpec) -> Asset:
    """What a maintenance run updates: an asset of its own, not the table's, whose events mean new data to the DAGs
    scheduled on them (a compaction changes files, never rows)."""
    return Asset(name=f"tidewater-{spec.name}-maintenance", uri=f"tidewater://maintenance/{spec.name}")


def build_maintain_dag(path: Path, spec: PipelineSpec):
    pipeline_path = str(path)
    asset = maintenance_asset(spec)
    m = spec.maintenance
    actions = m.enabled_actions(spec.applies_changes)

    @dag(
        dag_id=spec.dag_ids()["maintain"],
        schedule=m.schedule,
        **_dag_kwargs(spec, "maintenance"),
        doc_md=(
            f"### maintenance of `{spec.describe_targets()}`\n\n"
            f"* compaction: {m.rewrite_data_files.strategy}, at least {m.rewrite_data_files.min_input_files} files per group\n"
            f"* expire snapshots older than {m.expire_snapshots.older_than_hours:g} h, keep {m.expire_snapshots.retain_last}; "
            "the snapshot holding the committed offsets and every later one are always kept\n"
            f"* remove orphan files older than {m.remove_orphan_files.older_than_hours:g} h; staged files of batches "
            "in flight are never removed\n"
            f"* one event per run on the asset `{asset.uri}`, from the last action, with every action's report "
            "(never on the table's asset: no row changed)\n* pipeline file: `" + pipeline_path + "`"
        ),
    )
    def maintain():
        previous = None
        for action in actions:
            last = action == actions[-1]

            @task(task_id=action, outlets=[asset] if last else [])
            def run(action: str = action, last: bool = last, **context) -> dict:
                from tidewater.runtime.airflow import maintenance_task

                if not last:
                    return maintenance_task(pipeline_path, action)
                earlier = {a: context["ti"].xcom_pull(task_ids=a) for a in actions[:-1]}
                return maintenance_task(pipeline_path, action, context.get("outlet_events"), asset, earlier)

            current = run()
            if previous is not None:
                previous >> current
            previous = current

    return maintain()


# The builder of each kind of DAG (config.sections.airflow.DAG_KINDS; tests/dags/test_dagbag.py holds the two equal): a DAG id
# is ``<airflow.dag_id_prefix><kind>_<pipeline name>`` (PipelineSpec.dag_ids, build_pipeline_dags), and a file that
# does not load makes ``ingest_invalid_<file stem>`` (build_invalid_dag).
BUILDERS = {
    "ingest": build_ingest_dag,
    "audit": build_audit_dag,
    "replay": build_replay_dag,
    "skip": build_skip_dag,
    "retry_dead_letters": build_retry_dead_letters_dag,
    "quarantine": build_quarantine_dag,
    "maintain": build_maintain_dag,
}


def _occurrences(text: str, part: str) -> list[int]:
    """Every index where ``part`` starts in ``text``."""
    out, i = [], text.find(part)
    while i >= 0:
        out.append(i)
        i = text.find(part, i + 1)
    return out


def _parsing_dag_id() -> str | None:
    """The DAG a task of which this parse is for (Airflow's parsing context), or None when every DAG is wanted (the
    DAG processor, ``airflow dags list``)."""
    from airflow.sdk import get_parsing_context

    return get_parsing_context().dag_id


def _files_for(dag_id: str, folder: Path) -> list[Path]:
    """The pipeline files whose DAGs may include ``dag_id``, from the file names alone: ``<name>.yaml`` (or ``.yml``)
    for a DAG id ``<kind>_<name>`` (a file named after its pipeline, as ``tidewater init`` and the examples name
    them). The folder is not listed: a task's parse costs the same however many files it holds."""
    # each place a kind's "<kind>_" occurs: at the start, or after a pipeline's airflow.dag_id_prefix
    names = {dag_id[i + len(kind) + 1 :] for kind in DAG_KINDS for i in _occurrences(dag_id, kind + "_")}
    return sorted(p for n in names for p in (folder / f"{n}.yaml", folder / f"{n}.yml") if p.is_file())


def _file_dags(path: Path, dag_file: str) -> dict[str, Any]:
    """Every DAG of one pipeline file by DAG id; one file's problem, whatever it is, shows as that file's failing
    DAG and never hides the others."""
    try:
        spec = load_pipeline(path)
        check_hosts(spec, airflow_executor())  # a multi-host executor: no per-host place of state
        dags = build_pipeline_dags(path, spec)
    except Exception as e:  # noqa: BLE001 - reported in the UI as the file's ingest_invalid_<file> DAG
        log.error("%s: %s", path, e)
        dags = [build_invalid_dag(path, e if isinstance(e, ConfigError) else ConfigError(f"{path}: {e}"))]
    for dag_obj in dags:
        dag_obj.fileloc = dag_file
    return {d.dag_id: d for d in dags}


def pipeline_dags(dag_file: str | None = None, folder: str | Path | None = None) -> dict[str, Any]:
    """Every DAG of every pipeline file in ``folder`` (default: ``$TIDEWATER_PIPELINES_DIR``), by DAG id, for the
    calling DAG file's ``globals()``. ``dag_file``: that file (default: the caller's), recorded as each DAG's file
    so that Airflow's workers parse the DAG file they were given, not this module.

    A task's parse (Airflow's parsing context names its DAG) builds only the DAGs of the file named after the DAG's
    pipeline, so a task's start costs one pipeline's DAGs however many files the folder holds; when no such file
    makes that DAG (a file named otherwise than its pipeline), every file is built, as the DAG processor does."""
    dag_file = dag_file or sys._getframe(1).f_code.co_filename
    where = Path(folder) if folder else pipelines_dir()
    if not where.is_dir():
        log.warning("no pipelines folder at %s: set TIDEWATER_PIPELINES_DIR, or pass folder= to pipeline_dags in %s", where, dag_file)
    wanted = _parsing_dag_id()
    if wanted:
        out: dict[str, Any] = {}
        for path in _files_for(wanted, where):
            out.update(_file_dags(path, dag_file))
        if wanted in out:
            return out
        log.info("DAG %s: no pipeline file named after it in %s; building every pipeline's DAGs", wanted, where)
    out = {}
    for path in discover_pipelines(where):
        out.update(_file_dags(path, dag_file))
    return out
