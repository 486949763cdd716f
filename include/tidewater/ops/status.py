"""What a pipeline's tables say about it: lag per partition, last batch, valid-through, history."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from tidewater.config.spec import PipelineSpec
from tidewater.source.kafka import high_watermarks, kafka_settings, list_partitions, resolve_topics, watermarks
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import (
    BATCH_ID,
    DEAD_LETTERS,
    OFFSETS,
    RECORDS,
    SKIPPED,
    VALID_THROUGH,
    changes_of,
    committed_state,
    summary_dict,
)
from tidewater.table.targets import holder_state, target_spec, target_tables

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

# ---- status ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionStatus:
    topic: str
    partition: int
    committed: int | None
    log_start: int
    end: int  # the last stable offset: where a read_committed batch stops
    high: int | None = None  # the high watermark (read_uncommitted): past ``end`` while a transaction is open

    @property
    def lag(self) -> int:
        """Records not ingested yet (never negative: see ``problem``)."""
        return max(0, self.end - (self.committed if self.committed is not None else self.log_start))

    @property
    def held(self) -> int:
        """Offsets past the last stable offset: records (and markers) behind a transaction still open."""
        return max(0, self.high - self.end) if self.high is not None else 0

    @property
    def waiting(self) -> str | None:
        """Why this partition's batches stop short of its high watermark (None: they do not)."""
        if not self.held:
            return None
        return (
            f"{self.topic}[{self.partition}]: {self.held} offsets after the last stable offset {self.end} wait for "
            "an open transaction: batches stop there until it commits or aborts (a producer that died inside it "
            "holds it until its transaction.timeout.ms, then the broker aborts it)"
        )

    @property
    def problem(self) -> str | None:
        """Why the next plan of this partition will fail, as the planner would say it (None: healthy)."""
        c = self.committed
        if c is not None and c > self.end:
            return (
                f"{self.topic}[{self.partition}]: committed offset {c} is beyond the end offset {self.end}: the "
                "topic was recreated or truncated since it was ingested; batches fail until an operator acts"
            )
        if c is not None and c < self.log_start:
            return (
                f"{self.topic}[{self.partition}]: committed offset {c} is below the log start offset {self.log_start}: "
                f"{self.log_start - c} records were deleted by retention before they were ingested"
            )
        return None


def status(spec: PipelineSpec) -> dict[str, Any]:
    """Committed offset, end offset and lag per partition; last snapshot; valid-through."""
    catalog = load_catalog(spec)
    table, state = holder_state(catalog, spec)
    settings = kafka_settings(spec)
    listed = list_partitions(settings, resolve_topics(settings, spec))
    wm = watermarks(settings, listed)
    highs = high_watermarks(settings, listed)
    parts = [
        PartitionStatus(t, p, (state.offsets.get(t, {}).get(p) if state else None), lo, hi, highs.get((t, p)))
        for (t, p), (lo, hi) in sorted(wm.items())
    ]
    snap = table.current_snapshot() if table is not None else None
    dlq = load_table(catalog, spec.dead_letter_table())
    dlq_snap = dlq.current_snapshot() if dlq is not None else None
    last_props = summary_dict(table.metadata.snapshot_by_id(state.tidewater_snapshot_id)) if state and state.tidewater_snapshot_id else {}

    def iso(ms: int | None) -> str | None:
        return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat() if ms is not None else None

    out: dict[str, Any] = {
        "pipeline": spec.name,
        "table": spec.checkpoint_table(),
        "table_exists": table is not None,
        "last_snapshot_id": snap.snapshot_id if snap else None,
        "last_snapshot_at": iso(snap.timestamp_ms) if snap else None,
        "last_batch_id": state.batch_id if state else None,
        "valid_through": iso(state.valid_through_ms) if state else None,
        "total_lag": sum(p.lag for p in parts),
        "problems": [p.problem for p in parts if p.problem],
        "waiting": [p.waiting for p in parts if p.waiting],
        "dead_letter_table": spec.dead_letter_table(),
        "dead_letters": int(dlq_snap.summary.get("total-records", 0)) if dlq_snap and dlq_snap.summary else 0,
        "last_batch_dead_letters": int(last_props.get(DEAD_LETTERS, 0)),
        "last_batch_skipped": int(last_props.get(SKIPPED, 0)),
        "last_batch_changes": changes_of(last_props),
        "partitions": [
            {
                "topic": p.topic,
                "partition": p.partition,
                "committed": p.committed,
                "log_start": p.log_start,
                "end": p.end,
                "lag": p.lag,
                "held": p.held,
            }
            for p in parts
        ],
    }
    if not spec.targets.fused:  # each target table's own offsets and last batch
        out["tables"] = table_status(spec, catalog, wm, iso)
    return out


def table_status(spec: PipelineSpec, catalog: Catalog, wm: dict[Any, Any], iso: Any) -> list[dict[str, Any]]:
    """Routed pipelines: each target table's last batch and lag (its own offsets against the log end)."""
    rows = []
    for ident in target_tables(catalog, spec):
        t = load_table(catalog, ident)
        st = committed_state(t, target_spec(spec, ident).table.branch) if t is not None else None
        lag = sum(hi - (st.offsets.get(tp, {}).get(p, lo) if st else lo) for (tp, p), (lo, hi) in wm.items())
        rows.append(
            {
                "table": ident,
                "exists": t is not None,
                "last_batch_id": st.batch_id if st else None,
                "committed_at": iso(st.committed_at_ms) if st else None,
                "lag": lag,
            }
        )
    return rows


def history(spec: PipelineSpec) -> list[dict[str, Any]]:
    """The table's snapshots, oldest first, with the Tidewater properties of each."""
    table = load_table(load_catalog(spec), spec.table.identifier)
    if table is None:
        return []
    out = []
    for s in sorted(table.metadata.snapshots, key=lambda s: s.sequence_number or 0):
        props = summary_dict(s)
        out.append(
            {
                "snapshot_id": s.snapshot_id,
                "at": datetime.fromtimestamp(s.timestamp_ms / 1000, tz=timezone.utc).isoformat(timespec="seconds"),
                "operation": str(s.summary.operation.value) if s.summary else None,
                "batch_id": props.get(BATCH_ID),
                "records": props.get(RECORDS),
                "added_files": props.get("added-data-files"),
                "valid_through": props.get(VALID_THROUGH),
                "offsets": props.get(OFFSETS),
                "changes": changes_of(props),
            }
        )
    return out
