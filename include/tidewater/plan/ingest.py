"""Planning the next ingest batch: committed offsets from the table, end offsets from Kafka, the pure
planner in between; the plan is staged as JSON before Spark starts.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidewater.batch import (
    PLAN_NAME,
    BatchPlan,
    Offsets,
    TopicPartition,
    batch_dir,
    utc_now_iso,
    write_json_atomic,
)
from tidewater.config.spec import PipelineSpec
from tidewater.config.times import parse_time
from tidewater.errors import TerminalError
from tidewater.plan.planner import plan_ranges
from tidewater.source import kafka  # called through the module: the broker's answers are one seam (stand-ins in tests)
from tidewater.source.timestamps import KafkaOffsetLookup
from tidewater.staging import read_json, write_json
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import quarantined_batches
from tidewater.table.targets import holder_state, quarantine_candidates, target_role, target_spec

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)

# ---- plan ------------------------------------------------------------------------------------------


def refuse_while_quarantined(spec: PipelineSpec, table: Any) -> None:
    """A change table's next batch waits for its quarantined one: its changes come first (publish applies them
    in order, drop discards them); planning past it would apply later changes before them."""
    waiting = quarantined_batches(table)
    if waiting:
        which = f" --table {spec.table.identifier}" if spec.routed_from is not None else ""
        raise TerminalError(
            f"batch {waiting[0]} of change table {spec.table.identifier} is quarantined: publish or drop "
            f"it first (`tidewater quarantine publish|drop{which} --batch {waiting[0]}`, or the quarantine_"
            f"{spec.name} DAG); the next batch's changes must follow it",
            table=spec.table.identifier,
        )


def refuse_while_a_change_table_is_quarantined(spec: PipelineSpec, catalog: Catalog, holder: Any) -> None:
    """The next batch waits while one of the pipeline's change tables has a quarantined batch (its changes come
    first); an append table's quarantined batch holds nothing up. Only the tables that may hold one are loaded
    (``table.targets.quarantine_candidates``)."""
    for ident in quarantine_candidates(catalog, spec, holder):
        view = target_spec(spec, ident)
        table = (holder if target_role(spec, ident).holds_offsets else load_table(catalog, ident)) if view.applies_changes else None
        if table is not None:
            refuse_while_quarantined(view, table)


START_PIN = "start-offsets.json"  # `kafka.start_from: latest`'s pinned starts, in <staging>/<pipeline>/


def first_offsets(
    spec: PipelineSpec, settings: dict[str, str], committed: Offsets, watermarks: dict[TopicPartition, tuple[int, int]]
) -> dict[TopicPartition, int]:
    """Where the partitions without committed offsets start under ``kafka.start_from`` (none asked for
    ``earliest``: the planner starts them at their log start). ``watermarks``: (log start, log end) per partition."""
    if spec.kafka.start_from == "earliest":
        return {}
    new = [(t, p) for t, p in watermarks if p not in committed.get(t, {})]
    if not new:
        return {}
    out: dict[TopicPartition, int] = {}
    if spec.kafka.start_from == "latest":
        out = pinned_starts(spec, new, watermarks, committed)
    else:
        ms = parse_time(spec.kafka.start_from, "kafka.start_from")
        lookup = KafkaOffsetLookup(settings)
        for topic in sorted({t for t, _ in new}):
            found = lookup.offsets_for_times(topic, sorted(p for t, p in new if t == topic), ms)
            out.update({(topic, p): o for p, o in found.items()})
    log.info(
        "pipeline %s: partitions without committed offsets start at %s (kafka.start_from): %s",
        spec.name,
        spec.kafka.start_from,
        ", ".join(f"{t}[{p}] {o}" for (t, p), o in sorted(out.items())),
    )
    return out


def pinned_starts(
    spec: PipelineSpec, new: list[TopicPartition], watermarks: dict[TopicPartition, tuple[int, int]], committed: Offsets
) -> dict[TopicPartition, int]:
    """``kafka.start_from: latest``: the log end each of a topic's partitions had when a plan of this pipeline
    first saw the topic, pinned in the staging area (``<staging>/<pipeline>/start-offsets.json``, written before
    the plan is) and read by every later plan, so that records produced between an empty plan and the next are
    never skipped. A pipeline's offsets live in its table, and a plan without records commits nothing: without
    the pin, "the log end" would move with every plan until the first batch committed.

    A partition of a pinned topic that the pin does not hold (the topic gained it later) starts at its log start:
    all its records came after the pipeline went live; so does a new partition of a topic the table already holds
    offsets of (a pipeline that started ``earliest`` or at a time). A topic first seen later (a new ``topics``
    entry, a topic a ``topic_pattern`` picks up) is pinned at its log end then.

    Two first plans at once (the ingest DAG plans one batch at a time; by hand, two ``tidewater run`` started
    together) each write a pin, and every plan after them reads the one written last: no record is read twice (the
    table's offsets decide once a batch commits), and what arrived between the two pins is not read, as with any
    start at "now"."""
    path = spec.staging_dir() / spec.name / START_PIN
    doc: dict[str, Any] = read_json(path) if path.is_file() else {"pipeline": spec.name, "offsets": {}}
    pinned: dict[str, dict[str, int]] = doc["offsets"]
    unseen = sorted({t for t, _ in new} - set(pinned) - set(committed))  # a committed topic is not new
    if unseen:
        for topic in unseen:
            pinned[topic] = {str(p): high for (t, p), (_, high) in sorted(watermarks.items()) if t == topic}
            log.info("pipeline %s: topic %s pinned at its log end (kafka.start_from: latest): %s", spec.name, topic, pinned[topic])
        pinned_at = {**doc.get("pinned_at", {}), **dict.fromkeys(unseen, utc_now_iso())}
        write_json(path, {**doc, "offsets": pinned, "pinned_at": pinned_at})
        pinned = read_json(path)["offsets"]  # what every later plan reads (see the race above)
    return {(t, p): int(pinned.get(t, {}).get(str(p), watermarks[(t, p)][0])) for t, p in new}


def plan_batch(spec: PipelineSpec, data_interval: tuple[str, str] | None = None) -> tuple[BatchPlan, Path | None]:
    """Plan the next batch from the table's committed offsets and the brokers' end offsets.

    An empty plan is not staged (returns path None): nothing to do, no Spark start.
    """
    catalog = load_catalog(spec)
    table, state = holder_state(catalog, spec)
    committed = state.offsets if state else {}
    if table is not None:
        refuse_while_a_change_table_is_quarantined(spec, catalog, table)
    settings = kafka.kafka_settings(spec)
    parts = kafka.list_partitions(settings, kafka.resolve_topics(settings, spec))
    wm = kafka.watermarks(settings, parts)
    ranges = plan_ranges(committed, wm, spec.batch.max_records, first_offsets(spec, settings, committed, wm))
    plan = BatchPlan.new(spec, ranges, committed, state.snapshot_id if state else None, data_interval=data_interval)
    if plan.is_empty:
        log.info("pipeline %s: nothing to ingest (%d partitions caught up)", spec.name, len(parts))
        return plan, None
    path = batch_dir(spec.staging_dir(), spec.name, plan.batch_id) / PLAN_NAME
    write_json_atomic(path, plan.to_json())
    log.info(
        "pipeline %s: planned batch %s: %d offsets over %d partitions -> %s",
        spec.name,
        plan.batch_id,
        plan.record_span,
        len(plan.ranges),
        spec.describe_targets(),
    )
    for r in plan.ranges:
        log.info("  %s[%d] [%d, %d) %d", r.topic, r.partition, r.start, r.end, r.size)
    return plan, path
