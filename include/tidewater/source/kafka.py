"""Reading Kafka: connection settings, partition discovery, watermarks, and exact offset-range reads.

No consumer group is used for progress: partitions are assigned explicitly and positioned at exact
offsets; offsets are never committed to Kafka (the Iceberg table is the source of truth).
Reads use ``isolation.level=read_committed`` so aborted transactional records are not ingested.
"""

from __future__ import annotations

import logging
import re
import time
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, Message
from confluent_kafka import TopicPartition as KTP
from confluent_kafka.admin import AdminClient

from tidewater.batch import PartitionRange, TopicPartition
from tidewater.config.locations import KAFKA_CONFIG_ENV
from tidewater.config.secrets import redact
from tidewater.config.spec import PipelineSpec
from tidewater.errors import ConfigError, KafkaReadError, TransientError

log = logging.getLogger(__name__)


class RateLimit(logging.Filter):
    """Lets through at most ``burst`` records of one kind per ``window`` seconds, then one line saying
    how many were held back. librdkafka repeats the same failure (a refused connection, an
    authentication error) every few milliseconds per broker and thread; the kind is the message with
    its numbers blanked out, so attempts that differ only in timings count as one."""

    def __init__(self, burst: int = 3, window: float = 30.0) -> None:
        super().__init__()
        self.burst, self.window = burst, window
        self._seen: dict[str, list[float]] = {}  # kind -> [window start, passed, held back]

    def filter(self, record: logging.LogRecord) -> bool:
        kind = re.sub(r"\d+", "#", record.getMessage())[:300]
        now = time.monotonic()
        state = self._seen.get(kind)
        if state is None or now - state[0] > self.window:
            if state is not None and state[2]:
                record.msg = f"{record.msg} ({int(state[2])} similar messages held back in the last {self.window:.0f}s)"
            self._seen[kind] = [now, 1, 0]
            return True
        if state[1] < self.burst:
            state[1] += 1
            return True
        state[2] += 1
        return False


# librdkafka's own log (connection failures, authentication errors), through Python logging, rate-limited.
LIBRDKAFKA_LOG = logging.getLogger("tidewater.librdkafka")
LIBRDKAFKA_LOG.addFilter(RateLimit())


def client_logging(conf: dict[str, Any]) -> dict[str, Any]:
    """A librdkafka client configuration whose log goes to ``tidewater.librdkafka`` (rate-limited)
    instead of straight to stderr."""
    return {**conf, "logger": LIBRDKAFKA_LOG}


# Consumer settings that reached several hundred thousand small records per second in one process.
THROUGHPUT_DEFAULTS = {
    "fetch.queue.backoff.ms": "0",
    "queued.min.messages": "1000000",
    "max.partition.fetch.bytes": "10485760",
    "fetch.max.bytes": "104857600",
}


CONSUME_BATCH = 10_000


def kafka_settings(spec: PipelineSpec) -> dict[str, str]:
    """librdkafka settings for the pipeline (with secrets; never log the result without ``redact``).

    Precedence: ``$TIDEWATER_KAFKA_CONFIG`` (JSON, set by the ingest DAG for its Spark job), then the
    Airflow connection ``kafka.conn_id``, then ``kafka.bootstrap_servers``; ``kafka.settings`` always apply.
    """
    from tidewater.config.connections import from_env

    given = from_env(KAFKA_CONFIG_ENV)
    if given is not None:
        return given
    settings: dict[str, str] = {}
    if spec.kafka.conn_id:
        settings.update(_settings_from_airflow_connection(spec.kafka.conn_id))
    if spec.kafka.bootstrap_servers:
        settings["bootstrap.servers"] = spec.kafka.bootstrap_servers
    settings.update(spec.kafka.settings)
    if "bootstrap.servers" not in settings:
        raise ConfigError("kafka: no bootstrap servers (set kafka.bootstrap_servers or a connection host)")
    return settings


def _settings_from_airflow_connection(conn_id: str) -> dict[str, str]:
    from tidewater.config.connections import airflow_connection

    conn = airflow_connection(conn_id, "kafka.conn_id")
    out: dict[str, str] = {}
    if conn.host:
        hosts = conn.host
        out["bootstrap.servers"] = f"{hosts}:{conn.port}" if conn.port and "," not in hosts else hosts
    extra = conn.extra_dejson or {}
    for k, v in extra.items():
        if k == "bootstrap.servers" or "." in k:
            out[k] = str(v)
    if conn.login:
        out.setdefault("sasl.username", conn.login)
    if conn.password:
        out.setdefault("sasl.password", conn.password)
    return out


