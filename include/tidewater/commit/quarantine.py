"""The commits of quarantined batches (``validation.on_failure: quarantine``).

A batch whose expectations fail lands on its own branch ``quarantine-<batch id>`` in the same
transaction as main's empty snapshot that carries the batch id and the advanced offsets (see
``commit.batch``; a change table's row delta: ``commit.changes.quarantined``). Publishing appends the branch's
files to main once (marker ``tidewater.published``); a change table's row delta is applied to main as it was
computed, only while main is still at the batch's snapshot. Listing, publishing and dropping are operations:
``ops/quarantine.py``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pyiceberg.manifest import DataFileContent, ManifestEntryStatus

from tidewater.commit.primitive import Change, commit
from tidewater.config.spec import PipelineSpec
from tidewater.errors import TerminalError, ValidationFailedError
from tidewater.table.summary import (
    BATCH_ID,
    CHANGES,
    OFFSETS,
    PIPELINE,
    PUBLISHED,
    QUARANTINE_OF,
    quarantine_branch,
    summary_dict,
)
from tidewater.table.targets import reported_tables

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

log = logging.getLogger(__name__)


def quarantine_change(batch_id: str, data_files: Any, props: dict[str, str]) -> Change:
    """The batch's files on its quarantine branch; main's snapshot carries offsets and batch id."""
    branch_props = {k: v for k, v in props.items() if k not in (OFFSETS, BATCH_ID)}
    branch_props[QUARANTINE_OF] = batch_id
    return Change(branch_props, tuple(data_files), branch=quarantine_branch(batch_id))


def publish_files(catalog: Catalog, ident: str, pipeline: str, batch_id: str, extra: dict[str, str] | None = None) -> tuple[str, int, int]:
    """Append the quarantine branch's files to main, once (``extra``: more snapshot properties, such as who
    decided). Returns (status, rows, files)."""
    counted: dict[str, int] = {}

    def prepare(table: Table) -> Change | None:
        head = table.snapshot_by_name(quarantine_branch(batch_id))
        if head is None:
            return None
        files = tuple(t.file for t in table.scan(snapshot_id=head.snapshot_id).plan_files())
        counted.update(rows=sum(f.record_count for f in files), files=len(files))
        return Change({PUBLISHED: batch_id, PIPELINE: pipeline, **(extra or {})}, files)

    done = commit(catalog, ident, prepare, marker=batch_id, marker_key=PUBLISHED, what=f"publish {batch_id}")
    if done.status == "committed":
        log.info("published quarantined batch %s: %d rows in %d files appended to %s", batch_id, counted["rows"], counted["files"], ident)
    return done.status, counted.get("rows", 0), counted.get("files", 0)


def added_files(table: Table, snapshot: Any) -> tuple[list[Any], list[Any]]:
    """The data files and the delete files ``snapshot`` added."""
    data: list[Any] = []
    deletes: list[Any] = []
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snapshot.snapshot_id:
                (data if entry.data_file.content == DataFileContent.DATA else deletes).append(entry.data_file)
    return data, deletes


def publish_changes(
    catalog: Catalog, ident: str, pipeline: str, batch_id: str, extra: dict[str, str] | None = None
) -> tuple[str, int, int]:
    """Apply a quarantined change batch's row delta to main, once: its new row images and position deletes, as
    computed against main when the batch was quarantined. Only while main's head is still the batch's own
    snapshot (nothing changed main's rows since); otherwise a terminal error says what to do. Returns (status,
    new row images, files)."""
    counted: dict[str, int] = {}

    def prepare(table: Table) -> Change | None:
        head = table.snapshot_by_name(quarantine_branch(batch_id))
        if head is None:
            return None
        main = table.current_snapshot()
        if main is None or summary_dict(main).get(BATCH_ID) != batch_id:
            raise TerminalError(
                f"main of {ident} moved past quarantined batch {batch_id} (snapshot "
                f"{main.snapshot_id if main else None} is newer): its changes can no longer be applied "
                "in order. Drop it, then replay its range with mode reapply",
                table=ident,
                batch_id=batch_id,
            )
        data, deletes = added_files(table, head)
        counted.update(rows=sum(f.record_count for f in data), files=len(data) + len(deletes))
        props = {PUBLISHED: batch_id, PIPELINE: pipeline, **(extra or {})}
        if CHANGES in summary_dict(head):
            props[CHANGES] = summary_dict(head)[CHANGES]
        return Change(props, tuple(data), deletes=tuple(deletes))

    done = commit(catalog, ident, prepare, marker=batch_id, marker_key=PUBLISHED, what=f"publish {batch_id}")
    if done.status == "committed":
        log.info(
            "published quarantined change batch %s: %d row images and %d files applied to %s",
            batch_id,
            counted["rows"],
            counted["files"],
            ident,
        )
    return done.status, counted.get("rows", 0), counted.get("files", 0)


class QuarantinedError(ValidationFailedError):
    """A batch the gate quarantined: its commit has landed (main's offsets moved, the rows wait on a branch of each
    table in ``tables``) and its run fails so that a person decides."""

    def __init__(self, message: str, *, batch_id: str, tables: tuple[str, ...]) -> None:
        self.tables = tables
        super().__init__(message, batch_id=batch_id, table=", ".join(tables))


def quarantined_error(
    plan_batch_id: str, tables: tuple[str, ...], validation: dict[str, Any] | None, spec: PipelineSpec
) -> QuarantinedError:
    """The run's error for a quarantined batch: ``tables`` lists the target tables quarantined. Those a person must
    name (a routed pipeline's: ``--table``) are named in the command, and the others committed the batch as usual."""
    failed = (validation or {}).get("failed")
    named = reported_tables(spec, tables)
    which = f" --table {named[0]}" if len(named) == 1 else " --table T" if named else ""
    table = ", ".join(tables)
    return QuarantinedError(
        f"batch {plan_batch_id} failed validation ({failed} check(s)) and was quarantined on branch "
        f"{quarantine_branch(plan_batch_id)} of {table}; the offsets moved on and main is unchanged"
        + (" (the other tables committed the batch)" if named else "")
        + ". Publish it with "
        f"`tidewater quarantine publish --pipeline {spec.source_path}{which} --batch {plan_batch_id}` or drop it with "
        f"`tidewater quarantine drop ...`",
        batch_id=plan_batch_id,
        tables=tuple(tables),
    )
