"""result (moved from committing.py)."""


from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tidewater.batch import Offsets


@dataclass(frozen=True)
class CommitResult:
    status: str  # "committed" | "already-committed" | "nothing-to-commit"
    batch_id: str
    table: str
    snapshot_id: int | None
    records: int
    data_files: int
    offsets: Offsets
    dead_letters: int = 0
    tables: tuple[dict[str, Any], ...] = ()  # routed batches: per table {table, status, rows, seconds}

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
