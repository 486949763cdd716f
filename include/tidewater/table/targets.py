"""The target set (``config/targets.py``) against the catalog: which tables a pipeline's batches have committed
to, where its offsets stand, and each target table's own view of the pipeline.

Every reader of "which tables are mine" and "where are my offsets" asks here: status, planning, replays,
quarantine listings, maintenance, the ledger, the audit and the CLI.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidewater.config.spec import PipelineSpec
from tidewater.errors import TerminalError
from tidewater.table.catalog import load_table
from tidewater.table.summary import CommittedState, committed_state, ever_quarantined

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table


def holder_state(catalog: Catalog, spec: PipelineSpec) -> tuple[Any, CommittedState | None]:
    """The offsets holder (None if it does not exist yet) and its committed state on the holder's branch."""
    targets = spec.targets
    holder = load_table(catalog, targets.holder)
    return holder, (committed_state(holder, targets.branch) if holder is not None else None)


def named_by_holder(holder: Table) -> set[str]:
    """The tables a non-fused holder's batches committed to (its rows' ``tables`` column; none for a fused one)."""
    if holder is None or holder.current_snapshot() is None or "tables" not in holder.schema().column_names:
        return set()
    cells = holder.scan(selected_fields=("tables",)).to_arrow().column("tables").to_pylist()
    return {t for cell in cells for t in json.loads(cell or "[]")}


def target_tables(catalog: Catalog, spec: PipelineSpec, holder: Any = None) -> list[str]:
    """Every target table: those the configuration lists and those the holder's history names (dynamic routing).
    ``holder``: the holder table when the caller has loaded it already."""
    targets = spec.targets
    if targets.fused:
        return [targets.holder]
    holder = holder if holder is not None else load_table(catalog, targets.holder)
    return sorted(set(targets.static) | named_by_holder(holder))


def quarantine_candidates(catalog: Catalog, spec: PipelineSpec, holder: Any = None) -> list[str]:
    """The target tables that may hold a quarantined batch: a fused set's one table, or those a separate holder's
    history names as ever quarantined (``QUARANTINED_TABLES``), so that only those are loaded. ``holder``: the holder
    table when the caller has loaded it already."""
    targets = spec.targets
    if targets.fused:
        return [targets.holder]
    return sorted(ever_quarantined(holder if holder is not None else load_table(catalog, targets.holder)))


def target_spec(spec: PipelineSpec, ident: str) -> PipelineSpec:
    """The pipeline's settings for target table ``ident`` (``PipelineSpec.for_table``; a fused set's one table: the
    pipeline itself). Nothing is loaded: see ``target_view`` for a change table's id columns from its keys."""
    return spec if spec.targets.fused else spec.for_table(ident)


def target_view(spec: PipelineSpec, catalog: Catalog, ident: str) -> PipelineSpec:
    """The pipeline as target table ``ident`` sees it (its own settings: ``PipelineSpec.for_table``; a fused set's
    one table: the pipeline itself). A change table whose id columns come from the message keys gets them from
    the table's identifier fields."""
    view = target_spec(spec, ident)
    if view is not spec and view.applies_changes and not view.table.id_columns:
        view = spec.for_table(ident, load_table(catalog, ident))
        if not view.table.id_columns:
            raise TerminalError(
                f"table {ident} has no id columns: id_columns is empty and the table has no identifier fields; set its id_columns",
                table=ident,
            )
    return view


@dataclass(frozen=True)
class TargetRole:
    """One target table's part in its pipeline's batches: the per-target questions, asked of the target set once
    and answered by name (the commit, the gate's verdicts and the replay ask these, not the set's shape)."""

    table: str
    holds_offsets: bool  # the pipeline's offsets live in this table's own snapshots (a plain pipeline's one table)

    @property
    def reported_as(self) -> str | None:
        """The table an audit finding about it names: none for the pipeline's own table (the report is the
        pipeline's, named by it), its identifier for a routed pipeline's target."""
        return None if self.holds_offsets else self.table

    @property
    def carries_totals(self) -> bool:
        """Its snapshot carries the whole batch's accounting (records, skipped, dead letters) and the gate's verdict
        on the batch; another target's carries its own rows and its own verdict."""
        return self.holds_offsets

    @property
    def created_at_commit(self) -> bool:
        """A missing table is created by the batch's commit; other targets are created by the write step that
        routes records to them."""
        return self.holds_offsets

    @property
    def committed_without_rows(self) -> bool:
        """A batch with no rows for it still commits it: its snapshot is what moves the pipeline's offsets."""
        return self.holds_offsets

    @property
    def has_own_settings(self) -> bool:
        """Its settings are the pipeline's for it (``tables:``, the routing's defaults: ``PipelineSpec.for_table``),
        not the pipeline's own."""
        return not self.holds_offsets

    @property
    def keeps_own_offsets(self) -> bool:
        """Its snapshots carry its own offsets beside the holder's: records below them are already in it (a batch
        retried after this table committed drops them)."""
        return not self.holds_offsets

    @property
    def reached_by_routing(self) -> bool:
        """Records reach it by routing: it may be a table another pipeline writes, or one of the other kind (changes
        or appended rows), which the write step refuses record by record."""
        return not self.holds_offsets

    @property
    def takes_one_topic(self) -> bool:
        """As a change table it takes one topic's changes (a key's changes are ordered within one topic only);
        the pipeline's own table takes the changes of what its configuration reads."""
        return not self.holds_offsets


def target_role(spec: PipelineSpec, ident: str) -> TargetRole:
    """Target table ``ident``'s role in ``spec``'s batches. Pure: names only."""
    return TargetRole(ident, spec.targets.holds(ident))


def reported_tables(spec: PipelineSpec, tables: Iterable[str]) -> list[str]:
    """The tables of ``tables`` a report names (``TargetRole.reported_as``): all but the offsets holder, whose
    findings and batches are the pipeline's own."""
    return [t for t in tables if target_role(spec, t).reported_as]
