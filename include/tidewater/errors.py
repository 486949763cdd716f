"""Error hierarchy.

Every error says whether retrying can help (``transient``) and carries where it happened: batch id,
table, topic, partition and offset when they are known. Airflow task retries and the committer's own
retry loop look at ``transient``; people read ``str(error)``.
"""

from __future__ import annotations


class TidewaterError(Exception):
    """Base class. ``transient`` errors may succeed when retried unchanged; terminal ones will not."""

    transient = False

    def __init__(
        self,
        message: str,
        *,
        batch_id: str | None = None,
        table: str | None = None,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.message = message
        self.batch_id = batch_id
        self.table = table
        self.topic = topic
        self.partition = partition
        self.offset = offset
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.topic is not None:
            where.append(f"topic={self.topic}")
        if self.partition is not None:
            where.append(f"partition={self.partition}")
        if self.offset is not None:
            where.append(f"offset={self.offset}")
        if self.table is not None:
            where.append(f"table={self.table}")
        if self.batch_id is not None:
            where.append(f"batch={self.batch_id}")
        return f"{self.message} [{', '.join(where)}]" if where else self.message


class TransientError(TidewaterError):
    """Retrying may help (broker unreachable, catalog busy, commit conflict)."""

    transient = True


class TerminalError(TidewaterError):
    """Retrying unchanged will fail again; a person has to act."""


class ConfigError(TerminalError):
    """A pipeline specification or setting is invalid. The message names the key."""


class RecordError(TerminalError):
    """One record cannot be decoded or converted. Names topic, partition and offset."""


class OffsetGapError(TerminalError):
    """Committed offsets point at data the broker no longer has (retention) or never had."""


class OffsetsMovedError(TerminalError):
    """The table's committed offsets changed since the batch was planned (another writer committed)."""


class CommitConflictError(TransientError):
    """The catalog rejected a commit because the table changed underneath it."""


class ValidationFailedError(TerminalError):
    """The data-quality suite failed on a staged batch; nothing was committed."""


class KafkaReadError(TransientError):
    """Reading an offset range from Kafka failed or stalled."""
