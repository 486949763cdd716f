"""Quarantined batches (``validation.on_failure: quarantine``).

A batch whose expectations fail is not lost and not published: its data files are committed to a
branch ``quarantine-<batch id>`` of the table, and main gets an empty snapshot carrying the batch id
and the advanced offsets, so ingestion goes on and main stays clean. The run fails with the report.
A person then publishes the batch (its files appended to main in one commit) or drops it (main gets an empty
snapshot recording the decision, which the ledger keeps and the audit explains; then the branch is removed, and
expiry and orphan removal delete its files later). A change table's quarantined batch holds its row
delta; the table's next batch waits for the decision (a key's changes apply in order), and dropping it leaves the
table without those changes (a replay of the range with mode reapply applies them later).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from tidewater.commit.primitive import Change, commit
from tidewater.commit.quarantine import publish_changes, publish_files
from tidewater.config.spec import PipelineSpec
from tidewater.errors import ConfigError
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import (
    BATCH_ID,
    DECIDED_BY,
    DROPPED,
    PIPELINE,
    PUBLISHED,
    QUARANTINE_BRANCH,
    RANGES,
    VALIDATION,
    quarantine_branch,
    summary_dict,
)
from tidewater.table.targets import quarantine_candidates, target_spec, target_tables

if TYPE_CHECKING:
    from pyiceberg.table import Table

log = logging.getLogger(__name__)
DROP_PREFIX = "drop-"  # the batch id of the snapshot recording a drop: drop-<the quarantined batch's id>


def decision_run_id(batch_id: str) -> str:
    """The run of the quarantine DAG that asks a person about a quarantined batch (runtime/decisions.py)."""
    return f"decide__{batch_id}"


def list_quarantined(spec: PipelineSpec, table: Table) -> list[dict[str, Any]]:
    """The batches waiting on a quarantine branch: batch id, branch, rows, files, the gate's verdict."""
    out = []
    for name, ref in sorted(table.metadata.refs.items()):
        if not name.startswith(QUARANTINE_BRANCH):
            continue
        snap = table.metadata.snapshot_by_id(ref.snapshot_id)
        props = summary_dict(snap)
        out.append(
            {
                "batch_id": name[len(QUARANTINE_BRANCH) :],
                "branch": name,
                "rows": int(props.get("added-records", 0)),
                "files": int(props.get("added-data-files", 0)),
                "validation": json.loads(props[VALIDATION]) if VALIDATION in props else None,
            }
        )
    return out


def _table(spec: PipelineSpec) -> Any:
    table = load_table(load_catalog(spec), spec.table.identifier)
    if table is None:
        raise ConfigError(f"table {spec.table.identifier} does not exist")
    return table


def publish(spec: PipelineSpec, batch_id: str, by: str | None = None) -> dict[str, Any]:
    """Append a quarantined batch's files to main (one commit; done once), then remove its branch. ``by``: who
    decided, kept in the commit's summary (``tidewater.decided-by``)."""
    table = _table(spec)
    name = quarantine_branch(batch_id)
    done = next((s for s in table.metadata.snapshots if summary_dict(s).get(PUBLISHED) == batch_id), None)
    if done is None and table.snapshot_by_name(name) is None:
        raise ConfigError(
            f"--batch: no quarantined batch {batch_id} in {spec.table.identifier} "
            f"(waiting: {', '.join(q['batch_id'] for q in list_quarantined(spec, table)) or 'none'})"
        )
    publishing = publish_changes if spec.applies_changes else publish_files
    status, rows, _files = publishing(load_catalog(spec), spec.table.identifier, spec.name, batch_id, {DECIDED_BY: by} if by else None)
    table = _table(spec)
    if status != "committed":
        done = next((s for s in table.metadata.snapshots if summary_dict(s).get(PUBLISHED) == batch_id), None)
        rows = int(summary_dict(done).get("added-records", 0)) if done is not None else 0
    if table.snapshot_by_name(name) is not None:
        table.manage_snapshots().remove_branch(name).commit()
    return {"batch_id": batch_id, "status": "published", "rows": rows}


