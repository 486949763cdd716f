"""Is the table exactly its topic? The audit, from the ledger (``table/ledger.py``), the table's history and Kafka.

Findings, each naming topic, partition and offset range, with the batch and snapshot at fault:

- **coverage**: per partition, the ranges of the batches that moved the offsets (ingest, change, operator skip,
  quarantine), sorted: each starts where the previous ended. A gap (offsets never committed) or an overlap
  (offsets committed twice) is an error; a range an operator skipped (dead-lettered, see ``ops/skip.py``) or a
  quarantined batch is reported as explained. Replays re-read committed ranges and are listed, not counted.
- **accounting**: for every appending batch, records read = rows + dead letters + skipped.
- **writes outside Tidewater**: a snapshot of the table that added or removed rows without a batch id (an
  append by another tool, a hand-made delete) while it is still in the history.
- **against Kafka now**: a committed offset below the log start (records deleted by retention before they were
  read: an error) or beyond the log end (the topic was recreated: an error); the lag, for information.

- **deep** (``--deep``, from the metadata columns): see :func:`deep_findings`.

- **routed pipelines**: the checks above on the checkpoint table's batches, and per target table the batches the
  checkpoint committed with rows for it (see :func:`audit_routed`).

Severity ``error`` makes the audit fail (exit 1); ``explained``, ``warning`` and ``info`` do not.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from tidewater.config.spec import PipelineSpec
from tidewater.errors import ConfigError
from tidewater.table.summary import CHANGES

log = logging.getLogger(__name__)

MOVING = ("ingest", "change", "skip", "quarantine")  # kinds of batch that move the committed offsets


@dataclass(frozen=True)
class Finding:
    severity: str  # error, warning, explained, info
    check: str  # coverage, accounting, outside-write, kafka, routed, deep
    message: str
    topic: str | None = None
    partition: int | None = None
    start: int | None = None
    end: int | None = None
    batch_id: str | None = None
    snapshot_id: int | None = None
    table: str | None = None  # routed pipelines: the target table at fault

    def text(self) -> str:
        where = f"{self.topic}[{self.partition}] [{self.start}, {self.end}) " if self.topic is not None else ""
        where = f"{self.table}: {where}" if self.table else where
        at = f" (batch {self.batch_id}, snapshot {self.snapshot_id})" if self.batch_id else (
            f" (snapshot {self.snapshot_id})" if self.snapshot_id else "")
        return f"{self.severity:<9} {self.check:<13} {where}{self.message}{at}"


@dataclass
class AuditReport:
    pipeline: str
    table: str
    batches: int
    findings: list[Finding] = field(default_factory=list)
    partitions: list[dict[str, Any]] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)  # routed pipelines: the target tables audited

    @property
    def clean(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "table": self.table, "tables": self.tables, "clean": self.clean,
                "batches": self.batches,
                "partitions": self.partitions, "findings": [asdict(f) for f in self.findings]}


def audit(spec: PipelineSpec, table: str | None = None, deep: bool = False) -> AuditReport:
    """Bring the ledger up to date with the table, then check it, the table's history and Kafka (``deep``: and
    every row's source offset, see :func:`deep_findings`). Routed pipelines: see :func:`audit_routed`."""
    from tidewater.table import ledger
    from tidewater.table.catalog import load_catalog

    catalog = load_catalog(spec)
    report = audit_routed(spec, catalog, table, deep) if spec.routed else _audit_table(spec, catalog, table, deep)
    errors = [f.text() for f in report.findings if f.severity == "error"]
    verdict = {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "deep": deep, "clean": report.clean,
               "batches": report.batches, "errors": len(errors), "first": errors[:5], "table": report.table}
    try:
        ledger.save_verdict(catalog, spec, verdict)
    except Exception as e:  # noqa: BLE001 - the verdict is for the view; the audit's answer stands without it
        log.warning("the audit's verdict was not kept for the Tidewater view: %s", e)
    return report


