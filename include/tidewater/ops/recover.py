"""A way back when a table's offsets are gone anyway: ``tidewater recover-offsets``.

The tag ``tidewater-offsets`` keeps the newest snapshot with offsets through other tools' expiry
(``table/summary.py``). When it was removed and the snapshots expired anyway, or the table was restored from
elsewhere, planning refuses: reading the topics from the start would duplicate every row. This proposes the
offsets of each table whose offsets are unreadable from two pieces of evidence, shows both, and commits them
only when they agree or the operator confirms (never on its own when they disagree):

- **the ledger** (``audit/ledger.py``): per partition, the end of the last range a batch that moved the offsets
  recorded for the table;
- **the rows** (where the table keeps ``format.metadata``): per partition, the highest source offset among the
  table's rows, plus one (a routed pipeline's checkpoint: among all its target tables' rows).

They agree when, in every partition, no row lies at or past the ledger's offset (rows past it would be read
again) and the rows reach into the last range the ledger recorded (a missing tail means its batches' rows are
gone: rolled back, deleted). A range whose last records were all dead letters or skipped looks like a missing
tail: the operator confirms it (``--yes``). With neither a ledger nor metadata columns nothing can prove the
offsets, and nothing changes.

The recovered offsets are committed as an empty snapshot per table (``tidewater.recovered``: the evidence and
who asked), stamped with ``tidewater.offsets`` and tagged, through the one commit primitive (once: a retry finds
it); target tables before their holder, as batches do. The audit explains the recovery.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tidewater.audit import ledger
from tidewater.audit.findings import MOVING
from tidewater.batch import Offsets, new_batch_id, offsets_to_json
from tidewater.commit.primitive import Change, commit
from tidewater.config.spec import PipelineSpec
from tidewater.errors import ConfigError, TerminalError
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.provenance import metadata_columns
from tidewater.table.summary import BATCH_ID, OFFSETS, OFFSETS_TAG, PIPELINE, RECOVERED, committed_state
from tidewater.table.targets import target_role, target_spec, target_tables

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)


@dataclass
class Proposal:
    """One table's recovered offsets: what the ledger says, what its rows say, and whether they agree."""

    table: str
    ledger: Offsets
    rows: Offsets | None  # None: the table keeps no source offsets (format.metadata: none)
    last_starts: dict[str, dict[int, int]] = field(default_factory=dict)  # the ledger's last range start per partition
    disagreements: list[str] = field(default_factory=list)

    @property
    def offsets(self) -> Offsets:
        """What would be committed: the ledger's where it has any, else the rows'."""
        return self.ledger or (self.rows or {})

    @property
    def agree(self) -> bool:
        return bool(self.ledger) and self.rows is not None and not self.disagreements

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "ledger": offsets_to_json(self.ledger),
            "rows": offsets_to_json(self.rows) if self.rows is not None else None,
            "agree": self.agree,
            "disagreements": self.disagreements,
            "offsets": offsets_to_json(self.offsets),
        }


def branch_of(spec: PipelineSpec, ident: str) -> str | None:
    """The branch whose history carries ``ident``'s offsets."""
    return spec.targets.branch if target_role(spec, ident).holds_offsets else target_spec(spec, ident).table.branch


def stuck_tables(catalog: Catalog, spec: PipelineSpec) -> list[str]:
    """The pipeline's tables whose committed offsets cannot be read (target tables first, the holder last)."""
    names = [t for t in target_tables(catalog, spec) if not target_role(spec, t).holds_offsets] + [spec.targets.holder]
    out = []
    for ident in names:
        table = load_table(catalog, ident)
        try:
            if table is not None:
                committed_state(table, branch_of(spec, ident))
        except TerminalError:
            out.append(ident)
    return out


def from_ledger(entries: list[dict[str, Any]], ident: str) -> tuple[Offsets, dict[str, dict[int, int]]]:
    """Per partition, the end and the start of the last range that a batch moving offsets recorded for ``ident``."""
    ends: Offsets = {}
    starts: dict[str, dict[int, int]] = {}
    for e in entries:
        if e["table"] != ident or e["kind"] not in MOVING or e["topic"] is None:
            continue
        topic, part = e["topic"], int(e["partition"])
        if e["end_offset"] >= ends.get(topic, {}).get(part, -1):
            ends.setdefault(topic, {})[part] = int(e["end_offset"])
            starts.setdefault(topic, {})[part] = int(e["start_offset"])
    return ends, starts


def from_rows(spec: PipelineSpec, tables: list[Any]) -> Offsets | None:
    """Per partition, the highest source offset among the tables' rows, plus one (None: no metadata columns)."""
    if spec.format.metadata == "none":
        return None
    topic_col, part_col, offset_col = metadata_columns(spec)
    out: Offsets = {}
    for table in tables:
        if table is None or table.current_snapshot() is None:
            continue
        top = {c.split(".")[0] for c in (topic_col, part_col, offset_col)}
        data = table.scan(selected_fields=tuple(top)).to_arrow()
        if spec.format.metadata == "struct":
            s = data.column("_kafka").combine_chunks()
            data = pa.table({"t": s.field("topic"), "p": s.field("partition"), "o": s.field("offset")})
        else:
            data = pa.table({"t": data.column(topic_col), "p": data.column(part_col), "o": data.column(offset_col)})
        for row in data.group_by(["t", "p"]).aggregate([("o", "max")]).to_pylist():
            if row["t"] is None or row["o_max"] is None:
                continue
            cur = out.setdefault(row["t"], {}).get(int(row["p"]), 0)
            out[row["t"]][int(row["p"])] = max(cur, int(row["o_max"]) + 1)
    return out


