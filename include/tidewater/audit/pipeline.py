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

Severity ``error`` makes the audit fail (exit 1); ``explained``, ``warning`` and ``info`` do not.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime, timezone
from typing import Any

from tidewater.audit import ledger
from tidewater.audit.deep import deep_findings
from tidewater.audit.findings import AuditReport, Finding
from tidewater.audit.history import (
    accounting,
    coverage,
    decisions,
    outside_writes,
    rolled_back,
    tables_per_batch,
    target_findings,
)
from tidewater.audit.kafka import against_kafka
from tidewater.config.spec import PipelineSpec
from tidewater.errors import ConfigError
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.letters import counts as letter_counts
from tidewater.table.targets import target_tables

log = logging.getLogger(__name__)


def audit(spec: PipelineSpec, table: str | None = None, deep: bool = False) -> AuditReport:
    """Bring the ledger up to date with the tables, then check it, the tables' histories and Kafka (``deep``: and
    every row's source offset); ``table``: one target table only. The verdict is kept for the Tidewater view."""
    catalog = load_catalog(spec)
    report = audit_targets(spec, catalog, table, deep)
    errors = [f.text() for f in report.findings if f.severity == "error"]
    verdict = {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "deep": deep, "clean": report.clean,
               "batches": report.batches, "errors": len(errors), "first": errors[:5], "table": report.table}
    try:
        ledger.save_verdict(catalog, spec, verdict)
    except Exception as e:  # noqa: BLE001 - the verdict is for the view; the audit's answer stands without it
        log.warning("the audit's verdict was not kept for the Tidewater view: %s", e)
    return report


def letter_findings(spec: PipelineSpec, catalog: Any) -> list[Finding]:
    """The dead letters and what became of them (``tidewater dead-letters``): retried letters resolved are rows now,
    dropped ones given up; a retry under way (claimed, no outcome: killed) is a warning until the next retry ends it."""
    n = letter_counts(spec, catalog)
    if not n["total"]:
        return []
    out = [Finding("info", "dead-letters", f"{n['total']} dead letters: {n['open']} open, {n['resolved']} resolved by "
                   f"retries, {n['skipped']} skipped by retries, {n['dropped']} dropped")]
    if n["retrying"]:
        out.append(Finding("warning", "dead-letters", f"{n['retrying']} dead letters claimed by a retry that did not "
                           "finish: the next `tidewater dead-letters retry` finishes it"))
    return out


def audit_targets(spec: PipelineSpec, catalog: Any, only: str | None, deep: bool) -> AuditReport:
    """Coverage, accounting and Kafka from the holder's batches; per target table (every one, or ``only``) the
    writes outside Tidewater and, for tables of a separate holder, the holder's batches against the table's commits.
    ``deep``: each table's rows once per offset, and (all tables audited) every offset of a committed range a row
    of some table, a dead letter, skipped, or absent from Kafka."""
    targets, holder_ident = spec.targets, spec.targets.holder
    known = target_tables(catalog, spec)
    if only is not None and only not in known:
        raise ConfigError(f"--table: {only!r} is not one of this pipeline's target tables "
                          f"({', '.join(known) or 'none committed yet'})")
    ledger.sync(catalog, spec)
    entries = ledger.read(catalog, spec).to_pylist()
    holder = load_table(catalog, holder_ident)
    mine, undone = rolled_back(holder, targets.branch, [e for e in entries if e["table"] == holder_ident])
    audited = [only] if only else known
    report = AuditReport(spec.name, only or holder_ident, len({e["batch_id"] for e in mine}),
                         tables=[] if targets.fused else audited)
    report.findings += undone + coverage(mine) + accounting(mine, "rows" if targets.fused else "records routed")
    report.findings += decisions(entries) + letter_findings(spec, catalog)
    wrote = tables_per_batch(holder) if not targets.fused else {}
    tables = {t: holder if targets.holds(t) else load_table(catalog, t) for t in audited}
    for t, target in tables.items():
        if targets.holds(t):  # a fused table: its batches are the holder's, checked above
            report.findings += outside_writes(target) if target is not None else []
            continue
        found = target_findings(t, [e for e in entries if e["table"] == t], mine, wrote)
        found += outside_writes(target) if target is not None else []
        report.findings += [dataclasses.replace(f, table=t) for f in found]
    findings, report.partitions = against_kafka(spec, holder)
    report.findings += findings
    if deep:
        report.findings += deep_findings(spec, catalog, tables, mine, every_table=only is None)
    return report
