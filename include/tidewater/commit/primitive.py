"""The one commit primitive: every Iceberg commit Tidewater makes goes through :func:`commit`.

Shaped after the Iceberg Kafka Connect sink's ``Coordinator``: one place that commits, retried only when
retrying is right. One call:

1. loads the table fresh from the catalog (an unreachable or locked catalog is retried, then reported
   as transient);
2. looks for the marker (by default ``tidewater.batch-id`` = the batch id) in the table's snapshots: if
   a snapshot carries it, the change already landed and the call returns ``already-committed``
   (idempotent: a retry after success, or after an unknown outcome that did apply, is a no-op);
3. asks ``prepare(table)`` for the :class:`Change` to apply (``None``: nothing to do); whatever it raises is
   re-raised, never retried;
4. checks the change's requirement on the table as just loaded: ``Change.expect``, the committed offsets the
   batch was planned and written against (:class:`OffsetsExpected`; ``OffsetsMovedError`` when another
   writer moved them). This is the one offsets guard that exactly-once rests on, carried as data by every
   kind of commit, the way pyiceberg attaches ``AssertRefSnapshotId`` to a transaction;
5. applies the change in one transaction on a view of the table whose pyiceberg-level retries are off
   (a conflict must come back here to re-check offsets, not be rebased blindly);
6. on a commit conflict (``CommitFailedException``: another writer committed first) or an unknown
   outcome (the catalog call failed on I/O or a lock, so it may or may not have applied) it backs off and
   starts again at 1; anything else is re-raised at once.

A change is an append of staged files (or of a few Arrow rows), optionally preceded in the same
transaction by a copy-on-write delete (replays, a change table's truncate), or a row delta: data files plus
position delete files in one snapshot (change tables, ``Change.deletes``; ``table/row_delta.py``), and it may
carry changes to other branches in the same transaction (``Change.also``: quarantine branches). Staged files
whose ``content`` is ``deletes`` are refused by name (see ``batch.StagedFile.to_data_file``): delete files
reach a commit only as the position delete files the commit step wrote itself.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pyiceberg.manifest import DataFile
from pyiceberg.table.update.snapshot import ManageSnapshots

from tidewater.batch import Offsets
from tidewater.errors import OffsetsMovedError, TerminalError, TransientError
from tidewater.table.catalog import catalog_failure, load_table
from tidewater.table.row_delta import row_delta
from tidewater.table.summary import BATCH_ID, BRANCH_BASE, committed_state, find_marked_snapshot

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

Status = Literal["committed", "already-committed", "nothing-to-commit"]
DEFAULT_ATTEMPTS = 8


@dataclass(frozen=True)
class OffsetsExpected:
    """A commit's requirement: the committed offsets of ``table`` (on ``branch``) are still those the batch was
    planned and written against. ``seen``: topic -> partition -> every committed offset the batch's planner or
    writers saw for that partition (several when sub-ranges were written by several tasks); all must equal the
    table's offset now (``None``: the partition had none). Checked by :func:`commit` on every attempt, after the
    refresh, for every kind of commit; a mismatch is terminal (``OffsetsMovedError``): committing would
    duplicate or skip records, the batch must be re-planned."""

    seen: Mapping[str, Mapping[int, tuple[int | None, ...]]]
    branch: str | None = None
    batch_id: str | None = None
    holder: str = "the table"  # how errors name the offsets holder

    def moved(self, table: Any) -> list[str]:
        """The partitions whose offsets in ``table`` are no longer what the batch saw, each described."""
        return self.moved_from(committed_state(table, self.branch).offsets)

    def moved_from(self, now: Offsets) -> list[str]:
        """The partitions whose committed offsets ``now`` are not what the batch saw, each described (pure)."""
        return [
            f"{topic}[{p}] written against {seen[0] if len(set(seen)) == 1 else list(seen)}, now at {now.get(topic, {}).get(p)}"
            for topic, parts in sorted(self.seen.items())
            for p, seen in sorted(parts.items())
            if any(s != now.get(topic, {}).get(p) for s in seen)
        ]

    def check(self, table: Any, ident: str) -> None:
        moved = self.moved(table)
        if moved:
            raise OffsetsMovedError(
                f"{self.holder}'s offsets moved since this batch was planned (another writer "
                "committed); refusing to commit to avoid duplicates. Re-plan the batch: " + "; ".join(moved),
                table=ident,
                batch_id=self.batch_id,
            )


@dataclass(frozen=True)
class Change:
    """What one commit applies, atomically (one transaction; each part is a snapshot).

    ``delete_filter``: rows removed first (copy-on-write), with ``delete_properties`` on that snapshot.
    ``files`` (staged files or pyiceberg DataFiles) and ``rows`` (a small Arrow table) are appended with
    ``properties``; with ``append`` False only the delete is made (its properties then carry the marker).
    ``also``: changes to other branches committed in the same transaction (a quarantine branch with
    the batch's files beside main's snapshot with its offsets): all land, or none.
    """

    properties: Mapping[str, str]
    files: tuple[Any, ...] = ()
    rows: Any = None
    branch: str | None = None
    delete_filter: Any = None
    delete_properties: Mapping[str, str] | None = None
    append: bool = True
    also: tuple[Change, ...] = ()  # changes to other branches, made after this one in the same transaction
    deletes: tuple[Any, ...] = ()  # position delete files (pyiceberg DataFiles) committed with ``files`` as one row delta
    remove_properties: tuple[str, ...] = ()  # table properties removed in the same transaction (confirmations)
    set_properties: Mapping[str, str] | None = None  # table properties set in the same transaction (kept counts)
    expect: OffsetsExpected | None = None  # the requirement checked before the change is applied (see OffsetsExpected)
    tag: str | None = None  # a tag moved to the snapshot this change makes on its branch, in the same transaction

    @property
    def kind(self) -> str:
        return "overwrite" if self.delete_filter is not None else "append"


@dataclass(frozen=True)
class Committed:
    """The outcome of :func:`commit`: its status and the table as the call last saw it."""

    status: Status
    table: Any
    snapshot_id: int | None = None
    attempts: int = 1


def without_commit_retries(table: Table) -> Any:
    """A view of ``table`` whose commits are not retried by pyiceberg itself.

    pyiceberg rebases a conflicting append onto the new snapshot and retries it (table property
    ``commit.retry.num-retries``). For us a conflict means the offsets may have moved: the retry must
    come back to :func:`commit`, re-read the offsets and look for the batch id. The property is changed
    in this local view only; nothing is written to the table's properties.
    """
    from pyiceberg.table import Table, TableProperties

    props = {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
    meta = table.metadata.model_copy(update={"properties": props})
    return Table(table.name(), metadata=meta, metadata_location=table.metadata_location, io=table.io, catalog=table.catalog)


def _data_files(table: Table, files: tuple[Any, ...]) -> list[Any]:
    return [f if isinstance(f, DataFile) else f.to_data_file(table.format_version) for f in files]


def ensure_branch_base(view: Table, branch: str | None) -> None:
    """A table without any snapshot accepts writes to main only: an empty snapshot on main comes first
    (no files, no offsets), then the branch starts with the change."""
    if not branch or branch == "main" or view.metadata.current_snapshot_id is not None or view.metadata.snapshots:
        return
    with view.transaction() as tx, tx.update_snapshot(snapshot_properties={BRANCH_BASE: branch}).fast_append():
        pass


def apply_change(tx: Any, table: Any, change: Change) -> None:
    """The change inside an open transaction (the transaction commits when its block exits cleanly).

    ``also`` comes after the main part: a table without snapshots accepts a new branch only once the
    transaction has given main its first snapshot."""
    branch = change.branch or "main"
    if change.delete_filter is not None:
        tx.delete(
            delete_filter=change.delete_filter, snapshot_properties=dict(change.delete_properties or change.properties), branch=branch
        )
    if change.deletes:
        row_delta(tx, table, _data_files(table, change.files), list(change.deletes), dict(change.properties), branch)
    elif change.append and change.rows is not None:
        tx.append(change.rows, snapshot_properties=dict(change.properties), branch=branch)
    elif change.append:
        with tx.update_snapshot(snapshot_properties=dict(change.properties), branch=branch).fast_append() as append:
            for f in _data_files(table, change.files):
                append.append_data_file(f)
    if change.tag:  # the snapshot just made; the tag's own requirement refuses a tag another writer moved meanwhile
        with ManageSnapshots(tx) as refs:
            refs.create_tag(tx.table_metadata.refs[branch].snapshot_id, change.tag)
    for other in change.also:
        apply_change(tx, table, other)
    if change.remove_properties:
        tx.remove_properties(*change.remove_properties)
    if change.set_properties:
        tx.set_properties(dict(change.set_properties))


def failed_attempt(catalog: Catalog, e: BaseException, kind: str, what: str, ident: str, attempt: int) -> None:
    """After an attempt that may be retried: log it, and back off before the next attempt refreshes.

    A conflict means another writer committed first. An unknown outcome is checked on fresh connections
    (a SQLite COMMIT refused with "database is locked" leaves its transaction open, and that connection
    would see its own uncommitted pointer update).
    """
    if kind == "conflict":
        log.warning("%s: commit conflict on %s (attempt %d): %s; refreshing", what, ident, attempt, e)
    else:
        log.warning("%s: commit outcome unknown on %s (attempt %d): %r; checking", what, ident, attempt, e)
        drop_connections(catalog)
    # Full jitter (a random share of the exponential step): two writers that collided, say an ingest commit and
    # a compaction's, must not retry in lockstep and collide again on every attempt.
    time.sleep(random.uniform(0.05, min(0.1 * 2**attempt, 5)))


def retried_after(catalog: Catalog, e: BaseException, what: str, ident: str, attempt: int) -> bool:
    """Whether a commit call that raised ``e`` is tried again (``catalog_failure``: a conflict or an unknown outcome);
    if so, the attempt is logged and backed off (``failed_attempt``). False: re-raise it."""
    kind = catalog_failure(e)
    if kind is None:
        return False
    failed_attempt(catalog, e, kind, what, ident, attempt)
    return True


def drop_connections(catalog: Catalog) -> None:
    """Close a SQL catalog's pooled connections (rolling back whatever they left open)."""
    engine = getattr(catalog, "engine", None)
    if engine is not None:
        engine.dispose()