def _audit_table(spec: PipelineSpec, catalog: Any, table: str | None, deep: bool) -> AuditReport:
    from tidewater.table import ledger
    from tidewater.table.catalog import load_table

    if table not in (None, spec.table.identifier):
        raise ConfigError(f"--table: {table!r} is not this pipeline's table {spec.table.identifier!r}")
    ledger.sync(catalog, spec)
    entries = ledger.read(catalog, spec).to_pylist()
    report = AuditReport(spec.name, spec.table.identifier, len({e["batch_id"] for e in entries}))
    report.findings += coverage(entries) + accounting(entries)
    target = load_table(catalog, spec.table.identifier)
    if target is not None:
        report.findings += outside_writes(target)
    findings, report.partitions = against_kafka(spec, target)
    report.findings += findings
    if deep:
        report.findings += deep_findings(spec, catalog, {spec.table.identifier: target}, entries)
    return report


def audit_routed(spec: PipelineSpec, catalog: Any, only: str | None, deep: bool) -> AuditReport:
    """A routed pipeline: coverage, accounting (records read = records routed + dead letters + skipped) and Kafka
    from its checkpoint table's batches; per target table (every one, or ``only``): each batch the checkpoint says
    wrote rows to it has its commit there with the rows its writer counted, and no write outside Tidewater.
    ``deep``: each table's rows once per offset, and (all tables audited) every offset of a committed range a row of
    some table, a dead letter, skipped, or absent from Kafka."""
    from tidewater.ops.status import target_tables
    from tidewater.table import ledger
    from tidewater.table.catalog import load_table

    targets = target_tables(spec, catalog)
    if only is not None and only not in targets:
        raise ConfigError(f"--table: {only!r} is not one of this pipeline's target tables "
                          f"({', '.join(targets) or 'none committed yet'})")
    ledger.sync(catalog, spec)
    cp_ident = spec.checkpoint_table()
    entries = ledger.read(catalog, spec).to_pylist()
    mine = [e for e in entries if e["table"] == cp_ident]
    report = AuditReport(spec.name, only or cp_ident, len({e["batch_id"] for e in mine}), tables=[only] if only else targets)
    report.findings += coverage(mine) + accounting(mine, "records routed")
    checkpoint = load_table(catalog, cp_ident)
    wrote = _tables_per_batch(checkpoint)
    tables = {t: load_table(catalog, t) for t in ([only] if only else targets)}
    for t, target in tables.items():
        found = routed_table_findings(t, [e for e in entries if e["table"] == t], mine, wrote)
        found += outside_writes(target) if target is not None else []
        report.findings += [dataclasses.replace(f, table=t) for f in found]
    findings, report.partitions = against_kafka(spec, checkpoint)
    report.findings += findings
    if deep:
        report.findings += deep_findings(spec, catalog, tables, mine, every_table=only is None)
    return report


def _tables_per_batch(checkpoint: Any) -> dict[str, list[str]]:
    """The checkpoint table's rows (they outlive its snapshots): batch id -> the tables it committed rows to."""
    if checkpoint is None or checkpoint.current_snapshot() is None:
        return {}
    data = checkpoint.scan(selected_fields=("batch_id", "tables")).to_arrow()
    return {b: json.loads(t or "[]") for b, t in zip(data.column("batch_id").to_pylist(), data.column("tables").to_pylist())}


def routed_table_findings(ident: str, entries: list[dict[str, Any]], checkpoint: list[dict[str, Any]],
                          wrote: dict[str, list[str]]) -> list[Finding]:
    """One target table of a routed pipeline against the checkpoint's batches: a batch the checkpoint committed
    with rows for the table but the table lacks (its rows are lost: an error); rows committed that are not those
    the writer counted (an error); a batch in the table the checkpoint never committed (explained: its checkpoint
    commit failed, and the next batch, planned from the checkpoint, left out the records this table held)."""
    out: list[Finding] = []
    own = {e["batch_id"]: e for e in entries}
    committed = {e["batch_id"]: e for e in checkpoint}
    for batch_id, e in committed.items():
        if ident in wrote.get(batch_id, []) and batch_id not in own:
            out.append(Finding("error", "routed", "the checkpoint committed this batch with rows for the table, but "
                               "the table has no commit of it: those rows are missing", batch_id=batch_id,
                               snapshot_id=e["snapshot_id"]))
    for batch_id, e in own.items():
        if e["kind"] == "quarantine":  # its rows wait on the branch (published later as their own commit)
            out.append(_at("explained", "routed", "quarantined: the rows are on the quarantine branch "
                           f"{_detail(e).get('tidewater.quarantined', '')}", e))
            continue
        applied, what = _applied(e, "rows committed")
        if e["rows"] is not None and applied != e["records"]:
            out.append(Finding("error", "accounting", f"{what} {applied} != rows the writer routed to the "
                               f"table {e['records']}", batch_id=batch_id, snapshot_id=e["snapshot_id"]))
        if batch_id not in committed:
            out.append(Finding("explained", "routed", "committed to this table while the batch's checkpoint commit "
                               "failed; the next batch left out the records the table held", batch_id=batch_id,
                               snapshot_id=e["snapshot_id"]))
    return out


