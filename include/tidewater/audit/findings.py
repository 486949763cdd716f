"""What the audit reports: findings, each naming where (table, topic, partition, offset range) and which batch and
snapshot is at fault, and the report of one audit (``audit/pipeline.py``). Severity ``error`` makes the audit fail
(exit 1); ``explained``, ``warning`` and ``info`` do not."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

MOVING = ("ingest", "change", "skip", "quarantine")  # kinds of batch that move the committed offsets


@dataclass(frozen=True)
class Finding:
    severity: str  # error, warning, explained, info
    check: str  # coverage, accounting, outside-write, kafka, routed, deep
    message: str
    topic: str | None = None
    partition: int | None = None
    start: int | None = None
    end: int | None = None
    batch_id: str | None = None
    snapshot_id: int | None = None
    table: str | None = None  # routed pipelines: the target table at fault

    def text(self) -> str:
        where = f"{self.topic}[{self.partition}] [{self.start}, {self.end}) " if self.topic is not None else ""
        where = f"{self.table}: {where}" if self.table else where
        at = (
            f" (batch {self.batch_id}, snapshot {self.snapshot_id})"
            if self.batch_id
            else (f" (snapshot {self.snapshot_id})" if self.snapshot_id else "")
        )
        return f"{self.severity:<9} {self.check:<13} {where}{self.message}{at}"


@dataclass
class AuditReport:
    pipeline: str
    table: str
    batches: int
    findings: list[Finding] = field(default_factory=list)
    partitions: list[dict[str, Any]] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)  # routed pipelines: the target tables audited
    since: str | None = None  # the batches checked are those committed after this (None: every batch in the ledger)
    mark: dict[str, Any] | None = None  # where this audit's checks end (``audit/mark.py``), kept when it is clean

    @property
    def clean(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "table": self.table,
            "tables": self.tables,
            "clean": self.clean,
            "batches": self.batches,
            "since": self.since,
            "partitions": self.partitions,
            "findings": [asdict(f) for f in self.findings],
        }


def detail(e: dict[str, Any]) -> dict[str, str]:
    return json.loads(e["detail"]) if e.get("detail") else {}


def finding_at(severity: str, check: str, message: str, e: dict[str, Any]) -> Finding:
    return Finding(
        severity, check, message, e["topic"], e["partition"], e["start_offset"], e["end_offset"], e["batch_id"], e["snapshot_id"]
    )