def consumer_config(settings: dict[str, str], client_id: str) -> dict[str, Any]:
    conf: dict[str, Any] = dict(THROUGHPUT_DEFAULTS)
    conf.update(settings)
    conf.update(
        {
            # librdkafka requires a group id; it is never joined (assign) and nothing is committed.
            "group.id": f"tidewater-{client_id}",
            "client.id": f"tidewater-{client_id}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "auto.offset.reset": "error",
        }
    )
    return conf


class Refusals:
    """librdkafka's error callback on a metadata or admin client: keeps the first authentication failure (a wrong
    password, an unknown user). A metadata or offsets request that fails for that reason raises only a transport
    error; the reason reaches the callback when the client is polled (``refused``)."""

    def __init__(self) -> None:
        self.error: Any = None

    def __call__(self, err: Any) -> None:
        if self.error is None and err.code() == KafkaError._AUTHENTICATION:
            self.error = err


class _MetadataConsumer(Consumer):
    """A consumer that asks metadata only (never assigned), with its ``Refusals``."""

    refusals: Refusals


class _Admin(AdminClient):
    """An admin client (metadata and offsets only), with its ``Refusals``."""

    refusals: Refusals


def new_consumer(settings: dict[str, str], client_id: str, metadata_only: bool = False) -> Any:
    """A consumer on the pipeline's settings. ``metadata_only``: one that is never assigned, whose authentication
    failures are kept for ``refused`` (a reading consumer's errors come with the records it consumes)."""
    conf = client_logging(consumer_config(settings, client_id))
    refusals = Refusals() if metadata_only else None
    try:
        if refusals is None:
            return Consumer(conf)
        consumer = _MetadataConsumer({**conf, "error_cb": refusals})
    except Exception as e:  # noqa: BLE001 - librdkafka's configuration errors (KafkaException, TypeError, ValueError)
        raise ConfigError(f"kafka.settings: librdkafka rejected the configuration: {e}") from None
    consumer.refusals = refusals
    return consumer


def refused(client: Any, settings: dict[str, str]) -> None:
    """ConfigError (terminal: a wrong password stays wrong) when the brokers refused ``client``'s credentials; to call
    where a request of a metadata consumer or an admin client failed. Polls the client (nothing is consumed: it is
    never assigned) so that librdkafka serves the error callback."""
    client.poll(0)
    err = client.refusals.error
    if err is not None:
        raise ConfigError(
            f"kafka: the brokers at {redact(settings).get('bootstrap.servers')} refused the credentials "
            f"({err.str()}): check sasl.username and sasl.password in kafka.settings, or the login and "
            "password of the kafka.conn_id connection; nothing was read"
        )


def resolve_topics(settings: dict[str, str], spec: PipelineSpec, timeout: float = 15.0) -> list[str]:
    """The pipeline's topics: the listed ones plus every topic that fully matches ``topic_pattern`` now."""
    topics = list(spec.topics)
    if spec.topic_pattern is None:
        return topics
    pattern = re.compile(spec.topic_pattern)
    consumer = new_consumer(settings, "metadata", metadata_only=True)
    try:
        try:
            names = consumer.list_topics(timeout=timeout).topics
        except Exception as e:  # noqa: BLE001 - librdkafka's metadata errors: refused credentials terminal, the rest transient
            refused(consumer, settings)
            raise TransientError(f"cannot list topics on {redact(settings).get('bootstrap.servers')}: {e}") from None
    finally:
        consumer.close()
    matched = sorted(n for n in names if not n.startswith("__") and pattern.fullmatch(n))
    if not matched:
        log.info("topic_pattern %r matches no topic yet", spec.topic_pattern)
    return topics + [t for t in matched if t not in topics]


def list_partitions(settings: dict[str, str], topics: list[str], timeout: float = 15.0) -> list[TopicPartition]:
    """All partitions of the given topics. A missing topic is an error naming it; refused credentials are a
    configuration error (``refused``)."""
    consumer = new_consumer(settings, "metadata", metadata_only=True)
    try:
        out: list[TopicPartition] = []
        for topic in topics:
            try:
                md = consumer.list_topics(topic, timeout=timeout)
            except Exception as e:  # noqa: BLE001 - librdkafka's metadata errors: refused credentials terminal, the rest transient
                refused(consumer, settings)
                raise TransientError(
                    f"cannot read topic metadata from {redact(settings).get('bootstrap.servers')}: {e}", topic=topic
                ) from None
            tmd = md.topics.get(topic)
            if tmd is None or tmd.error is not None or not tmd.partitions:
                reason = tmd.error.str() if tmd is not None and tmd.error is not None else "no partitions"
                raise ConfigError(f"topics: topic {topic!r} is not available on the broker ({reason})", topic=topic)
            out.extend((topic, p) for p in sorted(tmd.partitions))
        return out
    finally:
        consumer.close()


