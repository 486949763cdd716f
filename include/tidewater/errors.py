"""Error hierarchy.

Every error says whether retrying can help (``transient``) and carries where it happened: batch id,
table, topic, partition and offset when they are known. Airflow task retries and the committer's own
retry loop look at ``transient``; people read ``str(error)``.
"""

from __future__ import annotations

import traceback
from typing import Any


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
    """A pipeline specification or setting is invalid. The message names the key. ``problems``: every
    problem found when several are reported at once (see :func:`config_problems`)."""

    problems: tuple[str, ...] = ()


def config_problems(problems: list[str]) -> ConfigError:
    """One ConfigError reporting every problem (one line each when there are several)."""
    e = ConfigError(problems[0] if len(problems) == 1 else f"{len(problems)} problems:\n  - " + "\n  - ".join(problems))
    e.problems = tuple(problems)
    return e


def problems_of(e: ConfigError) -> list[str]:
    return list(e.problems) or [e.message]


class RecordError(TerminalError):
    """One record cannot be decoded or converted. Names topic, partition and offset."""


class OffsetGapError(TerminalError):
    """Committed offsets point at data the broker no longer has (retention) or never had."""


class OffsetsMovedError(TerminalError):
    """The table's committed offsets changed since the batch was planned (another writer committed)."""


class ValidationFailedError(TerminalError):
    """The data-quality suite failed on a staged batch; nothing was committed."""


class KafkaReadError(TransientError):
    """Reading an offset range from Kafka failed or stalled."""


class BatchWriteError(TidewaterError):
    """A Spark task of the write step failed; carries the task's error document.

    Made with ``from_document``, which picks the subclass: retrying helps only when the task's own error
    was transient (``TransientBatchWriteError``); otherwise it is a ``TerminalBatchWriteError``.
    """

    def __init__(self, doc: dict[str, Any], count: int) -> None:
        self.doc = doc
        more = f" ({count - 1} more task(s) failed)" if count > 1 else ""
        super().__init__(
            f"{doc.get('class')}: {doc.get('detail') or doc.get('message')}{more}",
            topic=doc.get("topic"),
            partition=doc.get("partition"),
            offset=doc.get("offset"),
            table=doc.get("table"),
        )

    @staticmethod
    def from_document(doc: dict[str, Any], count: int) -> BatchWriteError:
        cls = TransientBatchWriteError if doc.get("transient") else TerminalBatchWriteError
        return cls(doc, count)


class TransientBatchWriteError(BatchWriteError, TransientError):
    """The failed task's error was transient (broker or catalog unreachable): rerunning the write step may help."""


class TerminalBatchWriteError(BatchWriteError, TerminalError):
    """The failed task's error was terminal (bad setting, bad data with the fail policy): a person has to act."""


def error_document(e: BaseException) -> dict[str, Any]:
    """What a failed Spark task leaves for the driver (a JSON document; see ``BatchWriteError``)."""
    doc: dict[str, Any] = {"class": type(e).__name__, "message": str(e)}
    if isinstance(e, TidewaterError):
        doc.update(
            transient=e.transient,
            detail=e.message,
            topic=e.topic,
            partition=e.partition,
            offset=e.offset,
            table=e.table,
        )
    else:
        doc.update(transient=False, traceback=traceback.format_exc(limit=5))
    return doc
