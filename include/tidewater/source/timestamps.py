"""Kafka's timestamp-to-offset lookup (ListOffsets by time), as replays and backfills of time ranges need it."""

from __future__ import annotations

from typing import Protocol

from confluent_kafka import TopicPartition as KTP

from tidewater.errors import TransientError
from tidewater.source.kafka import new_consumer, watermarks


class OffsetLookup(Protocol):
    """Kafka's ListOffsets by time (librdkafka ``offsets_for_times``), as replay needs it."""

    def offsets_for_times(self, topic: str, partitions: list[int], ms: int) -> dict[int, int]: ...


class KafkaOffsetLookup:
    """The real lookup: the earliest offset whose timestamp is at or after ``ms`` (the end offset when
    there is none)."""

    def __init__(self, settings: dict[str, str]) -> None:
        self.settings = settings

    def offsets_for_times(self, topic: str, partitions: list[int], ms: int) -> dict[int, int]:
        consumer = new_consumer(self.settings, "offsets-for-times")
        try:
            found = consumer.offsets_for_times([KTP(topic, p, ms) for p in partitions], timeout=15)
        except Exception as e:  # noqa: BLE001 - librdkafka's errors: the broker unreachable
            raise TransientError(f"offsets_for_times failed: {e}", topic=topic) from None
        finally:
            consumer.close()
        bad = next((tp for tp in found if tp.error is not None or tp.offset < -1), None)
        if bad is not None:  # an error, or no answer (-1001: the leader moving); -1 alone means "no such record"
            raise TransientError(
                f"offsets_for_times failed: {bad.error or f'no offset ({bad.offset})'}", topic=topic, partition=bad.partition
            )
        ends = watermarks(self.settings, [(topic, p) for p in partitions])
        return {tp.partition: (tp.offset if tp.offset >= 0 else ends[(topic, tp.partition)][1]) for tp in found}


def interval_offsets(lookup: OffsetLookup, topic: str, partitions: list[int], start_ms: int, end_ms: int) -> dict[int, tuple[int, int]]:
    """[first offset at or after start, first offset at or after end) per partition."""
    lo = lookup.offsets_for_times(topic, partitions, start_ms)
    hi = lookup.offsets_for_times(topic, partitions, end_ms)
    return {p: (lo[p], max(lo[p], hi[p])) for p in partitions}