def drop(spec: PipelineSpec, batch_id: str, reason: str = "", by: str | None = None) -> dict[str, Any]:
    """Give up a quarantined batch (its rows never reach main): record the decision on main (an empty snapshot with
    the batch's ranges, and the reason and who decided when given; committed once: a retry after it finds it), then
    remove the batch's branch. A batch already dropped is reported as dropped again."""
    table = _table(spec)
    name = quarantine_branch(batch_id)
    head = table.snapshot_by_name(name)
    if head is None:
        done = next((s for s in table.metadata.snapshots if summary_dict(s).get(BATCH_ID) == DROP_PREFIX + batch_id), None)
        if done is not None:
            return {"batch_id": batch_id, "status": "dropped", "rows": json.loads(summary_dict(done)[DROPPED])["rows"]}
        raise ConfigError(f"--batch: no quarantined batch {batch_id} in {spec.table.identifier}")
    rows = next((q["rows"] for q in list_quarantined(spec, table) if q["batch_id"] == batch_id), 0)
    ranges = json.loads(summary_dict(head).get(RANGES, "[]"))
    decision = {
        "batch": batch_id,
        "rows": rows,
        "ranges": ranges,
        **({"reason": reason.strip()} if reason.strip() else {}),
        **({"by": by} if by else {}),
    }
    record = {BATCH_ID: DROP_PREFIX + batch_id, PIPELINE: spec.name, DROPPED: json.dumps(decision, separators=(",", ":"))}
    commit(
        load_catalog(spec),
        spec.table.identifier,
        lambda _t: Change(record, (), branch=spec.table.branch),
        marker=record[BATCH_ID],
        what=f"drop of quarantined batch {batch_id}",
    )
    table = _table(spec)
    if table.snapshot_by_name(name) is not None:
        table.manage_snapshots().remove_branch(name).commit()
    log.info("dropped quarantined batch %s (%d rows) from %s", batch_id, rows, spec.table.identifier)
    return {"batch_id": batch_id, "status": "dropped", "rows": rows}


def view_for(spec: PipelineSpec, table: str | None) -> PipelineSpec:
    """The pipeline as one table's: a routed pipeline's target table ``table`` (required), else the pipeline."""
    named = spec.targets.named(table, spec.name)  # a plain pipeline's one table, named or not
    known = target_tables(load_catalog(spec), spec)
    if named not in known:
        raise ConfigError(
            f"--table: {'required for a routed pipeline' if not named else repr(named) + ' is not a target table'}"
            f" (the target tables of {spec.name}: {', '.join(known) or 'none yet'})"
        )
    return target_spec(spec, named)


def list_all(spec: PipelineSpec, table: str | None = None) -> list[dict[str, Any]]:
    """The quarantined batches of the pipeline's table, or of every target table of a routed pipeline (each row
    names its table), or of the one ``table`` names."""
    catalog = load_catalog(spec)
    names = [view_for(spec, table).table.identifier] if table else quarantine_candidates(catalog, spec)
    out = []
    for ident in names:
        loaded = load_table(catalog, ident)
        out += [{"table": ident, **q} for q in (list_quarantined(spec, loaded) if loaded is not None else [])]
    return out


def decision_body(
    spec: PipelineSpec,
    batch_id: str,
    tables: tuple[str, ...],
    report: dict[str, Any] | None,
    ranges: list[tuple[str, int, int, int]],
    docs_url: str | None,
) -> str:
    """What a person needs to decide on a quarantined batch, as Markdown (the body of the decision in Airflow's
    Required actions): the tables and their rows, the failed expectations with what was observed, the batch's
    ranges, and its Data Docs page."""
    lines = [
        f"Batch `{batch_id}` of pipeline `{spec.name}` failed its expectations and waits on branch "
        f"`{quarantine_branch(batch_id)}` of {', '.join(f'`{t}`' for t in tables)}. Main is unchanged and the "
        "offsets moved on. **Publish** appends its rows to main; **Drop** gives them up (give a reason).",
        "",
    ]
    if report is not None:
        from tidewater.quality.gate import ValidationReport

        verdict = ValidationReport.from_json(report)
        lines += [f"**Rows:** {verdict.rows}. **Suite:** `{verdict.suite}`.", "", "**Failed expectations:**", ""]
        failed = [c for c in verdict.checks if not c.success]
        for c in failed[:20]:
            observed = c.observed_text()
            lines.append(f"- `{c.call()}`" + (f": observed {observed}" if observed else ""))
        if len(failed) > 20:
            lines.append(f"- ... and {len(failed) - 20} more")
        lines.append("")
    shown = ranges[:50]
    lines += ["**Ranges read** (topic, partition, offsets start to end, end exclusive):", ""]
    lines += [f"- `{topic}` [{partition}] {start}-{end}" for topic, partition, start, end in shown]
    if len(ranges) > len(shown):
        lines.append(f"- ... and {len(ranges) - len(shown)} more partitions")
    if docs_url:
        lines += ["", f"[Data Docs of the batch]({docs_url})"]
    return "\n".join(lines)
