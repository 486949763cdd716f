"""The ledger: every committed batch's offset ranges and counts, kept as long as the table.

Snapshot summaries hold each batch's ranges and counts, but snapshot expiry removes them. The ledger is an
Iceberg table beside the target (``<table>_ledger``), one row per batch and range: queryable with Spark SQL
(``tidewater sql``) and read by the audit (``audit/pipeline.py``).

It is written from the table's own history, so it is never out of step with it: :func:`sync` walks the
ancestors of the table's current snapshot back to the snapshot the ledger last recorded (its head's
``tidewater.ledger-through``), and appends an entry for every Tidewater batch found, in one commit through the
commit primitive (the table snapshot id is its marker: a second sync of the same history is a no-op, two at
once commit once). The commit step syncs after every commit, and snapshot expiry syncs before it removes
anything; a crash between a batch's commit and its entry is healed by the next sync, before any snapshot the
ledger still needs can be expired by Tidewater. Expiry also compacts the ledger (:func:`compact`): every sync
adds a small file.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyiceberg.exceptions import CommitFailedException

from tidewater.commit.primitive import Change, commit
from tidewater.config.spec import PipelineSpec
from tidewater.table.catalog import create_table, load_table, retry_busy
from tidewater.table.own_tables import LEDGER_SCHEMA
from tidewater.table.summary import (
    BATCH_ID,
    CHANGES,
    DAG_RUN_ID,
    DEAD_LETTERS,
    DROPPED,
    OFFSETS,
    OPERATOR_SKIP,
    PIPELINE,
    QUARANTINED,
    RANGES,
    RECORDS,
    RECOVERED,
    REPLAY,
    ROUTED,
    SKIPPED,
    summary_dict,
)
from tidewater.table.targets import target_role, target_spec, target_tables

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

THROUGH = "tidewater.ledger-through"  # on the ledger's snapshots: the table snapshot it has recorded up to
LAST_AUDIT = "tidewater.last-audit"  # the ledger table's property: the last audit's verdict (JSON)


def identifier(spec: PipelineSpec) -> str:
    return (spec.routed_from or spec).ledger_table()


def _kind(props: dict[str, str]) -> str:
    if RECOVERED in props:
        return "recover"
    if DROPPED in props:
        return "drop"
    if REPLAY in props:
        return "replay"
    if OPERATOR_SKIP in props:
        return "skip"
    if QUARANTINED in props:
        return "quarantine"
    return "change" if CHANGES in props else "ingest"


def _ranges(props: dict[str, str], previous: dict[str, dict[int, int]]) -> list[tuple[str, int, int, int]]:
    """The batch's ranges: its own list, or (a summary too large to hold it) where its offsets moved."""
    if RANGES in props:
        return [(t, int(p), int(s), int(e)) for t, p, s, e in json.loads(props[RANGES])]
    out = []
    for topic, parts in json.loads(props.get(OFFSETS, "{}")).items():
        for p, end in parts.items():
            start = previous.get(topic, {}).get(int(p), end)
            if int(end) > int(start):
                out.append((topic, int(p), int(start), int(end)))
    return out


def _rows(props: dict[str, str], checkpoint: bool) -> int | None:
    """Rows the batch accounts for: those its snapshot added; on a routed pipeline's checkpoint, the records
    routed to at least one table (None where a checkpoint commit predates that count)."""
    if props.get(ROUTED) is not None:
        return int(props[ROUTED])
    return None if checkpoint else int(props.get("added-records", 0))


def entries(table_ident: str, snapshots: list[Any], checkpoint: bool = False, target: bool = False) -> list[dict[str, Any]]:
    """Ledger rows for the Tidewater batches among ``snapshots`` (oldest first), one per range (``checkpoint``:
    they are a routed pipeline's checkpoint table's; ``target``: a routed pipeline's target table's, where a batch
    whose ranges its summary does not hold still gets one row, without a range: the audit checks it was committed)."""
    rows: list[dict[str, Any]] = []
    previous: dict[str, dict[int, int]] = {}
    for snap in snapshots:
        props = summary_dict(snap)
        if BATCH_ID not in props:
            continue
        kind = _kind(props)
        detail = {k: props[k] for k in (REPLAY, OPERATOR_SKIP, CHANGES, QUARANTINED, RECOVERED, DROPPED) if k in props}
        # a recovery or a drop read no range: one row without a range records it (the audit explains it)
        unranged = kind in ("recover", "drop")
        ranges: list[tuple[Any, Any, Any, Any]] = list(_ranges(props, previous)) if not unranged else []
        for topic, part, start, end in ranges or ([(None, None, None, None)] if target or unranged else []):
            rows.append(
                {
                    "table": table_ident,
                    "batch_id": props[BATCH_ID],
                    "kind": kind,
                    "snapshot_id": snap.snapshot_id,
                    "committed_at": snap.timestamp_ms * 1000,
                    "dag_run_id": props.get(DAG_RUN_ID),
                    "topic": topic,
                    "partition": part,
                    "start_offset": start,
                    "end_offset": end,
                    "records": int(props.get(RECORDS, 0)),
                    "rows": _rows(props, checkpoint),
                    "dead_letters": int(props.get(DEAD_LETTERS, 0)),
                    "skipped": int(props.get(SKIPPED, 0)),
                    "detail": json.dumps(detail, sort_keys=True) if detail else None,
                }
            )
        if OFFSETS in props:
            previous = {t: {int(p): int(o) for p, o in parts.items()} for t, parts in json.loads(props[OFFSETS]).items()}
    return rows


