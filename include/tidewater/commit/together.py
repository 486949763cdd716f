"""Several tables' changes in one catalog transaction: the Iceberg REST spec's multi-table commit.

A routed ingest on a catalog that offers ``POST /v1/{prefix}/transactions/commit`` (among the endpoints its
``/v1/config`` lists; ``catalog.multi_table_commit: auto``) commits every target table and its checkpoint in one
request, which the catalog applies whole or not at all (``commit/batch.py: commit_targets_together``). Each table's
change is prepared exactly as its commit of its own would prepare it (the same ``Change``: snapshots, properties,
offsets tag and offsets requirement, checked here on the table as just loaded); what would have been that table's
commit (pyiceberg's staged updates and requirements, with the table's UUID) becomes one entry of the request. The
Iceberg Kafka Connect sink commits table by table.

Retried like the primitive (``commit/primitive.py``): a conflict (409) or an unknown outcome (a 5xx, a lost
connection) refreshes every table and starts again; the last table (the checkpoint) carrying the marker says the
transaction landed, and then every table has it, since the catalog applied all or nothing. A table that already
carries the marker (a one-by-one commit cut short before the catalog offered transactions) is left as it is.

pyiceberg (0.12) has no public multi-table commit: its ``Transaction`` keeps the staged updates and requirements in
``_updates`` and ``_requirements`` and hands them to the catalog in ``commit_transaction``; ``stage`` reads them
there, and ``post`` sends them through the REST catalog's own session (its auth, token refresh and headers).
tests/unit/test_together.py pins that shape.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidewater.commit.primitive import (
    Change,
    Committed,
    apply_change,
    ensure_branch_base,
    prepared,
    retried_after,
    without_commit_retries,
)
from tidewater.errors import TransientError
from tidewater.table.catalog import load_table
from tidewater.table.summary import BATCH_ID

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)

TRANSACTIONS = "POST /v1/{prefix}/transactions/commit"


def offers_transactions(catalog: Catalog) -> bool:
    """Whether ``catalog`` is a REST catalog whose server lists the multi-table commit among its endpoints."""
    endpoints = getattr(catalog, "_supported_endpoints", None) or ()  # pyiceberg's RestCatalog, from /v1/config
    return any(str(e) == TRANSACTIONS for e in endpoints)


@dataclass(frozen=True)
class Part:
    """One table of a transaction: how its change is prepared on the table as loaded (None: nothing to commit), and
    what to do when it does not exist (return the table, None or raise; None here: that is terminal)."""

    ident: str
    prepare: Callable[[Any], Change | None]
    on_missing: Callable[[], Any] | None = None


def stage(catalog: Catalog, part: Part, marker: str, what: str = "a multi-table commit") -> Any:
    """``part``'s commit request, staged in a pyiceberg transaction that is never committed alone; ``True`` when the
    table already carries ``marker``, None when there is nothing to commit (the primitive's steps 2 to 4:
    ``primitive.prepared``). A table without snapshots that takes a branch first gets main's empty base snapshot,
    alone (``ensure_branch_base``: no rows, no offsets)."""
    from pyiceberg.table import CommitTableRequest, TableIdentifier
    from pyiceberg.table.update import AssertTableUUID

    ready = prepared(
        load_table(catalog, part.ident),
        part.ident,
        part.prepare,
        marker=marker,
        marker_key=BATCH_ID,
        what=what,
        on_missing=part.on_missing,
        attempt=1,
    )
    if isinstance(ready, Committed):
        return True if ready.status == "already-committed" else None
    table, change = ready
    view = without_commit_retries(table)
    ensure_branch_base(view, change.branch)
    tx = view.transaction()
    apply_change(tx, view, change)
    name = view.name()
    requirements = (*tx._requirements, AssertTableUUID(uuid=view.metadata.table_uuid))  # as commit_transaction adds
    return CommitTableRequest(
        identifier=TableIdentifier(namespace=name[:-1], name=name[-1]), requirements=requirements, updates=tx._updates
    )


def post(catalog: Catalog, requests: list[Any]) -> None:
    """One multi-table commit. Raises pyiceberg's CommitFailedException on 409 (a requirement not met: another writer
    was first) and CommitStateUnknownException on 500, 502 and 504, as its table commit does."""
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.catalog.rest.response import _handle_non_200_response
    from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException

    if not isinstance(catalog, RestCatalog):  # offers_transactions said it is one
        raise TypeError(f"a multi-table commit needs a REST catalog, not {type(catalog).__name__}")
    body = json.dumps({"table-changes": [json.loads(r.model_dump_json()) for r in requests]})
    response = catalog._session.post(catalog.url("transactions/commit", prefixed=True), data=body.encode())
    if response.ok:
        return
    try:
        response.raise_for_status()  # the session's HTTPError, which pyiceberg maps to its exceptions
    except OSError as exc:  # requests' HTTPError is an OSError (requests is pyiceberg's to import, not ours)
        _handle_non_200_response(
            exc,  # type: ignore[arg-type]  # typed as requests' HTTPError, which this is
            {
                409: CommitFailedException,
                500: CommitStateUnknownException,
                502: CommitStateUnknownException,
                504: CommitStateUnknownException,
            },
        )


def discard_refused(io: Any, updates: Any, ident: str) -> int:
    """Delete what a refused commit wrote for its new snapshots (``updates``: its staged updates): each snapshot's
    manifest list and the manifests it added, as Iceberg Java's snapshot producer cleans up after a
    CommitFailedException. Data files stay: the next attempt commits the batch's files again. Never after an unknown
    outcome (a 5xx), whose snapshots may have landed. A file that cannot be deleted is left for orphan removal, with a
    warning. Returns how many files were deleted."""
    from pyiceberg.table.update import AddSnapshotUpdate

    deleted = 0
    for snapshot in (u.snapshot for u in updates if isinstance(u, AddSnapshotUpdate)):
        try:
            added = [m.manifest_path for m in snapshot.manifests(io) if m.added_snapshot_id == snapshot.snapshot_id]
            for path in (*added, snapshot.manifest_list):
                io.delete(path)
                deleted += 1
        except OSError as e:
            log.warning("%s: the refused snapshot %s's metadata files are left for orphan removal: %s", ident, snapshot.snapshot_id, e)
    return deleted


def discard_refused_requests(catalog: Catalog, requests: list[Any]) -> None:
    """After a refused transaction (409: the catalog applied none of it), each table's new manifests and manifest
    lists deleted (``discard_refused``); never after an unknown outcome (a 5xx), which may have landed."""
    for request in requests:
        ident = ".".join((*request.identifier.namespace.root, request.identifier.name))
        table = load_table(catalog, ident)
        if table is not None:
            discard_refused(table.io, request.updates, ident)


def commit_together(catalog: Catalog, parts: list[Part], *, marker: str, what: str, max_attempts: int) -> tuple[int, set[str]]:
    """Commit every part's change in one catalog transaction, once: the last part's table carrying ``marker`` says it
    landed. Returns the attempts it took and the parts' tables that carried ``marker`` before anything was posted
    (left as they were). Raises ``OffsetsMovedError`` when a part's offsets requirement fails, ``TransientError``
    when the catalog kept refusing or failing (nothing of it committed)."""
    from pyiceberg.exceptions import CommitFailedException

    last = parts[-1].ident
    carried: set[str] | None = None
    for attempt in range(1, max_attempts + 1):
        try:  # a table not loaded, or a branch base refused: retried as the primitive retries its own steps
            staged = [stage(catalog, p, marker, what) for p in parts]
        except Exception as e:
            if not retried_after(catalog, e, what, last, attempt):
                raise
            continue
        if carried is None:  # staged before anything was posted: these had it already
            carried = {p.ident for p, s in zip(parts, staged) if s is True}
        if staged[-1] is True:  # an earlier attempt's transaction landed
            log.info("%s: already committed (%s carries it)", what, last)
            return attempt, carried
        requests = [s for s in staged if s is not None and s is not True]
        try:
            post(catalog, requests)
        except Exception as e:
            if isinstance(e, CommitFailedException):  # a 409: the catalog applied nothing of it
                discard_refused_requests(catalog, requests)
            if not retried_after(catalog, e, what, last, attempt):
                raise
            continue
        log.info("%s: %d tables committed in one transaction", what, len(requests))
        return attempt, carried
    raise TransientError(
        f"{what}: the multi-table commit did not succeed after {max_attempts} attempts (conflicts "
        "or catalog unavailable); nothing of it is committed, retrying the commit step is safe",
        table=last,
    )