CHECK_AT_MOST = 100_000  # missing offsets asked of Kafka per partition (beyond: reported as not checked)


def deep_findings(spec: PipelineSpec, catalog: Any, tables: dict[str, Any], entries: list[dict[str, Any]],
                  every_table: bool = True) -> list[Finding]:
    """From the metadata columns of ``tables`` (the pipeline's table, or a routed pipeline's targets): no (topic,
    partition, offset) twice in a table, none both a row and a dead letter, and (append tables; ``every_table``:
    all of a routed pipeline's tables are in ``tables``) every offset of a committed range present as a row or a
    dead letter, or counted as skipped by its batch, or absent from Kafka (transaction markers, compaction).
    Change tables keep one row per changed key, so their check is each key once instead of each offset present."""
    import numpy as np

    from tidewater.source.kafka import Rereader, kafka_settings, watermarks
    from tidewater.table.provenance import present_offsets

    if spec.format.metadata not in ("prefixed", "struct"):
        raise ConfigError("--deep reads each row's source offset: it needs format.metadata prefixed or struct")
    moving = [e for e in entries if e["kind"] in MOVING]
    ranges = _merged(moving)
    rows = {t: present_offsets(spec, table, ranges) for t, table in tables.items() if table is not None}
    letters = _dead_letters(catalog, spec)
    out = _key_findings(spec, tables.get(spec.table.identifier)) if spec.applies_changes else []
    settings = kafka_settings(spec)
    lows = {tp: low for tp, (low, _) in watermarks(settings, sorted({(r.topic, r.partition) for r in ranges})).items()}
    rereader = Rereader(settings, f"{spec.name}-audit", spec.kafka.read_timeout_seconds)
    named = spec.routed  # a routed pipeline's findings name their table
    try:
        for rng in ranges:
            held = []
            for t, data in rows.items():
                mine = _offsets(data, rng)
                out += [dataclasses.replace(f, table=t if named else None) for f in _twice(mine, rng, "in the table twice")]
                held.append(np.unique(mine))
            anywhere = np.unique(np.concatenate(held)) if held else np.array([], np.int64)
            dead = _offsets(letters, rng)
            out += _twice(np.intersect1d(anywhere, np.unique(dead)), rng, "both a row and a dead letter", 0)
            if not spec.applies_changes and every_table:
                found = np.union1d(anywhere, dead)
                mine_batches = [e for e in moving if (e["topic"], e["partition"]) == (rng.topic, rng.partition)]
                out += _missing(found, rng, mine_batches, rereader, lows.get((rng.topic, rng.partition), 0))
    finally:
        rereader.close()
    return out


def _merged(entries: list[dict[str, Any]]) -> list[Any]:
    """The committed ranges per partition, adjacent ones merged."""
    from tidewater.batch import PartitionRange

    out: list[Any] = []
    for e in sorted(entries, key=lambda e: (e["topic"], e["partition"], e["start_offset"])):
        last = out[-1] if out else None
        if last is not None and (last.topic, last.partition) == (e["topic"], e["partition"]) and e["start_offset"] <= last.end:
            out[-1] = PartitionRange(last.topic, last.partition, last.start, max(last.end, e["end_offset"]))
        else:
            out.append(PartitionRange(e["topic"], e["partition"], e["start_offset"], e["end_offset"]))
    return out


