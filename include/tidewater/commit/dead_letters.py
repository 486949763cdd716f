"""The dead-letter table's commit of a batch: its own snapshot, once, marked with the batch id; and the optional
Kafka dead-letter topic the letters are sent to first (``dead_letter.topic``).

Called on every commit attempt of the batch (also when the batch was already committed), so a failure
between the batch's commit and this one is repaired by retrying the commit step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq
from confluent_kafka import KafkaError, KafkaException, Producer

from tidewater.batch import BatchManifest, BatchPlan, StagedFile
from tidewater.commit.primitive import Change, commit
from tidewater.errors import ConfigError, TerminalError, TransientError
from tidewater.source.kafka import client_logging, kafka_settings
from tidewater.table.letters import totals_after
from tidewater.table.summary import BATCH_ID, DEAD_LETTER_TOPIC, PIPELINE, RECORDS

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

# Sends a batch's dead-letter files to the Kafka dead-letter topic; returns the topic's name.
DeadLetterSink = Callable[[Any, list[StagedFile]], str]


def commit_dead_letters(
    catalog: Catalog, plan: BatchPlan, manifest: BatchManifest, sink: DeadLetterSink | None = None, max_attempts: int = 8
) -> None:
    """Append the batch's dead-letter files, once: after the batch's own commit, idempotent by batch id; the same
    commit keeps the table's count of each pipeline's letters (``table.letters.KEPT_TOTALS``).

    ``sink`` (the Kafka dead-letter topic) gets the files before the dead-letter commit, which records
    that it did: a retry after that commit never sends them again; a failure between the two sends them
    again (at least once).
    """
    if not manifest.dead_letter_files:
        return
    ident = manifest.dead_letter_table
    if ident is None:
        raise TerminalError(
            f"batch {plan.batch_id} wrote {len(manifest.dead_letter_files)} dead-letter file(s) but names no dead-letter table"
        )
    sent: dict[str, str] = {}  # sent once per call, whatever the commit attempts

    def prepare(table: Any) -> Change:
        props = {BATCH_ID: plan.batch_id, PIPELINE: plan.pipeline, RECORDS: str(manifest.dead_letters)}
        if sink is not None and DEAD_LETTER_TOPIC not in sent:
            sent[DEAD_LETTER_TOPIC] = sink(table, list(manifest.dead_letter_files))
        added = sum(f.record_count for f in manifest.dead_letter_files)
        return Change({**props, **sent}, manifest.dead_letter_files, set_properties=totals_after(table, plan.pipeline, added))

    try:
        done = commit(
            catalog, ident, prepare, marker=plan.batch_id, what=f"batch {plan.batch_id} (dead letters)", max_attempts=max_attempts
        )
    except TransientError:
        raise TransientError(
            "the batch is committed but its dead letters are not yet; retry the commit step", table=ident, batch_id=plan.batch_id
        ) from None
    if done.status == "committed":
        log.info("batch %s: %d dead letters committed to %s", plan.batch_id, manifest.dead_letters, ident)


# ---- the optional Kafka dead-letter topic ----------------------------------------------------------

HEADER_PREFIX = "tidewater."


def produce_to_topic(settings: dict[str, str], topic: str, table: Table, files: list[StagedFile], timeout: float = 60.0) -> int:
    """Produce the dead letters in ``files`` (data files of the dead-letter table) to ``topic``.

    Each message keeps the raw key, value and headers and adds headers naming its source and error:
    ``tidewater.topic``, ``tidewater.partition``, ``tidewater.offset``, ``tidewater.timestamp``,
    ``tidewater.error.class``, ``tidewater.error.message``, ``tidewater.batch-id``, ``tidewater.pipeline``.
    Delivery is at least once: ``tidewater.batch-id`` with the source coordinates identifies duplicates.
    Raises TransientError when a message is not acknowledged, ConfigError when the broker refuses the pipeline's
    principal the topic (an ACL to grant: retrying cannot help until it is).
    """
    consumer_only = (
        "auto.offset.reset",
        "fetch.",
        "max.partition.fetch.bytes",
        "queued.",
        "session.timeout.ms",
        "group.",
        "heartbeat.",
        "max.poll.interval.ms",
        "check.crcs",
        "isolation.level",
    )
    conf = {k: v for k, v in settings.items() if not k.startswith(consumer_only)}
    producer = Producer(client_logging({**conf, "enable.idempotence": True, "acks": "all", "linger.ms": 20}))
    failures: list[Any] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(err)

    sent = 0
    try:
        for f in files:
            sent += _produce_file(producer, topic, table, f, delivered)
        remaining = producer.flush(timeout)
    # A fatal client error (the idempotent producer refused its producer id) is raised by flush; confluent-kafka
    # raises it as the SystemError of the delivery callback that ran beside it, the KafkaException as its cause.
    except (KafkaException, SystemError) as e:
        kafka_error = _kafka_error(e)
        if kafka_error is None:
            raise
        failures.append(kafka_error)
        remaining = len(producer)  # still queued: the client stopped
    refused = [f for f in failures if f.code() in _REFUSALS]
    if refused:
        raise ConfigError(
            f"dead_letter.topic: the broker refused to take the dead letters on topic '{topic}' "
            f"({refused[0].str()}): the pipeline's principal needs Describe and Write on that topic "
            "(docs/reference/kafka.md); the batch's rows are committed, its dead letters not yet: grant "
            "the ACL, then retry the commit step"
        )
    if remaining or failures:
        raise TransientError(
            f"dead-letter topic {topic}: {remaining} message(s) unacknowledged after {timeout:.0f}s"
            + (f", {len(failures)} failed (first: {failures[0]})" if failures else "")
        )
    return sent


def _produce_file(producer: Producer, topic: str, table: Table, f: StagedFile, delivered: Callable) -> int:
    """Queue the dead letters of one staged file, each with the headers naming its source and error."""
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
    return rows.num_rows


def _kafka_error(e: BaseException | None) -> KafkaError | None:
    """The KafkaError in ``e`` or in the exceptions it was raised from."""
    while e is not None:
        if isinstance(e, KafkaException) and e.args and isinstance(e.args[0], KafkaError):
            return e.args[0]
        e = e.__cause__ or e.__context__
    return None


# a delivery error that names a missing permission, not a passing fault
_REFUSALS = (
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
)


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
