"""Metrics through Airflow's own stats (StatsD or OpenTelemetry, as ``[metrics]`` configures Airflow).

Every metric is sent with tags (``pipeline``, and ``topic``, ``partition`` or ``class`` where they apply). Where the
backend carries tags (OpenTelemetry, StatsD with ``statsd_influxdb_enabled`` or ``statsd_datadog_enabled``) its name
is the tag-free one below, one series per tag set, which an alert rule can aggregate; on plain StatsD, which has no
tags, the tags' values are put into the name instead (the names of earlier versions):

Tagged name (plain StatsD name), type, tags: when it is sent.

- ``tidewater.partition_lag`` (``tidewater.<pipeline>.lag.<topic>.<partition>``), gauge, pipeline, topic,
  partition: plan task, records not yet committed;
- ``tidewater.lag`` (``tidewater.<pipeline>.lag``), gauge, pipeline: plan task, the sum over partitions;
- ``tidewater.rows``, ``.records``, ``.bytes``, ``.dead_letters``, ``.commit_retries`` (``tidewater.<pipeline>.rows``,
  ...), counters, pipeline: commit task, rows committed, records read, bytes of the data files committed, records
  dead-lettered, table commits attempted again (conflicts);
- ``tidewater.dead_letters_by_class`` (``tidewater.<pipeline>.dead_letters.<class>``), counter, pipeline, class:
  commit task, the dead letters per error class;
- ``tidewater.freshness_seconds`` (``tidewater.<pipeline>.freshness_seconds``), gauge, pipeline: commit task, from
  the newest record committed (its Kafka timestamp) to the commit;
- ``tidewater.commit_seconds``, ``.batch_seconds`` (``tidewater.<pipeline>.commit_seconds``, ...), timers, pipeline:
  commit task, the commit step and the batch from its plan to its commit;
- ``tidewater.late`` (``tidewater.<pipeline>.late``), counter, pipeline: an ingest run missed its
  ``airflow.freshness`` deadline (triggerer).

All come from a pipeline's tasks: while its ingest DAG is paused (or the scheduler is down) none is sent, so an
alert on lag must also fire when the series stops (docs: Operating it, an example rule). Airflow's stats are a no-op
when metrics are off, so this costs nothing then; the per-partition lag is read from the broker and the dead
letters' classes from their staged files only when metrics are on.
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import datetime, timezone
from typing import Any

from tidewater.ops.status import status

log = logging.getLogger(__name__)


def _stats() -> Any:
    from airflow.sdk.observability import stats

    return stats


def _conf(key: str) -> bool:
    from airflow.sdk.configuration import conf

    return conf.getboolean("metrics", key, fallback=False)


def enabled() -> bool:
    return _conf("statsd_on") or _conf("otel_on")


def tags_carried() -> bool:
    """Whether Airflow's metrics backend carries tags: OpenTelemetry's attributes, StatsD's InfluxDB or Datadog
    conventions. Plain StatsD does not."""
    return _conf("otel_on") or _conf("statsd_influxdb_enabled") or _conf("statsd_datadog_enabled")


def _name(*parts: str) -> str:
    from airflow.sdk.observability.stats import normalize_name_for_stats

    return normalize_name_for_stats(".".join(["tidewater", *parts]))


def _send(kind: str, metric: str, value: float, pipeline: str, **tags: str) -> str:
    """Send one value: as ``tidewater.<metric>`` with its tags where the backend carries them, else under the plain
    StatsD name (pipeline and tag values in the name; module docstring). Returns the name used."""
    plain = {"partition_lag": "lag", "dead_letters_by_class": "dead_letters"}.get(metric, metric)
    name = _name(metric) if tags_carried() else _name(pipeline, plain, *tags.values())
    getattr(_stats(), kind)(name, value, tags={"pipeline": pipeline, **tags})
    return name


def lag(spec: Any) -> int | None:
    """Gauge the pipeline's lag per partition and in all; returns the total (None when metrics are off: nothing is
    asked of the broker then)."""
    if not enabled():
        return None
    st = status(spec)
    for p in st["partitions"]:
        _send("gauge", "partition_lag", p["lag"], spec.name, topic=p["topic"], partition=str(p["partition"]))
    _send("gauge", "lag", st["total_lag"], spec.name)
    return st["total_lag"]


def committed(spec: Any, plan: Any, manifest: Any, result: Any, commit_seconds: float, classes: dict[str, int] | None = None) -> None:
    """Count what one batch committed and time it; ``classes``: its dead letters per error class."""
    p = spec.name
    _send("incr", "rows", result.rows, p)
    _send("incr", "records", manifest.records, p)
    _send(
        "incr",
        "bytes",
        sum(f.file_size_in_bytes for o in manifest.outputs for f in o.data_files) or sum(f.file_size_in_bytes for f in manifest.data_files),
        p,
    )
    _send("incr", "dead_letters", manifest.dead_letters, p)
    for error_class, count in sorted((classes or {}).items()):
        _send("incr", "dead_letters_by_class", count, p, **{"class": error_class})
    _send("incr", "commit_retries", result.commit_retries, p)
    _send("timing", "commit_seconds", commit_seconds * 1000.0, p)
    now = datetime.now(timezone.utc)
    newest = manifest.valid_through_ms()
    if newest is not None:
        _send("gauge", "freshness_seconds", max(now.timestamp() - newest / 1000.0, 0.0), p)
    try:
        planned = datetime.fromisoformat(plan.created_at)
        _send("timing", "batch_seconds", (now - planned).total_seconds() * 1000.0, p)
    except (TypeError, ValueError):  # a plan without its creation time: no batch duration
        log.debug("plan %s has no creation time", plan.batch_id)


def letter_classes(spec: Any, manifest: Any) -> dict[str, int]:
    """The batch's dead letters per error class, read from its staged dead-letter files (their one column), only when
    metrics are on and the batch has any."""
    if not manifest.dead_letters or not manifest.dead_letter_files or not enabled():
        return {}
    import pyarrow.parquet as pq

    from tidewater.table.catalog import load_catalog, load_table

    counts: Counter[str] = Counter()
    try:
        dlq = load_table(load_catalog(spec), spec.dead_letter_table())
        if dlq is None:
            raise LookupError(f"{spec.dead_letter_table()} does not exist")
        io = dlq.io
        for f in manifest.dead_letter_files:
            with io.new_input(f.file_path).open() as fh:
                counts.update(pq.read_table(fh, columns=["error_class"]).column("error_class").to_pylist())
    except Exception:  # the batch is committed: a metric that cannot be read must not fail its task
        log.exception("batch %s: could not read its dead letters' classes for the metrics", manifest.batch_id)
        return {}
    return dict(counts)


def late(pipeline: str) -> None:
    """Count an ingest run that missed its freshness deadline (sent from Airflow's triggerer)."""
    try:
        _send("incr", "late", 1, pipeline)
    except Exception:  # metrics must never hide the warning the caller logged
        log.exception("pipeline %s: could not send the late metric", pipeline)
