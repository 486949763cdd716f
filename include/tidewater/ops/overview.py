"""One pipeline as an operator looks at it: lag, freshness, recent batches, dead letters, quarantine and
maintenance state, as one JSON document (the Tidewater view in the Airflow UI and its API serve it)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from tidewater.audit import ledger
from tidewater.audit.findings import MOVING
from tidewater.config.spec import PipelineSpec
from tidewater.ops import quarantine
from tidewater.ops.status import status
from tidewater.quality.data_docs import has_page
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.letters import counts as letter_counts
from tidewater.table.summary import (
    BATCH_ID,
    DEAD_LETTERS,
    OFFSETS,
    RECORDS,
    SKIPPED,
    VALID_THROUGH_MS,
    VALIDATION,
    changes_of,
    summary_dict,
)

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

DEAD_LETTER_SAMPLE = 5  # examples per error class
DEAD_LETTER_SCAN = 10_000  # dead letters read for the breakdown (the newest files first)


def _iso(ms: int | None) -> str | None:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="seconds") if ms is not None else None


def recent_batches(spec: PipelineSpec, table: Table, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` batches committed to the table, newest first, with what each did. ``latency_s``
    is the commit time minus the batch's valid-through (how far behind the source the batch landed)."""
    out = []
    snaps = sorted(table.metadata.snapshots, key=lambda s: s.sequence_number or 0, reverse=True)
    for s in snaps:
        props = summary_dict(s)
        batch = props.get(BATCH_ID)
        changes = changes_of(props)
        if not batch or s.summary is None or (s.summary.operation.value != "append" and changes is None):
            continue
        verdict = json.loads(props[VALIDATION]) if props.get(VALIDATION) else None
        vt = int(props[VALID_THROUGH_MS]) if props.get(VALID_THROUGH_MS) else None
        out.append(
            {
                "batch_id": batch,
                "snapshot_id": str(s.snapshot_id),
                "committed_at": _iso(s.timestamp_ms),
                "records": int(props.get(RECORDS, 0)),
                "rows": int(s.summary.get("added-records", 0) or 0),
                "files": int(s.summary.get("added-data-files", 0) or 0),
                "dead_letters": int(props.get(DEAD_LETTERS, 0)),
                "skipped": int(props.get(SKIPPED, 0)),
                "validation": None
                if verdict is None
                else {"success": verdict.get("success"), "failed": verdict.get("failed"), "checks": verdict.get("checks")},
                "data_docs": f"{spec.name}/{batch}.html" if has_page(spec, batch) else None,
                "valid_through": _iso(vt),
                "latency_s": round((s.timestamp_ms - vt) / 1000, 1) if vt is not None else None,
                "changes": changes,
            }
        )
        if len(out) >= limit:
            break
    return out


def dead_letter_classes(spec: PipelineSpec, catalog: Catalog) -> list[dict[str, Any]]:
    """Dead letters by error class: how many, and a few examples naming topic, partition and offset."""
    dlq = load_table(catalog, spec.dead_letter_table())
    if dlq is None or dlq.current_snapshot() is None:
        return []
    rows = dlq.scan(selected_fields=("error_class", "topic", "partition", "offset", "error_message"), limit=DEAD_LETTER_SCAN).to_arrow()
    by: dict[str, dict[str, Any]] = {}
    for r in rows.to_pylist():  # bounded by DEAD_LETTER_SCAN: the error path, not the hot path
        c = by.setdefault(r["error_class"] or "?", {"error_class": r["error_class"] or "?", "count": 0, "examples": []})
        c["count"] += 1
        if len(c["examples"]) < DEAD_LETTER_SAMPLE:
            c["examples"].append({k: r[k] for k in ("topic", "partition", "offset", "error_message")})
    total = int(dlq.current_snapshot().summary.get("total-records", 0) or 0) if dlq.current_snapshot().summary else 0
    classes = sorted(by.values(), key=lambda c: -c["count"])
    for c in classes:
        c["of_scanned"] = len(rows)
        c["total_in_table"] = total
    return classes


def maintenance_state(table: Table) -> dict[str, Any]:
    """Files, delete files, snapshots and the last compaction of the table."""
    snap = table.current_snapshot()
    totals = snap.summary if snap is not None and snap.summary is not None else {}
    replaces = [s for s in table.metadata.snapshots if s.summary is not None and s.summary.operation.value == "replace"]
    return {  # the snapshot summary's running totals (no manifest is read)
        "data_files": int(totals.get("total-data-files", 0) or 0),
        "delete_files": int(totals.get("total-delete-files", 0) or 0),
        "snapshots": len(table.metadata.snapshots),
        "last_compaction": _iso(max(s.timestamp_ms for s in replaces)) if replaces else None,
    }