def compare(p: Proposal) -> None:
    """Fill ``p.disagreements``: rows at or past the ledger's offset, partitions only one side knows, a missing tail."""
    if p.rows is None or not p.ledger:
        return
    for topic, parts in sorted(p.rows.items()):
        for part, reached in sorted(parts.items()):
            upto = p.ledger.get(topic, {}).get(part)
            if upto is None:
                p.disagreements.append(f"{topic}[{part}]: rows up to offset {reached - 1}, but no range in the ledger")
            elif reached > upto:
                p.disagreements.append(f"{topic}[{part}]: a row at offset {reached - 1}, past the ledger's {upto}")
    for topic, parts in sorted(p.ledger.items()):
        if topic not in p.rows:  # a routed table's ranges name every topic of its batches; it holds rows of some
            continue
        for part, upto in sorted(parts.items()):
            start = p.last_starts.get(topic, {}).get(part, 0)
            row_reach = p.rows.get(topic, {}).get(part)
            if upto > start and (row_reach is None or row_reach <= start):
                p.disagreements.append(
                    f"{topic}[{part}]: the ledger's last range [{start}, {upto}) has no rows in the "
                    "table (rolled back or deleted, or all dead letters or skipped)"
                )


def propose(spec: PipelineSpec) -> list[Proposal]:
    """A proposal per table whose offsets are unreadable (none: nothing to recover). Raises ConfigError when
    nothing can prove the offsets (no ledger entries and no metadata columns)."""
    catalog = load_catalog(spec)
    stuck = stuck_tables(catalog, spec)
    if not stuck:
        return []
    entries = ledger.read(catalog, spec).to_pylist()
    out = []
    for ident in stuck:
        ends, starts = from_ledger(entries, ident)
        holder_of_others = spec.targets.holds(ident) and not spec.targets.fused
        sources = [load_table(catalog, t) for t in target_tables(catalog, spec)] if holder_of_others else [load_table(catalog, ident)]
        p = Proposal(ident, ends, from_rows(spec, sources), starts)
        if not p.ledger and p.rows is None:
            raise ConfigError(
                f"{ident}: its offsets cannot be proven: the ledger {spec.ledger_table()} records no batch "
                "of it and its rows carry no source offsets (format.metadata: none); nothing was changed"
            )
        compare(p)
        out.append(p)
    return out


def recover(spec: PipelineSpec, by: str, dry_run: bool = False, confirmed: bool = False) -> dict[str, Any]:
    """Propose and (unless ``dry_run``) commit the recovered offsets; without ``confirmed`` only when every table's
    evidence agrees. Returns what was proposed and done."""
    proposals = propose(spec)
    doc: dict[str, Any] = {"tables": [p.to_json() for p in proposals], "status": "nothing-to-recover"}
    if not proposals:
        return doc
    agree = all(p.agree for p in proposals)
    if dry_run or not (agree or confirmed):
        doc["status"] = "dry-run" if dry_run else "refused"
        if not dry_run:
            log.warning(
                "recover-offsets: the evidence does not agree (%s); nothing committed: check it, then run "
                "again with --yes to commit the proposal",
                "; ".join(d for p in proposals for d in p.disagreements) or "a single source",
            )
        return doc
    catalog = load_catalog(spec)
    batch_id = "recover-" + new_batch_id()
    for p in proposals:
        commit_recovered(catalog, spec, p, batch_id, by, agree)
    doc.update(status="committed", batch_id=batch_id)
    return doc


def commit_recovered(catalog: Catalog, spec: PipelineSpec, p: Proposal, batch_id: str, by: str, agree: bool) -> None:
    """One table's recovered offsets as an empty snapshot, tagged (once, by batch id)."""
    branch = branch_of(spec, p.table)
    evidence = {
        "by": by,
        "agree": agree,
        "ledger": offsets_to_json(p.ledger),
        "rows": offsets_to_json(p.rows) if p.rows is not None else None,
        "disagreements": p.disagreements[:20],
    }
    props = {
        OFFSETS: json.dumps(offsets_to_json(p.offsets), separators=(",", ":")),
        BATCH_ID: batch_id,
        PIPELINE: spec.name,
        RECOVERED: json.dumps(evidence, separators=(",", ":"), sort_keys=True),
    }
    commit(
        catalog,
        p.table,
        lambda _table: Change(props, (), branch=branch, tag=OFFSETS_TAG),
        marker=batch_id,
        what=f"recover-offsets {batch_id}",
    )
    log.info(
        "recover-offsets %s: %s now holds offsets %s (%s, by %s)",
        batch_id,
        p.table,
        offsets_to_json(p.offsets),
        "ledger and rows agree" if agree else "confirmed by the operator",
        by,
    )