def cluster_topics(settings: dict[str, str], names: list[str] | None = None, timeout: float = 15.0) -> dict[str, list[int]]:
    """Topics of the cluster with their partitions, in one request (``list_partitions`` asks topic by topic, which
    suits one pipeline; a page of many pipelines on one broker asks once): the ``names`` that exist (a DescribeTopics
    request), or every topic but the internal ones when ``names`` is None (a topic pattern needs them all)."""
    from confluent_kafka import KafkaException, TopicCollection

    where = redact(settings).get("bootstrap.servers")
    if names is not None:
        if not names:
            return {}
        admin = new_admin(settings, "metadata")
        out: dict[str, list[int]] = {}
        for name, fut in admin.describe_topics(TopicCollection(names), request_timeout=timeout).items():
            try:
                out[name] = sorted(p.id for p in fut.result().partitions)
            except KafkaException as e:
                if e.args[0].code() not in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.TOPIC_AUTHORIZATION_FAILED):
                    refused(admin, settings)
                    raise TransientError(f"cannot describe topic {name!r} on {where}: {e}", topic=name) from None
        return out  # a topic missing or not readable is left out: its pipeline says so
    consumer = new_consumer(settings, "metadata", metadata_only=True)
    try:
        try:
            md = consumer.list_topics(timeout=timeout)
        except Exception as e:  # noqa: BLE001 - librdkafka's metadata errors: refused credentials terminal, the rest transient
            refused(consumer, settings)
            raise TransientError(f"cannot list topics on {where}: {e}") from None
    finally:
        consumer.close()
    return {name: sorted(t.partitions) for name, t in md.topics.items() if not name.startswith("__") and t.error is None and t.partitions}


def pipeline_topics(spec: PipelineSpec, cluster: dict[str, list[int]]) -> tuple[list[str], list[str]]:
    """(the pipeline's topics found in ``cluster``, the listed ones missing from it), as ``resolve_topics`` and
    ``list_partitions`` would find them."""
    wanted = list(spec.topics)
    if spec.topic_pattern is not None:
        pattern = re.compile(spec.topic_pattern)
        wanted += [t for t in sorted(cluster) if pattern.fullmatch(t) and t not in wanted]
    return [t for t in wanted if t in cluster], [t for t in spec.topics if t not in cluster]


def new_admin(settings: dict[str, str], client_id: str) -> Any:
    """An admin client on the pipeline's librdkafka settings (metadata and offsets only: nothing is consumed)."""
    conf = {k: v for k, v in settings.items() if k not in THROUGHPUT_DEFAULTS}  # consumer tuning, not the admin's
    refusals = Refusals()
    try:
        admin = _Admin(client_logging({**conf, "client.id": f"tidewater-{client_id}", "error_cb": refusals}))
    except Exception as e:  # noqa: BLE001 - librdkafka's configuration errors (KafkaException, TypeError, ValueError)
        raise ConfigError(f"kafka.settings: librdkafka rejected the configuration: {e}") from None
    admin.refusals = refusals
    return admin


def watermarks(settings: dict[str, str], partitions: list[TopicPartition], timeout: float = 15.0) -> dict[TopicPartition, tuple[int, int]]:
    """(log start offset, end offset) per partition, as a read_committed consumer sees them (the end is the last
    stable offset). One ListOffsets request per partition leader for all the partitions' starts, then one for their
    ends (a consumer's ``get_watermark_offsets`` asks for one partition at a time).

    The ends are asked once the starts are answered, not while: with both sent together, librdkafka 2.16.0 once
    deadlocked for good inside the second ``list_offsets`` call (a test run's replay plan, in
    ``rd_kafka_topic_partition_list_query_leaders_async_worker`` waiting on a lock, holding Python's GIL), a lock
    taken while the first request's leaders were being looked up. One request in flight at a time costs a round trip."""

    from confluent_kafka.admin import OffsetSpec

    if not partitions:
        return {}
    admin = new_admin(settings, "watermarks")
    low = _list_offsets(admin, settings, partitions, OffsetSpec.earliest(), timeout)
    high = _list_offsets(admin, settings, partitions, OffsetSpec.latest(), timeout)
    return {tp: (low[tp], high[tp]) for tp in partitions}


