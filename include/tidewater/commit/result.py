"""What a commit step returns (to the CLI, the Airflow task's XCom and the logs): one shape for every batch, the
batch's commit of each table it touched (a plain pipeline's one table, which holds its offsets; a routed pipeline's
target tables, then its checkpoint table)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tidewater.batch import Offsets

CommitStatus = Literal["committed", "already-committed", "nothing-to-commit"]
TableStatus = Literal["committed", "already-committed", "nothing-to-commit", "checkpoint"]  # a target table's, or the holder's


@dataclass(frozen=True)
class TableCommit:
    """One table's commit of a batch, with its duration. ``rows``: what the batch wrote to it (a checkpoint table's
    row is its batch's record, counted as no row); ``snapshot_id``: the snapshot that carries the batch, when known;
    ``attempts``: the catalog commits it took (more than one after a conflict or an unknown outcome)."""

    table: str
    status: TableStatus
    rows: int
    seconds: float
    snapshot_id: int | None = None
    attempts: int = 1

    @property
    def holds_rows(self) -> bool:
        """A target table's commit (not the checkpoint's record of the batch)."""
        return self.status != "checkpoint"


@dataclass(frozen=True)
class CommitResult:
    """A batch's commit. ``table``: the offsets holder; ``tables``: every table's commit, the holder's among them
    (a plain pipeline's one table) or last (a routed pipeline's checkpoint)."""

    status: CommitStatus
    batch_id: str
    table: str
    records: int
    data_files: int
    offsets: Offsets
    dead_letters: int = 0
    tables: tuple[TableCommit, ...] = ()
    quarantined: tuple[str, ...] = ()  # the target tables whose part of the batch the gate quarantined

    @property
    def snapshot_id(self) -> int | None:
        """The holder's snapshot of the batch, when known (a plain pipeline's one snapshot of data and offsets)."""
        return next((t.snapshot_id for t in self.tables if t.table == self.table), None)

    @property
    def rows(self) -> int:
        """Rows the batch wrote, over its tables."""
        return sum(t.rows for t in self.tables if t.holds_rows)

    @property
    def commit_retries(self) -> int:
        """Commits attempted again over the batch's tables (a conflict with another writer, an unknown outcome)."""
        return sum(t.attempts - 1 for t in self.tables)

    def touched(self) -> list[str]:
        """The target tables the batch committed to, besides its offsets holder."""
        return [t.table for t in self.tables if t.holds_rows and t.table != self.table]

    def summary(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "batch_id": self.batch_id,
            "table": self.table,
            "snapshot_id": self.snapshot_id,
            "records": self.records,
            "data_files": self.data_files,
            "dead_letters": self.dead_letters,
            "commit_retries": self.commit_retries,
        }
