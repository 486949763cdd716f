"""The audit's checks of the ledger and the tables' histories: coverage (the batches that moved the offsets tile each
partition), accounting (records read = rows + dead letters + skipped), each target table of a separate offsets
holder against the holder's batches, and writes made outside Tidewater."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tidewater.audit.findings import MOVING, Finding, detail, finding_at
from tidewater.table.summary import (
    BATCH_ID,
    BRANCH_BASE,
    CHANGES,
    DROPPED,
    PUBLISHED,
    QUARANTINE_OF,
    RECOVERED,
    REPLAY,
    TRUNCATE,
    summary_dict,
)

if TYPE_CHECKING:
    from pyiceberg.table import Table


def tables_per_batch(checkpoint: Any) -> dict[str, list[str]]:
    """The checkpoint table's rows (they outlive its snapshots): batch id -> the tables it committed rows to."""
    if checkpoint is None or checkpoint.current_snapshot() is None:
        return {}
    data = checkpoint.scan(selected_fields=("batch_id", "tables")).to_arrow()
    return {b: json.loads(t or "[]") for b, t in zip(data.column("batch_id").to_pylist(), data.column("tables").to_pylist())}


def target_findings(
    ident: str, entries: list[dict[str, Any]], checkpoint: list[dict[str, Any]], wrote: dict[str, list[str]]
) -> list[Finding]:
    """One target table of a routed pipeline against the checkpoint's batches: a batch the checkpoint committed
    with rows for the table but the table lacks (its rows are lost: an error); rows committed that are not those
    the writer counted (an error); a batch in the table the checkpoint never committed (explained: its checkpoint
    commit failed, and the next batch, planned from the checkpoint, left out the records this table held)."""
    out: list[Finding] = []
    own = {e["batch_id"]: e for e in entries}
    committed = {e["batch_id"]: e for e in checkpoint}
    for batch_id, e in committed.items():
        if ident in wrote.get(batch_id, []) and batch_id not in own:
            out.append(
                Finding(
                    "error",
                    "routed",
                    "the checkpoint committed this batch with rows for the table, but "
                    "the table has no commit of it: those rows are missing",
                    batch_id=batch_id,
                    snapshot_id=e["snapshot_id"],
                )
            )
    for batch_id, e in own.items():
        if e["kind"] in ("recover", "drop"):  # explained with the holder's (see recoveries), or by decisions
            continue
        if e["kind"] == "quarantine":  # its rows wait on the branch (published later as their own commit)
            out.append(
                finding_at(
                    "explained",
                    "routed",
                    f"quarantined: the rows are on the quarantine branch {detail(e).get('tidewater.quarantined', '')}",
                    e,
                )
            )
            continue
        applied, what = _applied(e, "rows committed")
        if e["rows"] is not None and applied != e["records"]:
            out.append(
                Finding(
                    "error",
                    "accounting",
                    f"{what} {applied} != rows the writer routed to the table {e['records']}",
                    batch_id=batch_id,
                    snapshot_id=e["snapshot_id"],
                )
            )
        if batch_id not in committed:
            out.append(
                Finding(
                    "explained",
                    "routed",
                    "committed to this table while the batch's checkpoint commit "
                    "failed; the next batch left out the records the table held",
                    batch_id=batch_id,
                    snapshot_id=e["snapshot_id"],
                )
            )
    return out