def _load(catalog: Catalog, ident: str, what: str, attempt: int) -> tuple[Any, bool]:
    """(table or None, loaded). A catalog that is unreachable or locked counts as a failed attempt."""
    try:
        return load_table(catalog, ident), True
    except TransientError as e:
        failed_attempt(catalog, e, "unavailable", what, ident, attempt)
        return None, False


def prepared(
    table: Any,
    ident: str,
    prepare: Callable[[Any], Change | None],
    *,
    marker: str | None,
    marker_key: str,
    what: str,
    on_missing: Callable[[], Any] | None,
    attempt: int,
) -> Committed | tuple[Any, Change]:
    """Steps 2 to 4 of :func:`commit` on ``table`` as just loaded (None: it does not exist): the outcome when there is
    nothing to apply (``already-committed``: it carries the marker; ``nothing-to-commit``), else the table and its
    change, whose offsets requirement holds. Shared with the multi-table commit (``commit/together.py``)."""
    if table is None:
        if on_missing is None:
            raise TerminalError(f"{what}: the table does not exist (dropped between write and commit?)", table=ident)
        table = on_missing()
        if table is None:
            return Committed("nothing-to-commit", None, None, attempt)
    if marker is not None:
        found = find_marked_snapshot(table, marker_key, marker)
        if found is not None:
            log.info("%s: already committed to %s as snapshot %s", what, ident, found.snapshot_id)
            return Committed("already-committed", table, found.snapshot_id, attempt)
    change = prepare(table)
    if change is None:
        return Committed("nothing-to-commit", table, None, attempt)
    if change.expect is not None:
        change.expect.check(table, ident)
    return table, change


