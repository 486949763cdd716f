"""What waits in Kafka for the next batch: records, an estimate of their bytes, the oldest one's age.

Read cheaply, without Spark: the committed offsets from the table's snapshot summary, the end offsets
from the broker, and at most one record per partition (the first pending one: its timestamp and size).
The lag trigger (``runtime/triggers.py``) starts a batch when a threshold of ``trigger.*`` is exceeded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import TopicPartition as KTP

from tidewater.config.spec import PipelineSpec
from tidewater.source.kafka import kafka_settings, list_partitions, new_consumer, resolve_topics, watermarks
from tidewater.table.catalog import load_catalog
from tidewater.table.targets import holder_state


@dataclass(frozen=True)
class Pending:
    records: int
    bytes_estimate: int  # pending records x the mean size of the first pending record of each partition
    oldest_ms: int | None  # Kafka timestamp of the oldest first-pending record
    committed: dict[str, dict[int, int]]

    def age_seconds(self, now_ms: int | None = None) -> float | None:
        now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
        return None if self.oldest_ms is None else (now_ms - self.oldest_ms) / 1000

    def exceeded(self, spec: PipelineSpec) -> str | None:
        """Why a batch should start now (the first threshold exceeded), or None."""
        t = spec.trigger
        if t.pending_records is not None and self.records > t.pending_records:
            return f"{self.records} pending records > trigger.pending_records {t.pending_records}"
        if t.pending_bytes is not None and self.bytes_estimate > t.pending_bytes:
            return f"about {self.bytes_estimate} pending bytes > trigger.pending_bytes {t.pending_bytes}"
        age = self.age_seconds()
        if t.max_age_seconds is not None and self.records and age is not None and age > t.max_age_seconds:
            return f"oldest pending record {age:.0f}s old > trigger.max_age_seconds {t.max_age_seconds:g}"
        return None


def _first_pending(settings: dict[str, str], starts: dict[tuple[str, int], int]) -> list[Any]:
    """The first pending record of each partition (one consumer, one record each)."""
    if not starts:
        return []
    consumer = new_consumer(settings, "tidewater-pending")
    try:
        consumer.assign([KTP(t, p, o) for (t, p), o in starts.items()])
        seen: dict[tuple[str, int], Any] = {}
        deadline = time.monotonic() + 10
        while len(seen) < len(starts) and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=len(starts), timeout=1.0):
                if m.error() is None and (m.topic(), m.partition()) not in seen:
                    seen[(m.topic(), m.partition())] = m
                    consumer.pause([KTP(m.topic(), m.partition())])
        return list(seen.values())
    finally:
        consumer.close()


def pending(spec: PipelineSpec) -> Pending:
    _, state = holder_state(load_catalog(spec), spec)
    committed = state.offsets if state is not None else {}
    settings = kafka_settings(spec)
    wm = watermarks(settings, list_partitions(settings, resolve_topics(settings, spec)))
    starts = {}
    for (topic, part), (low, high) in wm.items():
        start = committed.get(topic, {}).get(part, low)
        if high > start:
            starts[(topic, part)] = max(start, low)
    records = sum(wm[k][1] - s for k, s in starts.items())
    firsts = _first_pending(settings, starts) if (spec.trigger.pending_bytes or spec.trigger.max_age_seconds) else []
    sizes = [len(m.value() or b"") + len(m.key() or b"") for m in firsts]
    stamps = [m.timestamp()[1] for m in firsts if m.timestamp()[1] > 0]
    return Pending(
        records,
        int(records * sum(sizes) / len(sizes)) if sizes else 0,
        min(stamps) if stamps else None,
        {t: dict(ps) for t, ps in committed.items()},
    )
