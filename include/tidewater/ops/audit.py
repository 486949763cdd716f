"""Is the table exactly its topic? The audit, from the ledger (``table/ledger.py``), the table's history and Kafka.

Findings, each naming topic, partition and offset range, with the batch and snapshot at fault:

- **coverage**: per partition, the ranges of the batches that moved the offsets (ingest, change, operator skip,
  quarantine), sorted: each starts where the previous ended. A gap (offsets never committed) or an overlap
  (offsets committed twice) is an error; a range an operator skipped (dead-lettered, see ``ops/skip.py``) or a
  quarantined batch is reported as explained. Replays re-read committed ranges and are listed, not counted.
- **accounting**: for every appending batch, records read = rows + dead letters + skipped.
- **writes outside Tidewater**: a snapshot of the table that added or removed rows without a batch id (an
  append by another tool, a hand-made delete) while it is still in the history.
- **against Kafka now**: a committed offset below the log start (records deleted by retention before they were
  read: an error) or beyond the log end (the topic was recreated: an error); the lag, for information.

Severity ``error`` makes the audit fail (exit 1); ``explained`` and ``info`` do not. Not covered yet: the deep
audit from the metadata columns (each offset once, none both a row and a dead letter), routed pipelines, change
batches' accounting, retention settings (lag beyond retention as a warning).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from tidewater.config.spec import PipelineSpec
from tidewater.errors import ConfigError

MOVING = ("ingest", "change", "skip", "quarantine")  # kinds of batch that move the committed offsets


@dataclass(frozen=True)
class Finding:
    severity: str  # error, explained, info
    check: str  # coverage, accounting, outside-write, kafka
    message: str
    topic: str | None = None
    partition: int | None = None
    start: int | None = None
    end: int | None = None
    batch_id: str | None = None
    snapshot_id: int | None = None

    def text(self) -> str:
        where = f"{self.topic}[{self.partition}] [{self.start}, {self.end}) " if self.topic is not None else ""
        at = f" (batch {self.batch_id}, snapshot {self.snapshot_id})" if self.batch_id else (
            f" (snapshot {self.snapshot_id})" if self.snapshot_id else "")
        return f"{self.severity:<9} {self.check:<13} {where}{self.message}{at}"


@dataclass
class AuditReport:
    pipeline: str
    table: str
    batches: int
    findings: list[Finding] = field(default_factory=list)
    partitions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "table": self.table, "clean": self.clean, "batches": self.batches,
                "partitions": self.partitions, "findings": [asdict(f) for f in self.findings]}


def audit(spec: PipelineSpec, table: str | None = None) -> AuditReport:
    """Bring the ledger up to date with the table, then check it, the table's history and Kafka."""
    from tidewater.table import ledger
    from tidewater.table.catalog import load_catalog, load_table

    if spec.routed:
        raise ConfigError("audit: routed pipelines are not audited yet (their positions live in the checkpoint table)")
    if table not in (None, spec.table.identifier):
        raise ConfigError(f"--table: {table!r} is not this pipeline's table {spec.table.identifier!r}")
    catalog = load_catalog(spec)
    ledger.sync(catalog, spec)
    entries = ledger.read(catalog, spec).to_pylist()
    report = AuditReport(spec.name, spec.table.identifier, len({e["batch_id"] for e in entries}))
    report.findings += coverage(entries) + accounting(entries)
    target = load_table(catalog, spec.table.identifier)
    if target is not None:
        report.findings += outside_writes(target)
    findings, report.partitions = against_kafka(spec, target)
    report.findings += findings
    return report