def high_watermarks(settings: dict[str, str], partitions: list[TopicPartition], timeout: float = 15.0) -> dict[TopicPartition, int]:
    """Each partition's end as a read_uncommitted consumer sees it (the high watermark): past the last stable offset
    of ``watermarks`` when a transaction is open on the partition (``ops/status.py`` says why such a partition waits)."""
    from confluent_kafka import IsolationLevel
    from confluent_kafka.admin import OffsetSpec

    if not partitions:
        return {}
    admin = new_admin(settings, "watermarks")
    return _list_offsets(admin, settings, partitions, OffsetSpec.latest(), timeout, IsolationLevel.READ_UNCOMMITTED)


def _list_offsets(
    admin: Any, settings: dict[str, str], partitions: list[TopicPartition], spec: Any, timeout: float, isolation: Any = None
) -> dict[TopicPartition, int]:
    """One ListOffsets request (``spec``: earliest, latest) for ``partitions``, read_committed unless ``isolation``."""
    from confluent_kafka import IsolationLevel

    level = IsolationLevel.READ_COMMITTED if isolation is None else isolation
    try:
        return _offsets(admin.list_offsets({KTP(t, p): spec for t, p in partitions}, isolation_level=level, request_timeout=timeout))
    except TransientError:
        refused(admin, settings)
        raise


def _offsets(futures: dict[Any, Any]) -> dict[TopicPartition, int]:
    """The offsets of a ListOffsets request, by partition; a transient error naming the first partition without one.

    A partition whose leader has just gone (a broker killed) can come back without an error but with a negative
    offset (librdkafka 2.16: -1001, "invalid"): that is no answer either. Taken as one, it made a committed
    partition look truncated (a terminal OffsetGapError) and a new one look empty."""
    out = {}
    for tp, fut in futures.items():
        try:
            offset = int(fut.result().offset)
        except Exception as e:  # noqa: BLE001 - the broker unreachable, or the partition's leader unknown for now
            raise TransientError(f"cannot read watermarks: {e}", topic=tp.topic, partition=tp.partition) from None
        if offset < 0:
            raise TransientError(
                f"cannot read watermarks: the broker answered no offset ({offset}); the partition's leader is likely moving",
                topic=tp.topic,
                partition=tp.partition,
            )
        out[(tp.topic, tp.partition)] = offset
    return out


@dataclass
class Chunk:
    """A run of consecutive records of one partition, as Python lists taken from librdkafka batches."""

    topic: str
    partition: int
    values: list[bytes | None]
    offsets: list[int]
    timestamps: list[int]
    keys: list[bytes | None] | None = None  # only when read with keys=True
    headers: list[Any] | None = None  # only when read with headers=True

    def __len__(self) -> int:
        return len(self.offsets)


class _Columns:
    """The columns of the chunk being filled, appended a consumed batch at a time (map over librdkafka's
    message list with unbound C methods: the cheapest per-record step Python offers)."""

    def __init__(self, rng: PartitionRange, keys: bool, headers: bool) -> None:
        self.rng, self.keys, self.headers = rng, keys, headers
        self.reset()

    def reset(self) -> None:
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.stamps: list[int] = []
        self.key_list: list[bytes | None] | None = [] if self.keys else None
        self.header_list: list[Any] | None = [] if self.headers else None

    def add(self, msgs: list[Any], offs: list[int]) -> None:
        self.values.extend(map(Message.value, msgs))
        self.stamps.extend(map(itemgetter(1), map(Message.timestamp, msgs)))
        self.offsets.extend(offs)
        if self.key_list is not None:
            self.key_list.extend(map(Message.key, msgs))
        if self.header_list is not None:
            self.header_list.extend(map(Message.headers, msgs))

    def take(self) -> Chunk:
        chunk = Chunk(self.rng.topic, self.rng.partition, self.values, self.offsets, self.stamps, self.key_list, self.header_list)
        self.reset()
        return chunk


# librdkafka's consumer must carry a group.id and looks up that group's coordinator even when it is only assigned
# partitions and never commits; a principal without a group ACL is refused the lookup. The reads do not use the group,
# so that refusal is passed over (a pipeline needs Describe and Read on its topics only: docs/reference/kafka.md).
_GROUP_ONLY_ERRORS = frozenset({KafkaError.GROUP_AUTHORIZATION_FAILED})


