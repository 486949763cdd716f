"""quarantine (moved from quarantine.py)."""


from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


PREFIX = "quarantine-"


def branch_name(batch_id: str) -> str:
    return PREFIX + batch_id


def commit_to_branch(table: Any, batch_id: str, data_files: Any, props: dict[str, str]) -> None:
    """The batch's files on its quarantine branch (once: skipped when the branch already holds them)."""
    from tidewater.commit.primitive import fast_append as _fast_append
    from tidewater.commit.primitive import without_commit_retries as _without_commit_retries
    from tidewater.table.summary import BATCH_ID, OFFSETS, QUARANTINE_OF, summary_dict

    name = branch_name(batch_id)
    head = table.snapshot_by_name(name)
    if head is not None and summary_dict(head).get(QUARANTINE_OF) == batch_id:
        return
    branch_props = {k: v for k, v in props.items() if k not in (OFFSETS, BATCH_ID)}  # main carries those
    branch_props[QUARANTINE_OF] = batch_id
    _fast_append(_without_commit_retries(table), data_files, branch_props, name)
    log.info("batch %s: %d files committed to branch %s", batch_id, len(data_files), name)
