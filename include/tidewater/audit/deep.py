"""The deep audit (``tidewater audit --deep``): from the tables' metadata columns, every row's source offset against
the committed ranges, the dead letters and Kafka."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tidewater.audit.findings import MOVING, Finding, finding_at
from tidewater.audit.history import dropped_batches
from tidewater.batch import PartitionRange
from tidewater.config.spec import PipelineSpec
from tidewater.errors import ConfigError
from tidewater.source.kafka import Rereader, kafka_settings, watermarks
from tidewater.table.catalog import load_table
from tidewater.table.filters import equal
from tidewater.table.letters import letters as letters_in
from tidewater.table.provenance import present_offsets
from tidewater.table.summary import quarantine_branch, quarantined_batches
from tidewater.table.targets import target_role, target_spec, target_view

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

CHECK_AT_MOST = 100_000  # missing offsets asked of Kafka per partition (beyond: reported as not checked)


def deep_findings(
    spec: PipelineSpec,
    catalog: Catalog,
    tables: dict[str, Any],
    entries: list[dict[str, Any]],
    every_table: bool = True,
    progress: Callable[[str], None] | None = None,
) -> list[Finding]:
    """From the metadata columns of ``tables`` (the pipeline's table, or a routed pipeline's targets): no (topic,
    partition, offset) twice in a table, none both a row and a dead letter (but a letter a retry resolved, which must be
    a row of an append table), and (append tables; ``every_table``:
    all of a routed pipeline's tables are in ``tables``) every offset of a committed range present as a row or a
    dead letter, or counted as skipped by its batch, or absent from Kafka (transaction markers, compaction).
    Change tables keep one row per changed key, so their check is each key once instead of each offset present; in a
    routed pipeline, so are the topics whose records go to change tables (see ``_change_topics``). ``progress``: told
    as each table's offsets are read and as the ranges are checked (about ten times over the ranges)."""
    if spec.format.metadata not in ("prefixed", "struct"):
        raise ConfigError("--deep reads each row's source offset: it needs format.metadata prefixed or struct")
    moving = [e for e in entries if e["kind"] in MOVING]
    ranges = _merged(moving)
    undecided = _not_on_main(tables, dropped_batches(entries))
    tell = progress or (lambda _: None)
    rows = _rows(spec, tables, ranges, tell)
    letters = _dead_letters(catalog, spec)
    fixed = _resolved_letters(catalog, spec)
    out = []
    for ident, table in tables.items():  # change tables: each key once
        if target_spec(spec, ident).applies_changes:
            found = _key_findings(target_view(spec, catalog, ident), table)
            out += [dataclasses.replace(f, table=target_role(spec, ident).reported_as) for f in found]
    changed = _change_topics(spec, tables)
    if changed is None or changed:
        out.append(
            Finding(
                "info",
                "deep",
                "offsets read for change tables are not checked one by one (a key keeps "
                "one row): " + ("every topic may feed one" if changed is None else ", ".join(sorted(changed))),
            )
        )
    settings = kafka_settings(spec)
    lows = {tp: low for tp, (low, _) in watermarks(settings, sorted({(r.topic, r.partition) for r in ranges})).items()}
    rereader = Rereader(settings, f"{spec.name}-audit", spec.kafka.read_timeout_seconds)
    every = max(1, len(ranges) // 10)
    try:
        for i, rng in enumerate(ranges, start=1):
            if i % every == 0 or i == len(ranges):
                tell(f"[{i}/{len(ranges)}] checked through {rng.topic}[{rng.partition}] [{rng.start}, {rng.end})")
            held = []
            for t, data in rows.items():
                mine = _offsets(data, rng)
                out += [dataclasses.replace(f, table=target_role(spec, t).reported_as) for f in _twice(mine, rng, "in the table twice")]
                held.append(np.unique(mine))
            anywhere = np.unique(np.concatenate(held)) if held else np.array([], np.int64)
            dead = _offsets(letters, rng)
            resolved = _offsets(fixed, rng)
            # a letter a retry resolved is a row now (append tables: its own; a change table may have moved on)
            out += _twice(np.intersect1d(anywhere, np.setdiff1d(np.unique(dead), resolved)), rng, "both a row and a dead letter", 0)
            one_row_per_offset = not spec.applies_changes and changed is not None and rng.topic not in changed
            if one_row_per_offset:
                out += _twice(np.setdiff1d(resolved, anywhere), rng, "resolved by a retry but no row", 0)
            if one_row_per_offset and every_table:
                seen = np.union1d(anywhere, dead)
                mine_batches = [e for e in moving if (e["topic"], e["partition"]) == (rng.topic, rng.partition)]
                out += _missing(seen, rng, mine_batches, rereader, lows.get((rng.topic, rng.partition), 0), undecided)
    finally:
        rereader.close()
    return out


def _rows(spec: PipelineSpec, tables: dict[str, Any], ranges: list[Any], tell: Callable[[str], None]) -> dict[str, Any]:
    """Each table's (topic, partition, offset) of its rows from ``ranges``, telling ``tell`` as each is read (the
    longest part of a deep audit: every row's offset column of the files that hold the ranges)."""
    rows = {}
    for t, table in tables.items():
        if table is not None:
            started = time.monotonic()
            tell(f"reading the source offsets of {t} over {len(ranges)} merged range(s) ...")
            rows[t] = present_offsets(spec, table, ranges)
            tell(f"read {len(rows[t]):,} offsets of {t} in {time.monotonic() - started:.1f} s")
    return rows


def _merged(entries: list[dict[str, Any]]) -> list[Any]:
    """The committed ranges per partition, adjacent ones merged."""
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
    if data is None or data.num_rows == 0:
        return np.array([], np.int64)
    mask = pc.and_(
        pc.and_(pc.equal(data.column("topic"), rng.topic), pc.equal(data.column("partition"), rng.partition)),
        pc.and_(pc.greater_equal(data.column("offset"), rng.start), pc.less(data.column("offset"), rng.end)),
    )
    return np.sort(data.column("offset").filter(mask).to_numpy())


def _dead_letters(catalog: Catalog, spec: PipelineSpec) -> Any:
    """(topic, partition, offset) of the pipeline's dead letters (None when it has none)."""
    dlq = load_table(catalog, spec.dead_letter_table())
    if dlq is None or dlq.current_snapshot() is None:
        return None
    data = dlq.scan(row_filter=equal("pipeline", spec.name), selected_fields=("topic", "partition", "offset")).to_arrow()
    return pa.table(
        {"topic": data.column("topic"), "partition": data.column("partition").cast(pa.int32()), "offset": data.column("offset")}
    )


def _resolved_letters(catalog: Catalog, spec: PipelineSpec) -> Any:
    """(topic, partition, offset) of the letters a retry resolved (``ops/dead_letters.py``)."""
    done = letters_in(spec, catalog, state="resolved", payload=False)
    return done.select(["topic", "partition", "offset"]) if done.num_rows else None


def _runs(values: Any) -> list[tuple[int, int]]:
    """Sorted distinct integers as [start, end) runs of consecutive values."""
    if len(values) == 0:
        return []
    breaks = np.flatnonzero(np.diff(values) != 1)
    starts = np.concatenate(([values[0]], values[breaks + 1]))
    ends = np.concatenate((values[breaks], [values[-1]])) + 1
    return list(zip(starts.tolist(), ends.tolist()))


def _twice(offsets: Any, rng: Any, what: str, more_than: int = 1) -> list[Finding]:
    """Offsets that occur more than ``more_than`` times in ``offsets`` (sorted), as ranges."""
    values, counts = np.unique(offsets, return_counts=True)
    return [Finding("error", "deep", f"offsets {what}", rng.topic, rng.partition, s, e) for s, e in _runs(values[counts > more_than])]


def _change_topics(spec: PipelineSpec, tables: dict[str, Any]) -> set[str] | None:
    """A routed pipeline's topics whose records may go to a change table (their offsets need no row of their own);
    None when any topic may (a change table without a `topics` list, as with dynamic routing)."""
    out: set[str] = set()
    listed = {t.identifier: t.topics for t in spec.tables}
    for ident in tables:  # not the pipeline's own table: whether its offsets are changes is spec.applies_changes
        if target_role(spec, ident).has_own_settings and target_spec(spec, ident).applies_changes:
            topics = listed.get(ident) or (spec.topics if len(spec.topics) == 1 and not spec.topic_pattern else None)
            if not topics:
                return None
            out |= set(topics)
    return out


def _not_on_main(tables: dict[str, Any], dropped: dict[str, Any]) -> dict[str, str]:
    """Quarantined batches whose rows are not on main by an operator's decision or while they wait for one: batch id
    -> why (dropped, recorded in the ledger; or still on its quarantine branch)."""
    out = {batch: f"a quarantined batch an operator dropped ({d.get('rows', 0)} rows)" for batch, d in dropped.items()}
    for table in (t for t in tables.values() if t is not None):
        for batch in quarantined_batches(table):
            out.setdefault(batch, f"a quarantined batch waiting on its branch {quarantine_branch(batch)}")
    return out


def _missing(found: Any, rng: Any, batches: list[dict[str, Any]], rereader: Any, low: int, undecided: dict[str, str]) -> list[Finding]:
    """Offsets of ``rng`` neither rows nor dead letters: explained by the batches' skipped counts, by the batch being
    a quarantined one that was dropped or still waits (``undecided``), or by Kafka not holding them (transaction
    markers, compaction); else lost (an error)."""
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
            out.append(finding_at("explained", "deep", f"{skipped} offsets without a row: records the batch skipped", e))
        rest = inside[skipped:] if skipped < len(inside) else inside[:0]
        if e["kind"] == "quarantine" and e["batch_id"] in undecided and len(rest):
            out.append(finding_at("explained", "deep", f"{len(rest)} offsets without a row: {undecided[e['batch_id']]}", e))
            continue
        out += _absent_from_kafka(rest, rng, e, rereader, low)
    return out


def _absent_from_kafka(offsets: Any, rng: Any, batch: dict[str, Any], rereader: Any, low: int) -> list[Finding]:
    """Ask Kafka which of ``offsets`` hold a record: those are lost rows (errors), the others never held one.
    Offsets below the log start ``low`` cannot be asked any more (retention removed them): said so."""
    out: list[Finding] = []
    if len(offsets) and offsets[0] < low:
        out.append(
            finding_at(
                "info",
                "deep",
                f"{int((offsets < low).sum())} offsets without a row could not be checked: retention removed them from Kafka",
                batch,
            )
        )
        offsets = offsets[offsets >= low]
    if len(offsets) == 0:
        return out
    asked = offsets[:CHECK_AT_MOST]
    held = np.array(sorted(rereader.fetch(rng.topic, rng.partition, asked.tolist())), dtype=np.int64)
    out += [
        Finding(
            "error",
            "deep",
            "records in Kafka with no row and no dead letter",
            rng.topic,
            rng.partition,
            s,
            e,
            batch["batch_id"],
            batch["snapshot_id"],
        )
        for s, e in _runs(held)
    ]
    never = np.setdiff1d(asked, held)
    if len(never):
        said = f"{len(never)} offsets hold" if len(never) > 1 else "1 offset holds"
        out.append(finding_at("info", "deep", f"{said} no record in Kafka (transaction markers or compaction)", batch))
    if len(offsets) > CHECK_AT_MOST:
        out.append(finding_at("info", "deep", f"{len(offsets) - CHECK_AT_MOST} more offsets without a row were not asked of Kafka", batch))
    return out


def _key_findings(spec: PipelineSpec, table: Table) -> list[Finding]:
    """Change tables: keys that have more than one row."""
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
