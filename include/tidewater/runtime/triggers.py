"""The lag trigger: an Airflow event trigger (run by the triggerer, never by Spark) that starts a
pipeline's batch when the pending data exceeds a ``trigger.*`` threshold (``plan/pending.py``).

The ingest DAG of a pipeline with ``trigger`` settings is scheduled on its cron schedule *or* on the
asset ``tidewater://pending/<name>``, watched by this trigger. After firing, the trigger waits for the
table's committed offsets to move (the batch committed) before it fires again, so a slow batch is not
followed by a queue of runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from tidewater.config.parse import load_pipeline
from tidewater.errors import TidewaterError
from tidewater.plan.pending import pending

log = logging.getLogger(__name__)


class PendingDataTrigger(BaseEventTrigger):
    """Fires when ``tidewater.plan.pending.pending(spec).exceeded(spec)`` says so."""

    def __init__(self, pipeline_path: str, poll_seconds: float = 30.0) -> None:
        super().__init__()
        self.pipeline_path = pipeline_path
        self.poll_seconds = poll_seconds

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("tidewater.runtime.triggers.PendingDataTrigger", {"pipeline_path": self.pipeline_path, "poll_seconds": self.poll_seconds})

    async def run(self) -> Any:
        fired_at: dict[str, dict[int, int]] | None = None
        fired_time = 0.0
        while True:
            try:
                spec = load_pipeline(self.pipeline_path)
                now = await asyncio.to_thread(pending, spec)
                why = now.exceeded(spec)
                if fired_at is not None and (
                    now.committed != fired_at or time.monotonic() - fired_time > max(600.0, 10 * self.poll_seconds)
                ):
                    fired_at = None  # the batch it started has committed (or never will: a failed run)
                if why and fired_at is None:
                    log.info("pipeline %s: starting a batch: %s", spec.name, why)
                    fired_at, fired_time = now.committed, time.monotonic()
                    yield TriggerEvent({"pipeline": spec.name, "reason": why, "pending_records": now.records})
            except TidewaterError as e:  # a broker or catalog that is down: say so, keep watching
                log.warning("pending data of %s not readable: %s", self.pipeline_path, e)
            await asyncio.sleep(self.poll_seconds)
