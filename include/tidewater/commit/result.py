"""What a commit step returns (to the CLI, the Airflow task's XCom and the logs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tidewater.batch import Offsets

CommitStatus = Literal["committed", "already-committed", "nothing-to-commit"]
TableStatus = Literal["committed", "already-committed", "checkpoint"]


@dataclass(frozen=True)
class TableCommit:
    """One table's commit of a routed batch (and the checkpoint's, last), with its duration."""

    table: str
    status: TableStatus
    rows: int
    seconds: float


@dataclass(frozen=True)
class CommitResult:
    status: CommitStatus
    batch_id: str
    table: str
    snapshot_id: int | None
    records: int
    data_files: int
    offsets: Offsets
    dead_letters: int = 0
    tables: tuple[TableCommit, ...] = ()  # a separate holder's batches: per table, then the checkpoint
    quarantined: tuple[str, ...] = ()  # the target tables whose part of the batch the gate quarantined

    def summary(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "batch_id": self.batch_id,
            "table": self.table,
            "snapshot_id": self.snapshot_id,
            "records": self.records,
            "data_files": self.data_files,
            "dead_letters": self.dead_letters,
        }