def _without_errors(msgs: list[Any], rng: PartitionRange, pos: int) -> tuple[list[Any], bool]:
    """(the batch without its end-of-partition events, whether one was there). Any other error raises, but those
    of the consumer group the reader never uses (``_GROUP_ONLY_ERRORS``)."""
    if not any(map(Message.error, msgs)):
        return msgs, False
    eof = False
    for m in msgs:
        code = m.error().code() if m.error() is not None else None
        eof = eof or code == KafkaError._PARTITION_EOF
        if code is not None and code != KafkaError._PARTITION_EOF and code not in _GROUP_ONLY_ERRORS:
            raise KafkaReadError(f"read failed: {m.error().str()}", topic=rng.topic, partition=rng.partition, offset=pos)
    return [m for m in msgs if m.error() is None], eof


def read_range(
    settings: dict[str, str],
    rng: PartitionRange,
    *,
    chunk_records: int,
    read_timeout: float,
    client_id: str = "reader",
    keys: bool = False,
    headers: bool = False,
) -> Iterator[Chunk]:
    """Yield the records of ``rng`` in chunks of about ``chunk_records``.

    Stops when the consumer's position reaches ``rng.end`` (offsets can be missing inside a range:
    compacted topics and transaction markers). Raises KafkaReadError when no progress is made for
    ``read_timeout`` seconds, naming the partition and position.
    """
    if rng.size <= 0:
        return
    consumer = new_consumer(settings, client_id)
    try:
        consumer.assign([KTP(rng.topic, rng.partition, rng.start)])
        pos, cols, last_progress = rng.start, _Columns(rng, keys, headers), time.monotonic()
        while pos < rng.end:
            # Never ask for more than the range still holds: librdkafka's consume() waits out its timeout
            # until it has num_messages, so the last call of every range would otherwise idle for a second.
            want = max(1, min(CONSUME_BATCH, rng.end - pos))
            msgs, at_eof = _without_errors(consumer.consume(num_messages=want, timeout=1.0), rng, pos)
            past_end = False
            if msgs:
                offs = cast(list[int], list(map(Message.offset, msgs)))  # never None: error events are filtered out
                if offs[-1] >= rng.end:
                    cut = bisect_left(offs, rng.end)
                    past_end, msgs, offs = True, msgs[:cut], offs[:cut]
                if msgs:
                    cols.add(msgs, offs)
                    pos, last_progress = offs[-1] + 1, time.monotonic()
                if len(cols.offsets) >= chunk_records:
                    yield cols.take()
            if pos >= rng.end or past_end:
                break
            # Transaction markers and compaction leave offsets that are never delivered: the consumer's
            # position moves past them although no record arrives.
            if (at_eof or not msgs) and consumer.position([KTP(rng.topic, rng.partition)])[0].offset >= rng.end:
                break
            if time.monotonic() - last_progress > read_timeout:
                raise KafkaReadError(
                    f"no progress for {read_timeout:.0f}s reading up to offset {rng.end} (broker unreachable, or "
                    "the records were deleted while reading)",
                    topic=rng.topic,
                    partition=rng.partition,
                    offset=pos,
                )
        if cols.offsets:
            yield cols.take()
    finally:
        consumer.close()


class Rereader:
    """Reads the key and headers of given records again (error path only: the hot path does not keep
    them unless they become columns). One consumer, opened on first use and reused until ``close``."""

    def __init__(self, settings: dict[str, str], client_id: str, read_timeout: float) -> None:
        self._settings = settings
        self._client_id = client_id
        self._timeout = read_timeout
        self.new_consumer: Any = None

    def fetch(self, topic: str, partition: int, offsets: list[int]) -> dict[int, tuple[bytes | None, Any]]:
        if not offsets:
            return {}
        if self.new_consumer is None:
            self.new_consumer = new_consumer(self._settings, self._client_id)
        wanted = set(offsets)
        last = max(offsets)
        found: dict[int, tuple[bytes | None, Any]] = {}
        self.new_consumer.assign([KTP(topic, partition, min(offsets))])
        deadline = time.monotonic() + self._timeout
        done = False
        while not done and len(found) < len(wanted) and time.monotonic() < deadline:
            want = max(1, min(CONSUME_BATCH, len(wanted) - len(found)))  # see read_range: never wait for more
            for m in self.new_consumer.consume(num_messages=want, timeout=1.0):
                if m.error() is not None:
                    done = done or m.error().code() == KafkaError._PARTITION_EOF
                    continue
                if m.offset() in wanted:
                    found[m.offset()] = (m.key(), m.headers())
                done = done or m.offset() >= last
        return found

    def close(self) -> None:
        if self.new_consumer is not None:
            self.new_consumer.close()
            self.new_consumer = None
