"""The steps of one batch (plan, write, validate, commit), shared by the Airflow DAG, the CLI and operations.

Each step reads what the previous one staged (plan.json, manifest.json) so that any step can be
retried on its own: write never commits (``steps/write.py``), validate never changes anything, and commit is
idempotent (``commit/batch.py``). Around them: what an interrupted run left is finished (dead letters) or undone
(the schema changes of abandoned batches), and the ledger records each commit.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidewater.audit import ledger
from tidewater.batch import (
    GATE_REPORT_NAME,
    MANIFEST_NAME,
    PLAN_NAME,
    REVERTED_NAME,
    VALIDATION_NAME,
    BatchManifest,
    BatchPlan,
    batch_dir,
    is_ingest_batch,
    read_json,
    write_json_atomic,
)
from tidewater.commit.batch import commit_batch
from tidewater.commit.dead_letters import commit_dead_letters, dead_letter_sink
from tidewater.commit.quarantine import quarantined_error
from tidewater.commit.result import CommitResult
from tidewater.config.parse import load_pipeline
from tidewater.config.spec import PipelineSpec
from tidewater.errors import TerminalError, ValidationFailedError
from tidewater.plan.ingest import plan_batch
from tidewater.quality.data_docs import page_of, publish, render_in_background, site_dir
from tidewater.quality.gate import ValidationReport, judge, require_valid
from tidewater.source.kafka import kafka_settings
from tidewater.steps.write import load_plan, run_write_step, write_breakdown
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.provisional import revert
from tidewater.table.summary import BATCH_ID, DEAD_LETTERS, find_batch_snapshot, summary_dict
from tidewater.table.targets import holder_state, target_tables
from tidewater.write.task import probe_schema

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)


def validate_step(spec: PipelineSpec, plan: BatchPlan, manifest: BatchManifest) -> ValidationReport:
    """Run the quality gate; raises ValidationFailedError (nothing committed) when it fails."""
    report = judge(spec, load_catalog(spec), manifest)
    # observed values may be dates or decimals: as text, like the Data Docs' pending report
    write_json_atomic(batch_path(spec, plan) / GATE_REPORT_NAME, json.loads(json.dumps(report.to_json(), default=str)))
    page = publish(spec, report, plan.table)
    log.info("batch %s: Data Docs %s", plan.batch_id, page.as_uri() if page is not None else "page rendered after the commit")
    try:
        require_valid(report, spec.validation.on_failure)
    except ValidationFailedError:
        reject_batch(spec, plan, manifest, "the quality gate rejected it")
        raise
    # What the gate decided travels to the commit (stamped in the snapshot summary).
    verdict = report.summary()
    if not report.success and spec.validation.on_failure == "quarantine":
        verdict["quarantine"] = True
    write_json_atomic(batch_path(spec, plan) / VALIDATION_NAME, verdict)
    return report


def batch_path(spec: PipelineSpec, plan: BatchPlan) -> Path:
    return batch_dir(spec.staging_dir(), spec.name, plan.batch_id)


def finish_pending_commits(spec: PipelineSpec) -> str | None:
    """Before planning: finish the dead-letter commit of the latest committed batch, if a crash came
    between the batch's commit and its dead letters' (the batch's summary counts them, the dead-letter
    table lacks them). Uses the batch's staged manifest; idempotent. Returns the batch id it finished.

    Without this, the next run would plan from the advanced offsets and the dead letters would be lost.
    """
    catalog = load_catalog(spec)
    table, state = holder_state(catalog, spec)
    if state is None or state.batch_id is None or state.tidewater_snapshot_id is None:
        return None
    props = summary_dict(table.metadata.snapshot_by_id(state.tidewater_snapshot_id))
    if int(props.get(DEAD_LETTERS, 0) or 0) == 0:
        return None
    dlq = load_table(catalog, spec.dead_letter_table())
    if dlq is not None and find_batch_snapshot(dlq, state.batch_id) is not None:
        return None
    directory = batch_dir(spec.staging_dir(), spec.name, state.batch_id)
    mpath, ppath = directory / MANIFEST_NAME, directory / PLAN_NAME
    if not (mpath.is_file() and ppath.is_file()):
        log.error(
            "batch %s: committed with %s dead letters that the dead-letter table %s does not hold, and its "
            "staging directory %s is gone: those dead letters cannot be recovered (the records are still in "
            "Kafka at the batch's ranges)",
            state.batch_id,
            props.get(DEAD_LETTERS),
            spec.dead_letter_table(),
            directory,
        )
        return None
    plan, manifest = load_plan(ppath), BatchManifest.from_json(read_json(mpath))
    log.info(
        "batch %s: finishing its dead-letter commit (%d dead letters) left by an interrupted run", plan.batch_id, manifest.dead_letters
    )
    commit_dead_letters(catalog, plan, manifest, dead_letter_sink(spec, plan.batch_id))
    return plan.batch_id


def _written_tables(spec: PipelineSpec, catalog: Catalog, manifest: BatchManifest | None = None) -> list[str]:
    """The tables a batch may have changed the schema of: those its manifest wrote to, else every target table."""
    if manifest is not None and manifest.outputs:
        return [o.table for o in manifest.outputs]
    return target_tables(catalog, spec)


def reject_batch(spec: PipelineSpec, plan: BatchPlan, manifest: BatchManifest | None, why: str) -> None:
    """A batch that will never commit: undo its schema changes on every table it wrote to, and mark its
    staging directory so that no later commit step can commit its files (they may hold dropped columns)."""
    catalog = load_catalog(spec)
    undone = {ident: revert(catalog, ident, plan.batch_id) for ident in _written_tables(spec, catalog, manifest)}
    write_json_atomic(batch_path(spec, plan) / REVERTED_NAME, {"why": why, "undone": undone})


def _abandoned_batches(spec: PipelineSpec, catalog: Catalog) -> list[Path]:
    """Staged ingest batches planned after the newest committed one that never committed and were not
    undone yet: the only ones whose schema changes can still need undoing (earlier ones were handled by
    the plan step that came before the next commit). One directory listing; no table scan."""
    root = spec.staging_dir() / spec.name
    if not root.is_dir():
        return []
    table = load_table(catalog, spec.checkpoint_table())
    committed = {summary_dict(s).get(BATCH_ID) for s in table.metadata.snapshots} if table is not None else set()
    newest = max((b for b in committed if b and is_ingest_batch(b)), default="")
    return [
        d
        for d in sorted(root.iterdir())
        if d.name > newest
        and is_ingest_batch(d.name)
        and d.name not in committed
        and (d / PLAN_NAME).is_file()
        and not (d / REVERTED_NAME).is_file()
    ]


def revert_abandoned(spec: PipelineSpec) -> list[str]:
    """Before an ingest batch is planned: the provisional schema changes of earlier ingest batches that
    never committed (their run died, or was stopped) are undone. Ingest batches of one pipeline run one
    after another (the DAG allows one active run), so an uncommitted earlier one can no longer commit;
    replays and skips undo their own on failure. Returns the batch ids reverted."""
    catalog = load_catalog(spec)
    done = []
    for directory in _abandoned_batches(spec, catalog):
        plan = load_plan(directory / PLAN_NAME)
        manifest = BatchManifest.from_json(read_json(directory / MANIFEST_NAME)) if (directory / MANIFEST_NAME).is_file() else None
        reject_batch(spec, plan, manifest, "its run ended before the commit; a later run planned anew")
        done.append(plan.batch_id)
    return done


def plan_step(spec: PipelineSpec, data_interval: tuple[str, str] | None = None) -> tuple[BatchPlan, Path | None]:
    """The plan step of the DAG and the CLI: finish what an interrupted run left (its dead letters), undo
    what an abandoned batch changed (its schema), then plan the next batch."""
    finish_pending_commits(spec)
    revert_abandoned(spec)
    plan, path = plan_batch(spec, data_interval=data_interval)
    if path is not None and plan.base_snapshot_id is None:
        # A first batch: the table (routed: each table its first records name) is created here from the first
        # records of each range, so that the write job needs one round. Anything else (a field past those
        # records, a routed table a later batch names) the tasks report and the write job's driver makes once.

        probe_schema(spec, kafka_settings(spec), plan.batch_id, plan.ranges)
    return plan, path


def commit_step(spec: PipelineSpec, plan: BatchPlan, manifest: BatchManifest, dag_run_id: str | None = None) -> CommitResult:
    """Commit the batch (or find it committed), then record the table's new batches in its ledger (a batch whose
    commit raised, a quarantined one among them, is recorded by the next sync)."""
    result = _commit(spec, plan, manifest, dag_run_id)
    # a routed batch's sync loads only the tables it committed to (all of them when it committed none here)
    touched = result.touched() if result.tables else None
    record_in_ledger(spec, touched)
    return result


def record_in_ledger(spec: PipelineSpec, touched: list[str] | None = None) -> None:
    """Sync the ledger (``audit/ledger.py``; ``touched``: see ``ledger.sync``). A failure is logged, not raised:
    the batch is committed either way and the next sync (the next commit, snapshot expiry, the audit) records it."""
    try:
        ledger.sync(load_catalog(spec), spec, touched)
    except Exception as e:  # noqa: BLE001 - see the docstring
        log.warning("the ledger %s was not brought up to date (the next commit or audit does it): %s", ledger.identifier(spec), e)


def _commit(spec: PipelineSpec, plan: BatchPlan, manifest: BatchManifest, dag_run_id: str | None) -> CommitResult:
    reverted = batch_path(spec, plan) / REVERTED_NAME
    if reverted.is_file():
        why = read_json(reverted).get("why", "")
        raise TerminalError(
            f"batch {plan.batch_id} will never commit ({why}); its schema changes were undone. The next run plans its records anew",
            batch_id=plan.batch_id,
            table=plan.table,
        )
    path = batch_path(spec, plan) / VALIDATION_NAME
    validation = read_json(path) if path.is_file() else None
    result = commit_batch(
        load_catalog(spec),
        plan,
        manifest,
        spec=spec,
        dag_run_id=dag_run_id,
        validation=validation,
        dead_letter_sink=dead_letter_sink(spec, plan.batch_id),
    )
    if result.quarantined:  # a quarantined batch fails its run with the gate's report (its commit has landed)
        raise quarantined_error(plan.batch_id, tuple(result.quarantined), validation, spec)
    return result


Progress = Callable[..., None]  # progress(event, **facts): what run_once tells its caller as the batch goes


def _unseen(event: str, **facts: Any) -> None:
    """No progress shown (run_once's default)."""


def run_once(
    spec_path: str | Path, master: str | None = None, progress: Progress | None = None, wait_for_spark: bool = True
) -> dict[str, Any]:
    """One batch through plan, write (spark-submit or Spark Connect), validate and commit. ``progress`` is told each
    stage as it starts and what it did (events ``planning``, ``caught-up``, ``planned``, ``writing``, ``running``,
    ``written``, ``validated``, ``committing``, ``committed``, ``docs``, with the step's own results as facts); the
    command line prints them (``runtime/progress.py``).

    Spark stops while the batch is validated and committed; ``wait_for_spark=False`` (``tidewater run``)
    returns without waiting for its JVM to exit (about a second after the manifest, on its own)."""
    say = progress or _unseen
    spec = load_pipeline(spec_path)
    t0 = time.monotonic()
    say("planning", spec=spec)
    plan, plan_path = plan_step(spec)
    if plan_path is None:
        say("caught-up", seconds=time.monotonic() - t0)
        return {"status": "empty", "batch_id": None, "records": 0}
    say("planned", plan=plan)
    t1 = time.monotonic()
    say("writing", spec=spec)
    submit: dict[str, float] = {}
    background: list[Any] = []  # Spark stops while the batch is validated and committed
    try:
        manifest = run_write_step(
            spec, plan_path, master, progress=lambda elapsed: say("running", seconds=elapsed), timings=submit, background=background
        )
        return _validate_and_commit(spec, plan, manifest, say, submit, (t0, t1))
    finally:
        for finish in background if wait_for_spark else ():
            finish()


def _validate_and_commit(
    spec: PipelineSpec, plan: BatchPlan, manifest: BatchManifest, say: Progress, submit: dict[str, float], started: tuple[float, float]
) -> dict[str, Any]:
    t0, t1 = started
    say("written", manifest=manifest, seconds=time.monotonic() - t1)
    t2 = time.monotonic()
    report = validate_step(spec, plan, manifest)
    say("validated", report=report, seconds=time.monotonic() - t2)
    t3 = time.monotonic()
    say("committing", spec=spec, manifest=manifest)
    result = commit_step(spec, plan, manifest)
    t4 = time.monotonic()
    say("committed", result=result, seconds=t4 - t3, total=t4 - t0)
    steps = {"plan": t1 - t0, "write": t2 - t1, "validate": t3 - t2, "commit": t4 - t3}
    if page_of(spec, plan.batch_id) is None:
        render_in_background(spec, plan.batch_id)
        say("docs", site=site_dir(spec) / "index.html")
    return {
        **result.summary(),
        "seconds": round(time.monotonic() - t0, 3),
        "steps": {k: round(v, 3) for k, v in steps.items()},
        "write_breakdown": write_breakdown(manifest, submit["submitted"], submit["returned"]),
    }