def _offsets(data: Any, rng: Any) -> Any:
    """The offsets ``data`` (topic, partition, offset columns) holds in ``rng``, sorted, as a numpy array."""
    import numpy as np
    import pyarrow.compute as pc

    if data is None or data.num_rows == 0:
        return np.array([], np.int64)
    mask = pc.and_(pc.and_(pc.equal(data.column("topic"), rng.topic), pc.equal(data.column("partition"), rng.partition)),
                   pc.and_(pc.greater_equal(data.column("offset"), rng.start), pc.less(data.column("offset"), rng.end)))
    return np.sort(data.column("offset").filter(mask).to_numpy())


def _dead_letters(catalog: Any, spec: PipelineSpec) -> Any:
    """(topic, partition, offset) of the pipeline's dead letters (None when it has none)."""
    import pyarrow as pa
    from pyiceberg.expressions import EqualTo

    from tidewater.table.catalog import load_table

    dlq = load_table(catalog, spec.dead_letter_table())
    if dlq is None or dlq.current_snapshot() is None:
        return None
    data = dlq.scan(row_filter=EqualTo("pipeline", spec.name), selected_fields=("topic", "partition", "offset")).to_arrow()
    return pa.table({"topic": data.column("topic"), "partition": data.column("partition").cast(pa.int32()),
                     "offset": data.column("offset")})


def _runs(values: Any) -> list[tuple[int, int]]:
    """Sorted distinct integers as [start, end) runs of consecutive values."""
    import numpy as np

    if len(values) == 0:
        return []
    breaks = np.flatnonzero(np.diff(values) != 1)
    starts = np.concatenate(([values[0]], values[breaks + 1]))
    ends = np.concatenate((values[breaks], [values[-1]])) + 1
    return list(zip(starts.tolist(), ends.tolist()))


def _twice(offsets: Any, rng: Any, what: str, more_than: int = 1) -> list[Finding]:
    """Offsets that occur more than ``more_than`` times in ``offsets`` (sorted), as ranges."""
    import numpy as np

    values, counts = np.unique(offsets, return_counts=True)
    return [Finding("error", "deep", f"offsets {what}", rng.topic, rng.partition, s, e)
            for s, e in _runs(values[counts > more_than])]


def _missing(found: Any, rng: Any, batches: list[dict[str, Any]], rereader: Any, low: int) -> list[Finding]:
    """Offsets of ``rng`` neither rows nor dead letters: explained by the batches' skipped counts, or by Kafka not
    holding them (transaction markers, compaction); else lost (an error)."""
    import numpy as np

    expected = np.arange(rng.start, rng.end, dtype=np.int64)
    gone = np.setdiff1d(expected, found, assume_unique=True)
    if len(gone) == 0:
        return []
    allowance = {e["batch_id"]: e["skipped"] for e in batches}
    out: list[Finding] = []
    for e in sorted(batches, key=lambda e: e["start_offset"]):
        inside = gone[(gone >= e["start_offset"]) & (gone < e["end_offset"])]
        skipped = min(len(inside), allowance.get(e["batch_id"], 0))
        allowance[e["batch_id"]] = allowance.get(e["batch_id"], 0) - skipped
        if skipped:
            out.append(_at("explained", "deep", f"{skipped} offsets without a row: records the batch skipped", e))
        rest = inside[skipped:] if skipped < len(inside) else inside[:0]
        out += _absent_from_kafka(rest, rng, e, rereader, low)
    return out


def _absent_from_kafka(offsets: Any, rng: Any, batch: dict[str, Any], rereader: Any, low: int) -> list[Finding]:
    """Ask Kafka which of ``offsets`` hold a record: those are lost rows (errors), the others never held one.
    Offsets below the log start ``low`` cannot be asked any more (retention removed them): said so."""
    import numpy as np

    out: list[Finding] = []
    if len(offsets) and offsets[0] < low:
        out.append(_at("info", "deep", f"{int((offsets < low).sum())} offsets without a row could not be checked: "
                       "retention removed them from Kafka", batch))
        offsets = offsets[offsets >= low]
    if len(offsets) == 0:
        return out
    asked = offsets[:CHECK_AT_MOST]
    held = np.array(sorted(rereader.fetch(rng.topic, rng.partition, asked.tolist())), dtype=np.int64)
    out += [Finding("error", "deep", "records in Kafka with no row and no dead letter", rng.topic, rng.partition, s, e,
                   batch["batch_id"], batch["snapshot_id"]) for s, e in _runs(held)]
    never = np.setdiff1d(asked, held)
    if len(never):
        said = f"{len(never)} offsets hold" if len(never) > 1 else "1 offset holds"
        out.append(_at("info", "deep", f"{said} no record in Kafka (transaction markers or compaction)", batch))
    if len(offsets) > CHECK_AT_MOST:
        out.append(_at("info", "deep", f"{len(offsets) - CHECK_AT_MOST} more offsets without a row were not asked of "
                       "Kafka", batch))
    return out


