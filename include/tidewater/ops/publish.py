"""Write-audit-publish for tables that commit to a branch (``table.branch``): batches land on the branch, a
person (or a DAG) audits it, and publishing fast-forwards main to the branch's head, so main moves from one
audited state to the next in one metadata commit (no data file is rewritten or copied).

A fast-forward only: main's head must be an ancestor of the branch's head. If someone committed to main since
the branch left it, publishing would drop that commit; it is refused (terminal: retrying cannot help). A commit
that races the publish on main makes the catalog refuse it (Iceberg checks main's head), reported as transient.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pyiceberg.exceptions import CommitFailedException

from tidewater.config.spec import PipelineSpec
from tidewater.errors import ConfigError, TerminalError, TransientError
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import BRANCH_BASE, summary_dict
from tidewater.table.targets import target_spec

if TYPE_CHECKING:
    from pyiceberg.table import Table

log = logging.getLogger(__name__)


def _ancestors(table: Table, snapshot_id: int | None) -> list[int]:
    by_id = {s.snapshot_id: s for s in table.metadata.snapshots}
    out = []
    while snapshot_id is not None and snapshot_id in by_id:
        out.append(snapshot_id)
        snapshot_id = by_id[snapshot_id].parent_snapshot_id
    return out


def _only_branch_base(table: Table, snapshot_id: int) -> bool:
    """Main holds nothing but the empty snapshot a table's first branch commit starts from (``BRANCH_BASE``; the
    branch's first snapshot has no parent, so main's head is not its ancestor, yet nothing on main is lost)."""
    by_id = {s.snapshot_id: s for s in table.metadata.snapshots}
    return all(BRANCH_BASE in summary_dict(by_id[i]) for i in _ancestors(table, snapshot_id))


def publish_branch(spec: PipelineSpec, table_ident: str | None = None) -> dict[str, Any]:
    """Fast-forward main to the head of the table's branch (``table_ident``: one target table of a routed
    pipeline). Returns the branch, main's head before and after, and how many snapshots main gained (0: main
    already was the branch's head)."""
    ident = spec.targets.named(table_ident, spec.name, required=True)
    branch = target_spec(spec, ident).table.branch
    if not branch or branch == "main":
        raise ConfigError(f"table.branch: {ident} commits to main; there is no branch to publish")
    table = load_table(load_catalog(spec), ident)
    head = table.snapshot_by_name(branch) if table is not None else None
    if table is None or head is None:
        raise ConfigError(f"table.branch: {ident} has no branch {branch!r} yet (its first batch creates it)")
    main = table.metadata.current_snapshot_id
    lineage = _ancestors(table, head.snapshot_id)
    if main is not None and main not in lineage and not _only_branch_base(table, main):
        raise TerminalError(
            f"main of {ident} moved since branch {branch!r} left it (main's head {main} is not an "
            "ancestor of the branch's head): a fast-forward would drop main's commits; merge by hand",
            table=ident,
        )
    gained = lineage.index(main) if main in lineage else len(lineage)
    if gained:
        try:
            table.manage_snapshots().set_current_snapshot(ref_name=branch).commit()
        except CommitFailedException as e:
            raise TransientError(f"main of {ident} changed while publishing branch {branch!r}: {e}", table=ident) from e
    log.info("published branch %s of %s: main %s -> %s (%d snapshot(s))", branch, ident, main, head.snapshot_id, gained)
    return {"table": ident, "branch": branch, "main_before": main, "main_after": head.snapshot_id, "snapshots": gained}
