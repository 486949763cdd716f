"""The write step of a batch: the plan's ranges read and written as staged files by Spark, through spark-submit
(a job per batch) or a Spark Connect server (warm), never committed; the manifest is staged next to the plan.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from pathlib import Path
from typing import Any

from tidewater.batch import (
    ERROR_NAME,
    BatchManifest,
    BatchPlan,
    manifest_path,
    read_json,
)
from tidewater.config.spec import PipelineSpec
from tidewater.errors import TerminalError
from tidewater.source.kafka import kafka_settings
from tidewater.spark.connect import (
    CONNECT_TAG_KEY,
    connect_failure,
    connect_session,
    forget_connect_session,
    interrupt_previous_try,
)
from tidewater.spark.submit import WriteJob
from tidewater.write.job import read_error, run_arrow, stage_manifest

log = logging.getLogger(__name__)


def load_plan(plan_path: Any, spec: PipelineSpec | None = None) -> BatchPlan:
    """The staged plan at ``plan_path`` (text, as XCom and command lines carry it, is resolved in ``spec``'s
    staging area: object storage needs its settings)."""
    return BatchPlan.from_json(read_json(spec.stage(plan_path) if spec is not None else plan_path))


def load_manifest(plan_path: Any, spec: PipelineSpec | None = None) -> BatchManifest:
    """The write step's manifest; raises the write step's own error if it failed."""
    plan_path = spec.stage(plan_path) if spec is not None else plan_path
    mpath = manifest_path(plan_path)
    if not mpath.is_file():
        err = read_error(mpath.parent)
        if err is not None:
            raise err
        raise TerminalError(f"no manifest at {mpath}: the write step has not completed")
    return BatchManifest.from_json(read_json(mpath))


def run_write_step(
    spec: PipelineSpec,
    plan_path: Path,
    master: str | None = None,
    progress: Any = None,
    timings: dict[str, float] | None = None,
    background: list[Any] | None = None,
) -> BatchManifest:
    """Run the Spark job with spark-submit (as the DAG does) and return its manifest. ``timings`` receives
    when spark-submit started and when the step returned (epoch seconds, for :func:`write_breakdown`).

    With ``background`` (a list), the step returns as soon as the job's manifest exists (written atomically
    after the last task: the batch's files are complete) and Spark stops while the caller validates and
    commits; a function that waits for spark-submit to exit is appended to the list, to call at the end.
    """
    if spec.spark.connect_url:
        return run_connect_write(spec, plan_path, timings)
    WriteJob(spec, plan_path, master, timings).wait(plan_path, progress, background)
    return load_manifest(plan_path)


def run_connect_write(
    spec: PipelineSpec, plan_path: Path, timings: dict[str, float] | None = None, url: str | None = None, tries: Any = None
) -> BatchManifest:
    """The write step on a Spark Connect server (``url``, default ``spark.connect_url``), from this process:
    the same plan, tasks, manifest and error document as the spark-submit job. Its operations carry a tag of this
    try, kept in ``tries`` (the task's state store) before they start, so that a later try interrupts them first
    (``interrupt_previous_try``): sessions are shared by every batch on the server, so only the tag names this
    try's work."""
    timings = {} if timings is None else timings
    url = url or str(spec.spark.connect_url)
    (plan_path.parent / ERROR_NAME).unlink(missing_ok=True)
    manifest_path(plan_path).unlink(missing_ok=True)
    plan = load_plan(plan_path)
    timings["submitted"] = time.time()
    spark = connect_session(url)
    timings.update(driver_started=timings["submitted"], imports_done=time.time(), session_ready=time.time())
    interrupt_previous_try(spark, tries)
    tag = f"tidewater-{spec.name}-{plan.batch_id}-{uuid.uuid4().hex[:8]}"
    if tries is not None:
        tries.set(CONNECT_TAG_KEY, tag)
    spark.addTag(tag)
    try:
        manifest = stage_manifest(plan_path.parent, lambda: run_arrow(spark, plan, spec, kafka_settings(spec), timings))
    except Exception as e:
        mapped = connect_failure(e, url)
        if mapped is not None and mapped.transient:
            forget_connect_session(url)
        if mapped is None:
            raise
        raise mapped from None
    finally:
        with contextlib.suppress(Exception):  # the session is shared: later batches must not carry this try's tag
            spark.removeTag(tag)
    timings["returned"] = time.time()
    return manifest


def write_breakdown(manifest: BatchManifest, submitted: float, returned: float) -> dict[str, float]:
    """Where the write step's wall time went, in seconds, in order (from the driver's milestones and the
    tasks' timings; the figures add up to returned - submitted)."""
    d, tasks = manifest.driver_timings, manifest.task_timings
    if not d or "manifest_built" not in d:
        return {"spark-submit": round(returned - submitted, 3)}
    marks = [
        ("spark-submit and JVM start, until the Python driver runs", submitted, d["driver_started"]),
        ("driver imports", d["driver_started"], d["imports_done"]),
        ("SparkContext start", d["imports_done"], d["session_ready"]),
    ]
    ready = d["session_ready"]
    if tasks:
        first, last = min(t["started_at"] for t in tasks), max(t["finished_at"] for t in tasks)
        setup = min(tasks, key=lambda t: t["started_at"]).get("setup_seconds", 0.0)
        marks += [
            ("task scheduling and Python worker start", ready, first),
            ("first task's set-up (catalog, table, clients)", first, first + setup),
            ("data path after set-up (read, decode, write)", first + setup, last),
            ("task results to the driver", last, d["job_done"]),
        ]
    else:
        marks.append(("no tasks", ready, d["job_done"]))
    marks += [
        ("manifest (driver)", d["job_done"], d["manifest_built"]),
        ("manifest written until the step returned (Spark stop and JVM exit, unless in the background)", d["manifest_built"], returned),
    ]
    return {name: round(b - a, 3) for name, a, b in marks}