def _key_findings(spec: PipelineSpec, table: Any) -> list[Finding]:
    """Change tables: keys that have more than one row."""
    import pyarrow as pa

    keys = list(spec.table.id_columns or [])
    if table is None or not keys or table.current_snapshot() is None:
        return []
    data = table.scan(selected_fields=tuple(keys)).to_arrow()
    counts = data.group_by(keys).aggregate([([], "count_all")])
    twice = counts.filter(pa.compute.greater(counts.column("count_all"), 1))
    out = []
    for row in twice.slice(0, 100).to_pylist():
        n = row.pop("count_all")
        out.append(Finding("error", "deep", f"key {row} has {n} rows"))
    return out


def coverage(entries: list[dict[str, Any]]) -> list[Finding]:
    """Gaps and overlaps between the ranges of the batches that moved each partition's offsets."""
    out: list[Finding] = []
    by_partition: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for e in entries:
        if e["kind"] in MOVING:
            by_partition[(e["topic"], e["partition"])].append(e)
        elif e["kind"] == "replay":
            out.append(_at("info", "coverage", f"replayed ({_detail(e).get('tidewater.replay', '')})", e))
    for (topic, part), ranges in sorted(by_partition.items()):
        ranges.sort(key=lambda e: (e["start_offset"], e["end_offset"]))
        for prev, cur in zip(ranges, ranges[1:]):
            if cur["start_offset"] > prev["end_offset"]:
                out.append(Finding("error", "coverage", f"offsets never committed: between batch {prev['batch_id']} "
                                   "and the next", topic, part, prev["end_offset"], cur["start_offset"], cur["batch_id"],
                                   cur["snapshot_id"]))
            elif cur["start_offset"] < prev["end_offset"]:
                out.append(Finding("error", "coverage", f"offsets committed twice: also by batch {prev['batch_id']}",
                                   topic, part, cur["start_offset"], min(prev["end_offset"], cur["end_offset"]),
                                   cur["batch_id"], cur["snapshot_id"]))
        for e in ranges:
            if e["kind"] == "skip":
                request = json.loads(_detail(e).get("tidewater.operator-skip", "{}"))
                out.append(_at("explained", "coverage", f"skipped by {request.get('by', '?')}: "
                               f"{request.get('reason', '')} (its records are in the dead-letter table)", e))
            elif e["kind"] == "quarantine":
                out.append(_at("explained", "coverage", "quarantined: the rows are on the quarantine branch "
                               f"{_detail(e).get('tidewater.quarantined', '')}", e))
    return out


# what each change record did (commit/changes.py): a truncate, and each change it superseded, count once too
CHANGE_EFFECTS = ("inserted", "updated", "deleted", "noop", "truncated", "superseded")


def _applied(e: dict[str, Any], rows_are: str) -> tuple[int, str]:
    """What a ledger entry's batch made of its records: its rows, or for a change batch the change records
    applied (inserted + updated + deleted + no-op deletes, each record once: the rows it added are only the new
    row images); with its name for a finding."""
    if e["kind"] == "change":
        effects = json.loads(_detail(e).get(CHANGES, "{}"))
        return sum(int(effects.get(k, 0)) for k in CHANGE_EFFECTS), "changes applied"
    return e["rows"], rows_are


