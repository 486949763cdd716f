"""primitive (moved from committing.py)."""


from __future__ import annotations

import logging
import time
from typing import Any

from tidewater.table.summary import (
    BRANCH_BASE,
)
from tidewater.write.parquet import deserialize_data_file

log = logging.getLogger(__name__)


def without_commit_retries(table: Any) -> Any:
    """A view of ``table`` whose commits are not retried by pyiceberg itself.

    pyiceberg rebases a conflicting append onto the new snapshot and retries it (table property
    ``commit.retry.num-retries``). For us a conflict means the offsets may have moved: the retry must
    come back here, re-read the offsets and look for the batch id. The property is changed in this
    local view only; nothing is written to the table's properties.
    """
    from pyiceberg.table import Table, TableProperties

    props = {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
    meta = table.metadata.model_copy(update={"properties": props})
    return Table(table.name(), metadata=meta, metadata_location=table.metadata_location, io=table.io, catalog=table.catalog)


def fast_append(table: Any, data_files: Any, props: dict[str, str], branch: str | None = None) -> None:
    """One fast-append snapshot of the staged (serialized) data files, with these summary properties."""
    files = [deserialize_data_file(d, table.format_version) for d in data_files]
    if branch and branch != "main" and table.metadata.current_snapshot_id is None and not table.metadata.snapshots:
        # A table without any snapshot accepts writes to main only: an empty snapshot on main comes first
        # (no files, no offsets), then the branch starts with this batch.
        with table.transaction() as tx:
            with tx.update_snapshot(snapshot_properties={BRANCH_BASE: branch}).fast_append():
                pass
    with table.transaction() as tx:
        fast_append_tx(tx, table, data_files, props, branch, files)


def fast_append_tx(tx: Any, table: Any, data_files: Any, props: dict[str, str], branch: str | None = None,
                    files: list[Any] | None = None) -> None:
    """The fast append of staged data files inside an open transaction."""
    if files is None:
        files = [deserialize_data_file(d, table.format_version) for d in data_files]
    with tx.update_snapshot(snapshot_properties=props, branch=branch or "main").fast_append() as append:
        for f in files:
            append.append_data_file(f)


def failed_attempt(catalog: Any, e: BaseException, what: str, ident: str, attempt: int) -> None:
    """After a commit attempt raised: log it, and back off before the next attempt refreshes and checks.

    A conflict (CommitFailedException) means another writer committed first. Anything else leaves the
    outcome unknown: the next attempt looks for the batch id first, on fresh connections (a SQLite
    COMMIT refused with "database is locked" leaves its transaction open, and that connection would see
    its own uncommitted pointer update).
    """
    from pyiceberg.exceptions import CommitFailedException

    if isinstance(e, CommitFailedException):
        log.warning("%s: commit conflict on %s (attempt %d): %s; refreshing", what, ident, attempt, e)
    else:
        log.warning("%s: commit outcome unknown on %s (attempt %d): %r; checking", what, ident, attempt, e)
        drop_connections(catalog)
    time.sleep(min(0.1 * 2**attempt, 5))


def drop_connections(catalog: Any) -> None:
    """Close a SQL catalog's pooled connections (rolling back whatever they left open)."""
    engine = getattr(catalog, "engine", None)
    if engine is not None:
        engine.dispose()
