"""The audit against Kafka now: committed offsets below the log start (records deleted by retention before they were
read) or beyond the log end (the topic was recreated), the lag, and how close unread records are to retention."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import TopicPartition as KTP
from confluent_kafka.admin import AdminClient, ConfigResource

from tidewater.audit.findings import Finding
from tidewater.config.spec import PipelineSpec
from tidewater.source.kafka import client_logging, kafka_settings, list_partitions, new_consumer, watermarks
from tidewater.table.summary import committed_state


def against_kafka(spec: PipelineSpec, table: Any) -> tuple[list[Finding], list[dict[str, Any]]]:
    """The committed offsets against each partition's log start and end now."""
    committed = committed_state(table, spec.targets.branch).offsets if table is not None else {}
    settings = kafka_settings(spec)
    topics = sorted(set(spec.topics or []) | set(committed))
    findings, parts = kafka_findings(committed, watermarks(settings, list_partitions(settings, topics)))
    return findings + retention_findings(settings, parts), parts


RETENTION_WARNING = 0.8  # warn once the unread records have used this share of what retention allows them


def retention_findings(settings: dict[str, str], parts: list[dict[str, Any]], now_ms: int | None = None) -> list[Finding]:
    """Warnings for partitions whose unread records retention will delete before they are ingested, at the lag
    of now: the oldest unread record's age against ``retention.ms``, and the unread share of the retained log
    against ``retention.bytes`` (its size, in records); only where cleanup.policy deletes. A compacted topic
    with unread records gets a note (compaction may remove superseded ones first). A topic whose settings cannot
    be read is reported as not checked (info), never as clean."""
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
            out.append(
                Finding(
                    "warning",
                    "kafka",
                    f"lag beyond retention: the oldest unread record is "
                    f"{(now_ms - ts) / 3_600_000:.1f} h old and retention.ms is {ms / 3_600_000:.1f} h; "
                    f"unread records are deleted within {left / 3_600_000:.1f} h unless ingested",
                    *where,
                )
            )
        retained = p["log_end"] - p["log_start"]
        if size > 0 and retained and p["lag"] / retained >= RETENTION_WARNING:
            out.append(
                Finding(
                    "warning",
                    "kafka",
                    f"lag beyond retention: {p['lag']} unread records are "
                    f"{100 * p['lag'] / retained:.0f}% of the partition's retained log (retention.bytes "
                    f"{size}); as the log grows, the oldest unread ones are deleted first",
                    *where,
                )
            )
        compacted, lag_ms = cleanup.get(p["topic"], (-1, -1, False, 0))[2:]
        if compacted:
            out.append(
                Finding(
                    "info",
                    "kafka",
                    "compacted topic (cleanup.policy compact): an unread record that a "
                    f"later record of its key supersedes may be removed before it is read (after "
                    f"min.compaction.lag.ms {lag_ms}); the deep audit reports such offsets as holding no "
                    "record",
                    *where,
                )
            )
    return out


def topic_cleanup(settings: dict[str, str], topics: list[str], timeout: float = 15.0) -> dict[str, tuple[int, int, bool, int]]:
    """(retention.ms, retention.bytes, compacted, min.compaction.lag.ms) per topic as the broker reports them;
    the retention settings are -1 (unlimited) unless cleanup.policy includes ``delete``."""
    admin = AdminClient(client_logging(dict(settings)))
    futures = admin.describe_configs([ConfigResource("topic", t) for t in topics], request_timeout=timeout)
    out = {}
    for resource, future in futures.items():
        config = future.result(timeout)
        value = {k: config[k].value for k in ("retention.ms", "retention.bytes", "cleanup.policy", "min.compaction.lag.ms") if k in config}
        policy = {p.strip() for p in (value.get("cleanup.policy") or "delete").split(",")}
        deletes = "delete" in policy
        out[resource.name] = (
            int(value.get("retention.ms") or -1) if deletes else -1,
            int(value.get("retention.bytes") or -1) if deletes else -1,
            "compact" in policy,
            int(value.get("min.compaction.lag.ms") or 0),
        )
    return out


def oldest_unread(settings: dict[str, str], parts: list[dict[str, Any]], timeout: float = 10.0) -> dict[tuple[str, int], int]:
    """The timestamp (ms) of the record at each partition's committed offset: the oldest one not yet read."""
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


def kafka_findings(
    committed: dict[str, dict[int, int]], marks: dict[tuple[str, int], tuple[int, int]]
) -> tuple[list[Finding], list[dict[str, Any]]]:
    """Findings and per-partition positions from the committed offsets and (log start, log end) per partition."""
    out, parts = [], []
    for (topic, part), (low, high) in sorted(marks.items()):
        at = committed.get(topic, {}).get(part)
        parts.append(
            {
                "topic": topic,
                "partition": part,
                "committed": at,
                "log_start": low,
                "log_end": high,
                "lag": None if at is None else max(high - at, 0),
            }
        )
        if at is None:
            continue
        if at < low:
            out.append(Finding("error", "kafka", "deleted by retention before they were read", topic, part, at, low))
        elif at > high:
            out.append(
                Finding(
                    "error", "kafka", f"committed offset is beyond the log end {high} (was the topic recreated?)", topic, part, high, at
                )
            )
    return out, parts
