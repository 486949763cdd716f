"""dead_letters (moved from committing.py)."""


from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tidewater.batch import BatchManifest, BatchPlan
from tidewater.commit.primitive import failed_attempt, fast_append, without_commit_retries
from tidewater.errors import TerminalError, TransientError
from tidewater.table.catalog import load_table
from tidewater.table.summary import (
    BATCH_ID,
    DEAD_LETTER_TOPIC,
    PIPELINE,
    RECORDS,
    find_batch_snapshot,
)

log = logging.getLogger(__name__)


def commit_dead_letters(catalog: Any, plan: BatchPlan, manifest: BatchManifest,
                        sink: Callable[[Any, list[dict[str, Any]]], str] | None = None, max_attempts: int = 8) -> None:
    """Append the batch's dead-letter files, once: after the batch's own commit, idempotent by batch id.

    Called on every commit attempt of the batch (also when the batch was already committed), so a
    failure between the two commits is repaired by retrying the commit step. ``sink`` (the Kafka
    dead-letter topic) gets the files before the dead-letter commit, which records that it did: a retry
    after that commit never sends them again; a failure between the two sends them again (at least once).
    """

    if not manifest.dead_letter_files:
        return
    ident = manifest.dead_letter_table
    props_sent: dict[str, str] = {}  # sent once per call, whatever the commit attempts
    for attempt in range(1, max_attempts + 1):
        table = load_table(catalog, ident)
        if table is None:
            raise TerminalError("dead-letter table disappeared between write and commit", table=ident, batch_id=plan.batch_id)
        if find_batch_snapshot(table, plan.batch_id) is not None:
            return
        props = {BATCH_ID: plan.batch_id, PIPELINE: plan.pipeline, RECORDS: str(manifest.dead_letters)}
        if sink is not None and DEAD_LETTER_TOPIC not in props_sent:
            props_sent[DEAD_LETTER_TOPIC] = sink(table, list(manifest.dead_letter_files))
        props.update(props_sent)
        try:
            fast_append(without_commit_retries(table), manifest.dead_letter_files, props)
            log.info("batch %s: %d dead letters committed to %s", plan.batch_id, manifest.dead_letters, ident)
            return
        except Exception as e:
            failed_attempt(catalog, e, f"batch {plan.batch_id} (dead letters)", ident, attempt)
    raise TransientError(
        "the batch is committed but its dead letters are not yet; retry the commit step", table=ident, batch_id=plan.batch_id
    )