def coverage(entries: list[dict[str, Any]]) -> list[Finding]:
    """Gaps and overlaps between the ranges of the batches that moved each partition's offsets."""
    out: list[Finding] = []
    by_partition: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for e in entries:
        if e["kind"] in MOVING:
            by_partition[(e["topic"], e["partition"])].append(e)
        elif e["kind"] == "replay":
            out.append(_at("info", "coverage", f"replayed ({_detail(e).get('tidewater.replay', '')})", e))
    for (topic, part), ranges in sorted(by_partition.items()):
        ranges.sort(key=lambda e: (e["start_offset"], e["end_offset"]))
        for prev, cur in zip(ranges, ranges[1:]):
            if cur["start_offset"] > prev["end_offset"]:
                out.append(Finding("error", "coverage", f"offsets never committed: between batch {prev['batch_id']} "
                                   "and the next", topic, part, prev["end_offset"], cur["start_offset"], cur["batch_id"],
                                   cur["snapshot_id"]))
            elif cur["start_offset"] < prev["end_offset"]:
                out.append(Finding("error", "coverage", f"offsets committed twice: also by batch {prev['batch_id']}",
                                   topic, part, cur["start_offset"], min(prev["end_offset"], cur["end_offset"]),
                                   cur["batch_id"], cur["snapshot_id"]))
        for e in ranges:
            if e["kind"] == "skip":
                request = json.loads(_detail(e).get("tidewater.operator-skip", "{}"))
                out.append(_at("explained", "coverage", f"skipped by {request.get('by', '?')}: "
                               f"{request.get('reason', '')} (its records are in the dead-letter table)", e))
            elif e["kind"] == "quarantine":
                out.append(_at("explained", "coverage", "quarantined: the rows are on the quarantine branch "
                               f"{_detail(e).get('tidewater.quarantined', '')}", e))
    return out


def accounting(entries: list[dict[str, Any]]) -> list[Finding]:
    """Appending batches whose records read are not rows + dead letters + skipped."""
    out, seen = [], set()
    for e in entries:
        if e["kind"] not in ("ingest", "skip") or e["batch_id"] in seen:
            continue
        seen.add(e["batch_id"])
        accounted = e["rows"] + e["dead_letters"] + e["skipped"]
        if e["records"] != accounted:
            out.append(Finding("error", "accounting", f"records read {e['records']} != rows {e['rows']} + dead "
                               f"letters {e['dead_letters']} + skipped {e['skipped']}", batch_id=e["batch_id"],
                               snapshot_id=e["snapshot_id"]))
    return out


def outside_writes(table: Any) -> list[Finding]:
    """Snapshots still in the table's history that changed rows without a Tidewater batch id."""
    from tidewater.table.summary import BATCH_ID, BRANCH_BASE, REPLAY, summary_dict

    out = []
    for snap in table.metadata.snapshots:
        props = summary_dict(snap)
        operation = snap.summary.operation.value if snap.summary is not None else "?"
        # ours (a replay's delete carries its replay, not the batch id), or compaction (replace keeps the rows)
        if any(k in props for k in (BATCH_ID, REPLAY, BRANCH_BASE)) or operation == "replace":
            continue
        added, removed = int(props.get("added-records", 0)), int(props.get("deleted-records", 0))
        if added or removed:
            out.append(Finding("error", "outside-write", f"{operation} made outside Tidewater: {added} rows added, "
                               f"{removed} removed", snapshot_id=snap.snapshot_id))
    return out


def against_kafka(spec: PipelineSpec, table: Any) -> tuple[list[Finding], list[dict[str, Any]]]:
    """The committed offsets against each partition's log start and end now."""
    from tidewater.source.kafka import kafka_settings, list_partitions, watermarks
    from tidewater.table.summary import committed_state

    committed = committed_state(table).offsets if table is not None else {}
    settings = kafka_settings(spec)
    topics = sorted(set(spec.topics or []) | set(committed))
    return kafka_findings(committed, watermarks(settings, list_partitions(settings, topics)))


def kafka_findings(committed: dict[str, dict[int, int]], marks: dict[tuple[str, int], tuple[int, int]]
                   ) -> tuple[list[Finding], list[dict[str, Any]]]:
    """Findings and per-partition positions from the committed offsets and (log start, log end) per partition."""
    out, parts = [], []
    for (topic, part), (low, high) in sorted(marks.items()):
        at = committed.get(topic, {}).get(part)
        parts.append({"topic": topic, "partition": part, "committed": at, "log_start": low, "log_end": high,
                      "lag": None if at is None else max(high - at, 0)})
        if at is None:
            continue
        if at < low:
            out.append(Finding("error", "kafka", "deleted by retention before they were read", topic, part, at, low))
        elif at > high:
            out.append(Finding("error", "kafka", f"committed offset is beyond the log end {high} (was the topic "
                               "recreated?)", topic, part, high, at))
    return out, parts


def _detail(e: dict[str, Any]) -> dict[str, str]:
    return json.loads(e["detail"]) if e.get("detail") else {}


def _at(severity: str, check: str, message: str, e: dict[str, Any]) -> Finding:
    return Finding(severity, check, message, e["topic"], e["partition"], e["start_offset"], e["end_offset"],
                   e["batch_id"], e["snapshot_id"])