def accounting(entries: list[dict[str, Any]], rows_are: str = "rows") -> list[Finding]:
    """Batches whose records read are not rows + dead letters + skipped; for change batches, not the change
    records applied (inserted + updated + deleted + no-op deletes, each record once) + dead letters + skipped.
    A routed pipeline's checkpoint counts as rows the records routed to at least one table (``rows_are``); a
    checkpoint commit made before that count was recorded is left out."""
    out, seen = [], set()
    for e in entries:
        if e["kind"] not in ("ingest", "skip", "change") or e["batch_id"] in seen or e["rows"] is None:
            continue
        seen.add(e["batch_id"])
        applied, what = _applied(e, rows_are)
        if e["records"] != applied + e["dead_letters"] + e["skipped"]:
            out.append(Finding("error", "accounting", f"records read {e['records']} != {what} {applied} + dead "
                               f"letters {e['dead_letters']} + skipped {e['skipped']}", batch_id=e["batch_id"],
                               snapshot_id=e["snapshot_id"]))
    return out


def outside_writes(table: Any) -> list[Finding]:
    """Snapshots still in the table's history that changed rows without a Tidewater batch id."""
    from tidewater.table.summary import BATCH_ID, BRANCH_BASE, PUBLISHED, QUARANTINE_OF, REPLAY, TRUNCATE, summary_dict

    out = []
    for snap in table.metadata.snapshots:
        props = summary_dict(snap)
        operation = snap.summary.operation.value if snap.summary is not None else "?"
        # ours (a replay's delete carries its replay, a truncate's its truncate, a quarantined batch's branch and
        # its publication the batch id as `quarantine-of` and `published`, not the batch id), or compaction
        # (replace keeps the rows)
        ours = (BATCH_ID, REPLAY, BRANCH_BASE, TRUNCATE, PUBLISHED, QUARANTINE_OF)
        if any(k in props for k in ours) or operation == "replace":
            continue
        added, removed = int(props.get("added-records", 0)), int(props.get("deleted-records", 0))
        if added or removed:
            out.append(Finding("error", "outside-write", f"{operation} made outside Tidewater: {added} rows added, "
                               f"{removed} removed", snapshot_id=snap.snapshot_id))
    return out


def against_kafka(spec: PipelineSpec, table: Any) -> tuple[list[Finding], list[dict[str, Any]]]:
    """The committed offsets against each partition's log start and end now."""
    from tidewater.source.kafka import kafka_settings, list_partitions, watermarks
    from tidewater.table.summary import committed_state

    committed = committed_state(table).offsets if table is not None else {}
    settings = kafka_settings(spec)
    topics = sorted(set(spec.topics or []) | set(committed))
    findings, parts = kafka_findings(committed, watermarks(settings, list_partitions(settings, topics)))
    return findings + retention_findings(settings, parts), parts


RETENTION_WARNING = 0.8  # warn once the unread records have used this share of what retention allows them


def retention_findings(settings: dict[str, str], parts: list[dict[str, Any]], now_ms: int | None = None
                       ) -> list[Finding]:
    """Warnings for partitions whose unread records retention will delete before they are ingested, at the lag
    of now: the oldest unread record's age against ``retention.ms``, and the unread share of the retained log
    against ``retention.bytes`` (its size, in records); only where cleanup.policy deletes. A compacted topic
    with unread records gets a note (compaction may remove superseded ones first). A topic whose settings cannot
    be read is reported as not checked (info), never as clean."""
    import time

    lagging = [p for p in parts if p["lag"]]
    if not lagging:
        return []
    try:
        cleanup = topic_cleanup(settings, sorted({p["topic"] for p in lagging}))
    except Exception as e:  # noqa: BLE001 - a broker that refuses DescribeConfigs: said, not fatal
        return [Finding("info", "kafka", f"retention settings not read ({e}): lag beyond retention not checked")]
    configs = {t: (ms, size) for t, (ms, size, _, _) in cleanup.items()}
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    oldest = oldest_unread(settings, [p for p in lagging if configs.get(p["topic"], (-1, -1))[0] > 0])
    out = []
    for p in lagging:
        ms, size = configs.get(p["topic"], (-1, -1))
        where = (p["topic"], p["partition"], p["committed"], p["log_end"])
        ts = oldest.get((p["topic"], p["partition"]))
        if ms > 0 and ts is not None and now_ms - ts >= RETENTION_WARNING * ms:
            left = max(ms - (now_ms - ts), 0)
            out.append(Finding("warning", "kafka", f"lag beyond retention: the oldest unread record is "
                               f"{(now_ms - ts) / 3_600_000:.1f} h old and retention.ms is {ms / 3_600_000:.1f} h; "
                               f"unread records are deleted within {left / 3_600_000:.1f} h unless ingested", *where))
        retained = p["log_end"] - p["log_start"]
        if size > 0 and retained and p["lag"] / retained >= RETENTION_WARNING:
            out.append(Finding("warning", "kafka", f"lag beyond retention: {p['lag']} unread records are "
                               f"{100 * p['lag'] / retained:.0f}% of the partition's retained log (retention.bytes "
                               f"{size}); as the log grows, the oldest unread ones are deleted first", *where))
        compacted, lag_ms = cleanup.get(p["topic"], (-1, -1, False, 0))[2:]
        if compacted:
            out.append(Finding("info", "kafka", "compacted topic (cleanup.policy compact): an unread record that a "
                               f"later record of its key supersedes may be removed before it is read (after "
                               f"min.compaction.lag.ms {lag_ms}); the deep audit reports such offsets as holding no "
                               "record", *where))
    return out


