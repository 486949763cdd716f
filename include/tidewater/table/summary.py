"""Offsets and batch identity recorded in Iceberg snapshot summaries.

The table is the source of truth: every Tidewater commit stamps the NEXT offset to read for every
topic-partition the table has ever ingested (cumulative), so the latest Tidewater snapshot alone tells
where each partition stands. Snapshots made by others (compaction, expiry, manual writes) carry no such
keys; readers walk back through the snapshot's ancestors to the newest one that does.

Other tools' snapshot expiry (Spark's ``expire_snapshots`` with ``retain_last => 1``, a platform's nightly run)
would remove every ancestor that carries offsets. Each commit that stamps them therefore also moves the tag
``tidewater-offsets`` to its snapshot: Iceberg never expires a referenced snapshot, so the newest snapshot with
offsets stays, and with it the history of every later snapshot (compactions, deletes, other writers' appends).
The tag keeps that one snapshot's files alive until the next commit moves it. Where the expiry removed a snapshot
between the tagged one and the current one (an outside overwrite makes two), the current history is cut (an
expired parent is forgotten); readers then take the tagged snapshot, older (by sequence number) than all that is
left. A history that ends without offsets otherwise means the tag was removed, or the table was rolled back or
restored past it: the offsets are not guessed, the error says which, and ``ops/recover.py`` proposes them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from tidewater.batch import Offsets, offsets_from_json, offsets_to_json
from tidewater.errors import TerminalError

if TYPE_CHECKING:
    from pyiceberg.table import Table

PREFIX = "tidewater."


OFFSETS = PREFIX + "offsets"


BATCH_ID = PREFIX + "batch-id"


PIPELINE = PREFIX + "pipeline"


DAG_RUN_ID = PREFIX + "dag-run-id"


VALID_THROUGH_MS = PREFIX + "valid-through-ms"


VALID_THROUGH = PREFIX + "valid-through"


RECORDS = PREFIX + "records"  # records read


DEAD_LETTERS = PREFIX + "dead-letters"  # of which written to the dead-letter table


SKIPPED = PREFIX + "skipped"  # of which dropped by the skip policy


ROUTED = PREFIX + "routed"  # routed pipelines' checkpoint: of which routed to at least one table


DEAD_LETTER_TOPIC = PREFIX + "dead-letter-topic"  # on dead-letter snapshots: the topic they were also sent to


IGNORED_FIELDS = PREFIX + "ignored-fields"  # record fields not added (table.evolve_schema off)


VALIDATION = PREFIX + "validation"  # the gate's verdict: suite, success, rows, checks, failed


BRANCH_BASE = PREFIX + "branch-base"  # the empty snapshot on main made so that a branch can be written


QUARANTINED = PREFIX + "quarantined"  # main's empty snapshot of a quarantined batch: the branch holding it


QUARANTINE_OF = PREFIX + "quarantine-of"  # the quarantine branch's snapshot: the batch id
QUARANTINE_BRANCH = "quarantine-"  # a quarantined batch's branch: quarantine-<batch id>
# a routed pipeline's checkpoint: the target tables whose part of the batch was quarantined (JSON list)
QUARANTINED_TABLES = PREFIX + "quarantined-tables"


PUBLISHED = PREFIX + "published"  # a published quarantined batch: its batch id
# a dropped quarantined batch (main's empty snapshot recording the decision): {"batch", "rows", "ranges"} as JSON
DROPPED = PREFIX + "dropped"
# who published a quarantined batch, when a person decided (`quarantine publish --by`, the decision in Airflow)
DECIDED_BY = PREFIX + "decided-by"


RECOVERED = PREFIX + "recovered"  # offsets recovered by `tidewater recover-offsets`: the evidence and who asked


OPERATOR_SKIP = PREFIX + "operator-skip"  # the batch that dead-letters a range an operator skipped: the request


REPLAY = PREFIX + "replay"  # replays and backfills: mode, ranges, data interval


DATA_INTERVAL = PREFIX + "data-interval"  # the Airflow run's data interval: "start/end" (ISO)


RANGES = PREFIX + "ranges"  # the batch's offset ranges: [[topic, partition, start, end], ...]


OFFSETS_TAG = "tidewater-offsets"  # the tag on the newest snapshot that carries the table's offsets (see above)


TRUNCATE = PREFIX + "truncate"  # the snapshot that emptied a change table for a truncate of its source (batch id, count)
CHANGES = PREFIX + "changes"  # change tables: {"inserted", "updated", "deleted", "noop", "cross_partition_keys", ...}

FORMAT_VERSION = PREFIX + "summary-version"


SUMMARY_VERSION = "1"


@dataclass(frozen=True)
class CommittedState:
    """What the table says about ingestion: offsets and the Tidewater snapshot they came from."""

    offsets: Offsets
    snapshot_id: int | None  # newest snapshot of the branch (None: empty table)
    tidewater_snapshot_id: int | None  # newest ancestor that carries offsets
    batch_id: str | None
    valid_through_ms: int | None
    committed_at_ms: int | None


def summary_properties(
    *,
    offsets: Offsets,
    batch_id: str,
    pipeline: str,
    records: int,
    valid_through_ms: int | None,
    dag_run_id: str | None,
    dead_letters: int = 0,
    skipped: int = 0,
    ignored_fields: tuple[str, ...] = (),
    validation: dict[str, Any] | None = None,
) -> dict[str, str]:
    props = {
        OFFSETS: json.dumps(offsets_to_json(offsets), separators=(",", ":")),
        BATCH_ID: batch_id,
        PIPELINE: pipeline,
        RECORDS: str(records),
        DEAD_LETTERS: str(dead_letters),
        SKIPPED: str(skipped),
        FORMAT_VERSION: SUMMARY_VERSION,
    }
    if validation is not None:
        props[VALIDATION] = json.dumps(validation, separators=(",", ":"), sort_keys=True)
    if ignored_fields:
        text = ",".join(ignored_fields)
        props[IGNORED_FIELDS] = text if len(text) <= 1000 else text[:997] + "..."
    if valid_through_ms is not None:
        props[VALID_THROUGH_MS] = str(valid_through_ms)
        props[VALID_THROUGH] = datetime.fromtimestamp(valid_through_ms / 1000, tz=timezone.utc).isoformat()
    if dag_run_id:
        props[DAG_RUN_ID] = dag_run_id
    return props


def summary_dict(snapshot: Any) -> dict[str, str]:
    summary = snapshot.summary
    if summary is None:
        return {}
    return dict(summary.additional_properties) if hasattr(summary, "additional_properties") else dict(summary)


def _newest_with_offsets(by_id: dict[int, Any], start: int | None) -> tuple[tuple[Any, dict[str, str]] | None, Any]:
    """Walking from ``start`` back through its ancestors: (the newest snapshot that carries offsets with its
    properties, or None), and the oldest snapshot reached."""
    snap_id, last = start, None
    while snap_id is not None and snap_id in by_id:
        last = by_id[snap_id]
        props = summary_dict(last)
        if OFFSETS in props:
            return (last, props), last
        snap_id = last.parent_snapshot_id
    return None, last


def committed_state(table: Table, branch: str | None = None) -> CommittedState:
    """Read committed offsets from the head of ``branch`` (default ``main``), walking back through ancestors (the
    tag ``OFFSETS_TAG`` keeps the newest one there through other tools' expiry)."""
    meta = table.metadata
    current = meta.current_snapshot_id
    if branch and branch != "main":
        ref = meta.refs.get(branch)
        current = ref.snapshot_id if ref is not None else None
    by_id = {s.snapshot_id: s for s in meta.snapshots}
    found, oldest = _newest_with_offsets(by_id, current)
    tag = meta.refs.get(OFFSETS_TAG)
    if (
        found is None
        and oldest is not None
        and tag is not None
        and tag.snapshot_id in by_id
        and by_id[tag.snapshot_id].sequence_number < oldest.sequence_number
    ):
        # another tool's expiry cut the history (expired parents are forgotten) above the tagged snapshot, which is
        # older than all that is left of it: the offsets where the history went on from there
        found, _ = _newest_with_offsets(by_id, tag.snapshot_id)
    if found is not None:
        snap, props = found
        vt = props.get(VALID_THROUGH_MS)
        return CommittedState(
            offsets=offsets_from_json(json.loads(props[OFFSETS])),
            snapshot_id=current,
            tidewater_snapshot_id=snap.snapshot_id,
            batch_id=props.get(BATCH_ID),
            valid_through_ms=int(vt) if vt else None,
            committed_at_ms=snap.timestamp_ms,
        )
    if current in by_id and BRANCH_BASE in summary_dict(by_id[current]):
        return CommittedState({}, current, None, None, None, None)  # only the empty base of a branch
    if current is not None:
        # The table has history but none of it carries offsets: they were expired (another tool removed
        # the snapshot that held them) or the table was filled by something else. Planning from nothing
        # would re-read everything into a table that already has data.
        where = (
            f"and the tag {OFFSETS_TAG} points to snapshot {tag.snapshot_id}, which is not in that history (the table "
            "was rolled back or restored past it, or another tool moved the tag): the rows of its batches may be gone"
            if tag is not None
            else f"and the tag {OFFSETS_TAG} that keeps the newest one is missing (removed by another tool, or the table predates it)"
        )
        raise TerminalError(
            f"committed offsets are unreadable: no snapshot in the history of the current snapshot {current} "
            f"carries {OFFSETS} (expired by another tool, or the table was written by something else), {where}; "
            "refusing to plan from the start of the log into a table that has history. `tidewater recover-offsets` "
            "proposes them from the ledger and the rows",
            table=".".join(table.name()) if hasattr(table, "name") else None,
        )
    return CommittedState({}, current, None, None, None, None)


def find_marked_snapshot(table: Table, key: str, value: str) -> Any | None:
    """The snapshot whose summary has ``key`` = ``value``, if the table still has it."""
    for snap in table.metadata.snapshots:
        if summary_dict(snap).get(key) == value:
            return snap
    return None


def find_batch_snapshot(table: Any, batch_id: str) -> Any | None:
    """The snapshot that committed ``batch_id``, if the table still has it."""
    return find_marked_snapshot(table, BATCH_ID, batch_id)


def changes_of(props: Mapping[str, str]) -> dict[str, Any] | None:
    """A change batch's counts (inserted, updated, deleted, noop, ...) from its snapshot properties, or None."""
    text = props.get(CHANGES)
    return json.loads(text) if text else None


def ever_quarantined(checkpoint: Any) -> set[str]:
    """A routed pipeline's target tables that ever had part of a batch quarantined (its checkpoint's history)."""
    if checkpoint is None:
        return set()
    return {t for s in checkpoint.metadata.snapshots for t in json.loads(summary_dict(s).get(QUARANTINED_TABLES, "[]"))}


def quarantine_branch(batch_id: str) -> str:
    """The branch that holds a quarantined batch (``validation.on_failure: quarantine``)."""
    return QUARANTINE_BRANCH + batch_id


def quarantined_batches(table: Table) -> list[str]:
    """The batch ids of the table's quarantine branches (batches waiting for publish or drop), oldest first."""
    return sorted(name[len(QUARANTINE_BRANCH) :] for name in table.metadata.refs if name.startswith(QUARANTINE_BRANCH))
