"""What an Airflow backfill run of the ingest DAG does for its data interval (see ``plan_backfill``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidewater.batch import BACKFILL_PREFIX, BatchPlan, Mode, PartitionRange, new_batch_id
from tidewater.config.spec import PipelineSpec
from tidewater.config.times import parse_time
from tidewater.errors import ConfigError
from tidewater.plan.replay import replay_tables, stage_replay_plan
from tidewater.source.kafka import kafka_settings, list_partitions, resolve_topics
from tidewater.source.timestamps import KafkaOffsetLookup, OffsetLookup, interval_offsets
from tidewater.table.catalog import load_catalog
from tidewater.table.summary import DATA_INTERVAL, RANGES, REPLAY, summary_dict
from tidewater.table.targets import holder_state

if TYPE_CHECKING:
    from pyiceberg.table import Table

log = logging.getLogger(__name__)


def committed_intervals(table: Table) -> dict[str, list[list[Any]]]:
    """Data interval ("start/end") -> ranges, from the ingest batches the table's history records."""
    out: dict[str, list[list[Any]]] = {}
    for snap in table.metadata.snapshots:
        props = summary_dict(snap)
        if DATA_INTERVAL in props and RANGES in props and REPLAY not in props:
            out.setdefault(props[DATA_INTERVAL], []).extend(json.loads(props[RANGES]))
    return out


def plan_backfill(
    spec: PipelineSpec, data_interval: tuple[str, str], reprocess: bool = False, lookup: OffsetLookup | None = None
) -> tuple[BatchPlan | None, Path | None]:
    """What an Airflow backfill run of the ingest DAG does for its data interval.

    - The interval was committed by an ingest batch (its ranges are in the snapshot summary): nothing,
      or with ``reprocess`` a ``replace`` replay of exactly those ranges.
    - It was never ingested: the interval is mapped to offsets with Kafka's timestamp lookup, clipped to
      the committed offsets (later records are the scheduled batches'), and replayed with
      ``append-missing`` (``replace`` with ``reprocess``).

    The intervals and offsets are the offsets holder's (a routed pipeline's checkpoint table); change tables are
    reapplied (``batch.Mode.for_table``), append tables get the mode above.
    """
    key = "/".join(data_interval)
    catalog = load_catalog(spec)
    table, state = holder_state(catalog, spec)  # each target table is checked below
    if table is None or state is None:
        log.info("backfill %s: the table does not exist yet; the scheduled runs ingest from the log start", key)
        return None, None
    known = committed_intervals(table)
    if key in known:
        if not reprocess:
            log.info("backfill %s: already committed (ranges %s); nothing to do (set reprocess to re-ingest it)", key, known[key])
            return None, None
        ranges = [PartitionRange(t, int(p), int(s), int(e)) for t, p, s, e in known[key] if int(e) > int(s)]
        mode = Mode.REPLACE
    else:
        settings = kafka_settings(spec)
        lookup = lookup or KafkaOffsetLookup(settings)
        start_ms, end_ms = parse_time(data_interval[0], "data_interval_start"), parse_time(data_interval[1], "data_interval_end")
        ranges = []
        parts = list_partitions(settings, resolve_topics(settings, spec))
        for topic in sorted({t for t, _ in parts}):
            partitions = [p for t, p in parts if t == topic]
            for p, (lo, hi) in sorted(interval_offsets(lookup, topic, partitions, start_ms, end_ms).items()):
                upto = state.offsets.get(topic, {}).get(p)
                if upto is not None and min(hi, upto) > lo:
                    ranges.append(PartitionRange(topic, p, lo, min(hi, upto)))
        mode = Mode.REPLACE if reprocess else Mode.APPEND_MISSING
        if not ranges:
            log.info("backfill %s: no committed records in the interval (later records are the scheduled runs' to ingest)", key)
            return None, None
    if spec.format.metadata == "none":
        raise ConfigError(
            f"format.metadata: the backfill of {key} needs rows that carry their source offsets (format.metadata prefixed or struct)"
        )
    replay_tables(spec, catalog, (), table)  # every target table's rows must carry their offsets
    log.info("backfill %s: %s over %s", key, mode, ", ".join(f"{r.topic}[{r.partition}] [{r.start}, {r.end})" for r in ranges))
    return stage_replay_plan(
        spec, ranges, mode, state.offsets, state.snapshot_id, data_interval=data_interval, batch_id=BACKFILL_PREFIX + new_batch_id()
    )