def commit(
    catalog: Catalog,
    ident: str,
    prepare: Callable[[Any], Change | None],
    *,
    marker: str | None,
    marker_key: str = BATCH_ID,
    what: str,
    max_attempts: int = DEFAULT_ATTEMPTS,
    on_missing: Callable[[], Any] | None = None,
) -> Committed:
    """Commit what ``prepare`` returns to table ``ident``, once; see the module docstring for the steps.

    ``marker``: the value of ``marker_key`` in the snapshot summary that identifies this commit (``None``:
    no idempotency check, ``prepare`` must do its own). ``on_missing``: called when the table does not
    exist; returns the table to use (e.g. creates it), None for nothing to commit, or raises. Without it a
    missing table is terminal.
    Raises ``TransientError`` after ``max_attempts`` conflicts or unknown outcomes.
    """
    for attempt in range(1, max_attempts + 1):
        table, loaded = _load(catalog, ident, what, attempt)
        if not loaded:
            continue
        ready = prepared(table, ident, prepare, marker=marker, marker_key=marker_key, what=what, on_missing=on_missing, attempt=attempt)
        if isinstance(ready, Committed):
            return ready
        table, change = ready
        view = without_commit_retries(table)
        try:
            ensure_branch_base(view, change.branch)
            with view.transaction() as tx:
                apply_change(tx, view, change)
        except Exception as e:
            if not retried_after(catalog, e, what, ident, attempt):
                raise
            continue
        snap = view.snapshot_by_name(change.branch) if change.branch else view.current_snapshot()
        return Committed("committed", view, snap.snapshot_id if snap else None, attempt)
    raise TransientError(
        f"{what}: commit did not succeed after {max_attempts} attempts (conflicts or catalog "
        "unavailable); retrying the commit step is safe",
        table=ident,
    )