def coverage(entries: list[dict[str, Any]], ends: Mapping[tuple[str, int], int] | None = None) -> list[Finding]:
    """Gaps and overlaps between the ranges of the batches that moved each partition's offsets; ``ends`` (an audit
    from the last clean one's mark, ``audit/mark.py``): where the batches it checked ended, per partition, so the
    first new range must start there."""
    out: list[Finding] = []
    by_partition: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for e in entries:
        if e["kind"] in MOVING:
            by_partition[(e["topic"], e["partition"])].append(e)
        elif e["kind"] == "replay":
            out.append(finding_at("info", "coverage", f"replayed ({detail(e).get('tidewater.replay', '')})", e))
    for (topic, part), ranges in sorted(by_partition.items()):
        ranges.sort(key=lambda e: (e["start_offset"], e["end_offset"]))
        if ends and (topic, part) in ends:
            out += _after_mark(ranges, ends[(topic, part)])
            ranges = [e for e in ranges if e["start_offset"] >= ends[(topic, part)]]
        reach: dict[str, Any] | None = None  # of the ranges so far, the one that ends furthest
        for cur in ranges:
            prev, reach = reach, cur if reach is None else max(reach, cur, key=lambda e: e["end_offset"])
            if prev is None:
                continue
            if cur["start_offset"] > prev["end_offset"]:
                out.append(
                    Finding(
                        "error",
                        "coverage",
                        f"offsets never committed: between batch {prev['batch_id']} and the next",
                        topic,
                        part,
                        prev["end_offset"],
                        cur["start_offset"],
                        cur["batch_id"],
                        cur["snapshot_id"],
                    )
                )
            elif cur["start_offset"] < prev["end_offset"]:
                out.append(
                    Finding(
                        "error",
                        "coverage",
                        f"offsets committed twice: also by batch {prev['batch_id']}",
                        topic,
                        part,
                        cur["start_offset"],
                        min(prev["end_offset"], cur["end_offset"]),
                        cur["batch_id"],
                        cur["snapshot_id"],
                    )
                )
        for e in ranges:
            if e["kind"] == "skip":
                request = json.loads(detail(e).get("tidewater.operator-skip", "{}"))
                lost = int(request.get("deleted_unread", 0))
                where = (
                    (f"{lost} records deleted by retention before they were ingested, a known loss; the rest in the dead-letter table")
                    if lost
                    else "its records are in the dead-letter table"
                )
                out.append(
                    finding_at("explained", "coverage", f"skipped by {request.get('by', '?')}: {request.get('reason', '')} ({where})", e)
                )
            elif e["kind"] == "quarantine":
                out.append(
                    finding_at(
                        "explained",
                        "coverage",
                        f"quarantined: the rows are on the quarantine branch {detail(e).get('tidewater.quarantined', '')}",
                        e,
                    )
                )
    return out


def _after_mark(ranges: list[dict[str, Any]], end: int) -> list[Finding]:
    """The new ranges of a partition against ``end``, where the batches the last clean audit checked ended: below it,
    offsets committed twice; a first range after it, offsets never committed."""
    out = [
        Finding(
            "error",
            "coverage",
            f"offsets committed twice: below {end}, where the batches the last clean audit checked end",
            e["topic"],
            e["partition"],
            e["start_offset"],
            min(e["end_offset"], end),
            e["batch_id"],
            e["snapshot_id"],
        )
        for e in ranges
        if e["start_offset"] < end
    ]
    later = [e for e in ranges if e["start_offset"] >= end]
    if later and later[0]["start_offset"] > end:
        first = later[0]
        out.append(
            Finding(
                "error",
                "coverage",
                "offsets never committed: between the batches the last clean audit checked and this one",
                first["topic"],
                first["partition"],
                end,
                first["start_offset"],
                first["batch_id"],
                first["snapshot_id"],
            )
        )
    return out


# what each change record did (commit/changes.py): a truncate, and each change it superseded, count once too
CHANGE_EFFECTS = ("inserted", "updated", "deleted", "noop", "truncated", "superseded")


def _applied(e: dict[str, Any], rows_are: str) -> tuple[int, str]:
    """What a ledger entry's batch made of its records: its rows, or for a change batch the change records
    applied (inserted + updated + deleted + no-op deletes, each record once: the rows it added are only the new
    row images); with its name for a finding."""
    if e["kind"] == "change":
        effects = json.loads(detail(e).get(CHANGES, "{}"))
        return sum(int(effects.get(k, 0)) for k in CHANGE_EFFECTS), "changes applied"
    return e["rows"], rows_are


def accounting(entries: list[dict[str, Any]], rows_are: str = "rows") -> list[Finding]:
    """Batches whose records read are not rows + dead letters + skipped; for change batches, not the change
    records applied (inserted + updated + deleted + no-op deletes, each record once) + dead letters + skipped.
    A routed pipeline's checkpoint counts as rows the records routed to at least one table (``rows_are``); a
    checkpoint commit made before that count was recorded is left out."""
    out, seen = [], set()
    for e in entries:
        if e["kind"] not in ("ingest", "skip", "change") or e["batch_id"] in seen or e["rows"] is None:
            continue
        seen.add(e["batch_id"])
        applied, what = _applied(e, rows_are)
        if e["records"] != applied + e["dead_letters"] + e["skipped"]:
            out.append(
                Finding(
                    "error",
                    "accounting",
                    f"records read {e['records']} != {what} {applied} + dead letters {e['dead_letters']} + skipped {e['skipped']}",
                    batch_id=e["batch_id"],
                    snapshot_id=e["snapshot_id"],
                )
            )
    return out


# ours: a batch's, a replay's delete (its replay), a truncate's, a quarantined batch's branch and its publication (the
# batch id as `quarantine-of` and `published`, not the batch id)
OURS = (BATCH_ID, REPLAY, BRANCH_BASE, TRUNCATE, PUBLISHED, QUARANTINE_OF)


