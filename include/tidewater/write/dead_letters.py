"""Dead letters: the raw records a batch could not decode, with where they came from and why.

They are written as data files of the pipeline's dead-letter table by the same Spark task that writes
the good rows, listed in the batch manifest, and committed right after the batch's own commit (by
batch id, so a retry never adds them twice). Records read = rows written + dead letters + skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import KafkaException, Producer

from tidewater.batch import StagedFile
from tidewater.decode.records import BadRecord
from tidewater.errors import TransientError
from tidewater.source.kafka import Chunk, client_logging, kafka_settings
from tidewater.table.own_tables import DEAD_LETTER_SCHEMA

if TYPE_CHECKING:
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

POLICIES = ("dead_letter", "fail", "skip")


def dead_letter_rows(
    chunk: Chunk, bad: list[BadRecord], batch_id: str, pipeline: str, reread: Callable[[list[int]], dict[int, Any]] | None = None
) -> pa.Table:
    """One row per bad record (error path only: a Python step per bad record).

    Keys and headers come from the chunk when it was read with them, else from ``reread`` (the bad
    records' offsets read again: the hot path does not keep keys and headers it does not need).
    """
    idx = [b.index for b in bad]
    offsets = [chunk.offsets[i] for i in idx]
    if chunk.keys is not None and chunk.headers is not None:
        meta = {chunk.offsets[i]: (chunk.keys[i], chunk.headers[i]) for i in idx}
    else:
        meta = reread(offsets) if reread is not None else {}
    keys = [meta.get(o, (None, None))[0] for o in offsets]
    headers = [[{"key": k, "value": v} for k, v in h] if (h := meta.get(o, (None, None))[1]) else None for o in offsets]
    stamps = [chunk.timestamps[i] for i in idx]
    return pa.table(
        {
            "topic": [chunk.topic] * len(idx),
            "partition": pa.array([chunk.partition] * len(idx), pa.int32()),
            "offset": pa.array(offsets, pa.int64()),
            "timestamp": pa.array([t * 1000 if t is not None and t >= 0 else None for t in stamps], pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
            "key": pa.array(keys, pa.binary()),
            "value": pa.array([chunk.values[i] for i in idx], pa.binary()),
            "headers": pa.array(headers, DEAD_LETTER_SCHEMA.field("headers").type),
            "error_class": [b.error_class for b in bad],
            "error_message": [b.message for b in bad],
            "batch_id": [batch_id] * len(idx),
            "pipeline": [pipeline] * len(idx),
        },
        schema=DEAD_LETTER_SCHEMA,
    )


# ---- the optional Kafka dead-letter topic ----------------------------------------------------------

HEADER_PREFIX = "tidewater."


def produce_to_topic(settings: dict[str, str], topic: str, table: Table, files: list[StagedFile],
                     timeout: float = 60.0) -> int:
    """Produce the dead letters in ``files`` (data files of the dead-letter table) to ``topic``.

    Each message keeps the raw key, value and headers and adds headers naming its source and error:
    ``tidewater.topic``, ``tidewater.partition``, ``tidewater.offset``, ``tidewater.timestamp``,
    ``tidewater.error.class``, ``tidewater.error.message``, ``tidewater.batch-id``, ``tidewater.pipeline``.
    Delivery is at least once: ``tidewater.batch-id`` with the source coordinates identifies duplicates.
    Raises TransientError when a message is not acknowledged.
    """
    consumer_only = ("auto.offset.reset", "fetch.", "max.partition.fetch.bytes", "queued.", "session.timeout.ms",
                     "group.", "heartbeat.", "max.poll.interval.ms", "check.crcs", "isolation.level")
    conf = {k: v for k, v in settings.items() if not k.startswith(consumer_only)}
    producer = Producer(client_logging({**conf, "enable.idempotence": True, "acks": "all", "linger.ms": 20}))
    failures: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    sent = 0
    for f in files:
        with table.io.new_input(f.file_path).open() as stream:
            rows = pq.read_table(stream)
        for r in rows.to_pylist():  # error path: dead letters are few; a Python step per record is fine
            headers = [(h["key"], h["value"]) for h in (r["headers"] or [])]
            ts = r["timestamp"]
            headers += [
                (HEADER_PREFIX + "topic", r["topic"].encode()),
                (HEADER_PREFIX + "partition", str(r["partition"]).encode()),
                (HEADER_PREFIX + "offset", str(r["offset"]).encode()),
                (HEADER_PREFIX + "timestamp", (ts.isoformat() if ts else "").encode()),
                (HEADER_PREFIX + "error.class", (r["error_class"] or "").encode()),
                (HEADER_PREFIX + "error.message", (r["error_message"] or "")[:10_000].encode()),
                (HEADER_PREFIX + "batch-id", (r["batch_id"] or "").encode()),
                (HEADER_PREFIX + "pipeline", (r["pipeline"] or "").encode()),
            ]
            while True:
                try:
                    producer.produce(topic, value=r["value"], key=r["key"], headers=headers, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.5)
            sent += 1
    try:
        remaining = producer.flush(timeout)
    except KafkaException as e:
        raise TransientError(f"dead-letter topic {topic}: {e}") from e
    if remaining or failures:
        raise TransientError(
            f"dead-letter topic {topic}: {remaining} message(s) unacknowledged after {timeout:.0f}s"
            + (f", {len(failures)} failed (first: {failures[0]})" if failures else "")
        )
    return sent


def dead_letter_sink(spec: Any, batch_id: str) -> Any:
    """The Kafka dead-letter topic as a sink for the dead-letter commit (None without ``dead_letter.topic``)."""
    if not spec.dead_letter.topic:
        return None

    topic = spec.dead_letter.topic

    def send(table: Any, files: list[Any]) -> str:
        sent = produce_to_topic(kafka_settings(spec), topic, table, files)
        log.info("batch %s: %d dead letters sent to topic %s", batch_id, sent, topic)
        return topic

    return send