def _unrecorded(table: Table, head: int, through: int | None) -> tuple[list[Any], bool]:
    """The ancestors of ``head`` after ``through``, oldest first, and whether the walk reached ``through``
    (False: the ledger is new, or its mark's snapshot is gone: entries must be deduplicated)."""
    by_id = {s.snapshot_id: s for s in table.metadata.snapshots}
    walked: list[Any] = []
    sid: int | None = head
    while sid is not None and sid in by_id and sid != through:
        walked.append(by_id[sid])
        sid = by_id[sid].parent_snapshot_id
    return walked[::-1], sid is not None and sid == through


def _head(table: Table, branch: str | None) -> int | None:
    """Where the table's batches end: the head of ``branch`` when the batches are written there, else main's."""
    ref = table.metadata.refs.get(branch) if branch else None
    return ref.snapshot_id if ref is not None else table.metadata.current_snapshot_id


def recorded_tables(catalog: Catalog, spec: PipelineSpec, touched: list[str] | None = None) -> list[tuple[str, Any, int]]:
    """(identifier, table, head snapshot) of each table whose history the ledger records: the offsets holder (its
    ranges and counts), then every other target table (each its rows; ``touched``: only these)."""
    spec = spec.routed_from or spec
    targets = spec.targets
    others = [t for t in (touched if touched is not None else target_tables(catalog, spec)) if not target_role(spec, t).holds_offsets]
    out = []
    for ident, branch in [(targets.holder, targets.branch)] + [(t, target_spec(spec, t).table.branch) for t in others]:
        table = load_table(catalog, ident)
        head = _head(table, branch) if table is not None else None
        if head is not None:
            out.append((ident, table, head))
    return out


def _through(text: str | None, spec: PipelineSpec) -> dict[str, int]:
    """The ledger's mark: per recorded table, the snapshot it has recorded up to (a routed pipeline's mark is a
    JSON object; a single table's, its snapshot id)."""
    if not text:
        return {}
    if text.startswith("{"):
        return {k: int(v) for k, v in json.loads(text).items()}
    return {spec.table.identifier: int(text)}


def sync(catalog: Catalog, spec: PipelineSpec, touched: list[str] | None = None) -> int:
    """Record the batches of the pipeline's tables the ledger does not have yet; returns how many entries were
    added. A single-table view of a routed pipeline (maintenance) syncs the pipeline's ledger. ``touched`` (routed
    pipelines): the target tables a batch just committed to; the others keep their mark (the next full sync, by
    the audit or snapshot expiry, walks them), so a commit loads only the tables it wrote."""
    spec = spec.routed_from or spec
    fused = spec.targets.fused  # one table, its own holder: the mark is its head (else a JSON object per table)
    sources = recorded_tables(catalog, spec, touched)
    if not sources:
        return 0
    heads = {ident: head for ident, _, head in sources}
    added = [0]

    def prepare(ledger: Table) -> Any:
        snap = ledger.current_snapshot()
        through = _through(summary_dict(snap).get(THROUGH) if snap is not None else None, spec)
        if not fused and snap is not None and through == {**through, **heads}:
            return None  # nothing committed since the last sync
        rows, unsure = [], False
        for ident, table, head in sources:
            todo, reached = _unrecorded(table, head, through.get(ident))
            holder = spec.targets.holds(ident)
            rows += entries(ident, todo, checkpoint=holder and not fused, target=not holder)
            unsure = unsure or not reached
        if unsure and snap is not None and rows:
            known_rows = ledger.scan(selected_fields=("table", "batch_id")).to_arrow()
            known = set(zip(known_rows.column("table").to_pylist(), known_rows.column("batch_id").to_pylist()))
            rows = [r for r in rows if (r["table"], r["batch_id"]) not in known]
        added[0] = len(rows)
        mark = str(heads[spec.targets.holder]) if fused else json.dumps({**through, **heads}, sort_keys=True, separators=(",", ":"))
        # the pipeline's name marks the ledger as its own: another pipeline's routes never write into it (ForeignTable)
        return Change(properties={THROUGH: mark, PIPELINE: spec.name}, rows=pa.Table.from_pylist(rows, schema=LEDGER_SCHEMA))

    ident = identifier(spec)
    # a single table's mark is its head, known before the commit: it makes a second sync of the same history a
    # no-op. A routed pipeline's mark merges the ledger's (``touched``), so each attempt computes it afresh, and a
    # sync that finds nothing new commits nothing (see prepare)
    marker = str(heads[spec.targets.holder]) if fused else None
    commit(
        catalog,
        ident,
        prepare,
        marker=marker,
        marker_key=THROUGH,
        what=f"ledger {ident}",
        on_missing=lambda: load_table(catalog, ident) or create_table(catalog, ident, LEDGER_SCHEMA, {"format-version": "2"}),
    )
    return added[0]