def topic_cleanup(settings: dict[str, str], topics: list[str], timeout: float = 15.0
                  ) -> dict[str, tuple[int, int, bool, int]]:
    """(retention.ms, retention.bytes, compacted, min.compaction.lag.ms) per topic as the broker reports them;
    the retention settings are -1 (unlimited) unless cleanup.policy includes ``delete``."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    from tidewater.source.kafka import client_logging

    admin = AdminClient(client_logging(dict(settings)))
    futures = admin.describe_configs([ConfigResource("topic", t) for t in topics], request_timeout=timeout)
    out = {}
    for resource, future in futures.items():
        config = future.result(timeout)
        value = {k: config[k].value for k in ("retention.ms", "retention.bytes", "cleanup.policy",
                                              "min.compaction.lag.ms") if k in config}
        policy = {p.strip() for p in (value.get("cleanup.policy") or "delete").split(",")}
        deletes = "delete" in policy
        out[resource.name] = (int(value.get("retention.ms") or -1) if deletes else -1,
                              int(value.get("retention.bytes") or -1) if deletes else -1,
                              "compact" in policy, int(value.get("min.compaction.lag.ms") or 0))
    return out


def oldest_unread(settings: dict[str, str], parts: list[dict[str, Any]], timeout: float = 10.0
                  ) -> dict[tuple[str, int], int]:
    """The timestamp (ms) of the record at each partition's committed offset: the oldest one not yet read."""
    from confluent_kafka import TopicPartition as KTP

    from tidewater.source.kafka import new_consumer

    if not parts:
        return {}
    consumer = new_consumer(settings, "audit-retention")
    out: dict[tuple[str, int], int] = {}
    try:
        for p in parts:  # one record per lagging partition: few, and each needs its own position
            consumer.assign([KTP(p["topic"], p["partition"], p["committed"])])
            msg = consumer.consume(1, timeout)
            if msg and msg[0].error() is None and msg[0].timestamp()[1] > 0:
                out[(p["topic"], p["partition"])] = msg[0].timestamp()[1]
    finally:
        consumer.close()
    return out


def kafka_findings(committed: dict[str, dict[int, int]], marks: dict[tuple[str, int], tuple[int, int]]
                   ) -> tuple[list[Finding], list[dict[str, Any]]]:
    """Findings and per-partition positions from the committed offsets and (log start, log end) per partition."""
    out, parts = [], []
    for (topic, part), (low, high) in sorted(marks.items()):
        at = committed.get(topic, {}).get(part)
        parts.append({"topic": topic, "partition": part, "committed": at, "log_start": low, "log_end": high,
                      "lag": None if at is None else max(high - at, 0)})
        if at is None:
            continue
        if at < low:
            out.append(Finding("error", "kafka", "deleted by retention before they were read", topic, part, at, low))
        elif at > high:
            out.append(Finding("error", "kafka", f"committed offset is beyond the log end {high} (was the topic "
                               "recreated?)", topic, part, high, at))
    return out, parts


def _detail(e: dict[str, Any]) -> dict[str, str]:
    return json.loads(e["detail"]) if e.get("detail") else {}


def _at(severity: str, check: str, message: str, e: dict[str, Any]) -> Finding:
    return Finding(severity, check, message, e["topic"], e["partition"], e["start_offset"], e["end_offset"],
                   e["batch_id"], e["snapshot_id"])
