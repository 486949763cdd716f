"""Metrics through Airflow's own stats (StatsD or OpenTelemetry, as ``[metrics]`` configures Airflow).

Names, under Airflow's metric prefix (``airflow.`` by default), per pipeline:

| metric | type | when |
| --- | --- | --- |
| ``tidewater.<pipeline>.lag.<topic>.<partition>`` | gauge | plan task: records not yet committed |
| ``tidewater.<pipeline>.lag`` | gauge | plan task: the sum over partitions |
| ``tidewater.<pipeline>.rows`` | counter | commit task: rows committed |
| ``tidewater.<pipeline>.records`` | counter | commit task: records read |
| ``tidewater.<pipeline>.dead_letters`` | counter | commit task: records dead-lettered |
| ``tidewater.<pipeline>.commit_retries`` | counter | commit task: table commits attempted again (conflicts) |
| ``tidewater.<pipeline>.commit_seconds`` | timer | commit task: the commit step |
| ``tidewater.<pipeline>.batch_seconds`` | timer | commit task: from the plan to the commit |
| ``tidewater.<pipeline>.late`` | counter | an ingest run missed its ``airflow.freshness`` deadline (triggerer) |

Airflow's stats are a no-op when metrics are off, so this costs nothing then; the per-partition lag is
read from the broker only when metrics are on.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from tidewater.ops.status import status

log = logging.getLogger(__name__)


def _stats() -> Any:
    from airflow.sdk.observability import stats

    return stats


def enabled() -> bool:
    from airflow.sdk.configuration import conf

    return conf.getboolean("metrics", "statsd_on", fallback=False) or conf.getboolean("metrics", "otel_on", fallback=False)


def _name(*parts: str) -> str:
    from airflow.sdk.observability.stats import normalize_name_for_stats

    return normalize_name_for_stats(".".join(["tidewater", *parts]))


def lag(spec: Any) -> dict[str, int]:
    """Gauge the pipeline's lag per partition (and in all); returns what was sent (empty when metrics are off)."""
    if not enabled():
        return {}

    st = status(spec)
    sent = {}
    for p in st["partitions"]:
        sent[_name(spec.name, "lag", p["topic"], str(p["partition"]))] = p["lag"]
    sent[_name(spec.name, "lag")] = st["total_lag"]
    for name, value in sent.items():
        _stats().gauge(name, value)
    return sent


def committed(spec: Any, plan: Any, manifest: Any, result: Any, commit_seconds: float) -> None:
    """Count what one batch committed and time it."""
    s = _stats()
    s.incr(_name(spec.name, "rows"), count=result.rows)
    s.incr(_name(spec.name, "records"), count=manifest.records)
    s.incr(_name(spec.name, "dead_letters"), count=manifest.dead_letters)
    s.incr(_name(spec.name, "commit_retries"), count=result.commit_retries)
    s.timing(_name(spec.name, "commit_seconds"), commit_seconds * 1000.0)
    try:
        planned = datetime.fromisoformat(plan.created_at)
        s.timing(_name(spec.name, "batch_seconds"), (datetime.now(timezone.utc) - planned).total_seconds() * 1000.0)
    except (TypeError, ValueError):  # a plan without its creation time: no batch duration
        log.debug("plan %s has no creation time", plan.batch_id)


def late(pipeline: str) -> None:
    """Count an ingest run that missed its freshness deadline (sent from Airflow's triggerer)."""
    try:
        _stats().incr(_name(pipeline, "late"))
    except Exception:  # metrics must never hide the warning the caller logged
        log.exception("pipeline %s: could not send the late metric", pipeline)