def operation_of(snap: Any) -> str:
    return snap.summary.operation.value if snap.summary is not None else "?"


# a Tidewater commit that changes rows of ranges committed before it: a replay or a dead-letter retry, a quarantined
# batch published or dropped, offsets recovered, a change table emptied by its source's truncate
REWRITES = (REPLAY, PUBLISHED, DROPPED, RECOVERED, TRUNCATE)


def rewritten_since(table: Table, after_us: int, only: tuple[str, ...] | None = None) -> Any:
    """The first snapshot committed after ``after_us`` (µs since the epoch) that may have changed rows committed
    before it: one no Tidewater batch made (a write outside Tidewater, a compaction: its rows are the same, unless the
    tool that made it lost some), or one of Tidewater's ``REWRITES``; ``only``: one of these Tidewater rewrites. None:
    there is none."""
    for snap in sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms):
        props = summary_dict(snap)
        if snap.timestamp_ms * 1000 <= after_us:
            continue
        if any(k in props for k in (only if only is not None else REWRITES)):
            return snap
        if only is None and not any(k in props for k in OURS):
            return snap
    return None


def outside_writes(table: Table) -> list[Finding]:
    """Snapshots still in the table's history that changed rows without a Tidewater batch id."""
    out = []
    for snap in table.metadata.snapshots:
        props = summary_dict(snap)
        operation = operation_of(snap)
        if any(k in props for k in OURS) or operation == "replace":  # ours, or compaction (replace keeps the rows)
            continue
        added, removed = int(props.get("added-records", 0)), int(props.get("deleted-records", 0))
        if added or removed:
            out.append(
                Finding(
                    "error",
                    "outside-write",
                    f"{operation} made outside Tidewater: {added} rows added, {removed} removed",
                    snapshot_id=snap.snapshot_id,
                )
            )
    return out


def dropped_batches(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The quarantined batches an operator dropped (``tidewater quarantine drop``): batch id -> the recorded drop
    (``batch``, ``rows``, ``ranges``) and the ledger row that recorded it (``entry``)."""
    out = {}
    for e in entries:
        if e["kind"] == "drop":
            drop = json.loads(detail(e).get(DROPPED, "{}"))
            out[drop.get("batch")] = {**drop, "entry": e}
    return out


def decisions(entries: list[dict[str, Any]]) -> list[Finding]:
    """What operators decided: quarantined batches dropped (explained with the rows that never reached the table),
    and offsets recovered (``tidewater recover-offsets``: explained with the evidence and who asked)."""
    out = [
        Finding(
            "explained",
            "quarantine",
            f"quarantined batch dropped by an operator: its {d.get('rows', 0)} rows never reached the table",
            batch_id=batch,
            snapshot_id=d["entry"]["snapshot_id"],
            table=d["entry"]["table"],
        )
        for batch, d in dropped_batches(entries).items()
    ]
    for e in entries:
        if e["kind"] != "recover":
            continue
        why = json.loads(detail(e).get("tidewater.recovered", "{}"))
        how = "the ledger and the rows agreed" if why.get("agree") else "confirmed by the operator"
        out.append(
            finding_at(
                "explained",
                "coverage",
                f"offsets of {e['table']} recovered by {why.get('by')} ({how}; ledger {why.get('ledger')}, rows {why.get('rows')})",
                e,
            )
        )
    return out


def rolled_back(table: Table | None, branch: str | None, entries: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Finding]]:
    """The entries whose batches another tool rolled back (their snapshot is still in the table's metadata but no
    longer in the history of the branch's head): the remaining entries, and a finding explaining each rolled-back
    batch (its records were read again by the batches after the rollback). Expired snapshots are not told apart."""
    if table is None:
        return entries, []
    by_id = {s.snapshot_id: s for s in table.metadata.snapshots}
    ref = table.metadata.refs.get(branch or "main")
    history, sid = set(), ref.snapshot_id if ref is not None else None
    while sid is not None and sid in by_id:
        history.add(sid)
        sid = by_id[sid].parent_snapshot_id
    gone = {e["batch_id"] for e in entries if e["snapshot_id"] in by_id and e["snapshot_id"] not in history}
    found = [
        finding_at(
            "explained",
            "coverage",
            "rolled back by another tool: the batch's snapshot is no longer in the "
            "table's history, and its records were read again after the rollback",
            e,
        )
        for e in entries
        if e["batch_id"] in gone and e["kind"] in MOVING
    ]
    return [e for e in entries if e["batch_id"] not in gone], found
