"""Is every table exactly its topics? The audit of a pipeline, from its ledger (``audit/ledger.py``), its tables'
histories and Kafka. Findings, each naming topic, partition and offset range, with the batch and snapshot at fault:

- **coverage**: per partition, the ranges of the offsets holder's batches that moved the offsets (ingest, change,
  operator skip, quarantine), sorted: each starts where the previous ended (batches another tool rolled back are
  explained and left out: their records were read again). A gap (offsets never committed) or an
  overlap (offsets committed twice) is an error; a range an operator skipped (dead-lettered, see ``ops/skip.py``)
  or a quarantined batch is reported as explained. Replays re-read committed ranges and are listed, not counted.
- **accounting**: for every appending batch, records read = rows + dead letters + skipped (a separate holder's:
  records routed to at least one table + dead letters + skipped).
- **target tables** of a separate holder (a routed pipeline's checkpoint): each batch the holder says wrote rows
  to a table has its commit there with the rows its writer counted (``audit/history.py``).
- **writes outside Tidewater**: a snapshot of a table that added or removed rows without a batch id (an append by
  another tool, a hand-made delete) while it is still in the history.
- **against Kafka now** (``audit/kafka.py``): a committed offset below the log start or beyond the log end; the lag.
- **dead letters**: how many are open, resolved by retries and dropped (``ops/dead_letters.py``); a retry that did
  not finish is a warning.
- **deep** (``--deep``, from the metadata columns): see ``audit/deep.py``.

An audit checks the batches committed since the last clean audit (``audit/mark.py``); ``--full`` checks every batch
in the ledger. Kafka, the writes outside Tidewater still in the tables' histories and the dead letters are checked
whole each time (they cost the same whatever the history).

Severity ``error`` makes the audit fail (exit 1); ``explained``, ``warning`` and ``info`` do not.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from tidewater.audit import ledger
from tidewater.audit.deep import deep_findings
from tidewater.audit.findings import AuditReport, Finding
from tidewater.audit.history import (
    REWRITES,
    accounting,
    coverage,
    decisions,
    operation_of,
    outside_writes,
    rewritten_since,
    rolled_back,
    tables_per_batch,
    target_findings,
)
from tidewater.audit.kafka import against_kafka
from tidewater.audit.mark import ends_of, mark_of, next_mark, since
from tidewater.config.spec import PipelineSpec
from tidewater.errors import ConfigError
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.letters import counts as letter_counts
from tidewater.table.summary import RECOVERED, summary_dict
from tidewater.table.targets import reported_tables, target_role, target_tables

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)


def audit(
    spec: PipelineSpec, table: str | None = None, deep: bool = False, full: bool = False, progress: Callable[[str], None] | None = None
) -> AuditReport:
    """Bring the ledger up to date with the tables, then check it, the tables' histories and Kafka (``deep``: and
    every row's source offset); ``table``: one target table only; ``full``: every batch, not only those since the
    last clean audit. The verdict, with the mark the next audit starts from, is kept for the Tidewater view.
    ``progress``: told of the deep audit's steps (it reads every row's offset of the batches it checks)."""
    catalog = load_catalog(spec)
    previous = ledger.last_verdict(catalog, spec)
    mark, why = (None, None) if full else _usable_mark(catalog, mark_of(previous, deep), deep)
    report = audit_targets(spec, catalog, table, deep, mark, progress)
    report.findings += [why] if why else []
    errors = [f.text() for f in report.findings if f.severity == "error"]
    verdict = {
        "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "deep": deep,
        "clean": report.clean,
        "batches": report.batches,
        "errors": len(errors),
        "first": errors[:5],
        "table": report.table,
        "since": report.since,
        **_marks(previous, report, deep, whole=table is None),
    }
    try:
        ledger.save_verdict(catalog, spec, verdict)
    except Exception as e:  # noqa: BLE001 - the verdict is for the view; the audit's answer stands without it
        log.warning("the audit's verdict was not kept for the Tidewater view: %s", e)
    return report


def _usable_mark(catalog: Catalog, mark: dict[str, Any] | None, deep: bool) -> tuple[dict[str, Any] | None, Finding | None]:
    """The mark to audit from, unless a table was rewritten since it: every batch is checked again (None, and a
    finding saying why). For a deep audit, any rewrite (``audit.history.rewritten_since``: a write outside Tidewater,
    a compaction, a replay, a retry, a quarantine decision ...) may have changed rows of the batches checked before;
    the other checks read the ledger, and only recovered offsets change what its earlier entries mean."""
    for ident, after in (mark or {}).get("at", {}).items():
        table = load_table(catalog, ident)
        snap = rewritten_since(table, after, None if deep else (RECOVERED,)) if table is not None else None
        if snap is not None:
            return None, Finding(
                "info",
                "deep" if deep else "coverage",
                f"every batch checked: {ident} was rewritten "
                f"since the last clean audit ({operation_of(snap)} snapshot {snap.snapshot_id}: "
                f"{_what(snap)})",
            )
    return mark, None


def _what(snap: Any) -> str:
    props = summary_dict(snap)
    done = [k.removeprefix("tidewater.") for k in REWRITES if k in props]
    return f"Tidewater's {done[0]}" if done else "not a Tidewater batch"


def _marks(previous: dict[str, Any] | None, report: AuditReport, deep: bool, whole: bool) -> dict[str, Any]:
    """The marks the verdict keeps: a clean audit of every table moves the mark (a deep one the deep mark too);
    otherwise the previous marks stay."""
    kept = {k: (previous or {}).get(k) for k in ("mark", "deep_mark")}
    if report.clean and whole and report.mark is not None:
        kept["mark"] = report.mark
        if deep:
            kept["deep_mark"] = report.mark
    return {k: v for k, v in kept.items() if v is not None}


def letter_findings(spec: PipelineSpec, catalog: Catalog) -> list[Finding]:
    """The dead letters and what became of them (``tidewater dead-letters``): retried letters resolved are rows now,
    dropped ones given up; a retry under way (claimed, no outcome: killed) is a warning until the next retry ends it."""
    n = letter_counts(spec, catalog)
    if not n["total"]:
        return []
    out = [
        Finding(
            "info",
            "dead-letters",
            f"{n['total']} dead letters: {n['open']} open, {n['resolved']} resolved by "
            f"retries, {n['skipped']} skipped by retries, {n['dropped']} dropped",
        )
    ]
    if n["retrying"]:
        out.append(
            Finding(
                "warning",
                "dead-letters",
                f"{n['retrying']} dead letters claimed by a retry that did not finish: the next `tidewater dead-letters retry` finishes it",
            )
        )
    return out


def audit_targets(
    spec: PipelineSpec,
    catalog: Catalog,
    only: str | None,
    deep: bool,
    mark: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> AuditReport:
    """Coverage, accounting and Kafka from the holder's batches; per target table (every one, or ``only``) the
    writes outside Tidewater and, for tables of a separate holder, the holder's batches against the table's commits.
    ``deep``: each table's rows once per offset, and (all tables audited) every offset of a committed range a row
    of some table, a dead letter, skipped, or absent from Kafka. ``mark``: only the batches since it (see
    ``audit/mark.py``; None: every batch)."""
    targets, holder_ident = spec.targets, spec.targets.holder
    known = target_tables(catalog, spec)
    if only is not None and only not in known:
        raise ConfigError(f"--table: {only!r} is not one of this pipeline's target tables ({', '.join(known) or 'none committed yet'})")
    ledger.sync(catalog, spec)
    everything = ledger.read(catalog, spec)
    entries = since(everything, mark, holder_ident).to_pylist()
    holder = load_table(catalog, holder_ident)
    mine, undone = rolled_back(holder, targets.branch, [e for e in entries if e["table"] == holder_ident])
    audited = [only] if only else known
    report = AuditReport(
        spec.name,
        only or holder_ident,
        len({e["batch_id"] for e in mine}),
        tables=reported_tables(spec, audited),
        since=_mark_time(mark, holder_ident),
        mark=next_mark(everything, mine, holder_ident, mark),
    )
    report.findings += undone + coverage(mine, ends_of(mark)) + accounting(mine, targets.holder_rows)
    report.findings += decisions(entries) + letter_findings(spec, catalog)
    tables = {t: holder if target_role(spec, t).holds_offsets else load_table(catalog, t) for t in audited}
    wrote: dict[str, list[str]] | None = None  # the holder's record of the tables each batch wrote, read once
    for t, target in tables.items():
        if target_role(spec, t).holds_offsets:  # the pipeline's own table: its batches are the holder's, checked above
            report.findings += outside_writes(target) if target is not None else []
            continue
        wrote = tables_per_batch(holder) if wrote is None else wrote
        found = target_findings(t, [e for e in entries if e["table"] == t], mine, wrote)
        found += outside_writes(target) if target is not None else []
        report.findings += [dataclasses.replace(f, table=t) for f in found]
    findings, report.partitions = against_kafka(spec, holder)
    report.findings += findings
    if deep:
        report.findings += deep_findings(spec, catalog, tables, mine, every_table=only is None, progress=progress)
    return report


def _mark_time(mark: dict[str, Any] | None, holder: str) -> str | None:
    """When the batches the mark's audit checked ended (the holder's newest commit then), for the report."""
    at = (mark or {}).get("at", {}).get(holder)
    return datetime.fromtimestamp(at / 1e6, tz=timezone.utc).isoformat(timespec="seconds") if at is not None else None
