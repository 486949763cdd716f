"""The dead-letter table's commit of a batch: its own snapshot, once, marked with the batch id.

Called on every commit attempt of the batch (also when the batch was already committed), so a failure
between the batch's commit and this one is repaired by retrying the commit step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidewater.batch import BatchManifest, BatchPlan, StagedFile
from tidewater.commit.primitive import Change, commit
from tidewater.errors import TransientError
from tidewater.table.letters import totals_after
from tidewater.table.summary import BATCH_ID, DEAD_LETTER_TOPIC, PIPELINE, RECORDS

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)

# Sends a batch's dead-letter files to the Kafka dead-letter topic; returns the topic's name.
DeadLetterSink = Callable[[Any, list[StagedFile]], str]


def commit_dead_letters(catalog: Catalog, plan: BatchPlan, manifest: BatchManifest, sink: DeadLetterSink | None = None,
                        max_attempts: int = 8) -> None:
    """Append the batch's dead-letter files, once: after the batch's own commit, idempotent by batch id; the same
    commit keeps the table's count of each pipeline's letters (``table.letters.KEPT_TOTALS``).

    ``sink`` (the Kafka dead-letter topic) gets the files before the dead-letter commit, which records
    that it did: a retry after that commit never sends them again; a failure between the two sends them
    again (at least once).
    """
    if not manifest.dead_letter_files:
        return
    ident = manifest.dead_letter_table
    sent: dict[str, str] = {}  # sent once per call, whatever the commit attempts

    def prepare(table: Any) -> Change:
        props = {BATCH_ID: plan.batch_id, PIPELINE: plan.pipeline, RECORDS: str(manifest.dead_letters)}
        if sink is not None and DEAD_LETTER_TOPIC not in sent:
            sent[DEAD_LETTER_TOPIC] = sink(table, list(manifest.dead_letter_files))
        added = sum(f.record_count for f in manifest.dead_letter_files)
        return Change({**props, **sent}, manifest.dead_letter_files,
                      set_properties=totals_after(table, plan.pipeline, added))

    try:
        done = commit(catalog, ident, prepare, marker=plan.batch_id, what=f"batch {plan.batch_id} (dead letters)",
                      max_attempts=max_attempts)
    except TransientError:
        raise TransientError("the batch is committed but its dead letters are not yet; retry the commit step",
                             table=ident, batch_id=plan.batch_id) from None
    if done.status == "committed":
        log.info("batch %s: %d dead letters committed to %s", plan.batch_id, manifest.dead_letters, ident)
