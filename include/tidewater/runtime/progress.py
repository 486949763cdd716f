"""`tidewater run`'s progress lines, from what each step of the batch reports (``steps/lifecycle.py: run_once``).

Printed on standard error, so that standard output stays free for a result such as ``tidewater run --json``. The
stage lines say what the batch really does: which tables it commits and how (rows appended, changes applied by
key), where its offsets land, and what each table got.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from tidewater.batch import BatchManifest, BatchPlan
from tidewater.commit.result import CommitResult
from tidewater.config.locations import spark_app_path
from tidewater.config.spec import PipelineSpec
from tidewater.quality.gate import ValidationReport
from tidewater.table.targets import target_spec

INDENT = " " * 6
TICK = 10.0  # seconds between "spark job running" lines


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class BatchProgress:
    """A ``run_once`` progress listener that prints a line per stage and what it did."""

    def __init__(self, out: Callable[[str], None] = _stderr) -> None:
        self.out = out
        self.next_tick = TICK

    def __call__(self, event: str, **facts: Any) -> None:
        getattr(self, event.replace("-", "_"))(**facts)

    def planning(self, spec: PipelineSpec) -> None:
        self.out(f"[1/4] plan     {spec.name}: reading committed offsets from {spec.checkpoint_table()} and end offsets from Kafka")

    def caught_up(self, seconds: float) -> None:
        self.out(f"{INDENT}nothing to ingest: every partition is caught up ({seconds:.1f}s)")

    def planned(self, plan: BatchPlan) -> None:
        self.out(f"{INDENT}batch {plan.batch_id}: {plan.record_span} offsets over {len(plan.ranges)} partition(s)")

    def writing(self, spec: PipelineSpec) -> None:
        engine = f"Spark Connect {spec.spark.connect_url}" if spec.spark.connect_url else f"spark-submit {spark_app_path().name}"
        self.out(f"[2/4] write    {engine}")

    def running(self, seconds: float) -> None:
        if seconds >= self.next_tick:
            self.out(f"{INDENT}... spark job running, {seconds:.0f}s")
            self.next_tick += TICK

    def written(self, manifest: BatchManifest, seconds: float) -> None:
        if manifest.ignored_fields:
            self.out(f"{INDENT}fields not added (table.evolve_schema is off): {', '.join(manifest.ignored_fields)}")
        extra = f", {manifest.dead_letters} dead letter(s)" if manifest.dead_letters else ""
        extra += f", {manifest.skipped} skipped" if manifest.skipped else ""
        files = sum(len(o.data_files) for o in manifest.outputs)
        self.out(f"{INDENT}{manifest.records} records -> {files} file(s) for {len(manifest.outputs)} table(s){extra} ({seconds:.1f}s)")
        self.out("[3/4] validate the quality gate on the staged files")

    def validated(self, report: ValidationReport, seconds: float) -> None:
        passed = sum(c.success for c in report.checks)
        self.out(f"{INDENT}{passed}/{len(report.checks)} expectations passed ({seconds:.1f}s)")

    def committing(self, spec: PipelineSpec, manifest: BatchManifest) -> None:
        self.out(f"[4/4] commit   {committing_what(spec, manifest)}")

    def committed(self, result: CommitResult, seconds: float, total: float) -> None:
        for t in result.tables:  # what the batch did to each table
            self.out(
                f"{INDENT}{t.table}: {t.status}"
                + (f", snapshot {t.snapshot_id}" if t.snapshot_id is not None else "")
                + (f", {t.rows} row(s)" if t.holds_rows else "")
            )
        self.out(f"{INDENT}{result.status}: {result.records} records ({seconds:.1f}s; {total:.1f}s total)")

    def docs(self, site: Any) -> None:
        self.out(f"{INDENT}Data Docs page rendering in the background, into the site {site}")


def committing_what(spec: PipelineSpec, manifest: BatchManifest) -> str:
    """What the commit is about to do, from the batch's outputs: each table once, appended rows or changes by key,
    and where the offsets land (with the rows of the pipeline's own table, or in its checkpoint table after the
    others)."""
    holder = spec.targets.holder
    tables = [o.table for o in manifest.outputs if o.data_files]
    how = {t: "changes by key (one row delta)" if target_spec(spec, t).applies_changes else "rows appended" for t in tables}
    if holder in {o.table for o in manifest.outputs}:  # the pipeline's own table: data and offsets in one snapshot
        return f"{holder}: {how.get(holder, 'no rows')}, the offsets in the same snapshot"
    if not tables:
        return f"no rows for any table; the offsets in {holder}"
    listed = ", ".join(f"{t} ({h})" for t, h in how.items())
    return f"{len(tables)} table(s) once each: {listed}; then the offsets in {holder}"