def overview(spec: PipelineSpec, batches: int = 20) -> dict[str, Any]:
    """Everything the Tidewater view shows for one pipeline."""
    st = status(spec)
    catalog = load_catalog(spec)
    own = spec.targets.own_table  # None: a routed pipeline's batches and maintenance are its tables' (the view lists them)
    table = load_table(catalog, own) if own else None
    vt = st["valid_through"]
    freshness = (datetime.now(timezone.utc) - datetime.fromisoformat(vt)).total_seconds() if vt else None
    out: dict[str, Any] = {
        "pipeline": spec.name,
        "dag_id": spec.dag_id,
        "table": spec.checkpoint_table(),
        "routed": own is None,
        "status": st,
        "freshness_s": round(freshness, 1) if freshness is not None else None,
        "batches": recent_batches(spec, table, batches) if table is not None else [],
        "dead_letters": dead_letter_classes(spec, catalog),
        "quarantined": [  # own: not created yet
            {**q, "decision_run_id": quarantine.decision_run_id(q["batch_id"])}
            for q in ([] if own and table is None else quarantine.list_all(spec))
        ],
        "maintenance": maintenance_state(table) if table is not None else None,
        "audit": _last_audit(spec, catalog),
        "letters": letter_counts(spec, catalog),
    }
    out["status"]["last_snapshot_id"] = str(st["last_snapshot_id"]) if st["last_snapshot_id"] is not None else None
    return out


def _last_audit(spec: PipelineSpec, catalog: Catalog) -> dict[str, Any] | None:
    """The last audit's verdict (None: never audited)."""
    return ledger.last_verdict(catalog, spec)


def lag_history(spec: PipelineSpec, limit: int = 100) -> list[dict[str, Any]]:
    """Lag over time, from the ledger: for each of the last ``limit`` batches that moved the offsets, the records
    between the committed offsets and the log end when it was planned (its ranges' span, summed over partitions: the
    planner reads up to the log end, unless ``batch.max_records`` capped the batch, marked ``capped``)."""
    entries = ledger.read(load_catalog(spec), spec)  # one row per batch and range
    mine = entries.filter(
        pc.and_(
            pc.and_(pc.equal(entries.column("table"), spec.targets.holder), pc.is_in(entries.column("kind"), pa.array(MOVING))),
            pc.is_valid(entries.column("start_offset")),
        )
    )
    spans = mine.append_column("span", pc.subtract(mine.column("end_offset"), mine.column("start_offset")))
    per = spans.group_by("batch_id").aggregate([("span", "sum"), ("committed_at", "max")]).sort_by("committed_at_max")
    per = per.slice(max(0, per.num_rows - limit))
    return [
        {"at": at.isoformat(timespec="seconds"), "batch_id": batch, "lag": lag, "capped": lag >= spec.batch.max_records}
        for batch, lag, at in zip(*(per.column(c).to_pylist() for c in ("batch_id", "span_sum", "committed_at_max")))
    ]


def run_detail(spec: PipelineSpec, run_id: str) -> dict[str, Any]:
    """The batch a DAG run committed (``dag_run_id`` in the ledger): its ranges per partition, its counts, each table's
    rows and snapshot (a routed pipeline's checkpoint and target tables), the gate's verdict with its Data Docs page,
    the snapshot and the offsets after it; ``found`` False when the run committed none (caught up, running, failed
    before its commit; the commit step records each batch in the ledger)."""
    catalog = load_catalog(spec)
    entries = ledger.read(catalog, spec)
    mine = entries.filter(pc.equal(entries.column("dag_run_id"), run_id)).to_pylist()
    if not mine:
        return {"pipeline": spec.name, "run_id": run_id, "found": False, "ranges": [], "tables": []}
    holder = spec.targets.holder
    main = [e for e in mine if e["table"] == holder] or mine
    batch_id = main[0]["batch_id"]
    tables: dict[str, dict[str, Any]] = {}
    for e in mine:
        tables.setdefault(
            e["table"], {"table": e["table"], "rows": e["rows"] or 0, "snapshot_id": str(e["snapshot_id"]), "kind": e["kind"]}
        )
    table = load_table(catalog, holder)
    snap = table.snapshot_by_id(main[0]["snapshot_id"]) if table is not None else None
    props = summary_dict(snap) if snap is not None else {}
    verdict = json.loads(props[VALIDATION]) if props.get(VALIDATION) else None
    return {
        "pipeline": spec.name,
        "run_id": run_id,
        "found": True,
        "batch_id": batch_id,
        "kind": main[0]["kind"],
        "snapshot_id": str(main[0]["snapshot_id"]),
        "ranges": [
            {
                "table": e["table"],
                "topic": e["topic"],
                "partition": e["partition"],
                "start_offset": e["start_offset"],
                "end_offset": e["end_offset"],
                "offsets": e["end_offset"] - e["start_offset"],
            }
            for e in main
            if e["start_offset"] is not None
        ],  # the batch's (each table's summary repeats them)
        "tables": sorted(tables.values(), key=lambda t: t["table"]),
        "records": main[0]["records"],
        "rows": sum(t["rows"] for t in tables.values() if spec.targets.takes_rows(t["table"])),
        "dead_letters": main[0]["dead_letters"],
        "skipped": main[0]["skipped"],
        "validation": None if verdict is None else {k: verdict.get(k) for k in ("success", "failed", "checks")},
        "data_docs": f"{spec.name}/{batch_id}.html" if has_page(spec, batch_id) else None,
        "offsets": json.loads(props[OFFSETS]) if props.get(OFFSETS) else None,
    }
