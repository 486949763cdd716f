"""Running a manual replay end to end: plan, write (spark-submit or inline), validate, commit.

The request and its checks are in ``plan/replay.py``; the one atomic commit in ``commit/replay.py``.
"""

from __future__ import annotations

from typing import Any

from tidewater.batch import manifest_path, write_json_atomic
from tidewater.config.spec import PipelineSpec
from tidewater.plan.replay import ReplayRequest, describe, plan_replay
from tidewater.source.kafka import kafka_settings
from tidewater.source.timestamps import OffsetLookup
from tidewater.steps.lifecycle import commit_step, validate_step
from tidewater.steps.write import run_write_step
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import changes_of, find_batch_snapshot, summary_dict
from tidewater.write.job import run_inline


def run_replay(
    spec: PipelineSpec,
    req: ReplayRequest,
    master: str | None = None,
    out: Any = print,
    lookup: OffsetLookup | None = None,
    inline: bool = False,
) -> dict[str, Any]:
    """Plan, write (spark-submit, or in this process with ``inline``), validate and commit a replay."""
    say = out or (lambda _s: None)
    plan, path, shown = plan_replay(spec, req, lookup, log_preview=out is None)
    for row in shown:
        say(describe(row))
    if plan is None or path is None:
        say("dry run: nothing changed" if req.dry_run else "nothing to replay: the request selects no committed records")
        return {"status": "dry-run" if req.dry_run else "empty", "preview": shown}
    if inline:
        manifest = run_inline(plan, spec, kafka_settings(spec))
        write_json_atomic(manifest_path(path), manifest.to_json())
    else:
        manifest = run_write_step(spec, path, master=master)
    validate_step(spec, plan, manifest)
    result = commit_step(spec, plan, manifest)
    if not spec.targets.fused:  # one line per target table
        return _routed_result(spec, plan, manifest, result, shown, say)
    changes = _changes_of_replay(spec, plan.batch_id) if plan.mode == "reapply" else None
    if changes is not None:
        say(
            f"{result.status}: replay {plan.batch_id} (reapply) of {manifest.rows_in_files} changes: "
            + ", ".join(f"{v} {k}" for k, v in changes.items())
            + " (reapplied: rows restored from their latest change; "
            "restored: lost rows put back; superseded: a later change wins; absent: no row to restore)"
        )
    else:
        say(
            f"{result.status}: replay {plan.batch_id} ({plan.mode}), {manifest.rows_in_files} rows written"
            + (f", {manifest.present} already present" if manifest.present else "")
        )
    return {
        "status": result.status,
        "batch_id": plan.batch_id,
        "mode": plan.mode,
        "rows": manifest.rows_in_files,
        "already_present": manifest.present,
        "skipped": manifest.skipped,
        "preview": shown,
        **({"changes": changes} if changes is not None else {}),
    }


def _routed_result(spec: PipelineSpec, plan: Any, manifest: Any, result: Any, shown: list[dict[str, Any]], say: Any) -> dict[str, Any]:
    """A routed replay's outcome, one line per target table it committed to."""
    tables = {}
    for t in result.tables:
        mode = plan.mode.for_table(spec.for_table(t.table).applies_changes)
        changes = _changes_of_replay(spec, plan.batch_id, t.table) if mode == "reapply" else None
        tables[t.table] = {"status": t.status, "mode": mode, "rows": t.rows, **({"changes": changes} if changes else {})}
        say(
            f"{t.status}: {t.table} ({mode}), {t.rows} "
            + ("changes: " + ", ".join(f"{v} {k}" for k, v in changes.items()) if changes else "rows written")
        )
    say(
        f"{result.status}: replay {plan.batch_id} ({plan.mode}) of {manifest.records} records over {len(tables)} "
        f"table(s); {manifest.skipped} skipped"
    )
    return {
        "status": result.status,
        "batch_id": plan.batch_id,
        "mode": plan.mode,
        "tables": tables,
        "records": manifest.records,
        "skipped": manifest.skipped,
        "preview": shown,
    }


def _changes_of_replay(spec: PipelineSpec, batch_id: str, ident: str | None = None) -> dict[str, Any] | None:
    """The counts a reapply replay stamped on its snapshot (``ident``: a routed pipeline's target table)."""
    snap = find_batch_snapshot(load_table(load_catalog(spec), ident or spec.table.identifier), batch_id)
    return changes_of(summary_dict(snap)) if snap is not None else None