COMPACT_AT_FILES = 32  # the ledger is rewritten into one file at expiry once it has this many


def compact(catalog: Catalog, spec: PipelineSpec, at_files: int = COMPACT_AT_FILES) -> int:
    """Rewrite the ledger into one data file once every sync's small file adds up (the audit reads them all:
    measured 4 ms per file in ``make bench-audit``). The rows are kept as they are, and the new head snapshot
    keeps the mark (``THROUGH``) the next sync starts from. A sync that commits meanwhile wins: this rewrite's
    commit then fails on the moved head (nothing changed) and the next expiry tries again. Returns the number of
    files rewritten (0: not needed, or lost to a concurrent sync)."""

    ledger = load_table(catalog, identifier(spec))
    head = ledger.current_snapshot() if ledger is not None else None
    if ledger is None or head is None:
        return 0
    files = [t.file for t in ledger.scan().plan_files()]
    if len(files) < at_files:
        return 0
    rows = ledger.scan().to_arrow()
    props = {k: v for k, v in summary_dict(head).items() if k in (THROUGH, PIPELINE)}
    try:
        ledger.overwrite(rows, snapshot_properties=props)
    except CommitFailedException as e:
        log.info("the ledger %s was not compacted (a batch recorded meanwhile: %s); the next expiry does it", identifier(spec), e)
        return 0
    log.info("the ledger %s: %d files rewritten into one (%d entries)", identifier(spec), len(files), rows.num_rows)
    return len(files)


def expire_history(catalog: Catalog, spec: PipelineSpec) -> int:
    """Compact the ledger (:func:`compact`), then expire every snapshot of it but its newest: its rows are what
    matters, not its history, and each snapshot makes its metadata (read by every sync) bigger. Returns how many
    snapshots were expired."""

    retry_busy(lambda: compact(catalog, spec), "compacting the ledger", identifier(spec))

    def expire() -> int:
        ledger = load_table(catalog, identifier(spec))
        head = ledger.current_snapshot() if ledger is not None else None
        if ledger is None or head is None:
            return 0
        old = [s.snapshot_id for s in ledger.metadata.snapshots if s.snapshot_id != head.snapshot_id]
        if old:
            ledger.maintenance.expire_snapshots().older_than(datetime.fromtimestamp(head.timestamp_ms / 1000, tz=timezone.utc)).commit()
        return len(old)

    return retry_busy(expire, "expiring the ledger's history", identifier(spec))


def read(catalog: Catalog, spec: PipelineSpec) -> pa.Table:
    """Every entry of the pipeline's table (empty when nothing was recorded)."""
    ledger = load_table(catalog, identifier(spec))
    return ledger.scan().to_arrow() if ledger is not None else LEDGER_SCHEMA.empty_table()


def save_verdict(catalog: Catalog, spec: PipelineSpec, verdict: dict[str, Any]) -> None:
    """Keep the last audit's verdict as a property of the ledger table (the Tidewater view shows it)."""
    text = json.dumps(verdict, separators=(",", ":"), sort_keys=True, default=str)

    def save() -> None:  # loaded afresh each attempt: a batch's ledger entry may commit meanwhile
        ledger = load_table(catalog, identifier(spec))
        if ledger is not None:
            with ledger.transaction() as tx:
                tx.set_properties({LAST_AUDIT: text})

    retry_busy(save, "keeping the audit's verdict", identifier(spec))


def last_verdict(catalog: Catalog, spec: PipelineSpec) -> dict[str, Any] | None:
    ledger = load_table(catalog, identifier(spec))
    text = ledger.metadata.properties.get(LAST_AUDIT) if ledger is not None else None
    return json.loads(text) if text else None
