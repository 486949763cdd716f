"""The write step as a Spark job: one Spark task per partition sub-range, or per pack of short ones
(``write/packing.py``), files written, never committed.

The plan is made before Spark starts and passed in; Spark never decides offsets. Each task reads its
exact range with confluent-kafka inside the Python worker, decodes with Arrow, and writes Parquet data
files with the table's field ids; record data never crosses between the JVM and Python. The driver
collects what each task wrote into a batch manifest in the staging directory.

A task that fails on a record (or cannot read Kafka) deletes the files it wrote (nothing can have
landed: only the commit step makes files visible) and reports the error; the driver writes it to
``error.json`` next to the plan and exits non-zero.

Tasks never create or change a table. A task whose rows need a table created, a field added, a type
widened or a column made optional reads its whole range, writes nothing, and reports every change it
found; the driver makes them once (one schema change per table, tagged as the batch's until it commits:
``table/provisional.py``) and runs those tasks again (``write_rounds``). The plan step's probe creates a
first batch's tables from its first records, so most batches need one round.

This module is what the spark-submit driver runs (``runtime/spark_job.py``), and every batch waits for the driver's
start: it imports only the light modules at its top. The task code (pyarrow, pyiceberg, the decoders) is imported by
the executors that run it (``task_body``), and the catalog on the driver only where a schema change or a failed task
needs it (``make bench``'s write breakdown: the driver's imports).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from typing import Any

from tidewater.batch import (
    ERROR_NAME,
    MANIFEST_NAME,
    BatchManifest,
    BatchPlan,
    Mode,
    PartitionStats,
    StagedFile,
    TableOutput,
    fused_output,
    read_json,
    utc_now_iso,
    write_json_atomic,
)
from tidewater.config.spec import PipelineSpec
from tidewater.config.validate import cluster_mode_refused
from tidewater.errors import BatchWriteError, ConfigError, TerminalError, TidewaterError, error_document
from tidewater.write.packing import Pack, task_ranges

log = logging.getLogger(__name__)


def task_body(
    spec: PipelineSpec, settings: dict[str, str], batch_id: str, task_id: int, ranges: Pack, mode: Mode, tables: tuple[str, ...]
) -> dict[str, Any]:
    """One task of the write step where it runs (``write.task.write_ranges``, imported there: see the docstring)."""
    from tidewater.write.task import write_ranges

    return write_ranges(spec, settings, batch_id, task_id, ranges, mode, tables)


def tasks_of(plan: BatchPlan, spec: PipelineSpec, parallelism: int) -> list[Pack]:
    """The ranges each task of the write step reads (``write/packing.py``): an ingest batch packs its short ranges
    over ``batch.write_parallelism`` tasks, or ``parallelism`` (the engine's) when that is 0; a replay reads one
    sub-range a task (the offsets it leaves out are a partition's)."""
    tasks = task_ranges(
        plan.ranges,
        spec.batch.records_per_task,
        spec.batch.write_parallelism or parallelism,
        pack=spec.batch.pack_ranges and plan.mode is Mode.INGEST,
    )
    log.info("batch %s: %d task(s) over %d partition range(s)", plan.batch_id, len(tasks), len(plan.ranges))
    return tasks


def run(sc: Any, plan: BatchPlan, spec: PipelineSpec, settings: dict[str, str], timings: dict[str, float] | None = None) -> BatchManifest:
    """Run the write step on the SparkContext ``sc`` (one Spark task per sub-range or pack) and return the manifest."""
    timings = {} if timings is None else timings
    timings["job_submitted"] = time.time()
    tasks = tasks_of(plan, spec, sc.defaultParallelism)
    spec = spec.for_executors()
    batch_id, mode, only = plan.batch_id, plan.mode, plan.tables

    def execute(ids: list[int]) -> list[dict[str, Any]]:
        work = [(i, tasks[i]) for i in ids]
        rdd = sc.parallelize(work, numSlices=len(work))
        return rdd.map(lambda x: task_body(spec, settings, batch_id, x[0], x[1], mode, only)).collect()

    results = write_rounds(execute, plan, spec, len(tasks), timings)
    timings["job_done"] = time.time()
    return collect_manifest(plan, spec, results, timings)


def connect_parallelism(spark: Any) -> int:
    """The parallelism packing assumes through the DataFrame API: the session's ``spark.default.parallelism``, or
    this machine's cores when it is unset (a Spark Connect client cannot ask the server's cores)."""
    value = spark.conf.get("spark.default.parallelism", None)
    return int(value) if value else (os.cpu_count() or 1)


def run_arrow(
    spark: Any, plan: BatchPlan, spec: PipelineSpec, settings: dict[str, str], timings: dict[str, float] | None = None
) -> BatchManifest:
    """The same write step through Spark's DataFrame API, for Spark Connect (which has no RDDs): one
    partition per task, each running the task code once in ``mapInArrow`` and returning its result
    as one JSON string. Works on a classic SparkSession too."""
    timings = {} if timings is None else timings
    timings["job_submitted"] = time.time()
    tasks = tasks_of(plan, spec, connect_parallelism(spark))
    batch_id, mode, only = plan.batch_id, plan.mode, plan.tables
    spec = spec.for_executors()

    def execute(ids: list[int]) -> list[dict[str, Any]]:
        def run_tasks(batches: Any) -> Any:
            import pyarrow as pa  # where the tasks run

            for b in batches:
                out = [json.dumps(task_body(spec, settings, batch_id, ids[k], tasks[ids[k]], mode, only)) for k in b.column(0).to_pylist()]
                yield pa.RecordBatch.from_pydict({"result": out}, schema=pa.schema([("result", pa.string())]))

        # spark.range splits 0..n-1 evenly: exactly one task per partition
        rows = spark.range(len(ids), numPartitions=len(ids)).mapInArrow(run_tasks, "result string").collect()
        return [json.loads(r["result"]) for r in rows]

    results = write_rounds(execute, plan, spec, len(tasks), timings)
    timings["job_done"] = time.time()
    return collect_manifest(plan, spec, results, timings)


def run_inline(plan: BatchPlan, spec: PipelineSpec, settings: dict[str, str]) -> BatchManifest:
    """The same write step without Spark: the tasks one after another in this process (packed as over this
    machine's cores)."""
    tasks = tasks_of(plan, spec, os.cpu_count() or 1)

    def execute(ids: list[int]) -> list[dict[str, Any]]:
        return [task_body(spec, settings, plan.batch_id, i, tasks[i], plan.mode, plan.tables) for i in ids]

    timings: dict[str, float] = {}
    results = write_rounds(execute, plan, spec, len(tasks), timings)
    return collect_manifest(plan, spec, results, timings)


MAX_ROUNDS = 3  # a task's second run finds the changes made; a third covers a change another writer undid


def write_rounds(
    execute: Any, plan: BatchPlan, spec: PipelineSpec, n: int, timings: dict[str, float] | None = None
) -> list[dict[str, Any]]:
    """Run the tasks ``0..n-1`` (``execute(ids)`` returns their results); while some report schema changes
    their rows need, make the changes here, once per table, and run those tasks again. A change that
    cannot be made (a setting forbids it, conflicting types) becomes the batch's error."""
    results: dict[int, dict[str, Any]] = {}
    todo = list(range(n))
    for round_no in range(1, MAX_ROUNDS + 1):
        if not todo:
            break
        for r in execute(todo):
            results[r["task_id"]] = r
        todo = sorted(i for i, r in results.items() if "evolve" in r)
        if not todo or any("error" in r for r in results.values()):
            break
        requests = [req for i in todo for req in results[i]["evolve"]]
        try:
            if round_no == MAX_ROUNDS:
                raise TerminalError(
                    f"the tasks still need schema changes after {MAX_ROUNDS} rounds: "
                    f"{'; '.join(sorted({r['table'] + ': ' + r['change'] for r in requests}))}",
                    batch_id=plan.batch_id,
                )
            changed = change_schemas(spec, requests, plan.batch_id)
        except TidewaterError as e:
            results[-1] = {"task_id": -1, "error": error_document(e)}
            break
        log.info("batch %s: schema changed once for %d task(s) (%s); running them again", plan.batch_id, len(todo), " | ".join(changed))
        if timings is not None:
            timings[f"schema_changed_{round_no}"] = time.time()
    return list(results.values())


def change_schemas(spec: PipelineSpec, requests: list[dict[str, Any]], batch_id: str) -> list[str]:
    """Make the schema changes the tasks asked for, once per table (``table/evolution.py``, loaded here only: most
    batches change no schema)."""
    from tidewater.table.catalog import load_catalog
    from tidewater.table.evolution import apply_requests

    return apply_requests(load_catalog(spec), spec, requests, batch_id)


def discard(plan: BatchPlan, spec: PipelineSpec, results: list[dict[str, Any]]) -> None:
    """A batch that failed: no manifest will exist, so no commit can reference the files its tasks wrote; remove them
    and undo its schema changes. The catalog is loaded here only (a batch that succeeds never opens it)."""
    from tidewater.table.catalog import load_catalog, load_table
    from tidewater.table.provisional import revert
    from tidewater.write.sinks import delete_files

    catalog = load_catalog(spec)
    by_table: dict[str, list[str]] = {}
    for r in results:
        if r.get("files"):  # a plain batch's files are its one table's
            by_table.setdefault(spec.targets.holder, []).extend(f["file_path"] for f in r["files"])
        for out in r.get("outputs", []):
            by_table.setdefault(out["table"], []).extend(f["file_path"] for f in out["data_files"])
        by_table.setdefault(spec.dead_letter_table(), []).extend(f["file_path"] for f in r.get("dead_letter_files", []))
    for ident, paths in by_table.items():
        if paths:
            delete_files(load_table(catalog, ident), paths)
    for ident in set(by_table) - {spec.dead_letter_table()} if not spec.targets.fused else {spec.targets.holder}:
        revert(catalog, ident, plan.batch_id)  # nothing of this batch can commit: undo its schema changes


def collect_manifest(
    plan: BatchPlan, spec: PipelineSpec, results: list[dict[str, Any]], timings: dict[str, float] | None = None
) -> BatchManifest:
    """Gather the tasks' results; raise the first task error (all tasks' files are then uncommitted)."""
    errors = [r for r in results if "error" in r]
    if errors:
        discard(plan, spec, results)
        raise BatchWriteError.from_document(errors[0]["error"], len(errors))
    results = sorted(results, key=lambda r: r["task_id"])
    # The newest schema the tasks wrote with (tasks report it: the driver never opens the catalog on success).
    schema_id = max((r.get("schema_id", -1) for r in results), default=-1)
    manifest = BatchManifest(
        batch_id=plan.batch_id,
        table=plan.table,
        data_files=tuple(StagedFile.from_json(f) for r in results for f in r["files"]),
        partitions=tuple(PartitionStats(**st) for r in results for st in r["stats"]),
        schema_id=schema_id,
        written_at=utc_now_iso(),
        task_timings=tuple(r["timing"] for r in results),
        dead_letter_table=spec.dead_letter_table(),
        dead_letter_files=tuple(StagedFile.from_json(f) for r in results for f in r.get("dead_letter_files", [])),
        ignored_fields=tuple(sorted({n for r in results for n in r.get("ignored_fields", [])})),
        outputs=merge_outputs([o for r in results for o in r.get("outputs", [])]),
        driver_timings=dict(timings or {}),
    )
    if not spec.targets.fused:
        return manifest
    # a plain batch's one table: its output holds the files, the rows the writer counted into them, and the offsets
    # they were written against (the plan's)
    own = fused_output(plan, manifest.data_files, manifest.rows_expected, manifest.present, manifest.ignored_fields, spec.table.branch)
    return dataclasses.replace(manifest, outputs=(own,))


def merge_outputs(outputs: list[dict[str, Any]]) -> tuple[TableOutput, ...]:
    """The tasks' per-table outputs, one per table (files joined, counts added, offsets seen kept per
    partition as the distinct values the tasks saw)."""
    by_table: dict[str, list[dict[str, Any]]] = {}
    for o in outputs:
        by_table.setdefault(o["table"], []).append(o)
    merged = []
    for ident in sorted(by_table):
        parts = by_table[ident]
        seen: dict[str, dict[str, list[int | None]]] = {}
        for o in parts:
            for topic, ps in o["seen_offsets"].items():
                for p, off in ps.items():
                    values = seen.setdefault(topic, {}).setdefault(p, [])
                    if off not in values:
                        values.append(off)
        merged.append(
            TableOutput(
                table=ident,
                data_files=tuple(StagedFile.from_json(f) for o in parts for f in o["data_files"]),
                rows=sum(o["rows"] for o in parts),
                already_committed=sum(o["already_committed"] for o in parts),
                seen_offsets={t: {p: tuple(v) for p, v in ps.items()} for t, ps in seen.items()},
                ignored_fields=tuple(sorted({n for o in parts for n in o["ignored_fields"]})),
                branch=parts[0].get("branch"),
            )
        )
    return tuple(merged)


def read_error(batch_dir: Any) -> BatchWriteError | None:
    """The error the write step left next to the plan, if it failed on a record or on Kafka."""
    path = batch_dir / ERROR_NAME
    return BatchWriteError.from_document(read_json(path), 1) if path.is_file() else None


def missing_module(text: str) -> str | None:
    """The module a Python worker could not import, from a Spark error's text, if that is what it says."""
    found = re.search(r"ModuleNotFoundError: No module named '([^']+)'", text)
    return found.group(1) if found else None


def deployment_fault(text: str) -> Any:
    """A terminal error for a failure of the Spark job itself that no retry can heal (the executors' Python
    lacks the project's packages or does not exist on the workers), else None. ``text``: the job's error or log."""
    missing = missing_module(text)
    if missing:
        return ConfigError(
            f"spark.python_env: the executors' Python cannot import {missing!r} (it lacks the "
            "project's packages); ship them with spark.python_env (`make executor-env` builds "
            ".data/executor-env.tar.gz) or install them on the workers"
        )
    program = re.search(r'Cannot run program "([^"]+)"', text)
    if program:
        return ConfigError(
            f"spark.python_env / spark.pyspark.python: the executors' Python {program.group(1)!r} does not "
            "exist on the workers; ship an environment with spark.python_env (`make executor-env`) or "
            "set spark.conf spark.pyspark.python to the workers' interpreter"
        )
    if "Cluster deploy mode is currently not supported for python applications" in text:
        return cluster_mode_refused("deploy mode")
    return None


def stage_manifest(out_dir: Any, write: Any) -> BatchManifest:
    """Run ``write()`` (a write path returning the batch's manifest) and stage its outcome next to the plan:
    the manifest (with the moment it was built), or the error document of a ``BatchWriteError``, re-raised."""
    try:
        manifest = write()
    except BatchWriteError as e:
        write_json_atomic(out_dir / ERROR_NAME, e.doc)
        raise
    manifest = dataclasses.replace(manifest, driver_timings={**manifest.driver_timings, "manifest_built": time.time()})
    write_json_atomic(out_dir / MANIFEST_NAME, manifest.to_json())
    return manifest
