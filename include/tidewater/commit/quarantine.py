"""The commits of quarantined batches (``validation.on_failure: quarantine``).

A batch whose expectations fail lands on its own branch ``quarantine-<batch id>`` in the same
transaction as main's empty snapshot that carries the batch id and the advanced offsets (see
``commit.batch``). Publishing appends the branch's files to main once (marker ``tidewater.published``).
Listing, publishing and dropping are operations: ``ops/quarantine.py``.
"""

from __future__ import annotations

import logging
from typing import Any

from tidewater.commit.primitive import Change, commit
from tidewater.table.summary import BATCH_ID, OFFSETS, PIPELINE, PUBLISHED, QUARANTINE_OF

log = logging.getLogger(__name__)

PREFIX = "quarantine-"


def branch_name(batch_id: str) -> str:
    return PREFIX + batch_id


def quarantine_change(batch_id: str, data_files: Any, props: dict[str, str]) -> Change:
    """The batch's files on its quarantine branch; main's snapshot carries offsets and batch id."""
    branch_props = {k: v for k, v in props.items() if k not in (OFFSETS, BATCH_ID)}
    branch_props[QUARANTINE_OF] = batch_id
    return Change(branch_props, tuple(data_files), branch=branch_name(batch_id))


def publish_files(catalog: Any, ident: str, pipeline: str, batch_id: str) -> tuple[str, int, int]:
    """Append the quarantine branch's files to main, once. Returns (status, rows, files)."""
    counted: dict[str, int] = {}

    def prepare(table: Any) -> Change | None:
        head = table.snapshot_by_name(branch_name(batch_id))
        if head is None:
            return None
        files = tuple(t.file for t in table.scan(snapshot_id=head.snapshot_id).plan_files())
        counted.update(rows=sum(f.record_count for f in files), files=len(files))
        return Change({PUBLISHED: batch_id, PIPELINE: pipeline}, files)

    done = commit(catalog, ident, prepare, marker=batch_id, marker_key=PUBLISHED, what=f"publish {batch_id}")
    if done.status == "committed":
        log.info("published quarantined batch %s: %d rows in %d files appended to %s", batch_id, counted["rows"],
                 counted["files"], ident)
    return done.status, counted.get("rows", 0), counted.get("files", 0)
